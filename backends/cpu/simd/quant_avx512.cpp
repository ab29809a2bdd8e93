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
#include "backends/cpu/simd/rows_entry.h"
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/x86_k16.h"
#include "backends/cpu/simd/x86_kquant.h"
#include "backends/cpu/simd/x86_q45k_groups.h"
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
inline __m512 join_scales(float lo, float hi) { return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1); }

// Every kernel below takes K activation rows and is written once for all K (rows_entry.h makes
// vec_dot and multi-dot of it): the weight block is loaded and decoded once, then each row runs
// exactly the operation sequence of the K = 1 instance in accumulators of its own. vec_dot is the
// K = 1 instance, so the multi-row entries are bit-identical to it by construction, not just close.

// ---- float types ----------------------------------------------------------------------------

// Load(i, mask) -> 16 weights as floats.
template <int K, typename Load>
void dot_float_rows(int64_t n, float* out, const void* a, size_t stride, Load load) {
  const float* y[K];
  __m512 acc[K][4];
  for (int j = 0; j < K; ++j) {
    y[j] = act_row<float>(a, stride, j);
    for (int u = 0; u < 4; ++u) acc[j][u] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 w0 = load(i, 0xffff), w1 = load(i + 16, 0xffff), w2 = load(i + 32, 0xffff), w3 = load(i + 48, 0xffff);
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) {
      acc[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(y[j] + i), acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(y[j] + i + 16), acc[j][1]);
      acc[j][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(y[j] + i + 32), acc[j][2]);
      acc[j][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(y[j] + i + 48), acc[j][3]);
    }
  }
  for (; i < n; i += 16) {
    // Masked loads cover the tail: masked-out lanes read as 0 and are never touched in memory.
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 wv = load(i, m);
#pragma GCC unroll 4
    for (int j = 0; j < K; ++j) acc[j][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, y[j] + i), acc[j][0]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < K; ++j)
    out[j] =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]), _mm512_add_ps(acc[j][2], acc[j][3])));
}

template <int K>
struct DotF32 {
  static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
    const float* x = static_cast<const float*>(w);
    dot_float_rows<K>(n, out, a, stride, [x](int64_t i, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x + i); });
  }
};
template <int K>
struct DotF16 {
  static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
    const uint8_t* x = static_cast<const uint8_t*>(w);
    dot_float_rows<K>(n, out, a, stride,
                      [x](int64_t i, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + 2 * i)); });
  }
};
template <int K>
struct DotBf16 {
  static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
    const uint8_t* x = static_cast<const uint8_t*>(w);
    dot_float_rows<K>(n, out, a, stride, [x](int64_t i, __mmask16 m) {
      const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + 2 * i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    });
  }
};

// ---- Q8_0 -----------------------------------------------------------------------------------

// One kernel, Q8Tile<NR, K>, gives vec_dot (1 x 1), multi-dot (1 x K) and the tile (2 x K): NR
// weight rows against K activation rows, every (row, activation) pair with an accumulator of its
// own and the same operation sequence, so all three are bit-identical by construction.
//
// Signed x signed int8 without per-row sign fix-ups: vpdpbusd takes the weights biased to
// unsigned (w + 128 = w ^ 0x80, one xor per weight vector) against the signed activations, and
// starts from -128 * sum(a), which depends on the activation only (one vpdpbusd against a vector
// of 128s per activation vector, shared by all NR rows). The int32 lane sums are exact, so they
// equal those of any other exact method.
//
// Per 4 blocks (two 512-bit vectors of 2 blocks each) and pair (r, j):
//   acc += (dw_k * da_k spread over the 8 lanes of block k) * float(lane sums), blocks 0-1 first,
// and one horizontal reduction per pair at the end. The scale products are exact-order
// independent (one float multiply each), so where they are formed does not matter.

// The fp16 scales of 4 consecutive 34-byte blocks as 4 floats: assembled in a general register
// (scalar loads and shifts, no vector inserts), one vcvtph2ps.
template <typename Block>
inline __m128 fp16x4(const Block* b) {
  uint16_t h[4];
  for (int k = 0; k < 4; ++k) std::memcpy(&h[k], b[k].d, 2);
  const uint64_t v = static_cast<uint64_t>(h[0]) | static_cast<uint64_t>(h[1]) << 16 |
                     static_cast<uint64_t>(h[2]) << 32 | static_cast<uint64_t>(h[3]) << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(v)));
}

