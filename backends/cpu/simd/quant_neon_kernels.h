// The integer dot products of the AArch64 tables, written once and instantiated by each of
// quant_neon.cpp (ARMv8.0), quant_dotprod_neon.cpp (sdot) and quant_i8mm_neon.cpp (smmla) with an
// `Isa` policy that supplies the int8 multiply-accumulate:
//   Isa::dot16(acc, w, a)   int32x4 += 16 int8 products w*a (lanes hold partial sums: only the
//                           lane total is ever used, so the lane layout may differ per ISA)
//   Isa::kTile              whether Isa::tile_group (two weight rows x two activation rows per
//                           instruction, see unit_sums) exists; only the i8mm policy has it.
// Everything here has internal linkage on purpose: every file that includes this header is
// compiled with its own -march, and a shared (comdat) inline function could otherwise be taken
// from the sdot-compiled file by the linker and run on an ARMv8.0 core.
//
// Structure of every kernel: weight codes are decoded into int8x16 "chunks" in element order,
// four groups (16 or 32 elements, one scale each) at a time; unit_sums() turns them into one
// int32 lane per group for each of K activation rows (exact integer sums); the group scales are
// then applied in integers (K-quants) or in float per 32-element block (legacy types). A kernel
// is written once for R weight rows (1, or 2 for a tile) and K activation rows (each weight
// block is decoded once and shared by the K rows, each activation scale is read once and shared
// by the R rows), and each (weight row, activation row) pair runs the same float operations
// whatever R and K are, so vec_dot_multi and the tile are bit-identical to vec_dot — also across
// ISAs that compute the exact integer sums differently (smmla vs sdot).
#pragma once
#include <arm_neon.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "backends/cpu/quant.h"

namespace moelite::cpu {
namespace {

using namespace blocks;

// ---- loads and conversions --------------------------------------------------------------------

inline int8x16_t load_s8(const void* p) { return vld1q_s8(static_cast<const int8_t*>(p)); }
inline uint8x16_t load_u8(const void* p) { return vld1q_u8(static_cast<const uint8_t*>(p)); }
inline int8x16_t as_s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }
// fp16 -> fp32 in hardware (FCVT is ARMv8.0): exact, like fp16_to_fp32.
inline float fp16(const uint8_t p[2]) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return h;
}
inline float f32(const uint8_t p[4]) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
// The fp16 fields of `count` (<= 4) consecutive blocks, `stride` bytes apart, as 4 floats; lanes
// past count are 0 so a partial group of blocks adds exact zeros.
inline float32x4_t fp16x4(const uint8_t* first, size_t stride, int count) {
  uint16_t h[4] = {0, 0, 0, 0};
  for (int k = 0; k < count; ++k) std::memcpy(&h[k], first + k * stride, 2);
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}
// Q8_K's 16 int16 group sums (any alignment: loaded as bytes).
inline int16x8x2_t q8k_bsums(const Q8_K& b) {
  return {{vreinterpretq_s16_u8(load_u8(b.bsums)), vreinterpretq_s16_u8(load_u8(b.bsums + 16))}};
}
// Scales of groups 4u..4u+3 from 16 int16 scales (s[0]: groups 0..7, s[1]: 8..15).
inline int32x4_t scales4(const int16x8_t s[2], int u) {
  const int16x8_t h = s[u / 2];
  return (u % 2) ? vmovl_high_s16(h) : vmovl_s16(vget_low_s16(h));
}
// sum_i a[i] * b[i] over 8 int16 pairs (products fit int32; the total is exact).
inline int dot8_s16(int16x8_t a, int16x8_t b) {
  return vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(a), vget_low_s16(b)), a, b));
}

template <typename Block>
inline const Block* act_row(const void* a, size_t stride, int j) {
  return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(a) + static_cast<size_t>(j) * stride);
}

// ---- ISA policies -------------------------------------------------------------------------------

// ARMv8.0: widening multiplies. An int8 weight times an activation in [-127, 127] is at most
// 128 * 127 in magnitude, so two such products (vmull + vmlal) still fit int16; the pairwise
// widening add then moves them to int32.
struct IsaNeon {
  static constexpr bool kTile = false;
  static int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a) {
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(a)), w, a);
    return vpadalq_s16(acc, p);
  }
};

#if defined(__ARM_FEATURE_DOTPROD)
// ARMv8.2 sdot: four 4-element int8 dot products accumulated into int32 lanes, one instruction.
struct IsaDotprod {
  static constexpr bool kTile = false;
  static int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a) { return vdotq_s32(acc, w, a); }
};
#endif

// ---- group sums -------------------------------------------------------------------------------

