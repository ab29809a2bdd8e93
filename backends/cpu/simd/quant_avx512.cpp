// AVX-512 (F/BW/VL/DQ + VNNI) kernels for the hot weight types; every other entry comes from
// the AVX2 table (any AVX-512 CPU has AVX2). Nothing here runs before kernels_avx512() has
// checked the CPU.
//
// 512-bit registers hold 64 weights, i.e. two 32-element sub-blocks. Signed x signed int8
// (Q8_0) uses VNNI vpdpbusd with sign transfer: |w| as the unsigned operand, a with w's sign.
// K-quant codes are unsigned, so maddubs (u8 x s8 -> s16 pairs) feeds vpdpwssd, which
// multiplies by the 16-bit sub-block scale and accumulates in one instruction. As in the AVX2
// file, activation int8s are in [-127, 127].
#include <immintrin.h>

// GCC 12's AVX-512 headers build "undefined" vectors as `__m512i __Y = __Y;`, which its own
// -Wuninitialized then reports at every inlined use (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstring>

#include "backends/cpu/quant.h"
#include "platforms/platform.h"

namespace moelite::cpu {
namespace {

using namespace blocks;

inline float fp16(const uint8_t p[2]) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline float f32(const uint8_t p[4]) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1); }
inline __m512 join_scales(float lo, float hi) {
  return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

// ---- float types ----------------------------------------------------------------------------

template <typename Load>
float dot_float_row(int64_t n, const float* a, Load load) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(load(i, 0xffff), _mm512_loadu_ps(a + i), acc0);
    acc1 = _mm512_fmadd_ps(load(i + 16, 0xffff), _mm512_loadu_ps(a + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(load(i + 32, 0xffff), _mm512_loadu_ps(a + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(load(i + 48, 0xffff), _mm512_loadu_ps(a + i + 48), acc3);
  }
  for (; i < n; i += 16) {
    // Masked loads cover the tail: masked-out lanes read as 0 and are never touched in memory.
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    acc0 = _mm512_fmadd_ps(load(i, m), _mm512_maskz_loadu_ps(m, a + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

void dot_f32(int64_t n, float* out, const void* w, const void* a) {
  const float* x = static_cast<const float*>(w);
  *out = dot_float_row(n, static_cast<const float*>(a),
                       [x](int64_t i, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x + i); });
}
void dot_f16(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  *out = dot_float_row(n, static_cast<const float*>(a), [x](int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + 2 * i));
  });
}
void dot_bf16(int64_t n, float* out, const void* w, const void* a) {
  const uint8_t* x = static_cast<const uint8_t*>(w);
  *out = dot_float_row(n, static_cast<const float*>(a), [x](int64_t i, __mmask16 m) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  });
}

// ---- Q8_0 -----------------------------------------------------------------------------------

// 16 int32 partial sums of w*a over 64 signed bytes.
inline __m512i dot_s8(__m512i w, __m512i a) {
  const __mmask64 neg = _mm512_movepi8_mask(w);
  const __m512i a_signed = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), a_signed);
}

void dot_q8_0(int64_t n, float* out, const void* w, const void* a) {
  const Q8_0* x = static_cast<const Q8_0*>(w);
  const Q8_0* y = static_cast<const Q8_0*>(a);
  const int64_t nb = n / kQK;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const __m512i p0 = dot_s8(join(load256(x[i].qs), load256(x[i + 1].qs)),
                              join(load256(y[i].qs), load256(y[i + 1].qs)));
    const __m512i p1 = dot_s8(join(load256(x[i + 2].qs), load256(x[i + 3].qs)),
                              join(load256(y[i + 2].qs), load256(y[i + 3].qs)));
    acc0 = _mm512_fmadd_ps(join_scales(fp16(x[i].d) * fp16(y[i].d), fp16(x[i + 1].d) * fp16(y[i + 1].d)),
                           _mm512_cvtepi32_ps(p0), acc0);
    acc1 = _mm512_fmadd_ps(join_scales(fp16(x[i + 2].d) * fp16(y[i + 2].d), fp16(x[i + 3].d) * fp16(y[i + 3].d)),
                           _mm512_cvtepi32_ps(p1), acc1);
  }
  for (; i < nb; ++i) {
    // Single blocks in the low half; the high half multiplies zeros.
    const __m512i p = dot_s8(_mm512_zextsi256_si512(load256(x[i].qs)), _mm512_zextsi256_si512(load256(y[i].qs)));
    acc0 = _mm512_fmadd_ps(join_scales(fp16(x[i].d) * fp16(y[i].d), 0.0f), _mm512_cvtepi32_ps(p), acc0);
  }
  *out = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// ---- K-quants -------------------------------------------------------------------------------

// Q4_K/Q5_K packed scales -> bytes 0..7 scales, 8..15 mins (see unpack_scales_q4k). Built in
// registers to avoid a store-forwarding stall.
inline __m128i q4k_scales_mins(const uint8_t p[12]) {
  uint32_t a[3];
  std::memcpy(a, p, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  return _mm_setr_epi32(static_cast<int>(a[0] & m6),
                        static_cast<int>((a[2] & m4) | (((a[0] >> 6) & m2) << 4)),
                        static_cast<int>(a[1] & m6),
                        static_cast<int>(((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4)));
}

// Index vector for permutexvar_epi16: 256-bit half h of the result repeats int16 lane (lo, hi).
inline __m512i halves_idx(int lo, int hi) {
  return join(_mm256_set1_epi16(static_cast<short>(lo)), _mm256_set1_epi16(static_cast<short>(hi)));
}
// Quarter q (8 int16 lanes = one 16-element group after maddubs) repeats lane first + q.
inline __m512i quarters_idx(int first) {
  const __m128i q0 = _mm_set1_epi16(static_cast<short>(first)), q1 = _mm_set1_epi16(static_cast<short>(first + 1));
  const __m128i q2 = _mm_set1_epi16(static_cast<short>(first + 2)), q3 = _mm_set1_epi16(static_cast<short>(first + 3));
  return join(_mm256_set_m128i(q1, q0), _mm256_set_m128i(q3, q2));
}

// Q4_K / Q5_K. Each 32-byte chunk c of qs holds sub-block 2c in its low nibbles and 2c+1 in
// its high nibbles; broadcasting the chunk to both 256-bit halves and shifting the upper half by
// 4 gives [sb 2c | sb 2c+1], which lines up with 64 contiguous activations.
template <bool kFive, typename Block>
void dot_q45_k(int64_t n, float* out, const void* w, const void* a) {
  const Block* x = static_cast<const Block*>(w);
  const Q8_K* y = static_cast<const Q8_K*>(a);
  const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
  const __m512i nibble_shift = join(_mm256_setzero_si256(), _mm256_set1_epi16(4));
  const __m512i idx[4] = {halves_idx(0, 1), halves_idx(2, 3), halves_idx(4, 5), halves_idx(6, 7)};
  __m512 acc = _mm512_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float da = f32(y[i].d);
    const __m256i sm = _mm256_cvtepu8_epi16(q4k_scales_mins(x[i].scales));
    const __m256i bs = load256(y[i].bsums);
    const __m128i bs_pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    const __m128i pm = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs_pairs);
    acc_m = _mm_fmadd_ps(_mm_set1_ps(fp16(x[i].dmin) * da), _mm_cvtepi32_ps(pm), acc_m);

    const __m512i sc = _mm512_zextsi256_si512(sm);  // lanes 0..7: the 8 scales
    __m512i hbits = _mm512_setzero_si512();
    if constexpr (kFive) {
      // [qh | qh >> 1]: bit 0 of each half is then the 5th bit of sub-block 2c resp. 2c+1.
      hbits = _mm512_srlv_epi16(_mm512_broadcast_i64x4(load256(x[i].qh)),
                                join(_mm256_setzero_si256(), _mm256_set1_epi16(1)));
    }
    __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i chunk = _mm512_broadcast_i64x4(load256(x[i].qs + 32 * c));
      __m512i q = _mm512_and_si512(_mm512_srlv_epi16(chunk, nibble_shift), m4);
      if constexpr (kFive) {
        q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(hbits, one), 4));
        hbits = _mm512_srli_epi16(hbits, 2);
      }
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q, load512(y[i].qs + 64 * c)),
                                 _mm512_permutexvar_epi16(idx[c], sc));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(fp16(x[i].d) * da), _mm512_cvtepi32_ps(sumi), acc);
  }
  __m128 m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  *out = _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
}

