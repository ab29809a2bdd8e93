// Tests of the weight-type kernels.
//  - Known vectors: hand-built blocks whose values follow from the ggml format description,
//    so a swapped nibble order or a wrong scale unpacking fails (these pin the scalar reference).
//  - Scalar dot products against a float64 dot of the dequantized operands.
//  - Every SIMD table against the scalar reference on random blocks.
//  - fp16 / bf16 conversion vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant.h"
#include "platforms/platform.h"
#include "tests/random_weights.h"

namespace moelite::cpu {
namespace {

using moelite::test::fp16_field_offsets;
using moelite::test::random_weights;

using namespace blocks;

constexpr uint32_t tid(TensorType t) { return static_cast<uint32_t>(t); }

const TensorType kWeightTypes[] = {
    TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
    TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
    TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::MXFP4,
};

uint16_t h(float f) { return fp32_to_fp16(f); }
void put_fp16(uint8_t* p, float f) {
  const uint16_t v = fp32_to_fp16(f);
  std::memcpy(p, &v, 2);
}
size_t row_bytes(TensorType t, int64_t n) {
  uint64_t b = 0;
  EXPECT_TRUE(type_row_bytes(t, static_cast<uint64_t>(n), &b));
  return static_cast<size_t>(b);
}
std::vector<float> dequant(const KernelTable& k, TensorType t, const void* src, int64_t n) {
  std::vector<float> y(n);
  k.dequant[tid(t)](src, y.data(), n);
  return y;
}

// ---- (d) fp16 / bf16 ------------------------------------------------------------------------

float bits_to_f(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Fp16Conversion, KnownValues) {
  EXPECT_EQ(h(1.0f), 0x3C00);
  EXPECT_EQ(h(-2.0f), 0xC000);
  EXPECT_EQ(h(0.0f), 0x0000);
  EXPECT_EQ(h(-0.0f), 0x8000);
  EXPECT_EQ(h(65504.0f), 0x7BFF);
  EXPECT_EQ(h(0.1f), 0x2E66);
  EXPECT_EQ(h(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(h(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(h(std::ldexp(1023.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x7C00), INFINITY);
  EXPECT_EQ(fp16_to_fp32(0xFC00), -INFINITY);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));
}

TEST(Fp16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3C00);                          // tie, 0x3C00 is even
  EXPECT_EQ(h(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);                      // tie, 0x3C01 is odd: up
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);  // above tie
  EXPECT_EQ(h(65519.0f), 0x7BFF);                                              // below the midpoint to 65536
  EXPECT_EQ(h(65520.0f), 0x7C00);                                              // midpoint: even is infinity
  EXPECT_EQ(h(1e9f), 0x7C00);
  EXPECT_EQ(h(-INFINITY), 0xFC00);
  EXPECT_EQ(h(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 1 unit: 0
  EXPECT_EQ(h(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(h(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(h(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 units: tie to even 2
  EXPECT_EQ(h(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(h(std::ldexp(2047.0f, -25)), 0x0400);  // 1023.5 units: up into the normals
  const uint16_t nan = h(NAN);
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(Fp16Conversion, RoundTripsEveryHalf) {
  for (uint32_t v = 0; v < 0x10000; ++v) {
    if ((v & 0x7C00) == 0x7C00 && (v & 0x3FF) != 0) continue;  // NaNs: checked above
    ASSERT_EQ(h(fp16_to_fp32(static_cast<uint16_t>(v))), v) << std::hex << v;
  }
}

TEST(Fp16Conversion, Bf16) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_fp32(0xC000), -2.0f);
  EXPECT_EQ(fp32_to_bf16(bits_to_f(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(bits_to_f(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(bits_to_f(0x3F808001)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(bits_to_f(0x7F7FFFFF)), 0x7F80);  // max float rounds to inf
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(bits_to_f(0x7F800001)))));  // stays NaN
}

// ---- (c) known vectors of the block formats -------------------------------------------------

// MXFP4 from the format's definition, not from the kernels' table: an E2M1 code is sign (bit 3),
// exponent (bits 2-1, bias 1) and mantissa (bit 0), subnormal at exponent 0; the block's E8M0
// byte E scales by 2^(E - 127). Every code, at the smallest, a middle and the largest exponent.
TEST(QuantKnownVectors, Mxfp4) {
  auto e2m1 = [](int code) {
    const int sign = code >> 3, exp = (code >> 1) & 3, man = code & 1;
    const double mag = exp == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, exp - 1);
    return sign ? -mag : mag;
  };
  for (int e : {0, 1, 2, 120, 127, 128, 200, 254}) {
    MXFP4 b;
    b.e = static_cast<uint8_t>(e);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = dequant(kernels_scalar(), TensorType::MXFP4, &b, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], static_cast<float>(std::ldexp(e2m1(j), e - 127))) << "e " << e << " low " << j;
      EXPECT_EQ(y[16 + j], static_cast<float>(std::ldexp(e2m1(15 - j), e - 127))) << "e " << e << " high " << j;
    }
  }
}

TEST(QuantKnownVectors, Q4_0) {
  Q4_0 b;
  put_fp16(b.d, 0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto y = dequant(kernels_scalar(), TensorType::Q4_0, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;       // low nibbles: elements 0..15
    EXPECT_EQ(y[16 + j], (7 - j) * 0.5f) << j;  // high nibbles: elements 16..31
  }
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[15], 3.5f);
  EXPECT_EQ(y[16], 3.5f);
}

TEST(QuantKnownVectors, Q4_1) {
  Q4_1 b;
  put_fp16(b.d, 0.25f);
  put_fp16(b.m, -1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto y = dequant(kernels_scalar(), TensorType::Q4_1, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1.0f);
    EXPECT_EQ(y[16 + j], (15 - j) * 0.25f - 1.0f);
  }
}

TEST(QuantKnownVectors, Q5_0AndQ5_1) {
  Q5_0 b;
  put_fp16(b.d, 1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  // qh little-endian u32 0x80010003: bits 0, 1, 16, 31 -> elements 0, 1, 16, 31 get +16.
  const uint8_t qh[4] = {0x03, 0x00, 0x01, 0x80};
  std::memcpy(b.qh, qh, 4);
  auto y = dequant(kernels_scalar(), TensorType::Q5_0, &b, 32);
  for (int j = 0; j < 32; ++j) {
    const bool high = j == 0 || j == 1 || j == 16 || j == 31;
    EXPECT_EQ(y[j], static_cast<float>((j % 16) + (high ? 16 : 0) - 16)) << j;
  }
  Q5_1 c;
  put_fp16(c.d, 2.0f);
  put_fp16(c.m, 0.5f);
  std::memcpy(c.qs, b.qs, 16);
  std::memcpy(c.qh, qh, 4);
  auto z = dequant(kernels_scalar(), TensorType::Q5_1, &c, 32);
  EXPECT_EQ(z[0], 2.0f * 16 + 0.5f);
  EXPECT_EQ(z[2], 2.0f * 2 + 0.5f);
  EXPECT_EQ(z[17], 2.0f * 1 + 0.5f);
  EXPECT_EQ(z[31], 2.0f * 31 + 0.5f);
}

TEST(QuantKnownVectors, Q8_0) {
  Q8_0 b;
  put_fp16(b.d, 2.0f);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
  auto y = dequant(kernels_scalar(), TensorType::Q8_0, &b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 2.0f * (j - 16));
}

TEST(QuantKnownVectors, Q2_K) {
  Q2_K b;
  // Group g (16 elements): scale = g & 15 (low nibble), min = 15 - g (high nibble).
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>((g & 15) | ((15 - g) << 4));
  // Each byte holds codes 0,1,2,3 in bit pairs 0-1 .. 6-7: element 32s + l of each 128-half
  // reads bit pair s, so code = s.
  std::memset(b.qs, 0xE4, 64);
  put_fp16(b.d, 1.0f);
  put_fp16(b.dmin, 0.5f);
  auto y = dequant(kernels_scalar(), TensorType::Q2_K, &b, 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16, s = (i % 128) / 32;
    EXPECT_EQ(y[i], 1.0f * g * s - 0.5f * (15 - g)) << i;
  }
  EXPECT_EQ(y[40], -4.5f);   // g=2, code 1: 2*1 - 0.5*13
  EXPECT_EQ(y[255], 45.0f);  // g=15, code 3: 15*3 - 0
}

// Packs 16 six-bit Q3_K scale codes (0..63) as ggml lays them out.
void pack_q3k_scales(const int raw[16], uint8_t out[12]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 16; ++j) {
    out[j % 8] |= static_cast<uint8_t>((raw[j] & 15) << (4 * (j / 8)));
    out[8 + j % 4] |= static_cast<uint8_t>((raw[j] >> 4) << (2 * (j / 4)));
  }
}

TEST(QuantKnownVectors, Q3_K) {
  Q3_K b;
  int raw[16];
  for (int j = 0; j < 16; ++j) raw[j] = 20 + j * 3;  // 20..65 capped below
  raw[15] = 63;
  pack_q3k_scales(raw, b.scales);
  std::memset(b.qs, 0xE4, 64);  // low code = bit-pair index s, as in Q2_K
  std::memset(b.hmask, 0, 32);
  for (int l = 0; l < 32; ++l) b.hmask[l] = 0x01 | (l == 5 ? 0x80 : 0);  // elements 0..31 and 229
  put_fp16(b.d, 0.5f);
  auto y = dequant(kernels_scalar(), TensorType::Q3_K, &b, 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16, s = (i % 128) / 32;
    const bool high = i < 32 || i == 229;
    EXPECT_EQ(y[i], 0.5f * (raw[g] - 32) * (s - (high ? 0 : 4))) << i;
  }
  // Literal spot checks: element 33 is group 2 (raw 26 -> -6), code 1 without high bit -> -3.
  EXPECT_EQ(y[33], 0.5f * -6 * -3);
  // All-zero scale bytes mean every scale is -32.
  std::memset(b.scales, 0, 12);
  auto z = dequant(kernels_scalar(), TensorType::Q3_K, &b, 256);
  EXPECT_EQ(z[100], 0.5f * -32 * (3 - 4));
}

// Packs 8 six-bit scales and mins the Q4_K/Q5_K way (get_scale_min_k4 inverse).
void pack_q4k_scales(const int sc[8], const int mn[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

TEST(QuantKnownVectors, Q4_KScaleBits) {
  // Literal bytes: scale 0 = 0x41 & 63 = 1; scale 4 = low 4 bits from byte 8 (3) plus the top
  // two bits of byte 0 (01) as bits 4-5 = 19; min 5 = high nibble of byte 9 (2) plus top bits of
  // byte 5 (11) = 50. Other scales and mins are 0.
  Q4_K b{};
  const uint8_t scales[12] = {0x41, 0, 0, 0, 0, 0xC0, 0, 0, 0x03, 0x20, 0, 0};
  std::memcpy(b.scales, scales, 12);
  put_fp16(b.d, 1.0f);
  put_fp16(b.dmin, 1.0f);
  std::memset(b.qs, 0x21, 128);  // low nibble 1, high nibble 2
  auto y = dequant(kernels_scalar(), TensorType::Q4_K, &b, 256);
  EXPECT_EQ(y[0], 1.0f);      // sub-block 0: 1 * 1
  EXPECT_EQ(y[32], 0.0f);     // sub-block 1: scale 0
  EXPECT_EQ(y[128], 19.0f);   // sub-block 4: 19 * 1 (low nibble)
  EXPECT_EQ(y[160], -50.0f);  // sub-block 5: 0 * 2 - 50
}

TEST(QuantKnownVectors, Q4_K) {
  Q4_K b;
  const int sc[8] = {7, 14, 21, 28, 35, 42, 49, 56}, mn[8] = {63, 58, 53, 48, 43, 38, 33, 28};
  pack_q4k_scales(sc, mn, b.scales);
  put_fp16(b.d, 1.0f);
  put_fp16(b.dmin, 2.0f);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = static_cast<uint8_t>((l & 15) | ((15 - (l & 15)) << 4));
  auto y = dequant(kernels_scalar(), TensorType::Q4_K, &b, 256);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      // 64 elements per 32 bytes: low nibbles are sub-block 2c, high nibbles sub-block 2c+1.
      EXPECT_EQ(y[64 * c + l], 1.0f * sc[2 * c] * (l & 15) - 2.0f * mn[2 * c]);
      EXPECT_EQ(y[64 * c + 32 + l], 1.0f * sc[2 * c + 1] * (15 - (l & 15)) - 2.0f * mn[2 * c + 1]);
    }
}

TEST(QuantKnownVectors, Q5_K) {
  Q5_K b;
  const int sc[8] = {7, 14, 21, 28, 35, 42, 49, 56}, mn[8] = {63, 58, 53, 48, 43, 38, 33, 28};
  pack_q4k_scales(sc, mn, b.scales);
  put_fp16(b.d, 0.5f);
  put_fp16(b.dmin, 1.0f);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i & 15) | ((15 - (i & 15)) << 4));
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(l % 2 ? 0xA5 : 0x5A);
  auto y = dequant(kernels_scalar(), TensorType::Q5_K, &b, 256);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int qh = l % 2 ? 0xA5 : 0x5A;
      const int lo = (l & 15) | (((qh >> (2 * c)) & 1) << 4);             // bit 2c: sub-block 2c
      const int hi = (15 - (l & 15)) | (((qh >> (2 * c + 1)) & 1) << 4);  // bit 2c+1
      EXPECT_EQ(y[64 * c + l], 0.5f * sc[2 * c] * lo - 1.0f * mn[2 * c]);
      EXPECT_EQ(y[64 * c + 32 + l], 0.5f * sc[2 * c + 1] * hi - 1.0f * mn[2 * c + 1]);
    }
  EXPECT_EQ(y[1], 0.5f * 7 * (1 + 16) - 63.0f);  // qh[1] = 0xA5 has bit 0 set
}

TEST(QuantKnownVectors, Q6_K) {
  Q6_K b;
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g - 8);
  for (int i = 0; i < 128; ++i) b.ql[i] = static_cast<uint8_t>((i & 15) | ((i * 7 & 15) << 4));
  for (int i = 0; i < 64; ++i) b.qh[i] = static_cast<uint8_t>(0x1B ^ i);  // bit pairs 3,2,1,0
  put_fp16(b.d, 0.25f);
  auto y = dequant(kernels_scalar(), TensorType::Q6_K, &b, 256);
  for (int half = 0; half < 2; ++half)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* ql = b.ql + 64 * half;
      const int qh = b.qh[32 * half + l];
      const int base = 128 * half;
      const int q[4] = {(ql[l] & 15) | ((qh & 3) << 4), (ql[l + 32] & 15) | (((qh >> 2) & 3) << 4),
                        (ql[l] >> 4) | (((qh >> 4) & 3) << 4), (ql[l + 32] >> 4) | ((qh >> 6) << 4)};
      for (int k = 0; k < 4; ++k) {
        const int i = base + 32 * k + l;
        EXPECT_EQ(y[i], 0.25f * b.scales[i / 16] * (q[k] - 32)) << i;
      }
    }
  // Element 0: ql[0] low nibble 0, qh[0] = 0x1B bits 0-1 = 3 -> code 48 - 32 = 16, scale -8.
  EXPECT_EQ(y[0], 0.25f * -8 * 16);
}

TEST(QuantKnownVectors, Q8_0QuantizerRoundsHalfAwayFromZero) {
  float x[32] = {};
  x[0] = 127.0f;  // amax 127 -> d = 1, so codes equal the rounded inputs
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -126.5f;
  Q8_0 b;
  kernels_scalar().quantize_act[tid(TensorType::Q8_0)](x, &b, 32);
  uint16_t d;
  std::memcpy(&d, b.d, 2);
  EXPECT_EQ(d, 0x3C00);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 3);
  EXPECT_EQ(b.qs[2], -3);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(b.qs[4], -127);
  Q8_1 c;
  kernels_scalar().quantize_act[tid(TensorType::Q8_1)](x, &c, 32);
  uint16_t s;
  std::memcpy(&s, c.s, 2);
  EXPECT_EQ(fp16_to_fp32(s), 127.0f + 3 - 3 - 127);
  x[5] = 10.0f;
  kernels_scalar().quantize_act[tid(TensorType::Q8_1)](x, &c, 32);
  std::memcpy(&s, c.s, 2);
  EXPECT_EQ(fp16_to_fp32(s), 10.0f);
}

TEST(QuantKnownVectors, Q8_KQuantizer) {
  std::vector<float> x(256);
  for (int j = 0; j < 256; ++j) x[j] = (j % 50) * 0.04f - 1.0f;  // in [-1, 0.96]
  // Largest magnitude, positive: it maps to -127, so d is negative. 127/64 makes iscale = -64
  // exactly, so the products below are exact and the ties are real ties.
  x[77] = 127.0f / 64.0f;
  x[78] = 0.5f;          // -32 exactly
  x[79] = 2.5f / 64.0f;  // -2.5 -> ties to even: -2
  x[80] = 3.5f / 64.0f;  // -3.5 -> ties to even: -4
  Q8_K b;
  kernels_scalar().quantize_act[tid(TensorType::Q8_K)](x.data(), &b, 256);
  float d;
  std::memcpy(&d, b.d, 4);
  EXPECT_EQ(d, -1.0f / 64.0f);
  EXPECT_EQ(b.qs[77], -127);
  EXPECT_EQ(b.qs[78], -32);
  EXPECT_EQ(b.qs[79], -2);
  EXPECT_EQ(b.qs[80], -4);
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
    int16_t bs;
    std::memcpy(&bs, b.bsums + 2 * g, 2);
    EXPECT_EQ(bs, sum) << g;
  }
  std::vector<float> zeros(256, 0.0f);
  kernels_scalar().quantize_act[tid(TensorType::Q8_K)](zeros.data(), &b, 256);
  std::memcpy(&d, b.d, 4);
  EXPECT_EQ(d, 0.0f);
  for (int j = 0; j < 256; ++j) ASSERT_EQ(b.qs[j], 0);
}

TEST(QuantKnownVectors, DotOfHandBuiltQ4_0) {
  // w = d*(code-8) with d = 0.5; a = Q8_0 with d = 1 and codes 1 -> dot = 0.5 * sum(code-8).
  Q4_0 w;
  put_fp16(w.d, 0.5f);
  for (int j = 0; j < 16; ++j) w.qs[j] = static_cast<uint8_t>(j | (15 << 4));
  Q8_0 a;
  put_fp16(a.d, 1.0f);
  for (int j = 0; j < 32; ++j) a.qs[j] = static_cast<int8_t>(j < 16 ? 1 : 2);
  float out = 0;
  kernels_scalar().vec_dot[tid(TensorType::Q4_0)](32, &out, &w, &a);
  // low half: sum_{j<16} (j-8) = -8; high half: 16 * (15-8) * 2 = 224 -> 0.5 * 216 = 108
  EXPECT_EQ(out, 108.0f);
}

// ---- random operands --------------------------------------------------------------------------

std::vector<float> random_activations(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-2.0f, 2.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = val(rng);
  return x;
}

std::vector<uint8_t> quantize_act(const KernelTable& k, TensorType weight, const float* x, int64_t n) {
  std::vector<uint8_t> a(activation_row_bytes(weight, n));
  EXPECT_GT(a.size(), 0u);
  k.quantize_act[tid(dot_type(weight))](x, a.data(), n);
  return a;
}

// Sum of |w_i * a_i| in float64: the scale of the rounding error of any dot product.
double abs_dot(const std::vector<float>& w, const std::vector<float>& a) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += std::fabs(static_cast<double>(w[i]) * a[i]);
  return s;
}

std::vector<int64_t> test_lengths(TensorType t) {
  const int64_t bs = type_info(tid(t))->block_size;
  if (bs == 1) return {1, 7, 8, 15, 16, 31, 32, 33, 64, 100, 127, 128, 255, 1000, 4096};
  return {bs, 2 * bs, 3 * bs, 5 * bs, 8 * bs, 13 * bs, 32 * bs};
}

// ---- (a) scalar dot products against float64 ------------------------------------------------

TEST(QuantKernelsScalar, DotMatchesFloat64OfDequantized) {
  std::mt19937 rng(1234);
  const KernelTable& k = kernels_scalar();
  for (TensorType t : kWeightTypes) {
    for (int64_t n : test_lengths(t)) {
      SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n));
      auto w = random_weights(t, n, rng);
      auto x = random_activations(n, rng);
      auto a = quantize_act(k, t, x.data(), n);
      auto wf = dequant(k, t, w.data(), n);
      auto af = dequant(k, dot_type(t), a.data(), n);
      double ref = 0;
      for (int64_t i = 0; i < n; ++i) ref += static_cast<double>(wf[i]) * af[i];
      // Tolerance: dequantized values carry ~1-3 float roundings each (d*scale, *code, -min),
      // and the kernel rounds once per block product plus once per accumulation. With at most
      // 4096 terms accumulated sequentially the float32 bound is ~n*2^-24 relative to
      // sum|w*a|; blocks amortize that to (blocks + few) * 2^-24. 2e-5 covers 4096 floats
      // accumulated naively (4096 * 6e-8 = 2.4e-4 worst case, ~sqrt(n)*6e-8 in practice) only
      // for the quantized types, so the float types get the n-proportional bound.
      const double S = abs_dot(wf, af);
      const int64_t terms = n / type_info(tid(t))->block_size;
      double tol = (terms + 8) * 1.2e-7 * S + 1e-30;
      if (t == TensorType::Q4_1 || t == TensorType::Q5_1) {
        // The min term uses the activation's stored s = fp16(d*sum(q)) instead of d*sum(q):
        // one fp16 rounding (2^-11 relative, or 2^-25 absolute when subnormal) per block.
        const Q8_1* ab = reinterpret_cast<const Q8_1*>(a.data());
        const size_t wb = type_info(tid(t))->block_bytes;
        for (int64_t blk = 0; blk < n / 32; ++blk) {
          uint16_t m, s;
          std::memcpy(&m, w.data() + blk * wb + 2, 2);
          std::memcpy(&s, ab[blk].s, 2);
          tol += std::fabs(fp16_to_fp32(m)) * (std::fabs(fp16_to_fp32(s)) * 0x1p-11 + 0x1p-25);
        }
      }
      float out = 0;
      k.vec_dot[tid(t)](n, &out, w.data(), a.data());
      EXPECT_NEAR(out, ref, tol) << "S=" << S;
    }
  }
}

// A wrong kernel must be caught: corrupting one weight byte changes the result.
TEST(QuantKernelsScalar, DotIsSensitiveToEveryBlock) {
  std::mt19937 rng(99);
  const KernelTable& k = kernels_scalar();
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_K, TensorType::Q6_K}) {
    const int64_t n = 4 * type_info(tid(t))->block_size;
    auto w = random_weights(t, n, rng);
    auto x = random_activations(n, rng);
    auto a = quantize_act(k, t, x.data(), n);
    float before = 0, after = 0;
    k.vec_dot[tid(t)](n, &before, w.data(), a.data());
    w[w.size() - 20] ^= 0x11;  // a quant byte of the last block
    k.vec_dot[tid(t)](n, &after, w.data(), a.data());
    EXPECT_NE(before, after) << type_name(t);
  }
}

// ---- (b) SIMD tables against the scalar reference -------------------------------------------

std::vector<const KernelTable*> simd_tables() {
  std::vector<const KernelTable*> v;
  if (const KernelTable* t = kernels_avx2()) v.push_back(t);
  if (const KernelTable* t = kernels_avxvnni()) v.push_back(t);
  if (const KernelTable* t = kernels_avx512()) v.push_back(t);
  if (const KernelTable* t = kernels_amx()) v.push_back(t);
  if (const KernelTable* t = kernels_neon()) v.push_back(t);
  if (const KernelTable* t = kernels_dotprod()) v.push_back(t);
  if (const KernelTable* t = kernels_i8mm()) v.push_back(t);
  return v;
}

// Each table exists exactly where the CPU reports its instructions (under qemu: cortex-a53 ->
// neon; cortex-a76 -> neon, dotprod; max -> neon, dotprod, i8mm), and MOELITE_ISA's ranks cap
// the choice: the best table at or below the cap, never one above it.
TEST(QuantKernelsSimd, DispatchFollowsFeaturesAndCap) {
  const platform::CpuFeatures& f = platform::cpu_features();
#if defined(__aarch64__)
  ASSERT_NE(kernels_neon(), nullptr);
  EXPECT_EQ(kernels_dotprod() != nullptr, f.dotprod);
  EXPECT_EQ(kernels_i8mm() != nullptr, f.dotprod && f.i8mm);
  const char* best = f.i8mm && f.dotprod ? "i8mm" : f.dotprod ? "dotprod" : "neon";
  EXPECT_STREQ(kernels_capped(nullptr).isa, best);
  EXPECT_STREQ(kernels_capped("bogus").isa, best);
  EXPECT_STREQ(kernels_capped("i8mm").isa, best);
  EXPECT_STREQ(kernels_capped("dotprod").isa, f.dotprod ? "dotprod" : "neon");
  EXPECT_STREQ(kernels_capped("neon").isa, "neon");
#else
  EXPECT_EQ(kernels_neon(), nullptr);
  EXPECT_EQ(kernels_dotprod(), nullptr);
  EXPECT_EQ(kernels_i8mm(), nullptr);
#if defined(__x86_64__)
  EXPECT_EQ(kernels_avx2() != nullptr, f.avx2 && f.fma);
  EXPECT_EQ(kernels_avxvnni() != nullptr, f.avxvnni && kernels_avx2() != nullptr);
  // avxvnni sits between avx2 and avx512: capped there it is taken where the CPU has it.
  if (kernels_avxvnni()) EXPECT_STREQ(kernels_capped("avxvnni").isa, "avxvnni");
  else if (kernels_avx2()) EXPECT_STREQ(kernels_capped("avxvnni").isa, "avx2");
  if (kernels_avx2()) EXPECT_STREQ(kernels_capped("avx2").isa, "avx2");
  EXPECT_EQ(kernels_amx() != nullptr, f.amx_int8 && kernels_avx512() != nullptr);
  if (kernels_avx512()) EXPECT_STREQ(kernels_capped(nullptr).isa, kernels_amx() ? "amx" : "avx512");
  if (kernels_avx512()) EXPECT_STREQ(kernels_capped("avx512").isa, "avx512");
#else
  (void)f;
#endif
#endif
  EXPECT_STREQ(kernels_capped("scalar").isa, "scalar");
  const char* env = std::getenv("MOELITE_ISA");
  EXPECT_STREQ(kernels_best().isa, kernels_capped(env).isa);
  std::string names;
  for (const KernelTable* t : simd_tables()) names += std::string(" ") + t->isa;
  std::printf("CPU kernel tables:%s; kernels_best: %s\n", names.empty() ? " (none)" : names.c_str(), kernels_best().isa);
}

TEST(QuantKernelsSimd, TablesAreCompleteWhereScalarIs) {
  const KernelTable& s = kernels_scalar();
  for (const KernelTable* t : simd_tables()) {
    for (uint32_t i = 0; i < kTensorTypeIdLimit; ++i) {
      EXPECT_EQ(t->dequant[i] != nullptr, s.dequant[i] != nullptr) << t->isa << " " << i;
      EXPECT_EQ(t->quantize_act[i] != nullptr, s.quantize_act[i] != nullptr) << t->isa << " " << i;
      EXPECT_EQ(t->vec_dot[i] != nullptr, s.vec_dot[i] != nullptr) << t->isa << " " << i;
    }
  }
  const KernelTable& best = kernels_best();
  EXPECT_NE(best.vec_dot[tid(TensorType::Q4_K)], nullptr);
  std::printf("kernels_best: %s; SIMD tables on this CPU: %zu\n", best.isa, simd_tables().size());
}

TEST(QuantKernelsSimd, DotMatchesScalar) {
  const KernelTable& ref = kernels_scalar();
  for (const KernelTable* k : simd_tables()) {
    std::mt19937 rng(42);
    for (TensorType t : kWeightTypes) {
      for (int64_t n : test_lengths(t)) {
        SCOPED_TRACE(std::string(k->isa) + " " + type_name(t) + " n=" + std::to_string(n));
        auto w = random_weights(t, n, rng);
        auto x = random_activations(n, rng);
        auto a = quantize_act(ref, t, x.data(), n);
        float expect = 0, got = 0;
        ref.vec_dot[tid(t)](n, &expect, w.data(), a.data());
        k->vec_dot[tid(t)](n, &got, w.data(), a.data());
        // Integer sums are exact in both; only the order of float accumulation differs
        // (per-lane partial sums vs sequential): a few roundings of 2^-24 per term, bounded
        // by 1e-5 of sum|w*a| for these lengths.
        const double S = abs_dot(dequant(ref, t, w.data(), n), dequant(ref, dot_type(t), a.data(), n));
        EXPECT_NEAR(got, expect, 1e-5 * S + 1e-30);
      }
    }
  }
}

// Extreme codes: every quant byte 0x00, 0x7F, 0x80 or 0xFF against activations that quantize to
// all +127 or all -127 (or -127 for the Q8_K extreme element). This is where an int16
// saturation in maddubs, or the sign-transfer trick meeting -128, would show.
TEST(QuantKernelsSimd, DotWithExtremeCodes) {
  const KernelTable& ref = kernels_scalar();
  for (const KernelTable* k : simd_tables()) {
    for (TensorType t : kWeightTypes) {
      if (type_info(tid(t))->block_size == 1) continue;
      const int64_t n = 4 * type_info(tid(t))->block_size;
      for (uint8_t fill : {0x00, 0x7F, 0x80, 0xFF}) {
        for (float sign : {1.0f, -1.0f}) {
          std::mt19937 rng(fill);
          auto w = random_weights(t, n, rng);  // for the scale fields
          const TypeInfo* info = type_info(tid(t));
          const auto offsets = fp16_field_offsets(t);
          for (size_t i = 0; i < w.size(); ++i) {
            bool scale_byte = false;
            for (int off : offsets) {
              const size_t o = i % info->block_bytes;
              scale_byte |= o == static_cast<size_t>(off) || o == static_cast<size_t>(off) + 1;
            }
            scale_byte |= t == TensorType::MXFP4 && i % info->block_bytes == 0;  // its E8M0 byte
            if (!scale_byte) w[i] = fill;
          }
          std::vector<float> x(n, sign);
          auto a = quantize_act(ref, t, x.data(), n);
          float expect = 0, got = 0;
          ref.vec_dot[tid(t)](n, &expect, w.data(), a.data());
          k->vec_dot[tid(t)](n, &got, w.data(), a.data());
          const double S = abs_dot(dequant(ref, t, w.data(), n), dequant(ref, dot_type(t), a.data(), n));
          EXPECT_NEAR(got, expect, 1e-5 * S + 1e-30)
              << k->isa << " " << type_name(t) << " fill=" << int(fill) << " sign=" << sign;
        }
      }
    }
  }
}

// The avxvnni table forms the avx2 table's int32 lane sums with vpdpbusd instead of the sign
// trick, so its Q8_0, Q4_0 and MXFP4 products are the avx2 ones bit for bit: vec_dot, multi-dot and
// the prepared entry, on random codes and on every extreme weight byte (0x80 = -128 included).
TEST(QuantKernelsSimd, AvxVnniEqualsAvx2Bitwise) {
  const KernelTable* vnni = kernels_avxvnni();
  const KernelTable* avx2 = kernels_avx2();
  if (!vnni || !avx2) GTEST_SKIP() << "no AVX-VNNI on this CPU";
  const KernelTable& ref = kernels_scalar();
  std::mt19937 rng(11);
  for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::MXFP4}) {
    for (int64_t n : {32, 96, 256, 2048}) {
      for (int fill = -1; fill < 4; ++fill) {
        SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n) + " fill=" + std::to_string(fill));
        auto w = random_weights(t, n, rng);
        if (fill >= 0) {  // every code byte 0x00, 0x7F, 0x80 or 0xFF; scale bytes kept
          const uint8_t b = std::array<uint8_t, 4>{0x00, 0x7F, 0x80, 0xFF}[static_cast<size_t>(fill)];
          const size_t block = type_info(tid(t))->block_bytes, code0 = t == TensorType::MXFP4 ? 1 : 2;
          for (size_t i = 0; i < w.size(); ++i)
            if (i % block >= code0) w[i] = b;
        }
        std::vector<std::vector<uint8_t>> acts;
        for (int j = 0; j < kMultiDot; ++j) {
          auto x = random_activations(n, rng);
          if (j == 1) std::fill(x.begin(), x.end(), -1.0f);  // every code -127
          acts.push_back(quantize_act(ref, t, x.data(), n));
        }
        const size_t stride = acts[0].size();
        std::vector<uint8_t> packed;
        for (const auto& a : acts) packed.insert(packed.end(), a.begin(), a.end());
        for (int j = 0; j < kMultiDot; ++j) {
          float a2 = 0, v = 0;
          avx2->vec_dot[tid(t)](n, &a2, w.data(), acts[static_cast<size_t>(j)].data());
          vnni->vec_dot[tid(t)](n, &v, w.data(), acts[static_cast<size_t>(j)].data());
          EXPECT_EQ(std::memcmp(&a2, &v, 4), 0) << "vec_dot row " << j << ": " << a2 << " vs " << v;
        }
        float m2[kMultiDot], mv[kMultiDot];
        avx2->vec_dot_multi[tid(t)](n, m2, w.data(), packed.data(), stride, kMultiDot);
        vnni->vec_dot_multi[tid(t)](n, mv, w.data(), packed.data(), stride, kMultiDot);
        EXPECT_EQ(std::memcmp(m2, mv, sizeof(m2)), 0) << "multi-dot";
        // Prepared rows: each table prepares in its own layout (avxvnni's codes are biased).
        const PreparedTile& p2 = avx2->prepared[tid(t)];
        const PreparedTile& pv = vnni->prepared[tid(t)];
        ASSERT_TRUE(p2.tile && pv.tile);
        std::vector<uint8_t> prep2(p2.prepared_bytes(n) * kMultiDot), prepv(pv.prepared_bytes(n) * kMultiDot);
        for (int j = 0; j < kMultiDot; ++j) {
          p2.prepare(acts[static_cast<size_t>(j)].data(), n, prep2.data() + j * p2.prepared_bytes(n));
          pv.prepare(acts[static_cast<size_t>(j)].data(), n, prepv.data() + j * pv.prepared_bytes(n));
        }
        float t2[kMultiDot], tv[kMultiDot];
        p2.tile(n, t2, kMultiDot, w.data(), 0, prep2.data(), p2.prepared_bytes(n), kMultiDot);
        pv.tile(n, tv, kMultiDot, w.data(), 0, prepv.data(), pv.prepared_bytes(n), kMultiDot);
        EXPECT_EQ(std::memcmp(t2, tv, sizeof(t2)), 0) << "prepared";
        EXPECT_EQ(std::memcmp(t2, m2, sizeof(t2)), 0) << "prepared vs multi-dot";
      }
    }
  }
}

