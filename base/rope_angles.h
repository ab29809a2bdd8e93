// Rotary-embedding angles, shared by every backend so they all rotate by the same floats.
#pragma once
#include <cstdint>
#include <vector>

namespace moelite {

// cos/sin of pos * freq_base^(-2i/n_rot) for i < n_rot/2, computed in double (long contexts keep
// their precision) and rounded to float once.
void rope_angles(double freq_base, int32_t n_rot, int32_t pos, float* cos_out, float* sin_out);

// The angles of n positions as one table a GPU backend uploads: for position t and pair i,
// (cos, sin) at [(t * n_rot/2 + i) * 2].
std::vector<float> rope_cos_sin_table(double freq_base, int32_t n_rot, const int32_t* positions, int64_t n);

}  // namespace moelite
