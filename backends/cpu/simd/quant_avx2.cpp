// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c; nothing here runs before
// kernels_avx2() has checked the CPU.
//
// Integer dot products use maddubs (u8 x s8 -> pairs summed into s16) then madd (s16 x s16 ->
// s32). Weight codes are made unsigned where the format allows (K-quants: the constant offset
// of Q3_K/Q6_K is removed afterwards with the activation's bsums), so maddubs applies directly;
// signed x signed (Q8_0, Q4_0, Q5_0, MXFP4) uses the sign-transfer trick |w| * (a * sign(w)).
// Activation int8s are in [-127, 127] (the quantizers never produce -128), which keeps
// sign(w) * a in range and every maddubs pair sum below the int16 saturation point.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backends/cpu/quant.h"
#include "backends/cpu/simd/rows_entry.h"
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/x86_kquant.h"
#include "backends/cpu/simd/x86_q45k_groups.h"
#include "backends/cpu/simd/x86_q8_kernels.h"
#include "platforms/platform.h"

namespace moelite::cpu {
namespace {

using namespace blocks;

inline float f32(const uint8_t p[4]) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

// 8 int32 partial sums of w[i]*a[i] over 32 signed bytes.
inline __m256i dot_s8(__m256i w, __m256i a) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// 8 int32 partial sums over 32 unsigned weight bytes (values < 128).
inline __m256i dot_u8(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

// 32 bytes 0x00/0xFF: byte i is set when bit i of the little-endian u32 at p is set.
inline __m256i bits_to_bytes(const uint8_t p[4]) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i shuf =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// ---- float types ----------------------------------------------------------------------------

template <typename Load, typename Scalar>
float dot_float_row(int64_t n, const float* a, Load load, Scalar scalar) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(a + i), acc0);
    acc1 = _mm256_fmadd_ps(load(i + 8), _mm256_loadu_ps(a + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(load(i + 16), _mm256_loadu_ps(a + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(load(i + 24), _mm256_loadu_ps(a + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(a + i), acc0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) s += scalar(i) * a[i];
  return s;
}

void dot_f32(int64_t n, float* out, const void* w, const void* a) {
  const float* x = static_cast<const float*>(w);
  *out = dot_float_row(
      n, static_cast<const float*>(a), [x](int64_t i) { return _mm256_loadu_ps(x + i); },
      [x](int64_t i) { return f32(reinterpret_cast<const uint8_t*>(x + i)); });
}
void dot_f16(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  *out = dot_float_row(
      n, static_cast<const float*>(a), [x](int64_t i) { return _mm256_cvtph_ps(load128(x + 2 * i)); },
      [x](int64_t i) { return fp16(x + 2 * i); });
}
void dot_bf16(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  *out = dot_float_row(
      n, static_cast<const float*>(a),
      [x](int64_t i) {
        const __m256i v = _mm256_cvtepu16_epi32(load128(x + 2 * i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      },
      [x](int64_t i) {
        uint16_t h;
        std::memcpy(&h, x + 2 * i, 2);
        return bf16_to_fp32(h);
      });
}

// ---- 32-element block types -----------------------------------------------------------------

// Q8_0, Q4_0 and MXFP4 against Q8_0 activations: x86_q8_kernels.h (set_q8_kernels), here over the
// sign-transfer integer dot product (the avxvnni table runs the same kernels over vpdpbusd).

void dot_q5_0(int64_t n, float* out, const void* w, const void* a) {
  const Q5_0* x = static_cast<const Q5_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  const __m256i hi_off = _mm256_set1_epi8(static_cast<char>(0xF0));
  for (int64_t i = 0; i < n / kQK; ++i) {
    // code - 16 as int8: a nibble without its 5th bit becomes nibble | 0xF0 (= nibble - 16),
    // with it the plain nibble (= nibble + 16 - 16).
    const __m256i q = _mm256_or_si256(nibbles(x[i].qs), _mm256_andnot_si256(bits_to_bytes(x[i].qh), hi_off));
    const __m256i p = dot_s8(q, load256(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[i].d) * fp16(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  *out = hsum(acc);
}

// Q4_1 / Q5_1 against Q8_1: d*da*sum(q*a) + m*s, with unsigned codes q.
template <typename Block, bool kFive>
void dot_q_1(int64_t n, float* out, const void* w, const void* a) {
  const Block* x = static_cast<const Block*>(w);
  const Q8_1* y = static_cast<const Q8_1*>(a);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    __m256i q = nibbles(x[i].qs);
    if constexpr (kFive) {
      q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(x[i].qh), _mm256_set1_epi8(0x10)));
    }
    const __m256i p = dot_u8(q, load256(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[i].d) * fp16(y[i].d)), _mm256_cvtepi32_ps(p), acc);
    mins += fp16(x[i].m) * fp16(y[i].s);
  }
  *out = hsum(acc) + mins;
}

// ---- K-quants -------------------------------------------------------------------------------

// With 8 int16 scales broadcast to both lanes: all 16 int16 lanes = scale j.
inline __m256i scale_all(__m256i sc8, int j) {
  return _mm256_shuffle_epi8(sc8, _mm256_set1_epi16(static_cast<short>(0x0100 + 0x0202 * j)));
}
// With 8 int16 scales of 16-element groups broadcast to both lanes: low lane = scale 2k (the
// first 16 elements of a 32-byte chunk), high lane = scale 2k+1.
inline __m256i scale_pair(__m256i sc8, int k) {
  const short lo = static_cast<short>(0x0100 + 0x0202 * (2 * k));
  const short hi = static_cast<short>(0x0100 + 0x0202 * (2 * k + 1));
  return _mm256_shuffle_epi8(sc8, _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi));
}

// The K-quant row kernels prefetch (into L1) the super-block kRowPrefetchAhead ahead: their work per
// byte is high enough that the hardware prefetcher alone left one core's stream short of the memory
// on the one AVX2-only CPU measured (AMD Zen 3: decode of the bench-shaped Q4_K model in row layout
// 24-27 -> 28-31 tok/s, 2 threads; 2, 4 and 8 ahead alike). Q8_0's kernels, lighter per byte,
// gained nothing there and have none. A prefetch past the row is the next row's start (or nothing:
// it never faults).
constexpr int kRowPrefetchAhead = 4;

// Q4_K / Q5_K for K = 1..4 activation rows: the codes and scales of each 32-byte chunk are decoded
// once and serve every row. Integer sums are exact; the float work per super-block is that of
// interleaved_rows.h (one conversion of the super-block's integer totals, two FMAs), the same per
// row for every K and the same as the group kernel's (x86_q45k_groups.h), so a grouped copy of a
// weight and its row bytes give the same bits.
template <bool kFive, typename Block>
struct DotQ45K {
  template <int K>
  struct Rows {
    static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
      const Block* x = static_cast<const Block*>(w);
      const Q8_K* y[K];
      __m128 acc[K];  // lanes [acc, accm] (x86_q45k_groups.h)
#pragma GCC unroll 4  // every loop over the accumulators unrolled, or they stay in memory
      for (int j = 0; j < K; ++j) {
        y[j] = act_row<Q8_K>(a, stride, j);
        acc[j] = _mm_setzero_ps();
      }
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      for (int64_t i = 0; i < n / kQKK; ++i) {
        prefetch_lines(x + i + kRowPrefetchAhead);
        const __m256i sm = _mm256_cvtepu8_epi16(q4k_scales_mins(x[i].scales));
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        __m256i hbits = _mm256_setzero_si256();
        if constexpr (kFive) hbits = load256(x[i].qh);
        __m256i sumi[K];
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) sumi[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m256i q = load256(x[i].qs + 32 * c);
          __m256i lo = _mm256_and_si256(q, m4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          if constexpr (kFive) {
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
            hbits = _mm256_srli_epi16(hbits, 2);
          }
          const __m256i s0 = scale_all(sc, 2 * c), s1 = scale_all(sc, 2 * c + 1);
#pragma GCC unroll 4
          for (int j = 0; j < K; ++j) {
            const int8_t* q8 = y[j][i].qs + 64 * c;
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(q8)), s0);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(q8 + 32)), s1);
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(p0, p1));
          }
        }
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const __m128i isum4 = _mm_add_epi32(_mm256_castsi256_si128(sumi[j]), _mm256_extracti128_si256(sumi[j], 1));
          acc[j] = q4k_accumulate(acc[j], q4k_totals(isum4, mins, y[j][i].bsums), x[i].d, f32(y[j][i].d));
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) out[j] = q4k_result(acc[j]);
    }
  };
};
template <int K>
using DotQ4K = DotQ45K<false, Q4_K>::Rows<K>;
template <int K>
using DotQ5K = DotQ45K<true, Q5_K>::Rows<K>;