// Q6_K. Per 128-element half, the 64 ql bytes' low nibbles are elements 0..63 in order and the
// high nibbles elements 64..127; qh supplies bit pairs (0,2) and (4,6) for the two halves.
void dot_q6_k(int64_t n, float* out, const void* w, const void* a) {
  const Q6_K* x = static_cast<const Q6_K*>(w);
  const Q8_K* y = static_cast<const Q8_K*>(a);
  const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3);
  const __m512i idx[4] = {quarters_idx(0), quarters_idx(4), quarters_idx(8), quarters_idx(12)};
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(load128(x[i].scales));
    const __m512i sc = _mm512_zextsi256_si512(sc16);
    // Codes are stored +32: remove 32 * sum_g scale_g * bsum_g.
    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y[i].bsums)), 5);
    __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(off));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = load512(x[i].ql + 64 * h);
      const __m256i qh256 = load256(x[i].qh + 32 * h);
      const __m512i qh = join(qh256, _mm256_srli_epi16(qh256, 2));
      const __m512i q_lo = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qh, m3), 4));
      const __m512i q_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m3), 4));
      const int8_t* q8 = y[i].qs + 128 * h;
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q_lo, load512(q8)),
                                 _mm512_permutexvar_epi16(idx[2 * h], sc));
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q_hi, load512(q8 + 64)),
                                 _mm512_permutexvar_epi16(idx[2 * h + 1], sc));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(fp16(x[i].d) * f32(y[i].d)), _mm512_cvtepi32_ps(sumi), acc);
  }
  *out = _mm512_reduce_add_ps(acc);
}

constexpr uint32_t id(TensorType t) { return static_cast<uint32_t>(t); }

KernelTable make_table(const KernelTable& base) {
  KernelTable t = base;
  t.isa = "avx512";
  t.vec_dot[id(TensorType::F32)] = dot_f32;
  t.vec_dot[id(TensorType::F16)] = dot_f16;
  t.vec_dot[id(TensorType::BF16)] = dot_bf16;
  t.vec_dot[id(TensorType::Q8_0)] = dot_q8_0;
  t.vec_dot[id(TensorType::Q4_K)] = dot_q45_k<false, Q4_K>;
  t.vec_dot[id(TensorType::Q5_K)] = dot_q45_k<true, Q5_K>;
  t.vec_dot[id(TensorType::Q6_K)] = dot_q6_k;
  return t;
}

}  // namespace

const KernelTable* kernels_avx512() {
  const platform::CpuFeatures& f = platform::cpu_features();
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni)) return nullptr;
  const KernelTable* base = kernels_avx2();
  if (!base) return nullptr;
  static const KernelTable table = make_table(*base);
  return &table;
}

}  // namespace moelite::cpu
