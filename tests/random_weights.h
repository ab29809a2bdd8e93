// Random weight rows of any GGUF type with sane fp16 scales, shared by the kernel tests of
// every backend.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/quant.h"
#include "base/types.h"

namespace moelite::test {

using moelite::fp32_to_bf16;
using moelite::fp32_to_fp16;

inline size_t weight_row_bytes(TensorType t, int64_t n) {
  uint64_t b = 0;
  type_row_bytes(t, static_cast<uint64_t>(n), &b);
  return static_cast<size_t>(b);
}

// Offsets of fp16 scale fields inside one block, so random bytes can be given sane scales.
inline std::vector<int> fp16_field_offsets(TensorType t) {
  switch (t) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0: return {0};
    case TensorType::Q4_1:
    case TensorType::Q5_1: return {0, 2};
    case TensorType::Q2_K: return {80, 82};
    case TensorType::Q3_K: return {108};
    case TensorType::Q4_K:
    case TensorType::Q5_K: return {0, 2};
    case TensorType::Q6_K: return {208};
    default: return {};
  }
}

inline std::vector<uint8_t> random_weights(TensorType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> buf(weight_row_bytes(t, n));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  if (t == TensorType::F32) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = val(rng);
      std::memcpy(buf.data() + 4 * i, &v, 4);
    }
    return buf;
  }
  if (t == TensorType::F16 || t == TensorType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t v = t == TensorType::F16 ? fp32_to_fp16(val(rng)) : fp32_to_bf16(val(rng));
      std::memcpy(buf.data() + 2 * i, &v, 2);
    }
    return buf;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : buf) b = static_cast<uint8_t>(byte(rng));
  const TypeInfo* info = type_info(static_cast<uint32_t>(t));
  if (t == TensorType::MXFP4) {  // E8M0 exponents of scales 2^-10 .. 2^-3, like a model's
    for (size_t blk = 0; blk < buf.size() / info->block_bytes; ++blk)
      buf[blk * info->block_bytes] = static_cast<uint8_t>(117 + byte(rng) % 8);
    return buf;
  }
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (size_t blk = 0; blk < buf.size() / info->block_bytes; ++blk)
    for (int off : fp16_field_offsets(t)) {
      // Signed scales exercise the sign handling; the second field (min) of Q4_1/Q5_1 is a
      // signed offset as well, and K-quant mins are subtracted, so either sign is valid data.
      const float s = scale(rng) * (byte(rng) & 1 ? 1.0f : -1.0f);
      const uint16_t hv = fp32_to_fp16(s);
      std::memcpy(buf.data() + blk * info->block_bytes + off, &hv, 2);
    }
  return buf;
}

}  // namespace moelite::test
