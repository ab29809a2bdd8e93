// The K-quants of 16 groups of 16 codes with 8-bit scales (Q2_K, Q3_K, Q6_K), a super-block in
// 512-bit registers, for the avx512 table's kernels of these types and the amx table's (which sum
// each super-block exactly before any float operation, for its tiles): the 256 codes in element order
// and each 64-code chunk's scales as int16 lanes for vpdpwssd. Only files compiled with the AVX-512
// flags include this (see rows_entry.h for the anonymous namespace).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/simd/x86_kquant.h"
#include "base/quant_ref.h"

namespace moelite::cpu {
namespace {  // NOLINT(google-build-namespaces)

// Scales for chunk c (s[c]: quarter q of the vector, 8 int16 lanes = one 16-element group after
// maddubs, holds scale 4c + q). From the 16 scales as int16, scales 0..7 broadcast to every 128-bit
// lane serve chunks 0 and 1, scales 8..15 chunks 2 and 3: an in-lane byte shuffle picks scale
// (4c + q) mod 8 in quarter q. Constants in memory: built in registers they took about 30
// instructions a call, and an expert's row is one call of only 4-8 super-blocks.
struct K16Constants {
  uint8_t scale_idx[2][64];  // chunk c mod 2
};
constexpr K16Constants make_k16_constants() {
  K16Constants k{};
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 64; ++i) {
      const int scale = 4 * c + i / 16;  // of the eight in the lane
      k.scale_idx[c][i] = static_cast<uint8_t>(2 * scale + (i & 1));
    }
  return k;
}
alignas(64) constexpr K16Constants kK16 = make_k16_constants();

// One super-block decoded: q[c] the unsigned codes of elements 64c..64c+63 (stored + kBias),
// s[c] their scales per maddubs pair (above), sc16 the 16 scales as int16, mins16 Q2_K's 16 mins.
struct K16Decoded {
  __m512i q[4], s[4];
  __m256i sc16, mins16;
};

// The scale vectors of a super-block from its 16 scales as signed bytes (Q2_K's are 0..15).
inline __attribute__((always_inline)) void k16_scales(__m128i scale_bytes, K16Decoded& r) {
  r.sc16 = _mm256_cvtepi8_epi16(scale_bytes);
  // Scales 0..7 and 8..15 (int16), each broadcast to every 128-bit lane.
  const __m512i sc_half[2] = {_mm512_broadcast_i32x4(_mm256_castsi256_si128(r.sc16)),
                              _mm512_broadcast_i32x4(_mm256_extracti128_si256(r.sc16, 1))};
  const __m512i idx0 = _mm512_load_si512(kK16.scale_idx[0]), idx1 = _mm512_load_si512(kK16.scale_idx[1]);
  for (int h = 0; h < 2; ++h) {
    r.s[2 * h] = _mm512_shuffle_epi8(sc_half[h], idx0);
    r.s[2 * h + 1] = _mm512_shuffle_epi8(sc_half[h], idx1);
  }
}

// Q6_K: codes 0..63 stored +32. Per 128-element half, the 64 ql bytes' low nibbles are elements
// 0..63 in order and the high nibbles elements 64..127; qh supplies bit pairs (0,2) and (4,6) for
// the two halves.
struct Q6KFormat {
  using Block = blocks::Q6_K;
  static constexpr int kBias = 32, kBiasShift = 5;
  static constexpr bool kMins = false;
  static inline __attribute__((always_inline)) void codes(const Block& x, __m512i (&q)[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(x.ql + 64 * h);
      const __m256i qh256 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h));
      const __m512i qh = _mm512_inserti64x4(_mm512_zextsi256_si512(qh256), _mm256_srli_epi16(qh256, 2), 1);
      q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qh, m3), 4));
      q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                     _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m3), 4));
    }
  }
  static inline __m128i scale_bytes(const Block& x) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
  }
};