// One activation row: lane g = sum over group g (G chunks of 16) of w*a, for g < ng (<= 4);
// lanes >= ng are 0 and their activations are never read. Group g's activations start at
// a + g * stride, its chunks follow each other.
template <class Isa, int G>
inline int32x4_t row_sums(const int8x16_t* w, const int8_t* a, size_t stride, int ng) {
  int32x4_t p[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    p[g] = vdupq_n_s32(0);
    if (g < ng) {
#pragma GCC unroll 2
      for (int c = 0; c < G; ++c) p[g] = Isa::dot16(p[g], w[g * G + c], load_s8(a + g * stride + 16 * c));
    }
  }
  // Pairwise adds reduce the four partial-sum vectors to one lane each.
  return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

// ---- two weight rows (tiles) ------------------------------------------------------------------
// A tile policy's 2x8 operand is 8 bytes of each of the two weight rows: the 64-bit zips of their
// chunks, zip_lo (bytes 0..7 of row 0, then of row 1) and zip_hi (bytes 8..15).

// Activation row pairs of a tile: rows 2p and 2p + 1, the last one alone when K is odd.
constexpr int pairs_of(int K) { return (K + 1) / 2; }

inline uint8x16_t zip_lo(uint8x16_t a, uint8x16_t b) {
  return vreinterpretq_u8_u64(vzip1q_u64(vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b)));
}
inline uint8x16_t zip_hi(uint8x16_t a, uint8x16_t b) {
  return vreinterpretq_u8_u64(vzip2q_u64(vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b)));
}
inline int8x16_t zip_lo(int8x16_t a, int8x16_t b) { return as_s8(zip_lo(vreinterpretq_u8_s8(a), vreinterpretq_u8_s8(b))); }
inline int8x16_t zip_hi(int8x16_t a, int8x16_t b) { return as_s8(zip_hi(vreinterpretq_u8_s8(a), vreinterpretq_u8_s8(b))); }
// In a tiled K-quant kernel the two weight rows' bytes are zipped as loaded, and the decoder then
// works on the two zips (v[0] = zip_lo, v[1] = zip_hi) as it would on two rows. Every decoding
// step of those kernels is bytewise (masks, shifts by a constant, or, subtract), so this gives
// the zips of the decoded chunks directly: the tile's operands, with no zip per decoded chunk.
template <bool kZip, class V>
inline void zip_rows(V v[2]) {
  if constexpr (kZip) {
    const V lo = zip_lo(v[0], v[1]), hi = zip_hi(v[0], v[1]);
    v[0] = lo;
    v[1] = hi;
  }
}

// R weight rows (w[r]: that row's chunks) and K activation rows (a[j]): out[r][j] as row_sums.
// Two weight rows with a tile policy go through Isa::tile_group, which gives, per activation
// pair p and group g, t[p][g] = [w0.a(2p), w0.a(2p+1), w1.a(2p), w1.a(2p+1)] (for a lone last
// row [w0.a, -, w1.a, -]); a 4x4 transpose per pair turns that into one lane per group.
template <class Isa, int R, int K, int G>
inline void unit_sums(const int8x16_t* const* w, const int8_t* const* a, size_t stride, int ng, int32x4_t (*out)[K]) {
  if constexpr (R == 2 && Isa::kTile) {
    int32x4_t t[pairs_of(K)][4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      for (int p = 0; p < pairs_of(K); ++p) t[p][g] = vdupq_n_s32(0);
      if (g < ng) {
        int8x16_t wl[G], wh[G];
        for (int c = 0; c < G; ++c) wl[c] = zip_lo(w[0][g * G + c], w[1][g * G + c]), wh[c] = zip_hi(w[0][g * G + c], w[1][g * G + c]);
        const int8_t* ag[K];
        for (int j = 0; j < K; ++j) ag[j] = a[j] + g * stride;
        int32x4_t tg[pairs_of(K)];
        for (int p = 0; p < pairs_of(K); ++p) tg[p] = vdupq_n_s32(0);
        Isa::template tile_group<K, G>(wl, wh, ag, tg);
        for (int p = 0; p < pairs_of(K); ++p) t[p][g] = tg[p];
      }
    }
    for (int p = 0; p < pairs_of(K); ++p) {
      const int32x4_t lo01 = vtrn1q_s32(t[p][0], t[p][1]), lo23 = vtrn1q_s32(t[p][2], t[p][3]);
      out[0][2 * p] = vreinterpretq_s32_s64(vtrn1q_s64(vreinterpretq_s64_s32(lo01), vreinterpretq_s64_s32(lo23)));
      out[1][2 * p] = vreinterpretq_s32_s64(vtrn2q_s64(vreinterpretq_s64_s32(lo01), vreinterpretq_s64_s32(lo23)));
      if (2 * p + 1 < K) {
        const int32x4_t hi01 = vtrn2q_s32(t[p][0], t[p][1]), hi23 = vtrn2q_s32(t[p][2], t[p][3]);
        out[0][2 * p + 1] = vreinterpretq_s32_s64(vtrn1q_s64(vreinterpretq_s64_s32(hi01), vreinterpretq_s64_s32(hi23)));
        out[1][2 * p + 1] = vreinterpretq_s32_s64(vtrn2q_s64(vreinterpretq_s64_s32(hi01), vreinterpretq_s64_s32(hi23)));
      }
    }
  } else {
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) out[r][j] = row_sums<Isa, G>(w[r], a[j], stride, ng);
  }
}

// ---- kernel entry points ----------------------------------------------------------------------

