// The readable reference for every weight type: fp16/bf16 conversions, the per-block unpacking of
// integer codes, and scalar dequantization. Shared by core (dequantizing norms, embeddings and
// routers on the host) and by every backend's kernels and tests, as ggml-base owns ggml-quants.
#include "base/quant_ref.h"

#include <cstring>

namespace moelite {

using namespace blocks;

// ---- fp16 / bf16 ---------------------------------------------------------------------------

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float (mant < 2^10).
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;  // NaN -> quiet NaN
  // 65520 is the midpoint between 65504 (max half, odd mantissa) and 65536: ties-to-even
  // rounds it (and everything above) to infinity.
  if (abs >= 0x477ff000u) return sign | 0x7c00;
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): count in units of 2^-24. 2^-25 exactly ties to 0.
    if (abs <= 0x33000000u) return sign;
    const uint32_t e = abs >> 23;  // 102..112
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;  // may carry into the min normal: fine
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t e = (abs >> 23) - 112;  // 1..30
  const uint32_t m = abs & 0x7fffffu;
  uint32_t r = (e << 10) | (m >> 13);
  const uint32_t rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;  // a carry bumps the exponent: correct
  return static_cast<uint16_t>(sign | r);
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float load_fp16(const uint8_t p[2]) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}
void store_fp16(uint8_t p[2], float f) {
  const uint16_t h = fp32_to_fp16(f);
  std::memcpy(p, &h, 2);
}
float q8k_d(const Q8_K& b) {
  float d;
  std::memcpy(&d, b.d, 4);
  return d;
}
int q8k_bsum(const Q8_K& b, int g) {
  int16_t s;
  std::memcpy(&s, b.bsums + 2 * g, 2);
  return s;
}

void unpack_scales_q4k(const uint8_t q[12], uint8_t sc[8], uint8_t mn[8]) {
  // Bytes 0..3: low 6 bits = scale 0..3, top 2 bits = high bits of scale 4..7.
  // Bytes 4..7: low 6 bits = min 0..3,   top 2 bits = high bits of min 4..7.
  // Bytes 8..11: low nibble = low 4 bits of scale 4..7, high nibble = of min 4..7.
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((q[j + 8] & 0x0f) | ((q[j] >> 6) << 4));
    mn[j + 4] = static_cast<uint8_t>((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
  }
}

void unpack_scales_q3k(const uint8_t q[12], int8_t sc[16]) {
  // Bytes 0..7 hold the low 4 bits: scale j in byte j%8, low nibble for j<8, high for j>=8.
  // Bytes 8..11 hold the high 2 bits: scale j in byte 8 + j%4, bit pair j/4.
  for (int j = 0; j < 16; ++j) {
    const int low = (q[j % 8] >> (4 * (j / 8))) & 0x0f;
    const int high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// ---- per-block unpacking into integer codes -------------------------------------------------
// Each returns the codes of one block in element order, so dequant and dot share them.

void codes_q4_0(const Q4_0& b, int8_t q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((b.qs[j] & 0x0f) - 8);
    q[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - 8);
  }
}
void codes_mxfp4(const MXFP4& b, int8_t q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = kMxfp4Values[b.qs[j] & 0x0f];
    q[j + 16] = kMxfp4Values[b.qs[j] >> 4];
  }
}
void codes_q4_1(const Q4_1& b, int q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = b.qs[j] & 0x0f;
    q[j + 16] = b.qs[j] >> 4;
  }
}
uint32_t load_u32(const uint8_t p[4]) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian hosts only, as GGUF itself
}
// Unsigned 5-bit codes 0..31 of Q5_0/Q5_1: low nibbles as Q4, bit j of qh is bit 4 of element j.
void codes_q5(const uint8_t qs[16], const uint8_t qh_bytes[4], int q[32]) {
  const uint32_t qh = load_u32(qh_bytes);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
  }
}