template <int K>
struct DotQ6K {
  static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
    const Q6_K* x = static_cast<const Q6_K*>(w);
    const Q8_K* y[K];
    __m256 acc[K];
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) {
      y[j] = act_row<Q8_K>(a, stride, j);
      acc[j] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / kQKK; ++i) {
      prefetch_lines(x + i + kRowPrefetchAhead);
      const __m128i sc_bytes = load128(x[i].scales);
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc_bytes);
      __m256i sumi[K];
      // Codes are stored +32; subtract 32 * sum_g scale_g * bsum_g once per super-block.
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j)
        sumi[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y[j][i].bsums)), 5));
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = x[i].ql + 64 * h;
        const __m256i ql0 = load256(ql), ql1 = load256(ql + 32), qh = load256(x[i].qh + 32 * h);
        const __m256i sc =
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h == 0 ? sc_bytes : _mm_srli_si128(sc_bytes, 8)));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4))};
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m256i s = scale_pair(sc, c);
#pragma GCC unroll 4
          for (int j = 0; j < K; ++j) {
            const int8_t* q8 = y[j][i].qs + 128 * h + 32 * c;
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], load256(q8)), s));
          }
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j)
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[i].d) * f32(y[j][i].d)), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) out[j] = hsum(acc[j]);
  }
};