TEST(QuantKernelsScalar, DotTypesAndActivationSizes) {
  EXPECT_EQ(dot_type(TensorType::F16), TensorType::F32);
  EXPECT_EQ(dot_type(TensorType::BF16), TensorType::F32);
  EXPECT_EQ(dot_type(TensorType::Q4_0), TensorType::Q8_0);
  EXPECT_EQ(dot_type(TensorType::Q5_0), TensorType::Q8_0);
  EXPECT_EQ(dot_type(TensorType::Q4_1), TensorType::Q8_1);
  EXPECT_EQ(dot_type(TensorType::Q5_1), TensorType::Q8_1);
  EXPECT_EQ(dot_type(TensorType::Q6_K), TensorType::Q8_K);
  EXPECT_EQ(activation_row_bytes(TensorType::Q8_0, 64), 68u);
  EXPECT_EQ(activation_row_bytes(TensorType::Q4_1, 64), 72u);
  EXPECT_EQ(activation_row_bytes(TensorType::Q4_K, 512), 584u);
  EXPECT_EQ(activation_row_bytes(TensorType::F16, 10), 40u);
  EXPECT_EQ(activation_row_bytes(TensorType::Q4_K, 100), 0u);  // not a multiple of 256
}

// Unaligned rows: GGUF rows start at any even offset, activations anywhere in a buffer.
TEST(QuantKernelsSimd, DotOnUnalignedRows) {
  const KernelTable& ref = kernels_scalar();
  for (const KernelTable* k : simd_tables()) {
    std::mt19937 rng(7);
    for (TensorType t : kWeightTypes) {
      const int64_t n = 5 * type_info(tid(t))->block_size * (type_info(tid(t))->block_size == 1 ? 37 : 1);
      auto w = random_weights(t, n, rng);
      auto x = random_activations(n, rng);
      auto a = quantize_act(ref, t, x.data(), n);
      std::vector<uint8_t> wbuf(w.size() + 3), abuf(a.size() + 5);
      std::memcpy(wbuf.data() + 2, w.data(), w.size());
      std::memcpy(abuf.data() + 4, a.data(), a.size());  // Q8_K needs 4-byte alignment only for speed
      float expect = 0, got = 0;
      ref.vec_dot[tid(t)](n, &expect, w.data(), a.data());
      k->vec_dot[tid(t)](n, &got, wbuf.data() + 2, abuf.data() + 4);
      const double S = abs_dot(dequant(ref, t, w.data(), n), dequant(ref, dot_type(t), a.data(), n));
      EXPECT_NEAR(got, expect, 1e-5 * S + 1e-30) << k->isa << " " << type_name(t);
      if (type_info(tid(t))->block_size > 1) {
        // Odd offsets too for the byte-only layouts.
        std::vector<uint8_t> odd(w.size() + 1);
        std::memcpy(odd.data() + 1, w.data(), w.size());
        k->vec_dot[tid(t)](n, &got, odd.data() + 1, a.data());
        EXPECT_NEAR(got, expect, 1e-5 * S + 1e-30) << k->isa << " odd " << type_name(t);
      }
    }
  }
}

