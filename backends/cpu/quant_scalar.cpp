// Scalar reference kernels. Written for clarity, not speed: every SIMD table is tested against
// this file, and this file is tested against hand-computed vectors and float64 dot products.
//
// The dot products work in integers per (sub-)block exactly as the format intends (weights'
// integer codes times activation int8s), then apply the float scales. That is what every SIMD
// kernel does as well, so the only difference between tables is float accumulation order.
#include <cmath>
#include <cstring>

#include "backends/cpu/quant.h"
#include "base/quant_ref.h"

namespace moelite::cpu {

using namespace blocks;

namespace {

// ---- activation quantizers (same arithmetic as ggml's *_ref quantizers) ---------------------

void quantize_f32(const float* x, void* dst, int64_t n) { std::memcpy(dst, x, n * sizeof(float)); }

// Shared by Q8_0 and Q8_1: d = amax / 127, q = round-half-away(x / d). Returns d and sum(q).
float quantize_block_q8(const float* x, int8_t qs[32], int* sum) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int s = 0;
  for (int j = 0; j < 32; ++j) {
    qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    s += qs[j];
  }
  *sum = s;
  return d;
}
void quantize_q8_0(const float* x, void* dst, int64_t n) {
  Q8_0* b = static_cast<Q8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int sum;
    store_fp16(b[i].d, quantize_block_q8(x, b[i].qs, &sum));
  }
}
void quantize_q8_1(const float* x, void* dst, int64_t n) {
  Q8_1* b = static_cast<Q8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int sum;
    const float d = quantize_block_q8(x, b[i].qs, &sum);
    store_fp16(b[i].d, d);
    store_fp16(b[i].s, sum * d);
  }
}
// Q8_K: the scale maps the element of largest magnitude to -127 exactly (sign included), and
// rounding is to nearest even (ggml's nearest_int); d = 1/iscale is kept in full f32.
void quantize_q8_k(const float* x, void* dst, int64_t n) {
  Q8_K* b = static_cast<Q8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    float d = 0.0f;
    if (amax == 0.0f) {
      std::memset(b[i].qs, 0, 256);
    } else {
      const float iscale = -127.0f / max;
      for (int j = 0; j < 256; ++j) {
        const int v = static_cast<int>(std::nearbyintf(iscale * x[j]));  // default mode: RNE
        b[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
      }
      d = 1.0f / iscale;
    }
    std::memcpy(b[i].d, &d, 4);
    for (int g = 0; g < 16; ++g) {
      int16_t s = 0;
      for (int l = 0; l < 16; ++l) s = static_cast<int16_t>(s + b[i].qs[16 * g + l]);
      std::memcpy(b[i].bsums + 2 * g, &s, 2);
    }
  }
}

// ---- dot products ---------------------------------------------------------------------------

void dot_f32(int64_t n, float* out, const void* w, const void* a) {
  // Weights through memcpy: a row may sit at any offset of a mapped file.
  const uint8_t* x = static_cast<const uint8_t*>(w);
  const float* y = static_cast<const float*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, x + 4 * i, 4);
    s += v * y[i];
  }
  *out = s;
}
void dot_f16(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  const float* y = static_cast<const float*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += load_fp16(x + 2 * i) * y[i];
  *out = s;
}
void dot_bf16(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  const float* y = static_cast<const float*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, x + 2 * i, 2);
    s += bf16_to_fp32(h) * y[i];
  }
  *out = s;
}

template <typename Code>
int int_dot(const Code* q, const int8_t* a, int len) {
  int s = 0;
  for (int j = 0; j < len; ++j) s += static_cast<int>(q[j]) * a[j];
  return s;
}