// 4 blocks as two vectors whose 128-bit lane k holds bytes 0..15 (lo) resp. 16..31 (hi) of block
// k, so two chained vpdpbusd leave each block's sum in 4 int32 lanes (lane group k) and the float
// work (convert, scale, accumulate) is one vector per 4 blocks instead of two.
struct Quad {
  __m512i lo, hi;
};
inline Quad load_quad(const Q8_0* b) {
  const __m512i t01 = join(load256(b[0].qs), load256(b[1].qs));  // [b0 lo, b0 hi, b1 lo, b1 hi]
  const __m512i t23 = join(load256(b[2].qs), load256(b[3].qs));
  return {_mm512_shuffle_i64x2(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(t01, t23, _MM_SHUFFLE(3, 1, 3, 1))};
}
inline Quad xor_quad(Quad q, __m512i v) { return {_mm512_xor_si512(q.lo, v), _mm512_xor_si512(q.hi, v)}; }
// -128 * (per lane group, the sum of the signed bytes of q): the bias of an operand taken to
// unsigned by xor 0x80, taken back out.
inline __m512i neg_bias_quad(Quad q, __m512i bias) {
  const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, q.lo), bias, q.hi);
  return _mm512_sub_epi32(_mm512_setzero_si512(), s);
}

// Prepared activations (the `prepared` tile): the activation side of the loop below done once
// per token instead of once per group of weight rows. Row layout (n = 32 * nb):
//   per 4 blocks, 256 bytes: the Quad (lo 64, hi 64), -128 * its lane sums (16 int32) and the
//     4 scales spread over their lane groups (16 floats): the ac, aq and da of the loop below;
//   per remaining block, 64 bytes: qs (32), -128 * the lane sums of its zero-extended halves
//     (4 int32: lanes 0-3 of the tail's c), the scale (float), padding.
// The int32 lanes and float operations are those of the plain path, so results are the same bits.
constexpr size_t kPrepQuadBytes = 256, kPrepTailBytes = 64;

// The activation side of 4 blocks of one activation row: the Quad, -128 * its lane sums (formed
// only when kBias) and the scales spread over their lane groups, read from a prepared row or
// formed from the Q8_0 blocks of a plain one.
struct ActQuad {
  Quad q;
  __m512i neg128;
  __m512 d;
};
// `row` is the activation row, prepared or plain: blocks i.. of it, at byte `off` when prepared.
template <bool kPrepared, bool kBias = true>
inline ActQuad act_quad(const uint8_t* row, size_t off, int64_t i, __m512i bias, __m512i spread) {
  const uint8_t* p = row + off;
  const Q8_0* b = reinterpret_cast<const Q8_0*>(row) + i;
  if constexpr (kPrepared) {
    return {{load512(p), load512(p + 64)}, load512(p + 128), _mm512_loadu_ps(p + 192)};
  } else {
    const Quad q = load_quad(b);
    return {q, kBias ? neg_bias_quad(q, bias) : _mm512_setzero_si512(),
            _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(fp16x4(b)))};
  }
}
// One remaining block: its halves in lane group 0, -128 * their lane sums, the scale.
struct ActBlock {
  Quad q;
  __m512i neg128;
  float d;
};
template <bool kPrepared>
inline ActBlock act_block(const uint8_t* row, size_t off, int64_t i, __m512i bias) {
  const uint8_t* p = row + off;
  const Q8_0* b = reinterpret_cast<const Q8_0*>(row) + i;
  if constexpr (kPrepared) {
    return {{_mm512_zextsi128_si512(load128(p)), _mm512_zextsi128_si512(load128(p + 16))},
            _mm512_zextsi128_si512(load128(p + 32)), f32(p + 48)};
  } else {
    const Quad q = {_mm512_zextsi128_si512(load128(b->qs)), _mm512_zextsi128_si512(load128(b->qs + 16))};
    return {q, neg_bias_quad(q, bias), fp16(b->d)};
  }
}