TEST(QuantKernelsSimd, DequantMatchesScalar) {
  const KernelTable& ref = kernels_scalar();
  for (const KernelTable* k : simd_tables()) {
    std::mt19937 rng(5);
    for (TensorType t : kWeightTypes) {
      for (int64_t n : test_lengths(t)) {
        SCOPED_TRACE(std::string(k->isa) + " " + type_name(t) + " n=" + std::to_string(n));
        auto w = random_weights(t, n, rng);
        auto expect = dequant(ref, t, w.data(), n);
        auto got = dequant(*k, t, w.data(), n);
        // Same float operations in the same order (no FMA contraction of d*q - m), so exact.
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], expect[i]) << i;
      }
    }
  }
}

TEST(QuantKernelsSimd, ActivationQuantizersMatchScalarBitExactly) {
  const KernelTable& ref = kernels_scalar();
  for (const KernelTable* k : simd_tables()) {
    std::mt19937 rng(11);
    for (TensorType dt : {TensorType::F32, TensorType::Q8_0, TensorType::Q8_1, TensorType::Q8_K}) {
      for (int64_t blocks : {1, 2, 3, 9}) {
        const int64_t n = blocks * (dt == TensorType::Q8_K ? 256 : 32);
        SCOPED_TRACE(std::string(k->isa) + " " + type_name(dt) + " n=" + std::to_string(n));
        auto x = random_activations(n, rng);
        // Exact ties in every block: with amax 127 (Q8_0/1) the scale is 1, so x.5 is a tie;
        // the SIMD rounding must reproduce roundf (away from zero) / nearbyint (to even).
        for (int64_t b = 0; b < n / 32; ++b) {
          x[32 * b] = 127.0f;
          for (int k = 0; k < 4; ++k) {  // one tie of each kind in every group of 8
            x[32 * b + 8 * k + 1] = 2.5f;
            x[32 * b + 8 * k + 2] = -3.5f;
            x[32 * b + 8 * k + 3] = 0.5f;
          }
        }
        if (blocks == 9) std::fill(x.begin(), x.begin() + 32 * (dt == TensorType::Q8_K ? 8 : 1), 0.0f);
        std::vector<uint8_t> expect(row_bytes(dt, n)), got(row_bytes(dt, n));
        ref.quantize_act[tid(dt)](x.data(), expect.data(), n);
        k->quantize_act[tid(dt)](x.data(), got.data(), n);
        EXPECT_EQ(0, std::memcmp(expect.data(), got.data(), expect.size()));
      }
    }
  }
}

