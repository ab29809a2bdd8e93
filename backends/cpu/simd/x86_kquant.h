// Pieces of the Q4_K / Q5_K kernels that the avx2 and avx512 files share: 128-bit operations that
// both instruction sets run the same way. Each file compiles these with its own flags, so they sit
// in an anonymous namespace (see rows_entry.h for why).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace moelite::cpu {
namespace {  // NOLINT(google-build-namespaces)

// Q4_K/Q5_K packed scales -> bytes 0..7 scales, 8..15 mins (see unpack_scales_q4k). Built in
// registers: storing four u32 and reloading them as one vector would stall on store forwarding
// (measured: a third of the Q4_K throughput).
inline __m128i q4k_scales_mins(const uint8_t p[12]) {
  uint32_t a[3];
  std::memcpy(a, p, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  return _mm_setr_epi32(static_cast<int>(a[0] & m6), static_cast<int>((a[2] & m4) | (((a[0] >> 6) & m2) << 4)),
                        static_cast<int>(a[1] & m6), static_cast<int>(((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4)));
}

// One super-block's min term for one activation row: acc += dmin_da * sum_g min_g * (bsum_{2g} +
// bsum_{2g+1}), with the 8 mins as int16 and the activation's 16 int16 group sums.
inline __m128 q4k_mins_fma(__m128 acc, __m128i mins, const uint8_t bsums[32], float dmin_da) {
  const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums));
  const __m128i bs_pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
  return _mm_fmadd_ps(_mm_set1_ps(dmin_da), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs_pairs)), acc);
}

inline float hsum128(__m128 v) {
  __m128 m = _mm_add_ps(v, _mm_movehl_ps(v, v));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

}  // namespace
}  // namespace moelite::cpu