// Fn<Isa, R, K>::run(n, out, out_stride, w, w_stride, a, a_stride) computes R weight rows
// against K activation rows (out[r * out_stride + j]); vec_dot is its R = 1, K = 1 instance,
// vec_dot_multi R = 1 and the tile R = 2.
template <template <class, int, int> class Fn, class Isa>
void dot_one(int64_t n, float* out, const void* w, const void* a) {
  Fn<Isa, 1, 1>::run(n, out, 0, w, 0, a, 0);
}
template <template <class, int, int> class Fn, class Isa, int R>
void dot_rows(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a, size_t stride,
              int count) {
  switch (count) {
    case 1: Fn<Isa, R, 1>::run(n, out, out_stride, w, w_stride, a, stride); break;
    case 2: Fn<Isa, R, 2>::run(n, out, out_stride, w, w_stride, a, stride); break;
    case 3: Fn<Isa, R, 3>::run(n, out, out_stride, w, w_stride, a, stride); break;
    default: Fn<Isa, R, 4>::run(n, out, out_stride, w, w_stride, a, stride); break;
  }
}
template <template <class, int, int> class Fn, class Isa>
void dot_multi(int64_t n, float* out, const void* w, const void* a, size_t stride, int count) {
  dot_rows<Fn, Isa, 1>(n, out, 0, w, 0, a, stride, count);
}
template <template <class, int, int> class Fn, class Isa>
void dot_tile(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a, size_t stride,
              int count) {
  dot_rows<Fn, Isa, kTileRows>(n, out, out_stride, w, w_stride, a, stride, count);
}
static_assert(kMultiDot == 4, "dot_rows dispatches counts 1..4");
static_assert(kTileRows == 2, "tiles are two weight rows");

template <typename Block>
inline const Block* weight_row(const void* w, size_t stride, int r) {
  return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(w) + static_cast<size_t>(r) * stride);
}

// ---- 32-element block types -------------------------------------------------------------------
// Decoders: the block's 32 codes as two int8x16 chunks (elements 0..15, 16..31).

// Element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of byte j - 16.
inline void nibbles(const uint8_t qs[16], int8x16_t w[2]) {
  const uint8x16_t q = load_u8(qs);
  w[0] = as_s8(vandq_u8(q, vdupq_n_u8(0x0f)));
  w[1] = as_s8(vshrq_n_u8(q, 4));
}
// Adds the 5th bit of Q5_0/Q5_1 codes: bit j of the little-endian u32 qh is bit 4 of element j.
inline void add_fifth_bits(const uint8_t qh_bytes[4], int8x16_t w[2]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const uint8x8_t bytes = vreinterpret_u8_u32(vdup_n_u32(qh));
  const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));  // 1, 2, 4, .. per lane
  // Lane j of chunk c reads byte 2c + j / 8 of qh and tests bit j % 8.
  const uint8x16_t b0 = vcombine_u8(vdup_lane_u8(bytes, 0), vdup_lane_u8(bytes, 1));
  const uint8x16_t b1 = vcombine_u8(vdup_lane_u8(bytes, 2), vdup_lane_u8(bytes, 3));
  const uint8x16_t sixteen = vdupq_n_u8(0x10);
  w[0] = vorrq_s8(w[0], as_s8(vandq_u8(vtstq_u8(b0, bit), sixteen)));
  w[1] = vorrq_s8(w[1], as_s8(vandq_u8(vtstq_u8(b1, bit), sixteen)));
}

// Each decoder's block scales, `count` consecutive blocks from `first` (the rest 0): fp16 `d` for
// every type but MXFP4.
template <class Block>
inline float32x4_t fp16_scales(const Block* first, int count) {
  return fp16x4(first->d, sizeof(Block), count);
}

struct DecQ8_0 {
  using Block = Q8_0;
  using Act = Q8_0;
  static float32x4_t scales(const Block* first, int count) { return fp16_scales(first, count); }
  static void codes(const Block& b, int8x16_t w[2]) {
    w[0] = load_s8(b.qs);
    w[1] = load_s8(b.qs + 16);
  }
};
struct DecQ4_0 {
  using Block = Q4_0;
  using Act = Q8_0;
  static float32x4_t scales(const Block* first, int count) { return fp16_scales(first, count); }
  static void codes(const Block& b, int8x16_t w[2]) {
    nibbles(b.qs, w);
    w[0] = vsubq_s8(w[0], vdupq_n_s8(8));
    w[1] = vsubq_s8(w[1], vdupq_n_s8(8));
  }
};
// MXFP4: a nibble indexes the (doubled) E2M1 values; the scale is the E8M0 byte's 2^(e - 128).
struct DecMxfp4 {
  using Block = MXFP4;
  using Act = Q8_0;
  static float32x4_t scales(const Block* first, int count) {
    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < count; ++k) f[k] = mxfp4_half_scale(first[k].e);
    return vld1q_f32(f);
  }
  static void codes(const Block& b, int8x16_t w[2]) {
    nibbles(b.qs, w);
    const int8x16_t values = vld1q_s8(kMxfp4Values);
    w[0] = vqtbl1q_s8(values, vreinterpretq_u8_s8(w[0]));
    w[1] = vqtbl1q_s8(values, vreinterpretq_u8_s8(w[1]));
  }
};
struct DecQ5_0 {
  using Block = Q5_0;
  using Act = Q8_0;
  static float32x4_t scales(const Block* first, int count) { return fp16_scales(first, count); }
  static void codes(const Block& b, int8x16_t w[2]) {
    nibbles(b.qs, w);
    add_fifth_bits(b.qh, w);
    w[0] = vsubq_s8(w[0], vdupq_n_s8(16));
    w[1] = vsubq_s8(w[1], vdupq_n_s8(16));
  }
};
// Q4_1 / Q5_1: unsigned codes; the min term m * s is added per block (Act = Q8_1).
struct DecQ4_1 {
  using Block = Q4_1;
  using Act = Q8_1;
  static float32x4_t scales(const Block* first, int count) { return fp16_scales(first, count); }
  static void codes(const Block& b, int8x16_t w[2]) { nibbles(b.qs, w); }
};
struct DecQ5_1 {
  using Block = Q5_1;
  using Act = Q8_1;
  static float32x4_t scales(const Block* first, int count) { return fp16_scales(first, count); }
  static void codes(const Block& b, int8x16_t w[2]) {
    nibbles(b.qs, w);
    add_fifth_bits(b.qh, w);
  }
};