// ---- (e) multi-row dot products ---------------------------------------------------------------

std::vector<const KernelTable*> all_tables() {
  std::vector<const KernelTable*> v{&kernels_scalar()};
  for (const KernelTable* t : simd_tables()) v.push_back(t);
  return v;
}

TEST(QuantKernelsMulti, PresentWhereverVecDotIs) {
  for (const KernelTable* t : all_tables())
    for (uint32_t i = 0; i < kTensorTypeIdLimit; ++i)
      EXPECT_EQ(t->vec_dot_multi[i] != nullptr, t->vec_dot[i] != nullptr) << t->isa << " " << i;
}

// Batched (prefill) and token-by-token (decode) evaluation must give bitwise-identical logits,
// so each table's multi-dot must reproduce its own vec_dot exactly, row by row: compared as bit
// patterns, not with a tolerance. Rows of the byte-only block layouts start at odd offsets with
// an odd stride (float rows keep their element alignment, which the scalar reference needs, but
// not 64-byte alignment), and the rows' activations differ, so mixed-up rows or lanes would show.
TEST(QuantKernelsMulti, BitIdenticalToVecDotOfSameTable) {
  for (const KernelTable* k : all_tables()) {
    std::mt19937 rng(7);
    for (TensorType t : kWeightTypes) {
      for (int64_t n : test_lengths(t)) {
        SCOPED_TRACE(std::string(k->isa) + " " + type_name(t) + " n=" + std::to_string(n));
        const bool floats = type_info(tid(t))->block_size == 1;
        const size_t off = floats ? 4 : 1;
        const auto w = random_weights(t, n, rng);
        std::vector<uint8_t> w_buf(w.size() + off);
        std::memcpy(w_buf.data() + off, w.data(), w.size());
        const size_t a_bytes = activation_row_bytes(t, n);
        const size_t stride = a_bytes + (floats ? 4 : 3);
        std::vector<uint8_t> a_buf(off + stride * kMultiDot);
        for (int j = 0; j < kMultiDot; ++j) {
          auto x = random_activations(n, rng);
          auto a = quantize_act(*k, t, x.data(), n);
          std::memcpy(a_buf.data() + off + j * stride, a.data(), a_bytes);
        }
        for (int count = 1; count <= kMultiDot; ++count) {
          float got[kMultiDot];
          for (float& g : got) g = -1234.5f;
          k->vec_dot_multi[tid(t)](n, got, w_buf.data() + off, a_buf.data() + off, stride, count);
          for (int j = 0; j < kMultiDot; ++j) {
            if (j >= count) {
              EXPECT_EQ(got[j], -1234.5f) << "wrote past count " << count;
              continue;
            }
            float expect = 0;
            k->vec_dot[tid(t)](n, &expect, w_buf.data() + off, a_buf.data() + off + j * stride);
            uint32_t eb, gb;
            std::memcpy(&eb, &expect, 4);
            std::memcpy(&gb, &got[j], 4);
            EXPECT_EQ(gb, eb) << "count " << count << " row " << j << ": " << got[j] << " vs " << expect;
          }
        }
      }
    }
  }
}

