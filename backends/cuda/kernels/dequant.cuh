// Weight decoding on the device: dq<T>(row, i) is element i of a row of GGUF type T starting at
// byte pointer `row` (global memory, or a matrix product's shared stage). Bytes are read one at a
// time (blocks of 18, 22, 34 … bytes have no alignment), fp16 scales are converted exactly
// (half_bits_to_float), and every value is computed in the same float operations as the scalar
// reference (base/quant_ref.cpp), which the kernel tests compare against.
#pragma once
#include "backends/cuda/kernels/dialect.cuh"

namespace moelite::cuda_kernels {

enum WeightTypeId : int {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
  kMXFP4 = 39,
};

// The byte readers take any P that indexes bytes like a pointer: a global `const uint8_t*`, or
// bytes_at() of a shared stage (a pointer on the GPU, a race-checked view in the emulator).
template <class P>
MK_DEVICE uint32_t u8(P p) {
  return p[0];
}
template <class P>
MK_DEVICE uint32_t u16(P p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8);
}
template <class P>
MK_DEVICE uint32_t u32(P p) {
  return u16(p) | (u16(p + 2) << 16);
}
template <class P>
MK_DEVICE int32_t i8(P p) {
  return int32_t(int8_t(p[0]));
}
template <class P>
MK_DEVICE float f16(P p) {
  return half_bits_to_float(u16(p));
}

// Q4_K / Q5_K: six-bit scale and min of sub-block s (0..7) from the 12 packed bytes at p.
template <class P>
MK_DEVICE void scale_min_k4(P p, uint32_t s, float* sc, float* mn) {
  if (s < 4) {
    *sc = float(p[s] & 63u);
    *mn = float(p[s + 4] & 63u);
  } else {
    *sc = float((p[s + 4] & 15u) | ((p[s - 4] >> 6) << 4));
    *mn = float((p[s + 4] >> 4) | ((p[s] >> 6) << 4));
  }
}

// Elements per block and bytes per block of each type (the host checks the same in base/types).
template <int T>
struct Layout;
template <>
struct Layout<kF32> {
  static constexpr int block = 1, bytes = 4;
};
template <>
struct Layout<kF16> {
  static constexpr int block = 1, bytes = 2;
};
template <>
struct Layout<kBF16> {
  static constexpr int block = 1, bytes = 2;
};
template <>
struct Layout<kQ4_0> {
  static constexpr int block = 32, bytes = 18;
};
template <>
struct Layout<kQ4_1> {
  static constexpr int block = 32, bytes = 20;
};
template <>
struct Layout<kQ5_0> {
  static constexpr int block = 32, bytes = 22;
};
template <>
struct Layout<kQ5_1> {
  static constexpr int block = 32, bytes = 24;
};
template <>
struct Layout<kQ8_0> {
  static constexpr int block = 32, bytes = 34;
};
template <>
struct Layout<kQ2_K> {
  static constexpr int block = 256, bytes = 84;
};
template <>
struct Layout<kQ3_K> {
  static constexpr int block = 256, bytes = 110;
};
template <>
struct Layout<kQ4_K> {
  static constexpr int block = 256, bytes = 144;
};
template <>
struct Layout<kQ5_K> {
  static constexpr int block = 256, bytes = 176;
};
template <>
struct Layout<kQ6_K> {
  static constexpr int block = 256, bytes = 210;
};
template <>
struct Layout<kMXFP4> {
  static constexpr int block = 32, bytes = 17;
};