template <int NR, int K, bool kPrepared = false>
struct Q8Tile {
  // The bias goes on the side with fewer vectors per call: the activations' when K <= NR (each
  // weight vector is xored, each activation's -128 * sum is formed once), else the weights'.
  // Prepared activations carry it already.
  static constexpr bool kBiasWeights = K <= NR || kPrepared;
  static void run(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                  size_t a_stride) {
    const Q8_0* x[NR];
    const uint8_t* y[K];  // plain Q8_0 rows or prepared rows
    __m512 acc[NR][K];
    for (int r = 0; r < NR; ++r) x[r] = act_row<Q8_0>(w, w_stride, r);
    for (int j = 0; j < K; ++j) y[j] = act_row<uint8_t>(a, a_stride, j);
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < K; ++j) acc[r][j] = _mm512_setzero_ps();
    const int64_t nb = n / kQK;
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int64_t i = 0;
    size_t off = 0;  // into prepared rows
    for (; i + 4 <= nb; i += 4, off += kPrepQuadBytes) {
      Quad wq[NR];
      __m512i wc[NR];
      __m512 dw[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const Q8_0* b = x[r] + i;
        const Quad q = load_quad(b);
        if constexpr (kBiasWeights) {
          wq[r] = xor_quad(q, bias);
        } else {
          wq[r] = q;
          wc[r] = neg_bias_quad(q, bias);
        }
        dw[r] = _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(fp16x4(b)));
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        const ActQuad a = act_quad<kPrepared, kBiasWeights>(y[j], off, i, bias, spread);
        const Quad aq = kBiasWeights ? a.q : xor_quad(a.q, bias);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          __m512i p;
          if constexpr (kBiasWeights)
            p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a.neg128, wq[r].lo, aq.lo), wq[r].hi, aq.hi);
          else
            p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(wc[r], aq.lo, wq[r].lo), aq.hi, wq[r].hi);
          acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], a.d), _mm512_cvtepi32_ps(p), acc[r][j]);
        }
      }
    }
    for (; i < nb; ++i, off += kPrepTailBytes) {
      // Single blocks in lane group 0 (lo: bytes 0..15, hi: 16..31); the other lanes multiply zeros.
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        const ActBlock a = act_block<kPrepared>(y[j], off, i, bias);
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r) {
          const Quad wv = xor_quad({_mm512_zextsi128_si512(load128(x[r][i].qs)), _mm512_zextsi128_si512(load128(x[r][i].qs + 16))}, bias);
          // The zero lanes of w ^ 0x80 are 128s against zero activations: they add nothing.
          const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a.neg128, wv.lo, a.q.lo), wv.hi, a.q.hi);
          acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(fp16(x[r][i].d) * a.d), _mm512_cvtepi32_ps(p), acc[r][j]);
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < K; ++j) out[r * out_stride + j] = _mm512_reduce_add_ps(acc[r][j]);
  }
};

size_t prepared_bytes_q8_0(int64_t n) {
  const int64_t nb = n / kQK;
  return static_cast<size_t>(nb / 4) * kPrepQuadBytes + static_cast<size_t>(nb % 4) * kPrepTailBytes;
}
void prepare_q8_0(const void* a_row, int64_t n, void* out) {
  const Q8_0* y = static_cast<const Q8_0*>(a_row);
  uint8_t* o = static_cast<uint8_t*>(out);
  const int64_t nb = n / kQK;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4, o += kPrepQuadBytes) {
    const Quad q = load_quad(y + i);
    _mm512_storeu_si512(o, q.lo);
    _mm512_storeu_si512(o + 64, q.hi);
    _mm512_storeu_si512(o + 128, neg_bias_quad(q, bias));
    _mm512_storeu_ps(o + 192, _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(fp16x4(y + i))));
  }
  for (; i < nb; ++i, o += kPrepTailBytes) {
    const Quad av = {_mm512_zextsi128_si512(load128(y[i].qs)), _mm512_zextsi128_si512(load128(y[i].qs + 16))};
    std::memcpy(o, y[i].qs, 32);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm512_castsi512_si128(neg_bias_quad(av, bias)));
    const float da = fp16(y[i].d);
    std::memcpy(o + 48, &da, 4);
    std::memset(o + 52, 0, kPrepTailBytes - 52);
  }
}