// Q2_K and Q3_K, one to four activation rows: per 128-element half, 32 qs bytes hold 2-bit codes
// for s = 0..3 (bits 2s of byte l: element 32s + l); Q3_K's third bit is bit 4h + s of hmask[l]
// (codes used as low2 + 4 * hbit, i.e. value + 4: 4 * sum_g scale_g * bsum_g removed once per
// super-block), Q2_K's 4-bit mins apply through the bsums and dmin in an accumulator of their own.
// Each half's codes are decoded once for all rows.
template <bool kThree>
struct DotQ23K {
  template <int K>
  struct Rows {
    static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
      using Block = std::conditional_t<kThree, Q3_K, Q2_K>;
      const Block* x = static_cast<const Block*>(w);
      const Q8_K* y[K];
      __m256 acc[K], acc_m[K];
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        y[j] = act_row<Q8_K>(a, stride, j);
        acc[j] = acc_m[j] = _mm256_setzero_ps();
      }
      const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
      const __m128i m4 = _mm_set1_epi8(0x0f);
      for (int64_t i = 0; i < n / kQKK; ++i) {
        prefetch_lines(x + i + kRowPrefetchAhead);
        __m128i sc_bytes;
        __m256i sumi[K];
        if constexpr (kThree) {
          sc_bytes = q3k_scales(x[i].scales);
          const __m256i sc16 = _mm256_cvtepi8_epi16(sc_bytes);
#pragma GCC unroll 4
          for (int j = 0; j < K; ++j)
            sumi[j] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y[j][i].bsums)), 2));
        } else {
          const __m128i raw = load128(x[i].scales);
          sc_bytes = _mm_and_si128(raw, m4);
          const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
#pragma GCC unroll 4
          for (int j = 0; j < K; ++j) {
            const __m256i pm = _mm256_madd_epi16(mins16, load256(y[j][i].bsums));
            acc_m[j] =
                _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[i].dmin) * f32(y[j][i].d)), _mm256_cvtepi32_ps(pm), acc_m[j]);
            sumi[j] = _mm256_setzero_si256();
          }
        }
        __m256i hm = _mm256_setzero_si256();
        if constexpr (kThree) hm = load256(x[i].hmask);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          __m256i q = load256(x[i].qs + 32 * h);
          const __m128i half_scales = h == 0 ? sc_bytes : _mm_srli_si128(sc_bytes, 8);
          const __m256i sc =
              _mm256_broadcastsi128_si256(kThree ? _mm_cvtepi8_epi16(half_scales) : _mm_cvtepu8_epi16(half_scales));