// Four blocks per step: their four exact integer sums land in one int32x4 per (weight row,
// activation row), so the float scaling is one multiply and one fused multiply-add for four
// blocks. Each pair keeps one float lane per block position (block i in lane i % 4), reduced once
// at the end.
template <class Dec>
struct DotBlocks {
  using Block = typename Dec::Block;
  using Act = typename Dec::Act;
  static constexpr bool kMin = std::is_same_v<Act, Q8_1>;  // Q4_1 / Q5_1: + m * s per block

  template <class Isa, int R, int K>
  struct Rows {
    // Blocks i .. i + ng - 1 (ng <= 4).
    __attribute__((always_inline)) static inline void step(const Block* const* x, const Act* const* y, int64_t i,
                                                           int ng, float32x4_t (*acc)[K], float32x4_t (*acc_m)[K]) {
      int8x16_t w[R][8];
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          if (g < ng) {
            Dec::codes(x[r][i + g], w[r] + 2 * g);
          } else {
            w[r][2 * g] = w[r][2 * g + 1] = vdupq_n_s8(0);
          }
        }
      const int8x16_t* wp[R];
      for (int r = 0; r < R; ++r) wp[r] = w[r];
      const int8_t* ap[K];
      for (int j = 0; j < K; ++j) ap[j] = y[j][i].qs;
      int32x4_t s[R][K];
      unit_sums<Isa, R, K, 2>(wp, ap, sizeof(Act), ng, s);
      float32x4_t da[K];
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) da[j] = fp16x4(y[j][i].d, sizeof(Act), ng);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        const float32x4_t dw = Dec::scales(&x[r][i], ng);
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const float32x4_t d = vmulq_f32(dw, da[j]);
          acc[r][j] = vfmaq_f32(acc[r][j], d, vcvtq_f32_s32(s[r][j]));
        }
      }
      if constexpr (kMin) {
        float32x4_t sa[K];
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) sa[j] = fp16x4(y[j][i].s, sizeof(Act), ng);
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          const float32x4_t m = fp16x4(x[r][i].m, sizeof(Block), ng);
#pragma GCC unroll 4
          for (int j = 0; j < K; ++j) acc_m[r][j] = vfmaq_f32(acc_m[r][j], m, sa[j]);
        }
      }
    }

    static void run(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                    size_t stride) {
      const Block* x[R];
      const Act* y[K];
      float32x4_t acc[R][K], acc_m[R][K];
      for (int r = 0; r < R; ++r) x[r] = weight_row<Block>(w, w_stride, r);
      for (int j = 0; j < K; ++j) y[j] = act_row<Act>(a, stride, j);
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < K; ++j) acc[r][j] = acc_m[r][j] = vdupq_n_f32(0.0f);
      const int64_t nb = n / kQK;
      int64_t i = 0;
      for (; i + 4 <= nb; i += 4) step(x, y, i, 4, acc, acc_m);
      if (i < nb) step(x, y, i, static_cast<int>(nb - i), acc, acc_m);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j)
          out[r * out_stride + j] =
              kMin ? vaddvq_f32(acc[r][j]) + vaddvq_f32(acc_m[r][j]) : vaddvq_f32(acc[r][j]);
    }
  };
};
template <class Isa, int R, int K>
using DotQ8_0 = DotBlocks<DecQ8_0>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotQ4_0 = DotBlocks<DecQ4_0>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotQ5_0 = DotBlocks<DecQ5_0>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotMxfp4 = DotBlocks<DecMxfp4>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotQ4_1 = DotBlocks<DecQ4_1>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotQ5_1 = DotBlocks<DecQ5_1>::Rows<Isa, R, K>;

// ---- K-quants -----------------------------------------------------------------------------------
// Per super-block and row: sumi = sum_g scale_g * (group sum), all in int32 (bounded by 2^28 for
// every type), then one float step sum = fma(d * da, sumi, sum), as the scalar reference does.
// NEON multiplies signed by signed, so Q3_K and Q6_K use their signed codes directly (no bsum
// offset correction as on x86); the mins of Q2_K/Q4_K/Q5_K come from the activation's bsums.