// ---- (f) two-weight-row tiles ------------------------------------------------------------------

// Tiles are optional, only where vec_dot is; the i8mm table has SMMLA tiles for every quantized
// type, the avx512 table one for Q8_0 (two weight rows per VNNI pass), and no other table has any
// (the drivers take the tile path only where a table has a real kernel).
TEST(QuantKernelsTile, PresentOnlyWhereExpected) {
  for (const KernelTable* t : all_tables())
    for (uint32_t i = 0; i < kTensorTypeIdLimit; ++i) {
      if (t->tile[i]) EXPECT_NE(t->vec_dot[i], nullptr) << t->isa << " " << i;
      // avx512's row tiles: the VNNI kernels of Q8_0 and Q4_0; the amx table keeps Q4_0's (its Q8_0
      // goes through the matrix tile, test_quant_matrix.cpp).
      const bool avx512_tiled =
          (std::strcmp(t->isa, "avx512") == 0 && (i == tid(TensorType::Q8_0) || i == tid(TensorType::Q4_0))) ||
          (std::strcmp(t->isa, "amx") == 0 && i == tid(TensorType::Q4_0));
      const bool may_have = std::strcmp(t->isa, "i8mm") == 0 || avx512_tiled;
      if (!may_have) EXPECT_EQ(t->tile[i], nullptr) << t->isa << " " << i;
      // Four-row tiles: only those avx512 kernels, and only beside a two-row one.
      if (t->tile4[i]) EXPECT_NE(t->tile[i], nullptr) << t->isa << " " << i;
      if (!avx512_tiled) EXPECT_EQ(t->tile4[i], nullptr) << t->isa << " " << i;
      // Prepared tiles: beside those avx512 kernels (four rows) and the avx2 and avxvnni
      // Q8_0/Q4_0/MXFP4 multi-dots (one row; avx512 keeps avx2's for MXFP4), a complete set of
      // entries, at a size the drivers group rows by: the table's own tile size for the type (1
      // where it has no tile).
      const PreparedTile& p = t->prepared[i];
      const bool avx2_like = std::strcmp(t->isa, "avx2") == 0 || std::strcmp(t->isa, "avxvnni") == 0;
      const bool avx2_prepared =
          (avx2_like && (i == tid(TensorType::Q8_0) || i == tid(TensorType::Q4_0))) ||
          ((avx2_like || std::strcmp(t->isa, "avx512") == 0 || std::strcmp(t->isa, "amx") == 0) &&
           i == tid(TensorType::MXFP4));
      if (p.tile) {
        EXPECT_TRUE(p.prepare && p.prepared_bytes) << t->isa << " " << i;
        const int own_step = t->tile4[i] ? kQuadRows : t->tile[i] ? kTileRows : 1;
        EXPECT_EQ(p.rows, own_step) << t->isa << " " << i;
      }
      if (!avx512_tiled && !avx2_prepared) EXPECT_EQ(p.tile, nullptr) << t->isa << " " << i;
      if (avx512_tiled || avx2_prepared) EXPECT_NE(p.tile, nullptr) << t->isa << " " << i;
    }
  if (const KernelTable* t = kernels_i8mm())
    for (TensorType type : kWeightTypes)
      EXPECT_EQ(t->tile[tid(type)] != nullptr, type_info(tid(type))->block_size > 1) << type_name(type);
}

