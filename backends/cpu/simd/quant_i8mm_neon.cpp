// ARMv8.6 int8 matrix-multiply table ("i8mm"): SMMLA for the batched (prefill) products of the
// types that dominate Qwen3-style GGUFs (Q8_0, Q4_0, Q4_K, Q6_K); everything else, and vec_dot's
// single row, is SDOT as in the dotprod table. Compiled with -march=armv8.2-a+dotprod+i8mm (CMake);
// nothing here runs before kernels_i8mm() has seen both features at run time.
//
// SMMLA multiplies a 2x8 int8 matrix by an 8x2 one into a 2x2 int32 tile. vec_dot_multi gets one
// weight row and up to four activation rows, so the tile's two columns cannot be two weight rows
// (as in llama.cpp's 2x2 kernels): here the rows are two activation rows and the columns the low
// and high 8 bytes of one 16-byte weight chunk, so two of the four products are wanted (the
// diagonal pairs of matching bytes) and two are discarded. That is the same 16 useful
// multiply-adds per instruction as SDOT; what SMMLA saves is the horizontal reduction (each
// group's full sum arrives in one lane per row), what it costs is a zip per activation chunk. It
// has not been timed on i8mm hardware; a multi-dot over two weight rows would be needed to use
// the whole tile. Integer sums are exact either way, and the float steps are the shared ones, so
// multi-dot stays bit-identical to vec_dot.
#include "backends/cpu/simd/quant_neon_kernels.h"
#include "platforms/platform.h"

#if !defined(__ARM_FEATURE_DOTPROD) || !defined(__ARM_FEATURE_MATMUL_INT8)
#error "quant_i8mm_neon.cpp must be compiled with +dotprod+i8mm (see CMakeLists.txt)"
#endif

namespace moelite::cpu {
namespace {

struct IsaI8mm : IsaDotprod {
  static constexpr bool kPairs = true;

  // Rows a0 and a1: out[0], out[1] as row_sums (lane g = group g's sum, 0 for g >= ng).
  template <int G>
  static void pair_sums(const int8x16_t* w, const int8_t* a0, const int8_t* a1, size_t stride, int ng,
                        int32x4_t out[2]) {
    int32x4_t t[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      t[g] = vdupq_n_s32(0);
      if (g < ng) {
#pragma GCC unroll 2
        for (int c = 0; c < G; ++c) {
          const int8x16_t wc = w[g * G + c];
          const int64x2_t x0 = vreinterpretq_s64_s8(load_s8(a0 + g * stride + 16 * c));
          const int64x2_t x1 = vreinterpretq_s64_s8(load_s8(a1 + g * stride + 16 * c));
          // Tile rows: bytes 0..7 of both activation rows, columns: weight bytes 0..7 and
          // 8..15 -> lanes [a0lo.wlo, a0lo.whi, a1lo.wlo, a1lo.whi]. Then bytes 8..15 against the
          // swapped weight halves -> [a0hi.whi, a0hi.wlo, a1hi.whi, a1hi.wlo]. Lanes 0 and 2 sum
          // to row 0's and row 1's dot product; lanes 1 and 3 collect the unwanted cross terms.
          t[g] = vmmlaq_s32(t[g], vreinterpretq_s8_s64(vzip1q_s64(x0, x1)), wc);
          t[g] = vmmlaq_s32(t[g], vreinterpretq_s8_s64(vzip2q_s64(x0, x1)), vextq_s8(wc, wc, 8));
        }
      }
    }
    // [r0g0, r1g0, r0g1, r1g1] and [r0g2, r1g2, r0g3, r1g3], then split by row.
    const int32x4_t t01 = vuzp1q_s32(t[0], t[1]), t23 = vuzp1q_s32(t[2], t[3]);
    out[0] = vuzp1q_s32(t01, t23);
    out[1] = vuzp2q_s32(t01, t23);
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
    // vec_dot (the K = 1 instance: SDOT) and its multi-dot come from the same kernel.
    set_kernel<DotQ8_0, IsaI8mm>(t, TensorType::Q8_0);
    set_kernel<DotQ4_0, IsaI8mm>(t, TensorType::Q4_0);
    set_kernel<DotQ4K, IsaI8mm>(t, TensorType::Q4_K);
    set_kernel<DotQ6K, IsaI8mm>(t, TensorType::Q6_K);
    return t;
  }();
  return &table;
}

}  // namespace moelite::cpu
