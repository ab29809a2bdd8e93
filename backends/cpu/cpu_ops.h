// Float operations of the CPU backend, written plainly: they are both the CPU implementation and
// the reference other backends' versions are tested against.
#pragma once
#include <cstdint>

#include "backends/backend.h"

namespace moelite::cpu {

// y = x / sqrt(mean(x^2) + eps) * w (w may be null), over n floats. Sum of squares in double.
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y);

// Rotates one head in place at position `pos`.
void rope_head(float* head, const RopeParams& p, int32_t pos);

// Softmax over n values (max-subtracted), in place.
void softmax_row(float* x, int64_t n);

// Top-k of probabilities p[0..n): ids in descending probability, ties to the lower index.
void top_k(const float* p, int32_t n, int32_t k, int32_t* ids, float* weights);

// Attention of one query head over positions [0, n_pos) of a cache laid out as
// [position][kv_dim] with this head's kv slice at column `kv_offset`. `scores` has n_pos floats.
void attend_head(const float* q, const float* k_cache, const float* v_cache, int64_t kv_dim,
                 int64_t kv_offset, int64_t head_dim, int32_t n_pos, float scale, float* scores,
                 float* out);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

}  // namespace moelite::cpu