// Checks `tile` against k's vec_dot bit for bit (every weight row x activation row of counts 1..4)
// and against the scalar reference within the SIMD tolerance. Weight rows start at an odd offset
// with an odd stride between them (as consecutive rows of a mapped file may), activation rows too;
// the output rows are out_stride = kMultiDot + 1 apart and nothing outside [r][0, count) is written.
// With `prepared`, the activation rows are first put through its prepare (into rows at an odd
// offset and stride) and the tile reads those, while vec_dot still reads the plain rows.
void check_tile(const KernelTable& k, TensorType t, VecDotTileFn tile, uint32_t seed, int tile_rows = kTileRows,
                const PreparedTile* prepared = nullptr) {
  const KernelTable& ref = kernels_scalar();
  std::mt19937 rng(seed);
  for (int64_t n : test_lengths(t)) {
    SCOPED_TRACE(std::string(k.isa) + " " + type_name(t) + " n=" + std::to_string(n) + " rows=" + std::to_string(tile_rows));
    const size_t off = 1, wb = row_bytes(t, n), w_stride = wb + 5;
    std::vector<uint8_t> w_buf(off + w_stride * tile_rows);
    std::vector<std::vector<float>> wf;
    for (int r = 0; r < tile_rows; ++r) {
      const auto w = random_weights(t, n, rng);
      std::memcpy(w_buf.data() + off + r * w_stride, w.data(), wb);
      wf.push_back(dequant(ref, t, w.data(), n));
    }
    const size_t a_bytes = activation_row_bytes(t, n), a_stride = a_bytes + 3;
    std::vector<uint8_t> a_buf(off + a_stride * kMultiDot);
    std::vector<std::vector<float>> af;
    for (int j = 0; j < kMultiDot; ++j) {
      auto x = random_activations(n, rng);
      auto a = quantize_act(k, t, x.data(), n);
      std::memcpy(a_buf.data() + off + j * a_stride, a.data(), a_bytes);
      af.push_back(dequant(ref, dot_type(t), a.data(), n));
    }
    const uint8_t* w0 = w_buf.data() + off;
    const uint8_t* a0 = a_buf.data() + off;
    std::vector<uint8_t> p_buf;
    const uint8_t* tile_a = a0;
    size_t tile_a_stride = a_stride;
    if (prepared) {
      tile_a_stride = prepared->prepared_bytes(n) + 7;
      p_buf.assign(off + tile_a_stride * kMultiDot, 0xA5);  // garbage around the rows
      for (int j = 0; j < kMultiDot; ++j) prepared->prepare(a0 + j * a_stride, n, p_buf.data() + off + j * tile_a_stride);
      tile_a = p_buf.data() + off;
    }
    constexpr size_t kOutStride = kMultiDot + 1;
    for (int count = 1; count <= kMultiDot; ++count) {
      float got[kQuadRows * kOutStride];
      for (float& g : got) g = -1234.5f;
      tile(n, got, kOutStride, w0, w_stride, tile_a, tile_a_stride, count);
      for (int r = 0; r < tile_rows; ++r)
        for (size_t j = 0; j < kOutStride; ++j) {
          const float g = got[r * kOutStride + j];
          if (j >= static_cast<size_t>(count)) {
            EXPECT_EQ(g, -1234.5f) << "wrote past count " << count << " in row " << r;
            continue;
          }
          const uint8_t* wr = w0 + r * w_stride;
          const uint8_t* aj = a0 + j * a_stride;
          float expect = 0, scalar = 0;
          k.vec_dot[tid(t)](n, &expect, wr, aj);
          uint32_t eb, gb;
          std::memcpy(&eb, &expect, 4);
          std::memcpy(&gb, &g, 4);
          EXPECT_EQ(gb, eb) << "count " << count << " w row " << r << " a row " << j << ": " << g << " vs " << expect;
          ref.vec_dot[tid(t)](n, &scalar, wr, aj);
          EXPECT_NEAR(g, scalar, 1e-5 * abs_dot(wf[r], af[j]) + 1e-30) << "count " << count << " w row " << r;
        }
    }
  }
}

