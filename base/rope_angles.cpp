#include "base/rope_angles.h"

#include <cmath>

namespace moelite {

void rope_angles(double freq_base, int32_t n_rot, int32_t pos, float* cos_out, float* sin_out) {
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    const double theta = pos * std::pow(freq_base, -2.0 * i / n_rot);
    cos_out[i] = static_cast<float>(std::cos(theta));
    sin_out[i] = static_cast<float>(std::sin(theta));
  }
}

std::vector<float> rope_cos_sin_table(double freq_base, int32_t n_rot, const int32_t* positions, int64_t n) {
  const size_t half = static_cast<size_t>(n_rot / 2);
  std::vector<float> table(static_cast<size_t>(n) * half * 2), c(half), s(half);
  for (int64_t t = 0; t < n; ++t) {
    rope_angles(freq_base, n_rot, positions[t], c.data(), s.data());
    for (size_t i = 0; i < half; ++i) {
      table[(static_cast<size_t>(t) * half + i) * 2] = c[i];
      table[(static_cast<size_t>(t) * half + i) * 2 + 1] = s[i];
    }
  }
  return table;
}

}  // namespace moelite
