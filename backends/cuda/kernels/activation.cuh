// The FFN activations, shared by the element-wise kernel (ffn_act) and the grouped gate/up product,
// which applies them to its two rows' results directly: one expression, so both give the same bits.
#pragma once
#include "backends/cuda/kernels/dialect.cuh"

namespace moelite::cuda_kernels {

MK_DEVICE float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }

// mode 0: SwiGLU silu(g) * u; mode 1: gpt-oss's clamped SwiGLU.
MK_DEVICE float ffn_act_value(float g, float u, int mode, float alpha, float limit) {
  if (mode == 0) return g / (1.0f + expf(-g)) * u;
  const float gv = fminf(g, limit);
  const float uv = fminf(fmaxf(u, -limit), limit);
  return gv * sigmoid_f(alpha * gv) * (uv + 1.0f);
}

}  // namespace moelite::cuda_kernels