// The float step of one super-block for row j, kept in one place so every kernel rounds alike.
inline void kquant_step(float d, float dmin, float da, int sumi, int mins, float& acc, float& acc_m) {
  acc = std::fma(d * da, static_cast<float>(sumi), acc);
  acc_m = std::fma(dmin * da, static_cast<float>(mins), acc_m);
}

// Per super-block state shared by the K-quant kernels: R weight and K activation row pointers,
// float accumulators per (weight row, activation row) and the exact integer sums of the current
// super-block. Those are kept per pair with one lane per group (isum, reduced at the end), or
// with a tile policy and two weight rows (kTiled) in the tile's own layout: one vector per
// activation pair with one lane per (weight row, activation row), the group scales multiplied in
// lane by lane (no transpose needed, since a super-block only needs each pair's total). kTiled
// kernels decode zipped rows (zip_rows), so add_unit's w[0], w[1] are the zip_lo / zip_hi chunks.
template <class Isa, int R, int K>
struct SuperRows {
  static constexpr bool kTiled = R == 2 && Isa::kTile;
  static constexpr int P = pairs_of(K);
  const Q8_K* y[K];
  float acc[R][K], acc_m[R][K];
  int32x4_t isum[R][K];
  int32x4_t tsum[P];  // kTiled: lanes [w0.a(2p), w0.a(2p+1), w1.a(2p), w1.a(2p+1)]
  SuperRows(const void* a, size_t stride) {
    for (int j = 0; j < K; ++j) y[j] = act_row<Q8_K>(a, stride, j);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < K; ++j) acc[r][j] = acc_m[r][j] = 0.0f;
  }
  void begin() {
    if constexpr (kTiled) {
      for (int p = 0; p < P; ++p) tsum[p] = vdupq_n_s32(0);
    } else {
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < K; ++j) isum[r][j] = vdupq_n_s32(0);
    }
  }
  // Adds the four groups of the current unit: w[r] the chunks of weight row r, activations at
  // qs + offset, groups 16 * G bytes apart, sc[r] the four group scales of weight row r.
  template <int G>
  __attribute__((always_inline)) void add_unit(const int8x16_t* const* w, int64_t i, int offset,
                                               const int32x4_t* sc) {
    const int8_t* ap[K];
    for (int j = 0; j < K; ++j) ap[j] = y[j][i].qs + offset;
    if constexpr (kTiled) {
      // Scales of group g in the tile's lanes: [s0g, s0g, s1g, s1g].
      const int32x4_t z[2] = {vzip1q_s32(sc[0], sc[1]), vzip2q_s32(sc[0], sc[1])};
      int32x4_t sg[4];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) sg[2 * h] = vzip1q_s32(z[h], z[h]), sg[2 * h + 1] = vzip2q_s32(z[h], z[h]);
      // One group at a time, so only that group's weights and P accumulators are live.
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const int8_t* ag[K];
        for (int j = 0; j < K; ++j) ag[j] = ap[j] + 16 * G * g;
        int32x4_t t[P];
        for (int p = 0; p < P; ++p) t[p] = vdupq_n_s32(0);
        Isa::template tile_group<K, G>(w[0] + G * g, w[1] + G * g, ag, t);
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) tsum[p] = vmlaq_s32(tsum[p], t[p], sg[g]);
      }
    } else {
      int32x4_t s[R][K];
      unit_sums<Isa, R, K, G>(w, ap, 16 * G, 4, s);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) isum[r][j] = vmlaq_s32(isum[r][j], s[r][j], sc[r]);
    }
  }
  // The current super-block's integer sum of each (weight row, activation row) pair.
  __attribute__((always_inline)) void sums(int (*out)[K]) const {
    if constexpr (kTiled) {
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) {
        int lane[4];
        vst1q_s32(lane, tsum[p]);
#pragma GCC unroll 2
        for (int r = 0; r < 2; ++r)
          for (int q = 0; q < 2 && 2 * p + q < K; ++q) out[r][2 * p + q] = lane[2 * r + q];
      }
    } else {
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < K; ++j) out[r][j] = vaddvq_s32(isum[r][j]);
    }
  }
  void finish(float* out, size_t out_stride) const {
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < K; ++j) out[r * out_stride + j] = acc[r][j] - acc_m[r][j];
  }
};

// Q4_K/Q5_K packed scales -> bytes 0..7 scales, 8..15 mins (see unpack_scales_q4k), built with
// 32-bit masks and shifts (four bytes per operation) instead of a loop over bytes.
inline uint8x16_t q4k_scales_mins(const uint8_t p[12]) {
  uint32_t a[3];
  std::memcpy(a, p, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  const uint32_t v[4] = {a[0] & m6, (a[2] & m4) | (((a[0] >> 6) & m2) << 4), a[1] & m6,
                         ((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4)};
  return vreinterpretq_u8_u32(vld1q_u32(v));
}
// Q3_K packed scales -> 16 int8 scales with the -32 offset applied (see unpack_scales_q3k).
inline int8x16_t q3k_scales(const uint8_t p[12]) {
  uint32_t a[3];
  std::memcpy(a, p, 12);
  const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
  const uint32_t v[4] = {(a[0] & m4) | ((a[2] & m2) << 4), (a[1] & m4) | (((a[2] >> 2) & m2) << 4),
                         ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4), ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)};
  return vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(v)), vdupq_n_s8(32));
}
inline void widen_scales(int8x16_t s8, int16x8_t out[2]) {
  out[0] = vmovl_s8(vget_low_s8(s8));
  out[1] = vmovl_high_s8(s8);
}

