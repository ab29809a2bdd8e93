// The Q4_K and Q5_K kernels of the 256-bit and 512-bit x86 tables' float order (interleaved_rows.h):
// the group kernel over eight interleaved rows, and the pieces the row kernels share with it. 256-bit
// code; each including file compiles it with its own flags (-mavx2, -mavx512f, ...), so
// everything sits in an anonymous namespace (see rows_entry.h for why).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cpu/interleaved_rows.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/simd/x86_kquant.h"
#include "base/quant_ref.h"

namespace moelite::cpu {
namespace {  // NOLINT(google-build-namespaces)

// The float work of one super-block for a row kernel, in vector registers throughout (a trip
// through a general register and cvtsi2ss cost a third of the kernel's speed):
//   q4k_totals: [isum, msum, isum, msum] from isum's 4 int32 partial sums and the 8 mins (int16)
//     against the activation's 16 group sums (sub-block s covers groups 2s and 2s + 1);
//   q4k_accumulate: lanes [acc, accm] += [d, dmin] * da * float([isum, msum]), one FMA per lane;
//   q4k_result: acc - accm.
inline __m128i q4k_totals(__m128i isum4, __m128i mins16, const uint8_t bsums[32]) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums + 16));
  const __m128i t = _mm_hadd_epi32(isum4, _mm_madd_epi16(mins16, _mm_hadd_epi16(lo, hi)));
  return _mm_hadd_epi32(t, t);
}
inline __m128 q4k_accumulate(__m128 acc, __m128i totals, const uint8_t d_dmin[4], float da) {
  uint32_t h;
  std::memcpy(&h, d_dmin, 4);  // fp16 d, then fp16 dmin (Q4_K and Q5_K alike)
  const __m128 coef = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h))), _mm_set1_ps(da));
  return _mm_fmadd_ps(coef, _mm_cvtepi32_ps(totals), acc);
}
inline float q4k_result(__m128 acc) { return _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc))); }