// Two-bit codes (Q2_K, Q3_K's low bits) of chunk c = 2h + t from the 32 qs bytes of half h,
// broadcast to both 256-bit halves: element 128h + 32s + l is bits 2s of qs[32h + l], and the chunk
// covers s = 2t (its low 256 bits) and 2t + 1 (its high 256 bits). 16-bit shifts; the mask drops
// the neighbour's bits.
inline __attribute__((always_inline)) __m512i two_bit_codes(__m512i qs, int t) {
  const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * t)),
                                           _mm256_set1_epi16(static_cast<short>(4 * t + 2)), 1);
  return _mm512_and_si512(_mm512_srlv_epi16(qs, shift), _mm512_set1_epi8(3));
}
inline __m512i half_of_qs(const uint8_t* qs, int h) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * h)));
}

// Q3_K: codes 0..7 stored +4, the two low bits as above, the third in hmask (bit 4h + s of
// hmask[l], set for the upper four).
struct Q3KFormat {
  using Block = blocks::Q3_K;
  static constexpr int kBias = 4, kBiasShift = 2;
  static constexpr bool kMins = false;
  static inline __attribute__((always_inline)) void codes(const Block& x, __m512i (&q)[4]) {
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i hmask = half_of_qs(x.hmask, 0);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i qs = half_of_qs(x.qs, h);
#pragma GCC unroll 2
      for (int t = 0; t < 2; ++t) {
        const __m512i high_shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * h + 2 * t)),
                                                      _mm256_set1_epi16(static_cast<short>(4 * h + 2 * t + 1)), 1);
        const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(hmask, high_shift), one);
        q[2 * h + t] = _mm512_or_si512(two_bit_codes(qs, t), _mm512_slli_epi16(high, 2));
      }
    }
  }
  static inline __m128i scale_bytes(const Block& x) { return q3k_scales(x.scales); }
};

// Q2_K: codes 0..3 (no offset), unsigned 4-bit scales (low nibbles) and mins (high nibbles) per
// group; the mins apply through the activation's group sums and dmin.
struct Q2KFormat {
  using Block = blocks::Q2_K;
  static constexpr int kBias = 0, kBiasShift = 0;
  static constexpr bool kMins = true;
  static inline __attribute__((always_inline)) void codes(const Block& x, __m512i (&q)[4]) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i qs = half_of_qs(x.qs, h);
      q[2 * h] = two_bit_codes(qs, 0);
      q[2 * h + 1] = two_bit_codes(qs, 1);
    }
  }
  static inline __m128i scale_bytes(const Block& x) {
    return _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)), _mm_set1_epi8(0x0f));
  }
  static inline __m128i min_bytes(const Block& x) {
    return _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)), 4),
                         _mm_set1_epi8(0x0f));
  }
};

template <class Format>
inline __attribute__((always_inline)) K16Decoded k16_decode(const typename Format::Block& x) {
  K16Decoded r;
  Format::codes(x, r.q);
  k16_scales(Format::scale_bytes(x), r);
  if constexpr (Format::kMins) r.mins16 = _mm256_cvtepu8_epi16(Format::min_bytes(x));
  return r;
}

// The super-block's integer sum against one Q8_K block, in 16 int32 lanes (their total is
// sum_g scale_g * sum_{i in g} (code_i - kBias) * a_i): codes are stored + kBias, so kBias *
// sum_g scale_g * bsum_g is removed, in the low 8 lanes.
template <class Format>
inline __attribute__((always_inline)) __m512i k16_block_lanes(const K16Decoded& x, const blocks::Q8_K& b) {
  __m512i sumi = _mm512_setzero_si512();
  if constexpr (Format::kBias != 0) {
    const __m256i off = _mm256_slli_epi32(
        _mm256_madd_epi16(x.sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums))), Format::kBiasShift);
    sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(off));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c)
    sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(x.q[c], _mm512_loadu_si512(b.qs + 64 * c)), x.s[c]);
  return sumi;
}

// Q2_K's min term against one Q8_K block, in 16 int32 lanes (8 used): their total is
// sum_g min_g * bsum_g.
inline __attribute__((always_inline)) __m512i k16_min_lanes(const K16Decoded& x, const blocks::Q8_K& b) {
  return _mm512_zextsi256_si512(
      _mm256_madd_epi16(x.mins16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums))));
}

}  // namespace
}  // namespace moelite::cpu