// Q4_K / Q5_K: sub-blocks of 32; the 32-byte chunk c of qs holds sub-block 2c in its low nibbles
// and 2c + 1 in its high nibbles; Q5_K's qh[l] bit 2c (2c + 1) is the 5th bit of element l of
// sub-block 2c (2c + 1). A unit is half a super-block: sub-blocks 4u .. 4u + 3.
template <bool kFive, class Block>
struct DotQ45K {
  template <class Isa, int R, int K>
  struct Rows {
    static void run(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                    size_t stride) {
      const Block* x[R];
      for (int r = 0; r < R; ++r) x[r] = weight_row<Block>(w, w_stride, r);
      SuperRows<Isa, R, K> rows(a, stride);
      constexpr bool kZip = SuperRows<Isa, R, K>::kTiled;
      const uint8x16_t m4 = vdupq_n_u8(0x0f), sixteen = vdupq_n_u8(0x10);
      for (int64_t i = 0; i < n / kQKK; ++i) {
        int16x8_t sc[R][2], mins[R];
        uint8x16_t qh[2][R];  // [h][row], or [h][zip] when tiled
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          const uint8x16_t sm = q4k_scales_mins(x[r][i].scales);
          sc[r][0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(sm)));
          sc[r][1] = vdupq_n_s16(0);
          mins[r] = vreinterpretq_s16_u16(vmovl_high_u8(sm));
          qh[0][r] = qh[1][r] = vdupq_n_u8(0);
          if constexpr (kFive) qh[0][r] = load_u8(x[r][i].qh), qh[1][r] = load_u8(x[r][i].qh + 16);
        }
        if constexpr (kFive) zip_rows<kZip>(qh[0]), zip_rows<kZip>(qh[1]);
        rows.begin();
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          int8x16_t q[R][8];
          const int8x16_t* qp[R];
          int32x4_t scu[R];
#pragma GCC unroll 2
          for (int cc = 0; cc < 2; ++cc) {
            const int c = 2 * u + cc;
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              uint8x16_t bytes[R];
              for (int r = 0; r < R; ++r) bytes[r] = load_u8(x[r][i].qs + 32 * c + 16 * h);
              zip_rows<kZip>(bytes);
#pragma GCC unroll 2
              for (int r = 0; r < R; ++r) {
                uint8x16_t lo = vandq_u8(bytes[r], m4), hi = vshrq_n_u8(bytes[r], 4);
                if constexpr (kFive) {
                  lo = vorrq_u8(lo, vandq_u8(vtstq_u8(qh[h][r], vdupq_n_u8(1 << (2 * c))), sixteen));
                  hi = vorrq_u8(hi, vandq_u8(vtstq_u8(qh[h][r], vdupq_n_u8(2 << (2 * c))), sixteen));
                }
                q[r][4 * cc + h] = as_s8(lo);      // sub-block 2c, elements 16h ..
                q[r][4 * cc + 2 + h] = as_s8(hi);  // sub-block 2c + 1
              }
            }
          }
          for (int r = 0; r < R; ++r) qp[r] = q[r], scu[r] = scales4(sc[r], u);
          rows.template add_unit<2>(qp, i, 128 * u, scu);
        }
        float d[R], dmin[R];
        for (int r = 0; r < R; ++r) d[r] = fp16(x[r][i].d), dmin[r] = fp16(x[r][i].dmin);
        int sumi[R][K];
        rows.sums(sumi);
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const Q8_K& b = rows.y[j][i];
          const int16x8x2_t bs = q8k_bsums(b);
          // Sub-block sums of the activations: adjacent pairs of the 16-element group sums.
          const int16x8_t sub = vpaddq_s16(bs.val[0], bs.val[1]);
          const float da = f32(b.d);
#pragma GCC unroll 2
          for (int r = 0; r < R; ++r) {
            const int mn = dot8_s16(mins[r], sub);
            kquant_step(d[r], dmin[r], da, sumi[r][j], mn, rows.acc[r][j], rows.acc_m[r][j]);
          }
        }
      }
      rows.finish(out, out_stride);
    }
  };
};
template <class Isa, int R, int K>
using DotQ4K = DotQ45K<false, Q4_K>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotQ5K = DotQ45K<true, Q5_K>::Rows<Isa, R, K>;