#pragma GCC unroll 4
          for (int s = 0; s < 4; ++s) {
            __m256i u = _mm256_and_si256(q, m3);
            if constexpr (kThree) {
              u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(hm, one), 2));
              hm = _mm256_srli_epi16(hm, 1);
            }
            q = _mm256_srli_epi16(q, 2);
            const __m256i sp = scale_pair(sc, s);
#pragma GCC unroll 4
            for (int j = 0; j < K; ++j)
              sumi[j] = _mm256_add_epi32(
                  sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, load256(y[j][i].qs + 128 * h + 32 * s)), sp));
          }
        }
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j)
          acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[i].d) * f32(y[j][i].d)), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) out[j] = kThree ? hsum(acc[j]) : hsum(acc[j]) - hsum(acc_m[j]);
    }
  };
};
template <int K>
using DotQ2K = DotQ23K<false>::Rows<K>;
template <int K>
using DotQ3K = DotQ23K<true>::Rows<K>;

// ---- activation quantizers: bit-exact with the scalar reference -----------------------------

inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
// roundf(): nearest, ties away from zero. v - trunc(v) is exact, so the tie test is exact.
inline __m256 round_half_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = abs_ps(_mm256_sub_ps(v, t));
  const __m256 step = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
  return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}
// Four vectors of 8 integral floats -> 32 int8 in element order.
inline __m256i pack_i8(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256i a = _mm256_packs_epi32(_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1));
  const __m256i b = _mm256_packs_epi32(_mm256_cvtps_epi32(v2), _mm256_cvtps_epi32(v3));
  // packs works per 128-bit lane; the permute restores element order.
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
inline uint16_t to_fp16(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

// Returns d; writes the 32 codes.
inline float quantize_block_q8(const float* x, int8_t* qs, __m256i* codes) {
  const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
  const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(abs_ps(v0), abs_ps(v1)), _mm256_max_ps(abs_ps(v2), abs_ps(v3)));
  const float d = hmax(m) / 127.0f;
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  *codes = pack_i8(round_half_away(_mm256_mul_ps(v0, id)), round_half_away(_mm256_mul_ps(v1, id)),
                   round_half_away(_mm256_mul_ps(v2, id)), round_half_away(_mm256_mul_ps(v3, id)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), *codes);
  return d;
}

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  Q8_0* b = static_cast<Q8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    __m256i codes;
    const uint16_t d = to_fp16(quantize_block_q8(x, b[i].qs, &codes));
    std::memcpy(b[i].d, &d, 2);
  }
}
void quantize_q8_1(const float* x, void* dst, int64_t n) {
  Q8_1* b = static_cast<Q8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    __m256i codes;
    const float df = quantize_block_q8(x, b[i].qs, &codes);
    // sum of the int8 codes: maddubs with 1s sign-extends pairs exactly.
    const int sum = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), codes), _mm256_set1_epi16(1)));
    const uint16_t d = to_fp16(df), s = to_fp16(static_cast<float>(sum) * df);
    std::memcpy(b[i].d, &d, 2);
    std::memcpy(b[i].s, &s, 2);
  }
}

