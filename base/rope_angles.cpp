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

}  // namespace moelite