void dot_q4_0(int64_t n, float* out, const void* w, const void* a) {
  const Q4_0* x = static_cast<const Q4_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[32];
    codes_q4_0(x[i], q);
    s += load_fp16(x[i].d) * load_fp16(y[i].d) * int_dot(q, y[i].qs, 32);
  }
  *out = s;
}
// MXFP4 against Q8_0 activations: the block's integer values (doubled E2M1) times the int8 codes,
// then the two scales.
void dot_mxfp4(int64_t n, float* out, const void* w, const void* a) {
  const MXFP4* x = static_cast<const MXFP4*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8_t q[32];
    codes_mxfp4(x[i], q);
    s += mxfp4_half_scale(x[i].e) * load_fp16(y[i].d) * int_dot(q, y[i].qs, 32);
  }
  *out = s;
}
// Q4_1/Q5_1: sum (d*q + m) * (da*a) = d*da*sum(q*a) + m * (da*sum(a)); the last factor is the
// activation block's stored s.
void dot_q4_1(int64_t n, float* out, const void* w, const void* a) {
  const Q4_1* x = static_cast<const Q4_1*>(w);
  const Q8_1* y = static_cast<const Q8_1*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int q[32];
    codes_q4_1(x[i], q);
    s += load_fp16(x[i].d) * load_fp16(y[i].d) * int_dot(q, y[i].qs, 32) + load_fp16(x[i].m) * load_fp16(y[i].s);
  }
  *out = s;
}
void dot_q5_0(int64_t n, float* out, const void* w, const void* a) {
  const Q5_0* x = static_cast<const Q5_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int q[32];
    codes_q5(x[i].qs, x[i].qh, q);
    for (int& v : q) v -= 16;
    s += load_fp16(x[i].d) * load_fp16(y[i].d) * int_dot(q, y[i].qs, 32);
  }
  *out = s;
}
void dot_q5_1(int64_t n, float* out, const void* w, const void* a) {
  const Q5_1* x = static_cast<const Q5_1*>(w);
  const Q8_1* y = static_cast<const Q8_1*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int q[32];
    codes_q5(x[i].qs, x[i].qh, q);
    s += load_fp16(x[i].d) * load_fp16(y[i].d) * int_dot(q, y[i].qs, 32) + load_fp16(x[i].m) * load_fp16(y[i].s);
  }
  *out = s;
}
void dot_q8_0(int64_t n, float* out, const void* w, const void* a) {
  const Q8_0* x = static_cast<const Q8_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) s += load_fp16(x[i].d) * load_fp16(y[i].d) * int_dot(x[i].qs, y[i].qs, 32);
  *out = s;
}

// K-quants: per super-block, d*da*sum_g(scale_g * sum(q*a)) - dmin*da*sum_g(min_g * sum_g(a)),
// with sum_g(a) taken from the activation's bsums.
void dot_q2_k(int64_t n, float* out, const void* w, const void* a) {
  const Q2_K* x = static_cast<const Q2_K*>(w);
  const Q8_K* y = static_cast<const Q8_K*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint8_t q[256];
    codes_q2_k(x[i], q);
    int scaled = 0, mins = 0;
    for (int g = 0; g < 16; ++g) {
      scaled += (x[i].scales[g] & 0x0f) * int_dot(q + 16 * g, y[i].qs + 16 * g, 16);
      mins += (x[i].scales[g] >> 4) * q8k_bsum(y[i], g);
    }
    const float da = q8k_d(y[i]);
    s += load_fp16(x[i].d) * da * scaled - load_fp16(x[i].dmin) * da * mins;
  }
  *out = s;
}
void dot_q3_k(int64_t n, float* out, const void* w, const void* a) {
  const Q3_K* x = static_cast<const Q3_K*>(w);
  const Q8_K* y = static_cast<const Q8_K*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int8_t q[256], sc[16];
    codes_q3_k(x[i], q);
    unpack_scales_q3k(x[i].scales, sc);
    int scaled = 0;
    for (int g = 0; g < 16; ++g) scaled += sc[g] * int_dot(q + 16 * g, y[i].qs + 16 * g, 16);
    s += load_fp16(x[i].d) * q8k_d(y[i]) * scaled;
  }
  *out = s;
}
template <typename Block, void (*Codes)(const Block&, uint8_t*)>
void dot_q45_k(int64_t n, float* out, const void* w, const void* a) {
  const Block* x = static_cast<const Block*>(w);
  const Q8_K* y = static_cast<const Q8_K*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint8_t q[256], sc[8], mn[8];
    Codes(x[i], q);
    unpack_scales_q4k(x[i].scales, sc, mn);
    int scaled = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      scaled += sc[j] * int_dot(q + 32 * j, y[i].qs + 32 * j, 32);
      mins += mn[j] * (q8k_bsum(y[i], 2 * j) + q8k_bsum(y[i], 2 * j + 1));
    }
    const float da = q8k_d(y[i]);
    s += load_fp16(x[i].d) * da * scaled - load_fp16(x[i].dmin) * da * mins;
  }
  *out = s;
}
void dot_q6_k(int64_t n, float* out, const void* w, const void* a) {
  const Q6_K* x = static_cast<const Q6_K*>(w);
  const Q8_K* y = static_cast<const Q8_K*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int8_t q[256];
    codes_q6_k(x[i], q);
    int scaled = 0;
    for (int g = 0; g < 16; ++g) scaled += x[i].scales[g] * int_dot(q + 16 * g, y[i].qs + 16 * g, 16);
    s += load_fp16(x[i].d) * q8k_d(y[i]) * scaled;
  }
  *out = s;
}

