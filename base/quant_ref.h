// GGUF weight formats on the host: block layouts (bit-exact with ggml), fp16/bf16 conversions,
// per-block integer codes and the scalar reference dequantizer of every type. The readable
// reference that core uses on the host and that every backend's kernels are tested against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/types.h"

namespace moelite {

// y = dequantized(src), n elements (a multiple of the type's block size).
using DequantRowFn = void (*)(const void* src, float* y, int64_t n);
// The scalar reference dequantizer of a type, or null where moelite has none.
DequantRowFn dequant_row_fn(TensorType t);

// fp16 / bf16 conversions (scalar, exact: round-to-nearest-even for the narrowing ones).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

// ---- GGUF block layouts (bit-exact with ggml). Every member is a byte array, so the structs have
// alignment 1 and can overlay any byte offset of a mapped file (GGUF rows are not aligned to
// anything larger than 2, and blocks of 34 or 110 bytes follow each other). fp16 fields are read
// with load_fp16() below. Q8_K is an activation format that only moelite produces, in buffers of
// its own; its float scale and int16 sums are still read with memcpy or unaligned loads.
namespace blocks {
constexpr int kQK = 32;    // elements per block of the legacy types
constexpr int kQKK = 256;  // elements per super-block of the K-quants

struct Q4_0 {
  uint8_t d[2];
  uint8_t qs[16];
};  // x = d * (nibble - 8); low nibbles 0..15, high 16..31
struct Q4_1 {
  uint8_t d[2];
  uint8_t m[2];
  uint8_t qs[16];
};  // x = d * nibble + m
struct Q5_0 {
  uint8_t d[2];
  uint8_t qh[4];
  uint8_t qs[16];
};  // 5th bit j of element j in qh (LE u32)
struct Q5_1 {
  uint8_t d[2];
  uint8_t m[2];
  uint8_t qh[4];
  uint8_t qs[16];
};
struct Q8_0 {
  uint8_t d[2];
  int8_t qs[32];
};
struct Q8_1 {
  uint8_t d[2];
  uint8_t s[2];
  int8_t qs[32];
};  // s = d * sum(qs)
struct Q2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint8_t d[2];
  uint8_t dmin[2];
};
struct Q3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint8_t d[2];
};
struct Q4_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];
  uint8_t qs[128];
};
struct Q5_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct Q6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint8_t d[2];
};
struct Q8_K {
  uint8_t d[4];
  int8_t qs[256];
  uint8_t bsums[32];
};  // f32 d; int16 sums of 16 qs
// MXFP4 (OCP microscaling, gpt-oss's experts): 32 E2M1 values sharing one E8M0 exponent. Byte j
// holds element j in its low nibble and element j + 16 in its high one (as Q4_0). A code's value
// is kMxfp4Values[code] * 2^(e - 128): the table holds the E2M1 values doubled (0, 0.5, 1, 1.5, 2,
// 3, 4, 6 and their negatives, times 2) so they are integers, and the exponent is one less.
struct MXFP4 {
  uint8_t e;
  uint8_t qs[16];
};

static_assert(sizeof(Q4_0) == 18 && sizeof(Q4_1) == 20 && sizeof(Q5_0) == 22 && sizeof(Q5_1) == 24);
static_assert(sizeof(Q8_0) == 34 && sizeof(Q8_1) == 36);
static_assert(sizeof(Q2_K) == 84 && sizeof(Q3_K) == 110 && sizeof(Q4_K) == 144);
static_assert(sizeof(Q5_K) == 176 && sizeof(Q6_K) == 210 && sizeof(Q8_K) == 292);
static_assert(sizeof(MXFP4) == 17);
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
}  // namespace blocks

// 2^(e - 128) as a float, for every E8M0 byte: e = 0 and 1 give the subnormals 2^-128 and 2^-127
// (the MXFP4 block scale; with the doubled value table it is the format's 2^(e - 127)). Built from
// its bits, not with ldexp, so every kernel table computes the same float: exponent field e - 1
// for e >= 2; below that bit 21 (2^-128) or bit 22 (2^-127) of a subnormal.
inline float mxfp4_half_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Unpacked K-quant scales, shared by the scalar reference and the SIMD kernels so the bit
// twiddling lives in one place.
// Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12 bytes.
void unpack_scales_q4k(const uint8_t packed[12], uint8_t sc[8], uint8_t mn[8]);
// Q3_K: 16 six-bit scales packed in 12 bytes, returned with the -32 offset applied.
void unpack_scales_q3k(const uint8_t packed[12], int8_t sc[16]);

// Loads and stores of the byte-array fields above.
float load_fp16(const uint8_t p[2]);
void store_fp16(uint8_t p[2], float f);
float q8k_d(const blocks::Q8_K& b);
int q8k_bsum(const blocks::Q8_K& b, int g);
uint32_t load_u32(const uint8_t p[4]);

// Integer codes of one block in element order (dequantization and dot products share them).
void codes_q4_0(const blocks::Q4_0& b, int8_t q[32]);
void codes_q4_1(const blocks::Q4_1& b, int q[32]);
void codes_q5(const uint8_t qs[16], const uint8_t qh_bytes[4], int q[32]);
void codes_q2_k(const blocks::Q2_K& b, uint8_t q[256]);
void codes_q3_k(const blocks::Q3_K& b, int8_t q[256]);
void codes_q4_k(const blocks::Q4_K& b, uint8_t q[256]);
void codes_q5_k(const blocks::Q5_K& b, uint8_t q[256]);
void codes_q6_k(const blocks::Q6_K& b, int8_t q[256]);
void codes_mxfp4(const blocks::MXFP4& b, int8_t q[32]);  // the doubled values, kMxfp4Values

}  // namespace moelite
