// AVX-VNNI kernels: the avx2 table with its Q8_0, Q4_0 and MXFP4 products on vpdpbusd (the
// VEX-encoded, 256-bit int8 dot product of Intel's client cores since Alder Lake and of AMD Zen 5,
// which have no AVX-512 or leave it to servers). Compiled with -mavx2 -mfma -mf16c -mavxvnni;
// nothing here runs before kernels_avxvnni() has checked the CPU.
//
// Per (block, activation row) the avx2 table runs sign, maddubs and madd for the 8 int32 lane
// sums; vpdpbusd forms them in one instruction, from unsigned bytes against signed ones. The
// activations are taken to unsigned (a + 128 = a xor 0x80: once per token in prepared rows, else
// one xor per block), and the sum starts from -128 * the weights' lane sums, formed once per weight
// block and shared by every activation row of the call. The lane sums are exact, equal to the
// avx2 table's, so each result is that table's bit for bit (tested). K-quants and the other types
// keep the avx2 kernels.
#include <immintrin.h>

#include "backends/cpu/quant.h"
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/rows_entry.h"
#include "backends/cpu/simd/x86_q8_kernels.h"
#include "platforms/platform.h"

namespace moelite::cpu {
namespace {

struct VnniDot {
  static constexpr bool kBiasedActivations = true;
  struct Weights {
    __m256i q, neg_bias;  // the signed codes; -128 * their lane sums
  };
  static Weights weights(__m256i q) {
    const __m256i s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), q);
    return {q, _mm256_sub_epi32(_mm256_setzero_si256(), s)};
  }
  // a_biased = a + 128 as unsigned: sum (a + 128) * w - 128 * sum w = sum a * w, per lane.
  static __m256i lanes(const Weights& w, __m256i a_biased) { return _mm256_dpbusd_avx_epi32(w.neg_bias, a_biased, w.q); }
};

KernelTable make_table(const KernelTable& base) {
  KernelTable t = base;
  t.isa = "avxvnni";
  set_q8_kernels<VnniDot>(t);  // Q8_0, Q4_0, MXFP4
  return t;
}

}  // namespace

// Called only once the CPU is known to have AVX-VNNI and the avx2 table's instructions
// (quant_dispatch.cpp checks).
const KernelTable* avxvnni_table() {
  static const KernelTable table = make_table(*avx2_table());
  return &table;
}

}  // namespace moelite::cpu
