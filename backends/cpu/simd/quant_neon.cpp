// ARMv8.0 NEON table ("neon"): every AArch64 CPU has it, so no runtime check. Compiled for the
// baseline architecture only; the sdot and smmla tables live in quant_dotprod_neon.cpp and
// quant_i8mm_neon.cpp, compiled with their own -march and chosen at run time.
//
//  - F32 / F16 / BF16: fused multiply-adds in four float32x4 accumulators per row; F16 converts
//    with FCVTL (ARMv8.0), BF16 by a 16-bit shift.
//  - Quantized types: the shared kernels of quant_neon_kernels.h with widening int8 multiplies
//    (vmull/vmlal + pairwise add).
//  - Activation quantizers (Q8_0, Q8_1, Q8_K): byte-identical to the scalar reference; FCVTAS
//    rounds half away from zero like roundf, FCVTNS to nearest even like nearbyintf.
//  - Dequantization stays scalar (as on x86: it only runs on the host for small tensors).
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/quant_neon_kernels.h"

namespace moelite::cpu {
namespace {

// ---- float types ------------------------------------------------------------------------------

// Load(i) -> weights i .. i + 3 as floats; Scalar(i) -> weight i. Each row keeps four vector
// accumulators over 16-element steps, then a 4-element step, then a scalar tail with explicit
// fmas: the same operation sequence per row for every K.
template <int K, typename Load, typename Scalar>
inline void dot_float_rows(int64_t n, float* out, const void* a, size_t stride, Load load, Scalar scalar) {
  const float* y[K];
  float32x4_t acc[K][4];
  for (int j = 0; j < K; ++j) {
    y[j] = act_row<float>(a, stride, j);
    for (int u = 0; u < 4; ++u) acc[j][u] = vdupq_n_f32(0.0f);
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const float32x4_t w[4] = {load(i), load(i + 4), load(i + 8), load(i + 12)};
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[j][u] = vfmaq_f32(acc[j][u], w[u], vld1q_f32(y[j] + i + 4 * u));
  }
  for (; i + 4 <= n; i += 4) {
    const float32x4_t wv = load(i);
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) acc[j][0] = vfmaq_f32(acc[j][0], wv, vld1q_f32(y[j] + i));
  }
  float s[K];
  for (int j = 0; j < K; ++j)
    s[j] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[j][0], acc[j][1]), vaddq_f32(acc[j][2], acc[j][3])));
  for (; i < n; ++i) {
    const float wv = scalar(i);
    for (int j = 0; j < K; ++j) s[j] = std::fma(wv, y[j][i], s[j]);
  }
  for (int j = 0; j < K; ++j) out[j] = s[j];
}

// Weights through byte loads: a row may start at any offset of a mapped file.
template <class Isa, int R, int K>
struct DotF32 {
  static_assert(R == 1, "no float tiles");
  static void run(int64_t n, float* out, size_t, const void* w, size_t, const void* a, size_t stride) {
    const uint8_t* x = static_cast<const uint8_t*>(w);
    dot_float_rows<K>(
        n, out, a, stride, [x](int64_t i) { return vreinterpretq_f32_u8(vld1q_u8(x + 4 * i)); },
        [x](int64_t i) { return f32(x + 4 * i); });
  }
};
template <class Isa, int R, int K>
struct DotF16 {
  static_assert(R == 1, "no float tiles");
  static void run(int64_t n, float* out, size_t, const void* w, size_t, const void* a, size_t stride) {
    const uint8_t* x = static_cast<const uint8_t*>(w);
    dot_float_rows<K>(
        n, out, a, stride, [x](int64_t i) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(x + 2 * i))); },
        [x](int64_t i) { return fp16(x + 2 * i); });
  }
};
// bf16 is the top half of an fp32: widening shift left by 16.
template <class Isa, int R, int K>
struct DotBf16 {
  static_assert(R == 1, "no float tiles");
  static void run(int64_t n, float* out, size_t, const void* w, size_t, const void* a, size_t stride) {
    const uint8_t* x = static_cast<const uint8_t*>(w);
    dot_float_rows<K>(
        n, out, a, stride,
        [x](int64_t i) { return vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u8(vld1_u8(x + 2 * i)), 16)); },
        [x](int64_t i) {
          uint16_t h;
          std::memcpy(&h, x + 2 * i, 2);
          return bf16_to_fp32(h);
        });
  }
};

// ---- activation quantizers: byte-identical to the scalar reference ----------------------------

