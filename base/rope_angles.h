// Rotary-embedding angles, shared by every backend so they all rotate by the same floats.
#pragma once
#include <cstdint>
#include <vector>

namespace moelite {

// How a model stretches its rotary embedding past the context it was trained on (GGUF
// `rope.scaling.*`). Linear interpolation divides every angle by `factor`; YaRN (arXiv 2309.00071,
// as llama.cpp applies it) interpolates only the slow dimensions, keeps the fast ones, blends the
// ones between by a ramp, and scales cos and sin by 1 + 0.1 ln(factor).
enum class RopeScalingType { None, Linear, Yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  float factor = 1.0f;        // context extension (rope.scaling.factor), >= 1
  int32_t n_ctx_orig = 0;     // YaRN: rope.scaling.original_context_length
  float beta_fast = 32.0f;    // YaRN: rotations per original context above which nothing is interpolated
  float beta_slow = 1.0f;     // YaRN: ... below which everything is
  float attn_factor = 1.0f;   // magnitude factor on cos and sin (rope.scaling.attn_factor)
  // LongRoPE (Phi-3 / PhiMoE): n_rot/2 divisors of the angles, one per pair, or null. Host floats
  // that outlive every use (the model's).
  const float* freq_factors = nullptr;
};

// cos/sin of the angle of pair i < n_rot/2 at `pos`: pos * freq_base^(-2i/n_rot), scaled as
// `scaling` says; computed in double (long contexts keep their precision) and rounded to float once.
void rope_angles(double freq_base, int32_t n_rot, const RopeScaling& scaling, int32_t pos, float* cos_out,
                 float* sin_out);

// The angles of n positions as one table a GPU backend uploads: for position t and pair i,
// (cos, sin) at [(t * n_rot/2 + i) * 2].
std::vector<float> rope_cos_sin_table(double freq_base, int32_t n_rot, const RopeScaling& scaling,
                                      const int32_t* positions, int64_t n);

}  // namespace moelite