TEST(QuantKernelsTile, BitIdenticalToVecDotOfSameTable) {
  int checked = 0;
  for (const KernelTable* k : all_tables())
    for (TensorType t : kWeightTypes) {
      if (VecDotTileFn tile = k->tile[tid(t)]) {
        check_tile(*k, t, tile, 11 + tid(t));
        ++checked;
      }
      if (VecDotTileFn tile4 = k->tile4[tid(t)]) {
        check_tile(*k, t, tile4, 31 + tid(t), kQuadRows);
        ++checked;
      }
      if (const PreparedTile& p = k->prepared[tid(t)]; p.tile) {
        check_tile(*k, t, p.tile, 51 + tid(t), p.rows, &p);
        ++checked;
      }
    }
  std::printf("tile kernels checked: %d\n", checked);
}

// The loop reference (vec_dot_tile_loop) through the same check, so the check itself (layout,
// strides, count handling) runs on every machine, tiles or not.
void scalar_dot_q4_k(int64_t n, float* out, const void* w, const void* a) {
  kernels_scalar().vec_dot[tid(TensorType::Q4_K)](n, out, w, a);
}
void scalar_dot_q8_0(int64_t n, float* out, const void* w, const void* a) {
  kernels_scalar().vec_dot[tid(TensorType::Q8_0)](n, out, w, a);
}
TEST(QuantKernelsTile, LoopReferenceMatchesVecDot) {
  check_tile(kernels_scalar(), TensorType::Q4_K, vec_dot_tile_loop<scalar_dot_q4_k>, 5);
  check_tile(kernels_scalar(), TensorType::Q8_0, vec_dot_tile_loop<scalar_dot_q8_0>, 6);
}


// ---- rows interleaved in groups of eight (interleaved_rows.h) ----------------------------------

// Where a table has a grouped layout: Q4_K in the 256- and 512-bit x86 tables, nowhere else, and
// its three entries always together.
TEST(QuantKernelsGroups, PresentOnlyWhereExpected) {
  for (const KernelTable* k : all_tables())
    for (uint32_t i = 0; i < kTensorTypeIdLimit; ++i) {
      const RowGroups& g = k->groups[i];
      const std::string isa = k->isa;
      const bool expected = (i == tid(TensorType::Q4_K) || i == tid(TensorType::Q5_K)) &&
                            (isa == "avx2" || isa == "avxvnni" || isa == "avx512" || isa == "amx");
      EXPECT_EQ(g.dot != nullptr, expected) << isa << " " << i;
      EXPECT_EQ(g.repack != nullptr, g.dot != nullptr) << isa << " " << i;
      EXPECT_EQ(g.group_bytes != nullptr, g.dot != nullptr) << isa << " " << i;
      // Only the amx table's group kernels (on tiles) take more tokens, and two groups, per call.
      const bool wide = isa == "amx" && expected;
      EXPECT_EQ(g.max_count, wide ? kGroupTokens : kMultiDot) << isa << " " << i;
      EXPECT_EQ(g.dot_pair != nullptr, wide) << isa << " " << i;
    }
}

// The types with a grouped layout, and the readable reference of each.
struct GroupedType {
  TensorType type;
  RowGroups layout;  // the readable layout functions: repack, group bytes, and the reference as `dot`
};
const GroupedType kGroupedTypes[] = {
    {TensorType::Q4_K, {repack_q4_k_group8, group_bytes_q4_k, dot_q4_k_group8_reference}},
    {TensorType::Q5_K, {repack_q5_k_group8, group_bytes_q5_k, dot_q5_k_group8_reference}}};