// Eight Q4_K or Q5_K rows (one group, Q4KGroup8 / Q5KGroup8 per super-block) against K activation
// rows. Per chunk c the 8 lane vectors hold 4 code bytes of each row; their vpmaddubsw results
// against the broadcast activation words are summed as int16 before one vpmaddwd by the rows'
// scales of that sub-block: all 8 lanes for Q4_K (8 x 2 x 15 x 127 = 30 480 < 2^15), 4 at a time for
// Q5_K (4 x 2 x 31 x 127 = 31 496). Each row's sums end in its own lane. The integer totals are exact,
// so the order of the additions does not matter; the float work is interleaved_rows.h's.
template <bool kFive, int K>
struct Q45KGroupRows {
  using Group = std::conditional_t<kFive, Q5KGroup8, Q4KGroup8>;
  static const Q4KGroup8& low_part(const Q4KGroup8& g) { return g; }
  static const Q4KGroup8& low_part(const Q5KGroup8& g) { return g.low; }
  // Bit kBit of each fifth-bit byte (the fifth bit of one code) moved to bit 4.
  template <int kBit>
  static __m256i fifth_bits(__m256i qh) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    if constexpr (kBit >= 4)
      return _mm256_and_si256(_mm256_srli_epi16(qh, kBit - 4), bit4);
    else
      return _mm256_and_si256(_mm256_slli_epi16(qh, 4 - kBit), bit4);
  }

  // Software prefetch (into L1) of the super-block group kPrefetchAhead ahead; past a matrix's last
  // one that is the next group of rows, which the same thread usually takes next (a prefetch never
  // faults). The hardware prefetcher alone left one core's stream well below what the memory gives
  // on both CPUs measured: an AMD Zen 3 (avx2 table; bench_kernels from DRAM 5.5-7.7 -> 8.3-10 GB/s;
  // the bench-shaped Q5_K model's decode from its copies 23-25 -> 30-33 tok/s, 2 threads; 2 ahead as
  // good as 4 or 8 and better than 1) and an Intel Xeon with AMX (avx512 kernels, which the amx
  // table's decode runs; Q4_K model 47-50 -> 61-64 tok/s, Q5_K 39-42 -> 49-52, three alternating
  // rounds; AMD Zen 4/5 not measured with it). Not the row-ahead prefetch of cpu_backend.cpp, which
  // cost bandwidth on x86.
  static constexpr int kPrefetchAhead = 2;

  static void run(int64_t n, float* out, size_t out_stride, const void* w, const void* a, size_t a_stride) {
    const auto* x = static_cast<const Group*>(w);
    const blocks::Q8_K* y[K];
    __m256 acc[K], accm[K];
#pragma GCC unroll 4  // every loop over the K rows unrolled, or the arrays stay in memory
    for (int j = 0; j < K; ++j) {
      y[j] = reinterpret_cast<const blocks::Q8_K*>(static_cast<const uint8_t*>(a) + static_cast<size_t>(j) * a_stride);
      acc[j] = accm[j] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    // 8 bytes (one per row, in both 128-bit lanes) -> int32 lane r = the int16 pair (byte r, byte r).
    const __m256i spread = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1,
                                            5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    // [mins of sub-block 2k for rows 0..7 | of 2k + 1] -> int32 lane r = the pair (min 2k, min 2k + 1).
    const __m256i pair = _mm256_setr_epi8(0, -1, 8, -1, 1, -1, 9, -1, 2, -1, 10, -1, 3, -1, 11, -1, 4, -1, 12, -1, 5,
                                          -1, 13, -1, 6, -1, 14, -1, 7, -1, 15, -1);
    for (int64_t i = 0; i < n / blocks::kQKK; ++i) {
      const Q4KGroup8& g = low_part(x[i]);
      prefetch_lines(x + i + kPrefetchAhead);
      __m256i isum[K], msum[K];
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) isum[j] = msum[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i mins = _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.mins[2 * k]))), pair);
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          int16_t bs[4];
          std::memcpy(bs, y[j][i].bsums + 8 * k, 8);
          const uint32_t sums =
              static_cast<uint16_t>(bs[0] + bs[1]) | static_cast<uint32_t>(static_cast<uint16_t>(bs[2] + bs[3])) << 16;
          msum[j] = _mm256_add_epi32(msum[j], _mm256_madd_epi16(mins, _mm256_set1_epi32(static_cast<int>(sums))));
        }
      }
      chunk<0>(x[i], g, y, i, m4, spread, isum);
      chunk<1>(x[i], g, y, i, m4, spread, isum);
      chunk<2>(x[i], g, y, i, m4, spread, isum);
      chunk<3>(x[i], g, y, i, m4, spread, isum);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.d)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.dmin)));
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        const __m256 da = _mm256_broadcast_ss(reinterpret_cast<const float*>(y[j][i].d));
        acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[j]), acc[j]);
        accm[j] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum[j]), accm[j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) {
      alignas(32) float o[kGroupRows];
      _mm256_store_ps(o, _mm256_sub_ps(acc[j], accm[j]));
      for (int r = 0; r < kGroupRows; ++r) out[static_cast<size_t>(r) * out_stride + static_cast<size_t>(j)] = o[r];
    }
  }

  // Chunk c of super-block i: sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles), added to isum.
  template <int c>
  static inline __attribute__((always_inline)) void chunk(const Group& full, const Q4KGroup8& g,
                                                          const blocks::Q8_K* const* y, int64_t i, __m256i m4,
                                                          __m256i spread, __m256i* isum) {
    int64_t sc_lo, sc_hi;
    std::memcpy(&sc_lo, g.scales[2 * c], 8);
    std::memcpy(&sc_hi, g.scales[2 * c + 1], 8);
    const __m256i s_lo = _mm256_shuffle_epi8(_mm256_set1_epi64x(sc_lo), spread);
    const __m256i s_hi = _mm256_shuffle_epi8(_mm256_set1_epi64x(sc_hi), spread);
    __m256i lo_sum[K], hi_sum[K];
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) lo_sum[j] = hi_sum[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs[c][l]));
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kFive) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(full.qh[l]));
        lo = _mm256_or_si256(lo, fifth_bits<2 * c>(qh));
        hi = _mm256_or_si256(hi, fifth_bits<2 * c + 1>(qh));
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        int32_t a_lo, a_hi;
        std::memcpy(&a_lo, y[j][i].qs + 64 * c + 4 * l, 4);
        std::memcpy(&a_hi, y[j][i].qs + 64 * c + 32 + 4 * l, 4);
        lo_sum[j] = _mm256_add_epi16(lo_sum[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a_lo)));
        hi_sum[j] = _mm256_add_epi16(hi_sum[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(a_hi)));
      }
      if (l == 7 || (kFive && l == 3)) {  // the int16 sums are full: into int32 by the scales
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          isum[j] = _mm256_add_epi32(
              isum[j], _mm256_add_epi32(_mm256_madd_epi16(lo_sum[j], s_lo), _mm256_madd_epi16(hi_sum[j], s_hi)));
          lo_sum[j] = hi_sum[j] = _mm256_setzero_si256();
        }
      }
    }
  }
};

// The table entries (VecDotTileFn): count activation rows, 1..4.
template <bool kFive>
void q45k_group_dot(int64_t n, float* out, size_t out_stride, const void* w, size_t /*w_stride*/, const void* a,
                    size_t a_stride, int count) {
  switch (count) {
    case 1: Q45KGroupRows<kFive, 1>::run(n, out, out_stride, w, a, a_stride); break;
    case 2: Q45KGroupRows<kFive, 2>::run(n, out, out_stride, w, a, a_stride); break;
    case 3: Q45KGroupRows<kFive, 3>::run(n, out, out_stride, w, a, a_stride); break;
    default: Q45KGroupRows<kFive, 4>::run(n, out, out_stride, w, a, a_stride); break;
  }
}

}  // namespace
}  // namespace moelite::cpu