// Q2_K: 16 groups of 16; code = 2 bits; group scale/min = low/high nibble of scales[g].
// Element order: 128-element halves; in each, 4 shifts x 32 bytes (shift s covers 32 elements).
void codes_q2_k(const Q2_K& b, uint8_t q[256]) {
  for (int half = 0; half < 2; ++half)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) q[128 * half + 32 * s + l] = (b.qs[32 * half + l] >> (2 * s)) & 3;
}
// Q3_K: signed codes -4..3 = 2 low bits from qs (layout as Q2_K) minus 4 when the hmask bit is 0.
// hmask bit k of byte l belongs to element 32*k + l.
void codes_q3_k(const Q3_K& b, int8_t q[256]) {
  for (int half = 0; half < 2; ++half)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int i = 128 * half + 32 * s + l;
        const int low = (b.qs[32 * half + l] >> (2 * s)) & 3;
        const bool high = (b.hmask[l] >> (i / 32)) & 1;
        q[i] = static_cast<int8_t>(low - (high ? 0 : 4));
      }
}
// Q4_K: 8 sub-blocks of 32; per 64 elements, 32 bytes: low nibbles first, then high nibbles.
void codes_q4_k(const Q4_K& b, uint8_t q[256]) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = b.qs[32 * c + l] & 0x0f;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
}
// Q5_K: Q4_K's nibbles plus a 5th bit: qh bit (2c) of byte l for element 64c+l, bit (2c+1) for
// element 64c+32+l.
void codes_q5_k(const Q5_K& b, uint8_t q[256]) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = static_cast<uint8_t>((b.qs[32 * c + l] & 0x0f) | (((b.qh[l] >> (2 * c)) & 1) << 4));
      q[64 * c + 32 + l] = static_cast<uint8_t>((b.qs[32 * c + l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4));
    }
}
// Q6_K: signed codes -32..31. Per 128-element half h (ql += 64h, qh += 32h), for l < 32:
//   element l      : ql[l]    low nibble,  qh[l] bits 0-1
//   element l + 32 : ql[l+32] low nibble,  qh[l] bits 2-3
//   element l + 64 : ql[l]    high nibble, qh[l] bits 4-5
//   element l + 96 : ql[l+32] high nibble, qh[l] bits 6-7
void codes_q6_k(const Q6_K& b, int8_t q[256]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* out = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<int8_t>(((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
      out[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

// ---- dequantization -------------------------------------------------------------------------

void dequant_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, n * sizeof(float)); }
void dequant_f16(const void* src, float* y, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) y[i] = load_fp16(p + 2 * i);
}
void dequant_bf16(const void* src, float* y, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = bf16_to_fp32(h);
  }
}
void dequant_q4_0(const void* src, float* y, int64_t n) {
  const Q4_0* b = static_cast<const Q4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    int8_t q[32];
    codes_q4_0(b[i], q);
    const float d = load_fp16(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = q[j] * d;
  }
}
void dequant_mxfp4(const void* src, float* y, int64_t n) {
  const MXFP4* b = static_cast<const MXFP4*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    int8_t q[32];
    codes_mxfp4(b[i], q);
    const float d = mxfp4_half_scale(b[i].e);
    for (int j = 0; j < 32; ++j) y[j] = q[j] * d;
  }
}
void dequant_q4_1(const void* src, float* y, int64_t n) {
  const Q4_1* b = static_cast<const Q4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    int q[32];
    codes_q4_1(b[i], q);
    const float d = load_fp16(b[i].d), m = load_fp16(b[i].m);
    for (int j = 0; j < 32; ++j) y[j] = q[j] * d + m;
  }
}
void dequant_q5_0(const void* src, float* y, int64_t n) {
  const Q5_0* b = static_cast<const Q5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    int q[32];
    codes_q5(b[i].qs, b[i].qh, q);
    const float d = load_fp16(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = (q[j] - 16) * d;
  }
}
void dequant_q5_1(const void* src, float* y, int64_t n) {
  const Q5_1* b = static_cast<const Q5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    int q[32];
    codes_q5(b[i].qs, b[i].qh, q);
    const float d = load_fp16(b[i].d), m = load_fp16(b[i].m);
    for (int j = 0; j < 32; ++j) y[j] = q[j] * d + m;
  }
}
void dequant_q8_0(const void* src, float* y, int64_t n) {
  const Q8_0* b = static_cast<const Q8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = load_fp16(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = b[i].qs[j] * d;
  }
}
void dequant_q2_k(const void* src, float* y, int64_t n) {
  const Q2_K* b = static_cast<const Q2_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    uint8_t q[256];
    codes_q2_k(b[i], q);
    const float d = load_fp16(b[i].d), dmin = load_fp16(b[i].dmin);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * (b[i].scales[g] & 0x0f), ml = dmin * (b[i].scales[g] >> 4);
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * q[16 * g + l] - ml;
    }
  }
}
void dequant_q3_k(const void* src, float* y, int64_t n) {
  const Q3_K* b = static_cast<const Q3_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    int8_t q[256], sc[16];
    codes_q3_k(b[i], q);
    unpack_scales_q3k(b[i].scales, sc);
    const float d = load_fp16(b[i].d);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * sc[g];
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * q[16 * g + l];
    }
  }
}
// Q4_K and Q5_K differ only in how a block's codes are stored.
template <typename Block, void (*Codes)(const Block&, uint8_t*)>
void dequant_q45_k(const void* src, float* y, int64_t n) {
  const Block* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    uint8_t q[256], sc[8], mn[8];
    Codes(b[i], q);
    unpack_scales_q4k(b[i].scales, sc, mn);
    const float d = load_fp16(b[i].d), dmin = load_fp16(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      const float dl = d * sc[s], ml = dmin * mn[s];
      for (int l = 0; l < 32; ++l) y[32 * s + l] = dl * q[32 * s + l] - ml;
    }
  }
}
void dequant_q6_k(const void* src, float* y, int64_t n) {
  const Q6_K* b = static_cast<const Q6_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    int8_t q[256];
    codes_q6_k(b[i], q);
    const float d = load_fp16(b[i].d);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * b[i].scales[g];
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * q[16 * g + l];
    }
  }
}
void dequant_q8_k(const void* src, float* y, int64_t n) {
  const Q8_K* b = static_cast<const Q8_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = q8k_d(b[i]);
    for (int j = 0; j < 256; ++j) y[j] = b[i].qs[j] * d;
  }
}
void dequant_q8_1(const void* src, float* y, int64_t n) {
  const Q8_1* b = static_cast<const Q8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = load_fp16(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = b[i].qs[j] * d;
  }
}

DequantRowFn dequant_row_fn(TensorType t) {
  switch (t) {
    case TensorType::F32: return dequant_f32;
    case TensorType::F16: return dequant_f16;
    case TensorType::BF16: return dequant_bf16;
    case TensorType::Q4_0: return dequant_q4_0;
    case TensorType::Q4_1: return dequant_q4_1;
    case TensorType::Q5_0: return dequant_q5_0;
    case TensorType::Q5_1: return dequant_q5_1;
    case TensorType::Q8_0: return dequant_q8_0;
    case TensorType::Q2_K: return dequant_q2_k;
    case TensorType::Q3_K: return dequant_q3_k;
    case TensorType::Q4_K: return dequant_q45_k<Q4_K, codes_q4_k>;
    case TensorType::Q5_K: return dequant_q45_k<Q5_K, codes_q5_k>;
    case TensorType::Q6_K: return dequant_q6_k;
    case TensorType::Q8_K: return dequant_q8_k;
    case TensorType::Q8_1: return dequant_q8_1;
    case TensorType::MXFP4: return dequant_mxfp4;
    default: return nullptr;
  }
}

}  // namespace moelite
