// ARMv8.6 int8 matrix-multiply table ("i8mm"): the dotprod table plus SMMLA tiles (two weight
// rows against up to four activation rows, KernelTable::tile) for the batched (prefill) products.
// Compiled with -march=armv8.2-a+dotprod+i8mm (CMake); nothing here runs before kernels_i8mm() has
// seen both features at run time.
//
// SMMLA multiplies a 2x8 int8 matrix by an 8x2 one into a 2x2 int32 tile. In a tile the 2x8
// operand is 8 bytes of each of two weight rows (a 64-bit zip of their decoded 16-byte chunks, once
// per chunk) and the 8x2 operand 8 bytes of each of two activation rows, so each instruction gives
// 4 useful 8-element dot products (w0, w1) x (a_j, a_j+1): 32 multiply-adds, against 16 for one
// SDOT. A lone last activation row (odd count) pairs the weight halves with the activation chunk
// and its halves swapped: two of the four lanes are wanted, as with SDOT.
//
// vec_dot and vec_dot_multi (one weight row) are the dotprod table's SDOT kernels. An earlier
// version had an SMMLA multi-dot with two activation rows as the tile's rows and the low/high
// halves of one weight chunk as its columns, which wastes half of every tile and needs a zip per
// activation chunk and an ext per weight chunk: under tools/arm_instruction_count.sh (qemu,
// thousands of kernel instructions per prefill token) it lost to SDOT on every type (Q8_0 1028 vs
// 891, Q4_0 1236 vs 1023, Q4_K 1244 vs 933, Q6_K 1627 vs 1204), so one weight row stays on SDOT.
// Integer sums are exact either way and the float steps are the shared ones, so tiles, multi-dot
// and vec_dot are bit-identical. Not yet timed on i8mm hardware.
#include "backends/cpu/simd/quant_neon_kernels.h"
#include "platforms/platform.h"

#if !defined(__ARM_FEATURE_DOTPROD) || !defined(__ARM_FEATURE_MATMUL_INT8)
#error "quant_i8mm_neon.cpp must be compiled with +dotprod+i8mm (see CMakeLists.txt)"
#endif

namespace moelite::cpu {
namespace {

inline int64x2_t as_s64(int8x16_t v) { return vreinterpretq_s64_s8(v); }
inline int8x16_t zip_lo(int64x2_t a, int64x2_t b) { return vreinterpretq_s8_s64(vzip1q_s64(a, b)); }
inline int8x16_t zip_hi(int64x2_t a, int64x2_t b) { return vreinterpretq_s8_s64(vzip2q_s64(a, b)); }

struct IsaI8mm : IsaDotprod {
  static constexpr bool kTile = true;

  // Weight rows w0, w1 (chunks in element order, G per group, ng <= 4 groups) against K
  // activation rows a[j] (group g at a[j] + g * stride): t[p][g] = [w0.a(2p), w0.a(2p+1),
  // w1.a(2p), w1.a(2p+1)] summed over group g, or [w0.a(2p), -, w1.a(2p), -] for a lone last row;
  // zero for g >= ng (whose activations are never read).
  template <int K, int G>
  static void tile_groups(const int8x16_t* w0, const int8x16_t* w1, const int8_t* const* a, size_t stride, int ng,
                          int32x4_t (*t)[4]) {
    constexpr int P = pairs_of(K);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) t[p][g] = vdupq_n_s32(0);
      if (g < ng) {
#pragma GCC unroll 2
        for (int c = 0; c < G; ++c) {
          const int64x2_t x0 = as_s64(w0[g * G + c]), x1 = as_s64(w1[g * G + c]);
          // Tile rows: bytes 0..7 (then 8..15) of weight rows 0 and 1.
          const int8x16_t wlo = zip_lo(x0, x1), whi = zip_hi(x0, x1);
          const size_t off = g * stride + 16 * c;
#pragma GCC unroll 2
          for (int p = 0; p < P; ++p) {
            if (2 * p + 1 < K) {
              // Tile columns: the same bytes of activation rows 2p and 2p + 1.
              const int64x2_t y0 = as_s64(load_s8(a[2 * p] + off)), y1 = as_s64(load_s8(a[2 * p + 1] + off));
              t[p][g] = vmmlaq_s32(t[p][g], wlo, zip_lo(y0, y1));
              t[p][g] = vmmlaq_s32(t[p][g], whi, zip_hi(y0, y1));
            } else {
              // Columns bytes 0..7 and 8..15 of the one row: lanes 0 and 2 get the low halves'
              // products; then the swapped row puts the high halves' products there too.
              const int8x16_t y = load_s8(a[2 * p] + off);
              t[p][g] = vmmlaq_s32(t[p][g], wlo, y);
              t[p][g] = vmmlaq_s32(t[p][g], whi, vextq_s8(y, y, 8));
            }
          }
        }
      }
    }
  }
};

}  // namespace

const KernelTable* kernels_i8mm() {
  const platform::CpuFeatures& f = platform::cpu_features();
  if (!(f.dotprod && f.i8mm)) return nullptr;
  const KernelTable* base = kernels_dotprod();
  if (!base) return nullptr;
  static const KernelTable table = [base] {
    KernelTable t = *base;
    t.isa = "i8mm";
    // vec_dot and multi-dot: SDOT (as in the dotprod table); tile: SMMLA.
    set_kernel_tile<DotQ8_0, IsaDotprod, IsaI8mm>(t, TensorType::Q8_0);
    set_kernel_tile<DotQ4_0, IsaDotprod, IsaI8mm>(t, TensorType::Q4_0);
    set_kernel_tile<DotQ4K, IsaDotprod, IsaI8mm>(t, TensorType::Q4_K);
    set_kernel_tile<DotQ6K, IsaDotprod, IsaI8mm>(t, TensorType::Q6_K);
    return t;
  }();
  return &table;
}

}  // namespace moelite::cpu
