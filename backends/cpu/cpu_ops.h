// Float operations of the CPU backend, written plainly: they are both the CPU implementation and
// the reference other backends' versions are tested against.
#pragma once
#include <cstdint>

#include "backends/backend.h"
#include "backends/cpu/quant.h"

namespace moelite::cpu {

// y = x / sqrt(mean(x^2) + eps) * w (w may be null), over n floats. Sum of squares in double.
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y);

// cos/sin of the n_rot/2 rotation angles at position `pos` (theta_i = pos * base^(-2i/n_rot)).
void rope_angles(const RopeParams& p, int32_t pos, float* cos_out, float* sin_out);
// Rotates one head in place with precomputed angles.
void rope_apply(float* head, const RopeParams& p, const float* cos_v, const float* sin_v);

// Softmax over n values (max-subtracted), in place.
void softmax_row(float* x, int64_t n);

// Top-k of probabilities p[0..n): ids in descending probability, ties to the lower index.
void top_k(const float* p, int32_t n, int32_t k, int32_t* ids, float* weights);

// The positions one query reads: [first, end), position p at slot p % slots of the cache.
struct AttendRange {
  int32_t first = 0, end = 0, slots = 1;
};

// Attention of one query head over the positions of `range` in a cache laid out as
// [slot][kv_dim] with this head's kv slice at column `kv_offset`; `sink` (-inf for none) is a logit
// that joins the softmax denominator and weighs no value. `scores` has end - first floats.
// `dot` is an F32 dot-product kernel (the scalar table's for the reference, a SIMD one for speed).
void attend_head(const float* q, const float* k_cache, const float* v_cache, int64_t kv_dim, int64_t kv_offset,
                 int64_t head_dim, int64_t head_dim_v, const AttendRange& range, float scale, float sink, float* scores, float* out,
                 VecDotFn dot);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
// An expert's hidden activation from its gate and up projections (see FfnKind).
inline float ffn_activation(const FfnKind& kind, float g, float u) {
  if (kind.activation == FfnActivation::SwiGLU) return silu(g) * u;
  const float gc = g < kind.limit ? g : kind.limit;
  const float uc = u < -kind.limit ? -kind.limit : (u > kind.limit ? kind.limit : u);
  return gc * sigmoid(kind.alpha * gc) * (uc + 1.0f);
}

}  // namespace moelite::cpu