// Q2_K / Q3_K: groups of 16; per 128-element half h the 32 bytes qs[32h ..] hold elements
// 128h + 32s + l in bit pair s of byte l. A unit covers bit pairs s, s + 1 (64 elements).
// Q3_K's 3rd bit: bit 4h + s of hmask[l]; the code is low2 - 4 unless it is set.
template <bool kThree, class Block>
struct DotQ23K {
  template <class Isa, int R, int K>
  struct Rows {
    static void run(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                    size_t stride) {
      const Block* x[R];
      for (int r = 0; r < R; ++r) x[r] = weight_row<Block>(w, w_stride, r);
      SuperRows<Isa, R, K> rows(a, stride);
      constexpr bool kZip = SuperRows<Isa, R, K>::kTiled;
      const uint8x16_t m3 = vdupq_n_u8(3), one = vdupq_n_u8(1);
      for (int64_t i = 0; i < n / kQKK; ++i) {
        int16x8_t sc[R][2];
        int16x8x2_t mins[R] = {};
        uint8x16_t hm[R][2];  // [row or zip][k % 2]
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          hm[r][0] = hm[r][1] = vdupq_n_u8(0);
          if constexpr (kThree) {
            widen_scales(q3k_scales(x[r][i].scales), sc[r]);
            hm[r][0] = load_u8(x[r][i].hmask);
            hm[r][1] = load_u8(x[r][i].hmask + 16);
          } else {
            const uint8x16_t raw = load_u8(x[r][i].scales);
            widen_scales(as_s8(vandq_u8(raw, vdupq_n_u8(0x0f))), sc[r]);
            widen_scales(as_s8(vshrq_n_u8(raw, 4)), mins[r].val);
          }
        }
        if constexpr (kThree && kZip) {
          for (int k = 0; k < 2; ++k) {
            uint8x16_t v[2] = {hm[0][k], hm[1][k]};
            zip_rows<kZip>(v);
            hm[0][k] = v[0], hm[1][k] = v[1];
          }
        }
        rows.begin();
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          uint8x16_t q[R][2];
          for (int r = 0; r < R; ++r) q[r][0] = load_u8(x[r][i].qs + 32 * h), q[r][1] = load_u8(x[r][i].qs + 32 * h + 16);
          if constexpr (kZip) {
            for (int k = 0; k < 2; ++k) {
              uint8x16_t v[2] = {q[0][k], q[1][k]};
              zip_rows<kZip>(v);
              q[0][k] = v[0], q[1][k] = v[1];
            }
          }
#pragma GCC unroll 2
          for (int half_unit = 0; half_unit < 2; ++half_unit) {
            int8x16_t codes[R][4];
            const int8x16_t* cp[R];
            int32x4_t scu[R];
            const int u = 2 * h + half_unit;
#pragma GCC unroll 2
            for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
              for (int k = 0; k < 4; ++k) {  // bit pair s = 2 * half_unit + k / 2, bytes 16 * (k % 2) ..
                uint8x16_t c = vandq_u8(q[r][k % 2], m3);
                if constexpr (kThree) {
                  c = vorrq_u8(c, vshlq_n_u8(vandq_u8(hm[r][k % 2], one), 2));  // low2 + 4 * hbit
                  c = vreinterpretq_u8_s8(vsubq_s8(as_s8(c), vdupq_n_s8(4)));
                  if (k % 2) hm[r][0] = vshrq_n_u8(hm[r][0], 1), hm[r][1] = vshrq_n_u8(hm[r][1], 1);
                }
                codes[r][k] = as_s8(c);
                if (k % 2) q[r][0] = vshrq_n_u8(q[r][0], 2), q[r][1] = vshrq_n_u8(q[r][1], 2);
              }
              cp[r] = codes[r];
              scu[r] = scales4(sc[r], u);
            }
            rows.template add_unit<1>(cp, i, 64 * u, scu);
          }
        }
        float d[R], dmin[R];
        for (int r = 0; r < R; ++r) {
          d[r] = fp16(x[r][i].d);
          dmin[r] = 0.0f;
          if constexpr (!kThree) dmin[r] = fp16(x[r][i].dmin);
        }
        int sumi[R][K];
        rows.sums(sumi);
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const Q8_K& b = rows.y[j][i];
          const float da = f32(b.d);
          int16x8x2_t bs{};
          if constexpr (!kThree) bs = q8k_bsums(b);
#pragma GCC unroll 2
          for (int r = 0; r < R; ++r) {
            int mn = 0;
            if constexpr (!kThree) mn = dot8_s16(mins[r].val[0], bs.val[0]) + dot8_s16(mins[r].val[1], bs.val[1]);
            kquant_step(d[r], dmin[r], da, sumi[r][j], mn, rows.acc[r][j], rows.acc_m[r][j]);
          }
        }
      }
      rows.finish(out, out_stride);
    }
  };
};
template <class Isa, int R, int K>
using DotQ2K = DotQ23K<false, Q2_K>::Rows<Isa, R, K>;
template <class Isa, int R, int K>
using DotQ3K = DotQ23K<true, Q3_K>::Rows<Isa, R, K>;