constexpr uint32_t id(TensorType t) { return static_cast<uint32_t>(t); }

KernelTable make_scalar_table() {
  KernelTable t{};
  t.isa = "scalar";
  for (uint32_t i = 0; i < kTensorTypeIdLimit; ++i) t.dequant[i] = dequant_row_fn(static_cast<TensorType>(i));

  t.quantize_act[id(TensorType::F32)] = quantize_f32;
  t.quantize_act[id(TensorType::Q8_0)] = quantize_q8_0;
  t.quantize_act[id(TensorType::Q8_1)] = quantize_q8_1;
  t.quantize_act[id(TensorType::Q8_K)] = quantize_q8_k;

  set_vec_dot<dot_f32>(t, TensorType::F32);
  set_vec_dot<dot_f16>(t, TensorType::F16);
  set_vec_dot<dot_bf16>(t, TensorType::BF16);
  set_vec_dot<dot_q4_0>(t, TensorType::Q4_0);
  set_vec_dot<dot_q4_1>(t, TensorType::Q4_1);
  set_vec_dot<dot_q5_0>(t, TensorType::Q5_0);
  set_vec_dot<dot_q5_1>(t, TensorType::Q5_1);
  set_vec_dot<dot_q8_0>(t, TensorType::Q8_0);
  set_vec_dot<dot_q2_k>(t, TensorType::Q2_K);
  set_vec_dot<dot_q3_k>(t, TensorType::Q3_K);
  set_vec_dot<dot_q45_k<Q4_K, codes_q4_k>>(t, TensorType::Q4_K);
  set_vec_dot<dot_q45_k<Q5_K, codes_q5_k>>(t, TensorType::Q5_K);
  set_vec_dot<dot_q6_k>(t, TensorType::Q6_K);
  set_vec_dot<dot_mxfp4>(t, TensorType::MXFP4);
  return t;
}

}  // namespace

const KernelTable& kernels_scalar() {
  static const KernelTable table = make_scalar_table();
  return table;
}

TensorType dot_type(TensorType weight) {
  switch (weight) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0:
    case TensorType::MXFP4: return TensorType::Q8_0;
    case TensorType::Q4_1:
    case TensorType::Q5_1: return TensorType::Q8_1;
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K: return TensorType::Q8_K;
    default: return TensorType::F32;
  }
}

size_t activation_row_bytes(TensorType weight, int64_t n) {
  uint64_t bytes = 0;
  if (n < 0 || !type_row_bytes(dot_type(weight), static_cast<uint64_t>(n), &bytes)) return 0;
  return static_cast<size_t>(bytes);
}

}  // namespace moelite::cpu