void quantize_q8_k(const float* x, void* dst, int64_t n) {
  Q8_K* b = static_cast<Q8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
    const float amax = hmax(m);
    float d = 0.0f;
    if (amax == 0.0f) {
      std::memset(b[i].qs, 0, 256);
    } else {
      // The reference keeps the first element of largest magnitude (its sign matters).
      int first = 0;
      const __m256 vmax = _mm256_set1_ps(amax);
      for (int j = 0; j < 256; j += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), vmax, _CMP_EQ_OQ));
        if (mask) {
          first = j + __builtin_ctz(static_cast<unsigned>(mask));
          break;
        }
      }
      const float iscale = -127.0f / x[first];
      const __m256 is = _mm256_set1_ps(iscale);
      const __m256i cap = _mm256_set1_epi32(127);
      for (int j = 0; j < 256; j += 32) {
        __m256 v[4];
        for (int k = 0; k < 4; ++k) {
          // cvtps rounds to nearest even (MXCSR default), as nearbyint does in the reference.
          const __m256i r =
              _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), is)), cap);
          v[k] = _mm256_cvtepi32_ps(r);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + j), pack_i8(v[0], v[1], v[2], v[3]));
      }
      d = 1.0f / iscale;
    }
    std::memcpy(b[i].d, &d, 4);
    // Group sums of 16: maddubs(1, q) sums pairs, madd sums quads, then two hadds finish.
    for (int g = 0; g < 16; g += 2) {
      const __m256i q = load256(b[i].qs + 16 * g);
      const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
      const __m128i lo = _mm256_castsi256_si128(s4), hi = _mm256_extracti128_si256(s4, 1);
      const int16_t s0 = static_cast<int16_t>(_mm_extract_epi32(lo, 0) + _mm_extract_epi32(lo, 1) +
                                              _mm_extract_epi32(lo, 2) + _mm_extract_epi32(lo, 3));
      const int16_t s1 = static_cast<int16_t>(_mm_extract_epi32(hi, 0) + _mm_extract_epi32(hi, 1) +
                                              _mm_extract_epi32(hi, 2) + _mm_extract_epi32(hi, 3));
      std::memcpy(b[i].bsums + 2 * g, &s0, 2);
      std::memcpy(b[i].bsums + 2 * g + 2, &s1, 2);
    }
  }
}

constexpr uint32_t id(TensorType t) { return static_cast<uint32_t>(t); }

KernelTable make_table() {
  KernelTable t = kernels_scalar();  // dequantization stays scalar
  t.isa = "avx2";
  set_vec_dot<dot_f32>(t, TensorType::F32);
  set_vec_dot<dot_f16>(t, TensorType::F16);
  set_vec_dot<dot_bf16>(t, TensorType::BF16);
  set_q8_kernels<SignTransferDot>(t);  // Q8_0, Q4_0, MXFP4
  set_vec_dot<dot_q5_0>(t, TensorType::Q5_0);
  set_vec_dot<dot_q_1<Q4_1, false>>(t, TensorType::Q4_1);
  set_vec_dot<dot_q_1<Q5_1, true>>(t, TensorType::Q5_1);
  set_vec_dot<dot_one<DotQ2K>>(t, TensorType::Q2_K, dot_multi<DotQ2K>);
  set_vec_dot<dot_one<DotQ3K>>(t, TensorType::Q3_K, dot_multi<DotQ3K>);
  set_vec_dot<dot_one<DotQ4K>>(t, TensorType::Q4_K, dot_multi<DotQ4K>);
  set_groups(t, TensorType::Q4_K, {repack_q4_k_group8, group_bytes_q4_k, q45k_group_dot<false>});
  set_vec_dot<dot_one<DotQ5K>>(t, TensorType::Q5_K, dot_multi<DotQ5K>);
  set_groups(t, TensorType::Q5_K, {repack_q5_k_group8, group_bytes_q5_k, q45k_group_dot<true>});
  set_vec_dot<dot_one<DotQ6K>>(t, TensorType::Q6_K, dot_multi<DotQ6K>);
  t.quantize_act[id(TensorType::Q8_0)] = quantize_q8_0;
  t.quantize_act[id(TensorType::Q8_1)] = quantize_q8_1;
  t.quantize_act[id(TensorType::Q8_K)] = quantize_q8_k;
  return t;
}

}  // namespace

// Called only once the CPU is known to have AVX2, FMA and F16C (quant_dispatch.cpp checks).
const KernelTable* avx2_table() {
  static const KernelTable table = make_table();
  return &table;
}

}  // namespace moelite::cpu