// Entry points of a row-tile kernel Tile<NR, K, kPrepared>::run: vec_dot (1 x 1), multi-dot
// (1 x count), the tiles (NR x count), each dispatching count 1..kMultiDot to its instance.
template <template <int, int, bool> class Tile, int NR, bool kPrepared = false>
void tile_entry(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                size_t a_stride, int count) {
  switch (count) {
    case 1: Tile<NR, 1, kPrepared>::run(n, out, out_stride, w, w_stride, a, a_stride); break;
    case 2: Tile<NR, 2, kPrepared>::run(n, out, out_stride, w, w_stride, a, a_stride); break;
    case 3: Tile<NR, 3, kPrepared>::run(n, out, out_stride, w, w_stride, a, a_stride); break;
    default: Tile<NR, 4, kPrepared>::run(n, out, out_stride, w, w_stride, a, a_stride); break;
  }
}
template <template <int, int, bool> class Tile>
void tile_dot(int64_t n, float* out, const void* w, const void* a) {
  Tile<1, 1, false>::run(n, out, 1, w, 0, a, 0);
}
template <template <int, int, bool> class Tile>
void tile_multi(int64_t n, float* out, const void* w, const void* a, size_t stride, int count) {
  tile_entry<Tile, 1>(n, out, 1, w, 0, a, stride, count);
}
static_assert(kMultiDot == 4, "tile_entry dispatches counts 1..4");

// ---- Q4_0 -----------------------------------------------------------------------------------

// Q4Tile<NR, K, kPrepared>: Q8Tile's scheme for Q4_0 weights (x = d * (q - 8), q a nibble)
// against Q8_0 activations. The nibbles are unsigned already, so vpdpbusd takes them as they are
// and the accumulator starts at -8 * the activation's lane sums: Q8Tile's -128 * sum shifted right
// by 4 (exact, a multiple of 128), so prepared Q8_0 activations serve both types. Per 4 blocks one
// vector holds the blocks' 16 bytes (128-bit lane k = block k): its low nibbles are elements
// 0..15 (the Quad's lo), its high nibbles 16..31 (hi), the activations' Quad layout. Same
// accumulators, operation order and reduction for vec_dot, multi-dot, tiles and prepared, so all
// are bit-identical.
inline Quad load_quad_q4(const Q4_0* b) {
  __m512i v = _mm512_castsi128_si512(load128(b[0].qs));
  v = _mm512_inserti32x4(v, load128(b[1].qs), 1);
  v = _mm512_inserti32x4(v, load128(b[2].qs), 2);
  v = _mm512_inserti32x4(v, load128(b[3].qs), 3);
  const __m512i m = _mm512_set1_epi8(0x0F);
  return {_mm512_and_si512(v, m), _mm512_and_si512(_mm512_srli_epi16(v, 4), m)};
}

template <int NR, int K, bool kPrepared = false>
struct Q4Tile {
  static void run(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                  size_t a_stride) {
    const Q4_0* x[NR];
    const uint8_t* y[K];  // plain Q8_0 rows or prepared rows
    __m512 acc[NR][K];
    for (int r = 0; r < NR; ++r) x[r] = act_row<Q4_0>(w, w_stride, r);
    for (int j = 0; j < K; ++j) y[j] = act_row<uint8_t>(a, a_stride, j);
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < K; ++j) acc[r][j] = _mm512_setzero_ps();
    const int64_t nb = n / kQK;
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int64_t i = 0;
    size_t off = 0;  // into prepared rows
    for (; i + 4 <= nb; i += 4, off += kPrepQuadBytes) {
      Quad wq[NR];
      __m512 dw[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        wq[r] = load_quad_q4(x[r] + i);
        dw[r] = _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(fp16x4(x[r] + i)));
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        const ActQuad a = act_quad<kPrepared>(y[j], off, i, bias, spread);
        const __m512i neg8 = _mm512_srai_epi32(a.neg128, 4);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(neg8, wq[r].lo, a.q.lo), wq[r].hi, a.q.hi);
          acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], a.d), _mm512_cvtepi32_ps(p), acc[r][j]);
        }
      }
    }
    for (; i < nb; ++i, off += kPrepTailBytes) {
      // Single blocks in lane group 0; the other lanes multiply zeros.
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        const ActBlock a = act_block<kPrepared>(y[j], off, i, bias);
        const __m512i neg8 = _mm512_srai_epi32(a.neg128, 4);
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r) {
          const __m512i v = _mm512_zextsi128_si512(load128(x[r][i].qs));
          const Quad wv = {_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low)};
          const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(neg8, wv.lo, a.q.lo), wv.hi, a.q.hi);
          acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(fp16(x[r][i].d) * a.d), _mm512_cvtepi32_ps(p), acc[r][j]);
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < K; ++j) out[r * out_stride + j] = _mm512_reduce_add_ps(acc[r][j]);
  }
};

