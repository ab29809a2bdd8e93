// ARMv8.6 int8 matrix-multiply table ("i8mm"): the dotprod table plus SMMLA tiles
// (KernelTable::tile: two weight rows against up to four activation rows) for every quantized
// type, which the matmul drivers use for the batched (prefill) products and, with one activation
// row, for decode. Compiled with -march=armv8.2-a+dotprod+i8mm (CMake); nothing here runs before
// kernels_i8mm() has seen both features at run time.
//
// SMMLA multiplies a 2x8 int8 matrix by an 8x2 one into a 2x2 int32 tile. In a tile the 2x8
// operand is 8 bytes of each of the two weight rows (the 64-bit zips of their chunks; the K-quant
// kernels zip the raw bytes and decode the zips, see zip_rows) and the 8x2 operand the same 8
// bytes of two activation rows, so each instruction gives 4 useful 8-element dot products
// (w0, w1) x (a_j, a_j+1): 32 multiply-adds, against 16 for one SDOT. A lone last activation row
// (odd count) pairs the weight zips with the activation chunk and its halves swapped: two of the
// four lanes are wanted, as with SDOT.
//
// vec_dot and vec_dot_multi (one weight row) are the dotprod table's SDOT kernels. An earlier
// version had an SMMLA multi-dot with two activation rows as the tile's rows and the low/high
// halves of one weight chunk as its columns: half of every tile wasted, plus a zip per activation
// chunk and an ext per weight chunk. Under tools/arm_instruction_count.sh (qemu, thousands of
// kernel instructions per prefill token) it lost to SDOT on every type (Q8_0 1028 vs 891, Q4_0
// 1236 vs 1023, Q4_K 1244 vs 933, Q6_K 1627 vs 1204), so one weight row stays on SDOT. With the
// tiles (and -fno-schedule-insns, see CMakeLists.txt) i8mm vs dotprod is Q8_0 645 vs 860, Q4_0
// 770 vs 999, Q4_K 696 vs 882, Q6_K 882 vs 1060, and 0.70-0.83x on the other quantized types.
// Integer sums are exact either way and the float steps are the shared ones, so tiles, multi-dot
// and vec_dot are bit-identical. Not yet timed on i8mm hardware.
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/quant_neon_kernels.h"
#include "platforms/platform.h"

#if !defined(__ARM_FEATURE_DOTPROD) || !defined(__ARM_FEATURE_MATMUL_INT8)
#error "quant_i8mm_neon.cpp must be compiled with +dotprod+i8mm (see CMakeLists.txt)"
#endif

namespace moelite::cpu {
namespace {

struct IsaI8mm : IsaDotprod {
  static constexpr bool kTile = true;

  // One group of G 16-byte chunks of two weight rows, given as their 64-bit zips (wl[c]: bytes
  // 0..7 of row 0 then of row 1, wh[c]: bytes 8..15; the tile's 2x8 operand), against K activation
  // rows whose group starts at a[j]: t[p] += [w0.a(2p), w0.a(2p+1), w1.a(2p), w1.a(2p+1)], or
  // [w0.a(2p), -, w1.a(2p), -] for a lone last row.
  template <int K, int G>
  __attribute__((always_inline)) static inline void tile_group(const int8x16_t* wl, const int8x16_t* wh,
                                                               const int8_t* const* a, int32x4_t* t) {
#pragma GCC unroll 2
    for (int c = 0; c < G; ++c) {
      for (int p = 0; p < pairs_of(K); ++p) {
        if (2 * p + 1 < K) {
          // The 8x2 operand: the same bytes of activation rows 2p and 2p + 1.
          const int64x2_t y0 = vreinterpretq_s64_s8(load_s8(a[2 * p] + 16 * c));
          const int64x2_t y1 = vreinterpretq_s64_s8(load_s8(a[2 * p + 1] + 16 * c));
          t[p] = vmmlaq_s32(t[p], wl[c], vreinterpretq_s8_s64(vzip1q_s64(y0, y1)));
          t[p] = vmmlaq_s32(t[p], wh[c], vreinterpretq_s8_s64(vzip2q_s64(y0, y1)));
        } else {
          // Columns bytes 0..7 and 8..15 of the one row: lanes 0 and 2 get the low halves'
          // products; then the halves swapped put the high halves' products there too.
          const int8x16_t y = load_s8(a[2 * p] + 16 * c);
          t[p] = vmmlaq_s32(t[p], wl[c], y);
          t[p] = vmmlaq_s32(t[p], wh[c], vextq_s8(y, y, 8));
        }
      }
    }
  }
};

}  // namespace

// Called only once the CPU is known to have SDOT and SMMLA (quant_dispatch.cpp checks).
const KernelTable* i8mm_table() {
  const KernelTable* base = dotprod_table();
  static const KernelTable table = [base] {
    KernelTable t = *base;
    t.isa = "i8mm";
    // vec_dot and multi-dot: SDOT (as in the dotprod table); tile: SMMLA.
    set_kernel_tile<DotQ8_0, IsaDotprod, IsaI8mm>(t, TensorType::Q8_0);
    set_kernel_tile<DotQ4_0, IsaDotprod, IsaI8mm>(t, TensorType::Q4_0);
    set_kernel_tile<DotQ5_0, IsaDotprod, IsaI8mm>(t, TensorType::Q5_0);
    set_kernel_tile<DotMxfp4, IsaDotprod, IsaI8mm>(t, TensorType::MXFP4);
    set_kernel_tile<DotQ4_1, IsaDotprod, IsaI8mm>(t, TensorType::Q4_1);
    set_kernel_tile<DotQ5_1, IsaDotprod, IsaI8mm>(t, TensorType::Q5_1);
    set_kernel_tile<DotQ2K, IsaDotprod, IsaI8mm>(t, TensorType::Q2_K);
    set_kernel_tile<DotQ3K, IsaDotprod, IsaI8mm>(t, TensorType::Q3_K);
    set_kernel_tile<DotQ4K, IsaDotprod, IsaI8mm>(t, TensorType::Q4_K);
    set_kernel_tile<DotQ5K, IsaDotprod, IsaI8mm>(t, TensorType::Q5_K);
    set_kernel_tile<DotQ6K, IsaDotprod, IsaI8mm>(t, TensorType::Q6_K);
    return t;
  }();
  return &table;
}

}  // namespace moelite::cpu
