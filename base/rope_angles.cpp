#include "base/rope_angles.h"

#include <algorithm>
#include <cmath>

namespace moelite {

namespace {

constexpr double kPi = 3.14159265358979323846;

// The dimension (of n_rot) whose wavelength makes `rotations` turns over the original context.
double yarn_dimension(int32_t n_rot, int32_t n_ctx_orig, double rotations, double freq_base) {
  return n_rot * std::log(n_ctx_orig / (rotations * 2.0 * kPi)) / (2.0 * std::log(freq_base));
}

}  // namespace

void rope_angles(double freq_base, int32_t n_rot, const RopeScaling& scaling, int32_t pos, float* cos_out,
                 float* sin_out) {
  const double factor = scaling.type == RopeScalingType::None ? 1.0 : std::max(1.0, double{scaling.factor});
  double magnitude = scaling.attn_factor;
  // YaRN's ramp runs from the first dimension that turns fewer than beta_fast times over the
  // original context (extrapolated: kept as trained) to the last that turns more than beta_slow
  // times (interpolated: divided by the factor).
  double low = 0.0, high = 0.0;
  const bool yarn = scaling.type == RopeScalingType::Yarn && factor > 1.0;
  if (yarn) {
    low = std::max(0.0, std::floor(yarn_dimension(n_rot, scaling.n_ctx_orig, scaling.beta_fast, freq_base)));
    high = std::min(n_rot - 1.0, std::ceil(yarn_dimension(n_rot, scaling.n_ctx_orig, scaling.beta_slow, freq_base)));
    magnitude *= 1.0 + 0.1 * std::log(factor);
  }
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    double extrapolated = pos * std::pow(freq_base, -2.0 * i / n_rot);
    if (scaling.freq_factors) extrapolated /= scaling.freq_factors[i];
    double theta = extrapolated / factor;
    if (yarn) {
      const double keep = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
      theta = theta * (1.0 - keep) + extrapolated * keep;
    }
    cos_out[i] = static_cast<float>(std::cos(theta) * magnitude);
    sin_out[i] = static_cast<float>(std::sin(theta) * magnitude);
  }
}

std::vector<float> rope_cos_sin_table(double freq_base, int32_t n_rot, const RopeScaling& scaling,
                                      const int32_t* positions, int64_t n) {
  const size_t half = static_cast<size_t>(n_rot / 2);
  std::vector<float> table(static_cast<size_t>(n) * half * 2), c(half), s(half);
  for (int64_t t = 0; t < n; ++t) {
    rope_angles(freq_base, n_rot, scaling, positions[t], c.data(), s.data());
    for (size_t i = 0; i < half; ++i) {
      table[(static_cast<size_t>(t) * half + i) * 2] = c[i];
      table[(static_cast<size_t>(t) * half + i) * 2 + 1] = s[i];
    }
  }
  return table;
}

}  // namespace moelite
