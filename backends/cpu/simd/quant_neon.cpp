// ARMv8.0 NEON kernels (every AArch64 CPU has them): the dot products of the most common weight
// types, the rest from the scalar table. Per block the integer sum is exact and then scaled in the
// same order as the scalar kernel (Q8_0, Q4_0); F32 keeps
// four lanes of partial sums (the float order differs, within the tolerance the tests allow).
// Work in progress for the ARM issue: dotprod / i8mm paths and the other types are still to come.
#include <arm_neon.h>

#include <cstring>

#include "backends/cpu/quant.h"

namespace moelite::cpu {
namespace {

using namespace moelite::blocks;

// sum of a[i] * b[i] over 32 int8 values, exact in int32.
inline int32_t dot32_s8(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
  int32x4_t acc = vdupq_n_s32(0);
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
  acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(a0), vget_high_s8(b0)));
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
  acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(a1), vget_high_s8(b1)));
  return vaddvq_s32(acc);
}

void dot_q8_0(int64_t n, float* out, const void* w, const void* a) {
  const Q8_0* x = static_cast<const Q8_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  float s = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    const int32_t sum = dot32_s8(vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16), vld1q_s8(y[i].qs), vld1q_s8(y[i].qs + 16));
    s += load_fp16(x[i].d) * load_fp16(y[i].d) * sum;
  }
  *out = s;
}

void dot_q4_0(int64_t n, float* out, const void* w, const void* a) {
  const Q4_0* x = static_cast<const Q4_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  const uint8x16_t low_nibble = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  float s = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    // Element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of byte j - 16.
    const uint8x16_t packed = vld1q_u8(x[i].qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(packed, low_nibble)), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(packed, 4)), eight);
    const int32_t sum = dot32_s8(lo, hi, vld1q_s8(y[i].qs), vld1q_s8(y[i].qs + 16));
    s += load_fp16(x[i].d) * load_fp16(y[i].d) * sum;
  }
  *out = s;
}

void dot_f32(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);  // any byte offset: vld1q_f32 on bytes
  const float* y = static_cast<const float*>(a);
  float32x4_t acc = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    float32x4_t wv;
    std::memcpy(&wv, x + 4 * i, 16);
    acc = vfmaq_f32(acc, wv, vld1q_f32(y + i));
  }
  float s = vaddvq_f32(acc);
  for (; i < n; ++i) {
    float v;
    std::memcpy(&v, x + 4 * i, 4);
    s += v * y[i];
  }
  *out = s;
}

KernelTable make_table() {
  KernelTable t = kernels_scalar();
  t.isa = "neon";
  set_vec_dot<dot_f32>(t, TensorType::F32);
  set_vec_dot<dot_q8_0>(t, TensorType::Q8_0);
  set_vec_dot<dot_q4_0>(t, TensorType::Q4_0);
  return t;
}

}  // namespace

const KernelTable* kernels_neon() {
  static const KernelTable table = make_table();
  return &table;
}

}  // namespace moelite::cpu