// Eight rows of random Q4_K / Q5_K blocks (or with every code byte `fill`: Q5_K's fifth bits too;
// d, dmin and scale bytes kept) and kGroupTokens activation rows (the most any group kernel takes),
// one of them all -127 (with codes 0xFF, the largest int16 sums the group kernels add up) and one
// all 127, an odd stride apart.
struct GroupCase {
  int64_t n;
  size_t row_bytes;
  std::vector<uint8_t> rows;  // kGroupRows rows, row_bytes apart
  std::vector<uint8_t> acts;  // kGroupTokens rows, act_stride apart
  size_t act_stride;
};
GroupCase make_group_case(TensorType t, int64_t n, int fill, std::mt19937& rng) {
  GroupCase c;
  c.n = n;
  c.row_bytes = row_bytes(t, n);
  for (int r = 0; r < kGroupRows; ++r) {
    std::vector<uint8_t> w = random_weights(t, n, rng);
    if (fill >= 0)
      for (size_t i = 0; i < w.size(); ++i)
        if (i % type_info(tid(t))->block_bytes >= 16)
          w[i] = static_cast<uint8_t>(fill);  // the codes, after d, dmin, scales
    c.rows.insert(c.rows.end(), w.begin(), w.end());
  }
  c.act_stride = activation_row_bytes(t, n) + 3;
  c.acts.assign(c.act_stride * kGroupTokens, 0);
  for (int j = 0; j < kGroupTokens; ++j) {
    std::vector<float> x = random_activations(n, rng);
    if (j == 2) std::fill(x.begin(), x.end(), -1.0f);
    if (j == 9) std::fill(x.begin(), x.end(), 1.0f);
    const std::vector<uint8_t> a = quantize_act(kernels_scalar(), t, x.data(), n);
    std::memcpy(c.acts.data() + j * c.act_stride, a.data(), a.size());
  }
  return c;
}

// The contract that keeps exact mode exact: each output of a group kernel is the bits of its
// table's vec_dot of that row, for every count the kernel takes (the amx Q4_K/Q5_K kernels: a
// group 1-5 tokens through the avx512 kernel and 6-16 on tiles, a pair 1-4 and 5-16), and the
// bits of the readable reference, which pins the layout and the float order independently of any
// SIMD code. Columns past the count stay unwritten.
TEST(QuantKernelsGroups, BitIdenticalToVecDotAndToReference) {
  int checked = 0;
  for (const KernelTable* k : all_tables()) {
    for (const GroupedType& type : kGroupedTypes) {
      const TensorType t = type.type;
      const RowGroups& g = k->groups[tid(t)];
      if (!g.dot) continue;
      std::mt19937 rng(23);
      for (int64_t n : {256, 512, 2048}) {
        for (int fill : {-1, 0x00, 0xFF, 0x0F, 0xF0}) {
          SCOPED_TRACE(std::string(k->isa) + " " + type_name(t) + " n=" + std::to_string(n) +
                       " fill=" + std::to_string(fill));
          const GroupCase c = make_group_case(t, n, fill, rng);
          std::vector<uint8_t> group(g.group_bytes(n) + 1);
          g.repack(c.rows.data(), c.row_bytes, n, group.data() + 1);  // at an odd address
          for (int count = 1; count <= g.max_count; ++count) {
            float got[kGroupRows][kGroupTokens], ref[kGroupRows][kGroupTokens];
            std::fill(&got[0][0], &got[0][0] + kGroupRows * kGroupTokens, -7.0f);
            g.dot(n, got[0], kGroupTokens, group.data() + 1, 0, c.acts.data(), c.act_stride, count);
            type.layout.dot(n, ref[0], kGroupTokens, group.data() + 1, 0, c.acts.data(), c.act_stride, count);
            for (int r = 0; r < kGroupRows; ++r)
              for (int j = count; j < kGroupTokens; ++j) EXPECT_EQ(got[r][j], -7.0f) << "row " << r << " column " << j;
            for (int r = 0; r < kGroupRows; ++r)
              for (int j = 0; j < count; ++j) {
                float row = 0;
                k->vec_dot[tid(t)](n, &row, c.rows.data() + r * c.row_bytes, c.acts.data() + j * c.act_stride);
                EXPECT_EQ(std::memcmp(&got[r][j], &row, 4), 0)
                    << "row " << r << " act " << j << " count " << count << ": " << got[r][j] << " vs vec_dot " << row;
                EXPECT_EQ(std::memcmp(&got[r][j], &ref[r][j], 4), 0)
                    << "row " << r << " act " << j << ": " << got[r][j] << " vs reference " << ref[r][j];
              }
          }
          ++checked;
          if (!g.dot_pair) continue;
          // Two adjacent groups per call (the amx table): the second group's rows from another
          // case, the pair at an odd address with the groups group_bytes apart. Out rows 0-7 are
          // the first group's, 8-15 the second's, each the bits of vec_dot and of the reference.
          const GroupCase c2 = make_group_case(t, n, fill, rng);
          const size_t gb = g.group_bytes(n);
          std::vector<uint8_t> pair(2 * gb + 1);
          g.repack(c.rows.data(), c.row_bytes, n, pair.data() + 1);
          g.repack(c2.rows.data(), c2.row_bytes, n, pair.data() + 1 + gb);
          for (int count = 1; count <= g.max_count; ++count) {
            float got[2 * kGroupRows][kGroupTokens], ref[2 * kGroupRows][kGroupTokens];
            std::fill(&got[0][0], &got[0][0] + 2 * kGroupRows * kGroupTokens, -7.0f);
            g.dot_pair(n, got[0], kGroupTokens, pair.data() + 1, gb, c.acts.data(), c.act_stride, count);
            type.layout.dot(n, ref[0], kGroupTokens, pair.data() + 1, 0, c.acts.data(), c.act_stride, count);
            type.layout.dot(n, ref[kGroupRows], kGroupTokens, pair.data() + 1 + gb, 0, c.acts.data(), c.act_stride,
                            count);
            for (int r = 0; r < 2 * kGroupRows; ++r) {
              const uint8_t* w = r < kGroupRows ? c.rows.data() + r * c.row_bytes
                                                : c2.rows.data() + (r - kGroupRows) * c2.row_bytes;
              for (int j = count; j < kGroupTokens; ++j) EXPECT_EQ(got[r][j], -7.0f) << "pair row " << r << " column " << j;
              for (int j = 0; j < count; ++j) {
                float row = 0;
                k->vec_dot[tid(t)](n, &row, w, c.acts.data() + j * c.act_stride);
                EXPECT_EQ(std::memcmp(&got[r][j], &row, 4), 0)
                    << "pair row " << r << " act " << j << " count " << count << ": " << got[r][j] << " vs " << row;
                EXPECT_EQ(std::memcmp(&got[r][j], &ref[r][j], 4), 0) << "pair row " << r << " act " << j;
              }
            }
          }
          ++checked;
        }
      }
    }
  }
  std::printf("group cases checked: %d\n", checked);
}

// The references themselves against the scalar table's dot (a different float order, so within
// the tolerance of DotMatchesScalar), on every machine: a layout or repacking slip shows here
// whether or not this CPU has a group kernel.
TEST(QuantKernelsGroups, ReferenceMatchesScalarDot) {
  std::mt19937 rng(29);
  const KernelTable& ref = kernels_scalar();
  for (const GroupedType& type : kGroupedTypes) {
    const TensorType t = type.type;
    for (int64_t n : {256, 1024}) {
      for (int fill : {-1, 0xFF, 0x0F}) {
        const GroupCase c = make_group_case(t, n, fill, rng);
        std::vector<uint8_t> group(type.layout.group_bytes(n));
        type.layout.repack(c.rows.data(), c.row_bytes, n, group.data());
        float got[kGroupRows][kMultiDot];
        type.layout.dot(n, got[0], kMultiDot, group.data(), 0, c.acts.data(), c.act_stride, kMultiDot);
        for (int r = 0; r < kGroupRows; ++r)
          for (int j = 0; j < kMultiDot; ++j) {
            const uint8_t* w = c.rows.data() + r * c.row_bytes;
            const uint8_t* a = c.acts.data() + j * c.act_stride;
            float expect = 0;
            ref.vec_dot[tid(t)](n, &expect, w, a);
            const double S = abs_dot(dequant(ref, t, w, n), dequant(ref, TensorType::Q8_K, a, n));
            EXPECT_NEAR(got[r][j], expect, 1e-5 * S + 1e-30)
                << type_name(t) << " n=" << n << " fill=" << fill << " row " << r << " act " << j;
          }
      }
    }
  }
}

}  // namespace
}  // namespace moelite::cpu