// Q6_K: signed codes (6 bits - 32), groups of 16. Per 128-element half h (ql += 64h, qh += 32h):
// elements l and l + 32 take the low nibbles of ql[l], ql[l + 32] with qh[l] bits 0-1 and 2-3;
// elements l + 64 and l + 96 the high nibbles with bits 4-5 and 6-7. Unit 2h + 1 is the high
// nibbles. The 2 high bits are moved to bits 4-5 with one shift and one mask.
template <class Isa, int R, int K>
struct DotQ6K {
  static void run(int64_t n, float* out, size_t out_stride, const void* w, size_t w_stride, const void* a,
                  size_t stride) {
    const Q6_K* x[R];
    for (int r = 0; r < R; ++r) x[r] = weight_row<Q6_K>(w, w_stride, r);
    SuperRows<Isa, R, K> rows(a, stride);
    constexpr bool kZip = SuperRows<Isa, R, K>::kTiled;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30);
    const int8x16_t off = vdupq_n_s8(32);
    for (int64_t i = 0; i < n / kQKK; ++i) {
      int16x8_t sc[R][2];
      for (int r = 0; r < R; ++r) widen_scales(load_s8(x[r][i].scales), sc[r]);
      rows.begin();
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        uint8x16_t ql[R][4], qh[R][2];  // [row or zip][k]
        int8x16_t q[R][4];
        const int8x16_t* qp[R];
        int32x4_t scu[R];
        for (int r = 0; r < R; ++r) {
          for (int k = 0; k < 4; ++k) ql[r][k] = load_u8(x[r][i].ql + 64 * h + 16 * k);
          for (int k = 0; k < 2; ++k) qh[r][k] = load_u8(x[r][i].qh + 32 * h + 16 * k);
        }
        if constexpr (kZip) {
          for (int k = 0; k < 4; ++k) {
            uint8x16_t v[2] = {ql[0][k], ql[1][k]};
            zip_rows<kZip>(v);
            ql[0][k] = v[0], ql[1][k] = v[1];
          }
          for (int k = 0; k < 2; ++k) {
            uint8x16_t v[2] = {qh[0][k], qh[1][k]};
            zip_rows<kZip>(v);
            qh[0][k] = v[0], qh[1][k] = v[1];
          }
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          // Unit 2h: chunk k is elements 16k .. of the half: ql[k] low nibble, qh[k % 2] bits
          // (0-1) for k < 2, (2-3) for k >= 2.
          for (int k = 0; k < 4; ++k) {
            const uint8x16_t hb = k < 2 ? vshlq_n_u8(qh[r][k % 2], 4) : vshlq_n_u8(qh[r][k % 2], 2);
            q[r][k] = vsubq_s8(as_s8(vorrq_u8(vandq_u8(ql[r][k], m4), vandq_u8(hb, m30))), off);
          }
          qp[r] = q[r];
          scu[r] = scales4(sc[r], 2 * h);
        }
        rows.template add_unit<1>(qp, i, 128 * h, scu);
        // Unit 2h + 1: high nibbles, qh bits (4-5) for k < 2, (6-7) for k >= 2.
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          for (int k = 0; k < 4; ++k) {
            const uint8x16_t hb = k < 2 ? qh[r][k % 2] : vshrq_n_u8(qh[r][k % 2], 2);
            q[r][k] = vsubq_s8(as_s8(vorrq_u8(vshrq_n_u8(ql[r][k], 4), vandq_u8(hb, m30))), off);
          }
          scu[r] = scales4(sc[r], 2 * h + 1);
        }
        rows.template add_unit<1>(qp, i, 128 * h + 64, scu);
      }
      float d[R];
      for (int r = 0; r < R; ++r) d[r] = fp16(x[r][i].d);
      int sumi[R][K];
      rows.sums(sumi);
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        const float da = f32(rows.y[j][i].d);
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) kquant_step(d[r], 0.0f, da, sumi[r][j], 0, rows.acc[r][j], rows.acc_m[r][j]);
      }
    }
    rows.finish(out, out_stride);
  }
};

// A type's vec_dot (K = 1) and multi-dot from one kernel and one ISA, always set together (and
// no tile: a table copied from another loses the other's tile for this type).
template <template <class, int, int> class Fn, class Isa>
void set_kernel(KernelTable& t, TensorType type) {
  set_vec_dot<dot_one<Fn, Isa>>(t, type, dot_multi<Fn, Isa>);
}
// The same with a tile whose integer sums use TileIsa (exact, so any policy gives the same bits).
template <template <class, int, int> class Fn, class Isa, class TileIsa>
void set_kernel_tile(KernelTable& t, TensorType type) {
  set_vec_dot<dot_one<Fn, Isa>>(t, type, dot_multi<Fn, Isa>, dot_tile<Fn, TileIsa>);
}
// Every quantized weight type with one ISA policy.
template <class Isa>
void set_quantized_kernels(KernelTable& t) {
  set_kernel<DotQ8_0, Isa>(t, TensorType::Q8_0);
  set_kernel<DotQ4_0, Isa>(t, TensorType::Q4_0);
  set_kernel<DotQ5_0, Isa>(t, TensorType::Q5_0);
  set_kernel<DotMxfp4, Isa>(t, TensorType::MXFP4);
  set_kernel<DotQ4_1, Isa>(t, TensorType::Q4_1);
  set_kernel<DotQ5_1, Isa>(t, TensorType::Q5_1);
  set_kernel<DotQ2K, Isa>(t, TensorType::Q2_K);
  set_kernel<DotQ3K, Isa>(t, TensorType::Q3_K);
  set_kernel<DotQ4K, Isa>(t, TensorType::Q4_K);
  set_kernel<DotQ5K, Isa>(t, TensorType::Q5_K);
  set_kernel<DotQ6K, Isa>(t, TensorType::Q6_K);
}

}  // namespace
}  // namespace moelite::cpu