template <int T, class P>
MK_DEVICE float dq(P row, int64_t i) {
  if constexpr (T == kF32) return bits_to_float(u32(row + 4 * i));
  if constexpr (T == kF16) return f16(row + 2 * i);
  if constexpr (T == kBF16) return bits_to_float(u16(row + 2 * i) << 16);
  if constexpr (T == kQ8_0) {
    const auto b = row + (i >> 5) * 34;
    return float(i8(b + 2 + (i & 31))) * f16(b);
  }
  if constexpr (T == kMXFP4) {
    // E2M1 code (low nibble: element j < 16, high: j >= 16) as the doubled value in [-12, 12],
    // times the E8M0 byte's 2^(e - 128) built from its bits (subnormal for e < 2), as
    // base/quant_ref.h's kMxfp4Values and mxfp4_half_scale.
    const uint32_t j = uint32_t(i & 31);
    const auto b = row + (i >> 5) * 17;
    const uint32_t byte = b[1 + (j & 15u)];
    const uint32_t code = j < 16 ? (byte & 15u) : (byte >> 4);
    const uint32_t m = code & 7u;
    const int32_t doubled = m < 5 ? int32_t(m) : m == 5 ? 6 : m == 6 ? 8 : 12;
    const uint32_t e = b[0];
    const float scale = bits_to_float(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23));
    return float(code & 8u ? -doubled : doubled) * scale;
  }
  if constexpr (T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1) {
    // 4-bit codes: element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of j - 16.
    const uint32_t j = uint32_t(i & 31);
    const auto b = row + (i >> 5) * Layout<T>::bytes;
    constexpr int qs_at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
    const uint32_t byte = b[qs_at + (j & 15u)];
    uint32_t q = j < 16 ? (byte & 15u) : (byte >> 4);
    if constexpr (T == kQ5_0 || T == kQ5_1) q |= ((u32(b + (T == kQ5_0 ? 2 : 4)) >> j) & 1u) << 4;
    const float d = f16(b);
    if constexpr (T == kQ4_0) return (float(q) - 8.0f) * d;
    if constexpr (T == kQ5_0) return (float(q) - 16.0f) * d;
    if constexpr (T == kQ4_1 || T == kQ5_1) return float(q) * d + f16(b + 2);
  }
  // K-quants: 256 elements per super-block.
  const uint32_t e = uint32_t(i & 255);
  const auto b = row + (i >> 8) * Layout<T>::bytes;
  if constexpr (T == kQ2_K) {
    const uint32_t q = (b[16 + 32 * (e >> 7) + (e & 31u)] >> (2 * ((e >> 5) & 3u))) & 3u;
    const uint32_t sc = b[e >> 4];
    return f16(b + 80) * float(sc & 15u) * float(q) - f16(b + 82) * float(sc >> 4);
  }
  if constexpr (T == kQ3_K) {
    const int32_t low = int32_t((b[32 + 32 * (e >> 7) + (e & 31u)] >> (2 * ((e >> 5) & 3u))) & 3u);
    const bool high = ((b[e & 31u] >> (e >> 5)) & 1u) != 0;
    const uint32_t g = e >> 4;
    const uint32_t sl = (b[96 + (g & 7u)] >> (4 * (g >> 3))) & 15u;
    const uint32_t sh = (b[104 + (g & 3u)] >> (2 * (g >> 2))) & 3u;
    const int32_t sc = int32_t(sl | (sh << 4)) - 32;
    return f16(b + 108) * float(sc) * float(low - (high ? 0 : 4));
  }
  if constexpr (T == kQ4_K || T == kQ5_K) {
    const uint32_t c = e >> 6, l = e & 31u, hi = (e >> 5) & 1u;
    const uint32_t byte = b[(T == kQ4_K ? 16 : 48) + 32 * c + l];
    uint32_t q = hi ? (byte >> 4) : (byte & 15u);
    if constexpr (T == kQ5_K) q |= ((b[16 + l] >> (2 * c + hi)) & 1u) << 4;
    float sc, mn;
    scale_min_k4(b + 4, e >> 5, &sc, &mn);
    return f16(b) * sc * float(q) - f16(b + 2) * mn;
  }
  if constexpr (T == kQ6_K) {
    const uint32_t h = e >> 7, r = e & 127u, l = r & 31u, part = r >> 5;
    const uint32_t ql = b[64 * h + l + ((part & 1u) ? 32 : 0)];
    const uint32_t nib = part >= 2 ? (ql >> 4) : (ql & 15u);
    const uint32_t qh = (b[128 + 32 * h + l] >> (2 * part)) & 3u;
    const int32_t q = int32_t(nib | (qh << 4)) - 32;
    return f16(b + 208) * float(i8(b + 192 + (e >> 4))) * float(q);
  }
  return 0.0f;
}

}  // namespace moelite::cuda_kernels