// ---- K-quants -------------------------------------------------------------------------------

// Q4_K/Q5_K constants. scale_idx[c]: byte-shuffle indices that turn a vector whose 128-bit lanes
// each hold the 8 scale bytes into int16 lanes holding scale 2c in the low 256 bits and scale
// 2c + 1 in the high 256 bits (zero high bytes): a shuffle within 128-bit lanes instead of a
// permute across the vector (vpermw). nibble_shift: 0 in the low half, 4 in the high. In memory:
// built in registers they took about 30 instructions a call, and an expert's row is one call of
// only 4-8 super-blocks.
struct Q45KConstants {
  uint16_t scale_idx[4][32];
  uint16_t nibble_shift[32];
};
constexpr Q45KConstants make_q45k_constants() {
  Q45KConstants k{};
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) k.scale_idx[c][i] = static_cast<uint16_t>(0xff00 | (2 * c + (i >= 16 ? 1 : 0)));
  for (int i = 0; i < 32; ++i) k.nibble_shift[i] = i >= 16 ? 4 : 0;
  return k;
}
alignas(64) constexpr Q45KConstants kQ45K = make_q45k_constants();

// Q4_K / Q5_K. Each 32-byte chunk c of qs holds sub-block 2c in its low nibbles and 2c+1 in
// its high nibbles; broadcasting the chunk to both 256-bit halves and shifting the upper half by
// 4 gives [sb 2c | sb 2c+1], which lines up with 64 contiguous activations.
template <bool kFive, typename Block>
struct DotQ45K {
  template <int K>
  struct Rows {
    static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
      const Block* x = static_cast<const Block*>(w);
      const Q8_K* y[K];
      __m128 acc[K];  // lanes [acc, accm]: the float order of interleaved_rows.h (x86_q45k_groups.h)
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        y[j] = act_row<Q8_K>(a, stride, j);
        acc[j] = _mm_setzero_ps();
      }
      const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
      const __m512i nibble_shift = load512(kQ45K.nibble_shift);
      const __m512i idx[4] = {load512(kQ45K.scale_idx[0]), load512(kQ45K.scale_idx[1]), load512(kQ45K.scale_idx[2]),
                              load512(kQ45K.scale_idx[3])};
      for (int64_t i = 0; i < n / kQKK; ++i) {
        prefetch_row_ahead(x + i);
        // Weight side, once per super-block: codes, per-chunk scales, mins, d and dmin.
        const __m128i sm8 = q4k_scales_mins_vec(x[i].scales);  // 8 scales, 8 mins as bytes
        const __m128i mins = _mm_unpackhi_epi8(sm8, _mm_setzero_si128());
        const __m512i sc = _mm512_broadcast_i32x4(sm8);  // every 128-bit lane holds all 8 scales
        __m512i hbits = _mm512_setzero_si512();
        if constexpr (kFive) {
          // [qh | qh >> 1]: bit 0 of each half is then the 5th bit of sub-block 2c resp. 2c+1.
          hbits = _mm512_srlv_epi16(_mm512_broadcast_i64x4(load256(x[i].qh)),
                                    join(_mm256_setzero_si256(), _mm256_set1_epi16(1)));
        }
        __m512i q[4], s[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m512i chunk = _mm512_broadcast_i64x4(load256(x[i].qs + 32 * c));
          q[c] = _mm512_and_si512(_mm512_srlv_epi16(chunk, nibble_shift), m4);
          if constexpr (kFive) {
            q[c] = _mm512_or_si512(q[c], _mm512_slli_epi16(_mm512_and_si512(hbits, one), 4));
            hbits = _mm512_srli_epi16(hbits, 2);
          }
          s[c] = _mm512_shuffle_epi8(sc, idx[c]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const Q8_K& b = y[j][i];
          __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c)
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[c], load512(b.qs + 64 * c)), s[c]);
          const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
          const __m128i isum4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
          acc[j] = q4k_accumulate(acc[j], q4k_totals(isum4, mins, b.bsums), x[i].d, f32(b.d));
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

// Q2_K, Q3_K and Q6_K: 16 groups of 16 codes with 8-bit scales (x86_k16.h decodes a super-block
// and forms its integer lanes; Q2_K's mins have lanes and a float accumulator of their own).
template <class Format>
struct DotK16 {
  template <int K>
  struct Rows {
    static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
      const auto* x = static_cast<const typename Format::Block*>(w);
      const Q8_K* y[K];
      __m512 acc[K], acc_m[K];
      for (int j = 0; j < K; ++j) {
        y[j] = act_row<Q8_K>(a, stride, j);
        acc[j] = acc_m[j] = _mm512_setzero_ps();
      }
      for (int64_t i = 0; i < n / kQKK; ++i) {
        prefetch_row_ahead(x + i);
        const K16Decoded q = k16_decode<Format>(x[i]);
        const float d = fp16(x[i].d);
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const float da = f32(y[j][i].d);
          acc[j] =
              _mm512_fmadd_ps(_mm512_set1_ps(d * da), _mm512_cvtepi32_ps(k16_block_lanes<Format>(q, y[j][i])), acc[j]);
          if constexpr (Format::kMins)
            acc_m[j] = _mm512_fmadd_ps(_mm512_set1_ps(fp16(x[i].dmin) * da),
                                       _mm512_cvtepi32_ps(k16_min_lanes(q, y[j][i])), acc_m[j]);
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j)
        out[j] = Format::kMins ? _mm512_reduce_add_ps(acc[j]) - _mm512_reduce_add_ps(acc_m[j])
                               : _mm512_reduce_add_ps(acc[j]);
    }
  };
};
template <int K>
using DotQ2K = DotK16<Q2KFormat>::Rows<K>;
template <int K>
using DotQ3K = DotK16<Q3KFormat>::Rows<K>;
template <int K>
using DotQ6K = DotK16<Q6KFormat>::Rows<K>;