// fp32 -> fp16 with FCVT: round to nearest even under the default FPCR, overflow to infinity and
// subnormal results kept, exactly as fp32_to_fp16.
inline void put_fp16(uint8_t p[2], float f) {
  const __fp16 h = f;
  std::memcpy(p, &h, 2);
}
// 16 int32 (already in [-127, 127]) -> 16 int8, in order.
inline int8x16_t narrow_s32(const int32x4_t v[4]) {
  const int16x8_t lo = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
  const int16x8_t hi = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
  return vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
}
inline float32x4_t abs_max(float32x4_t m, float32x4_t v) { return vmaxq_f32(m, vabsq_f32(v)); }

// Q8_0 / Q8_1 block: d = amax / 127, q = roundf(x / d) computed as x * (1 / d) like the
// reference. Returns d; *sum = sum of the codes.
float quantize_block_q8(const float* x, int8_t* qs, int* sum) {
  float32x4_t v[8];
  float32x4_t m = vdupq_n_f32(0.0f);
  for (int k = 0; k < 8; ++k) m = abs_max(m, v[k] = vld1q_f32(x + 4 * k));
  const float d = vmaxvq_f32(m) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int8x16_t q[2];
  for (int h = 0; h < 2; ++h) {
    int32x4_t r[4];
    for (int k = 0; k < 4; ++k) r[k] = vcvtaq_s32_f32(vmulq_n_f32(v[4 * h + k], id));
    q[h] = narrow_s32(r);
    vst1q_s8(qs + 16 * h, q[h]);
  }
  *sum = vaddlvq_s8(q[0]) + vaddlvq_s8(q[1]);
  return d;
}
void quantize_q8_0(const float* x, void* dst, int64_t n) {
  Q8_0* b = static_cast<Q8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int sum;
    put_fp16(b[i].d, quantize_block_q8(x, b[i].qs, &sum));
  }
}
void quantize_q8_1(const float* x, void* dst, int64_t n) {
  Q8_1* b = static_cast<Q8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int sum;
    const float d = quantize_block_q8(x, b[i].qs, &sum);
    put_fp16(b[i].d, d);
    put_fp16(b[i].s, static_cast<float>(sum) * d);
  }
}

// Q8_K: the element of largest magnitude (the first one, sign included) maps to -127.
void quantize_q8_k(const float* x, void* dst, int64_t n) {
  Q8_K* b = static_cast<Q8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < 256; j += 4) m = abs_max(m, vld1q_f32(x + j));
    const float amax = vmaxvq_f32(m);
    float d = 0.0f;
    if (amax == 0.0f) {
      std::memset(b[i].qs, 0, 256);
    } else {
      int first = 0;
      const float32x4_t vmax = vdupq_n_f32(amax);
      for (int j = 0; j < 256; j += 4)
        if (vmaxvq_u32(vceqq_f32(vabsq_f32(vld1q_f32(x + j)), vmax))) {
          first = j;
          while (std::fabs(x[first]) != amax) ++first;  // within these 4
          break;
        }
      const float iscale = -127.0f / x[first];
      const int32x4_t cap = vdupq_n_s32(127);
      for (int j = 0; j < 256; j += 16) {
        int32x4_t r[4];
        for (int k = 0; k < 4; ++k) r[k] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4 * k), iscale)), cap);
        vst1q_s8(b[i].qs + j, narrow_s32(r));
      }
      d = 1.0f / iscale;
    }
    std::memcpy(b[i].d, &d, 4);
    for (int g = 0; g < 16; ++g) {
      const int16_t s = vaddlvq_s8(vld1q_s8(b[i].qs + 16 * g));
      std::memcpy(b[i].bsums + 2 * g, &s, 2);
    }
  }
}

constexpr uint32_t id(TensorType t) { return static_cast<uint32_t>(t); }

KernelTable make_table() {
  KernelTable t = kernels_scalar();  // dequantization stays scalar
  t.isa = "neon";
  set_kernel<DotF32, IsaNeon>(t, TensorType::F32);
  set_kernel<DotF16, IsaNeon>(t, TensorType::F16);
  set_kernel<DotBf16, IsaNeon>(t, TensorType::BF16);
  set_quantized_kernels<IsaNeon>(t);
  t.quantize_act[id(TensorType::Q8_0)] = quantize_q8_0;
  t.quantize_act[id(TensorType::Q8_1)] = quantize_q8_1;
  t.quantize_act[id(TensorType::Q8_K)] = quantize_q8_k;
  return t;
}

}  // namespace

const KernelTable* neon_table() {
  static const KernelTable table = make_table();
  return &table;
}

}  // namespace moelite::cpu