constexpr uint32_t id(TensorType t) { return static_cast<uint32_t>(t); }

KernelTable make_table(const KernelTable& base) {
  KernelTable t = base;
  t.isa = "avx512";
  set_vec_dot<dot_one<DotF32>>(t, TensorType::F32, dot_multi<DotF32>);
  set_vec_dot<dot_one<DotF16>>(t, TensorType::F16, dot_multi<DotF16>);
  set_vec_dot<dot_one<DotBf16>>(t, TensorType::BF16, dot_multi<DotBf16>);
  set_vec_dot<tile_dot<Q8Tile>>(t, TensorType::Q8_0, tile_multi<Q8Tile>, tile_entry<Q8Tile, kTileRows>,
                                 tile_entry<Q8Tile, kQuadRows>);
  set_prepared(t, TensorType::Q8_0, {prepare_q8_0, prepared_bytes_q8_0, tile_entry<Q8Tile, kQuadRows, true>, kQuadRows});
  // Q4_0 reads the same (prepared) Q8_0 activations.
  set_vec_dot<tile_dot<Q4Tile>>(t, TensorType::Q4_0, tile_multi<Q4Tile>, tile_entry<Q4Tile, kTileRows>,
                                tile_entry<Q4Tile, kQuadRows>);
  set_prepared(t, TensorType::Q4_0, {prepare_q8_0, prepared_bytes_q8_0, tile_entry<Q4Tile, kQuadRows, true>, kQuadRows});
  set_vec_dot<dot_one<DotQ4K>>(t, TensorType::Q4_K, dot_multi<DotQ4K>);
  set_groups(t, TensorType::Q4_K, {repack_q4_k_group8, group_bytes_q4_k, q45k_group_dot<false>});
  set_vec_dot<dot_one<DotQ5K>>(t, TensorType::Q5_K, dot_multi<DotQ5K>);
  set_groups(t, TensorType::Q5_K, {repack_q5_k_group8, group_bytes_q5_k, q45k_group_dot<true>});
  set_vec_dot<dot_one<DotQ2K>>(t, TensorType::Q2_K, dot_multi<DotQ2K>);
  set_vec_dot<dot_one<DotQ3K>>(t, TensorType::Q3_K, dot_multi<DotQ3K>);
  set_vec_dot<dot_one<DotQ6K>>(t, TensorType::Q6_K, dot_multi<DotQ6K>);
  return t;
}

}  // namespace

// Called only once the CPU is known to have AVX-512 (F, BW, VL, DQ, VNNI) and the avx2 table's
// instructions (quant_dispatch.cpp checks).
const KernelTable* avx512_table() {
  static const KernelTable table = make_table(*avx2_table());
  return &table;
}

}  // namespace moelite::cpu
