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

template <int K>
using DotQ8_0 = Q8Dot<VnniDot, Q8Codes, PlainQ8Row<true>>::Rows<K>;
template <int K>
using DotQ4_0 = Q8Dot<VnniDot, Q4Codes, PlainQ8Row<true>>::Rows<K>;
template <int K>
using DotMxfp4 = Q8Dot<VnniDot, Mxfp4Codes, PlainQ8Row<true>>::Rows<K>;

KernelTable make_table(const KernelTable& base) {
  KernelTable t = base;
  t.isa = "avxvnni";
  const PrepareActFn prepare = prepare_q8_0<true>;
  set_vec_dot<dot_one<DotQ8_0>>(t, TensorType::Q8_0, dot_multi<DotQ8_0>);
  set_prepared(t, TensorType::Q8_0, {prepare, prepared_bytes_q8_0, prepared_q8_rows<VnniDot, Q8Codes>, 1});
  set_vec_dot<dot_one<DotQ4_0>>(t, TensorType::Q4_0, dot_multi<DotQ4_0>);
  set_prepared(t, TensorType::Q4_0, {prepare, prepared_bytes_q8_0, prepared_q8_rows<VnniDot, Q4Codes>, 1});
  set_vec_dot<dot_one<DotMxfp4>>(t, TensorType::MXFP4, dot_multi<DotMxfp4>);
  set_prepared(t, TensorType::MXFP4, {prepare, prepared_bytes_q8_0, prepared_q8_rows<VnniDot, Mxfp4Codes>, 1});
  return t;
}

}  // namespace

const KernelTable* kernels_avxvnni() {
  if (!platform::cpu_features().avxvnni) return nullptr;
  const KernelTable* base = kernels_avx2();
  if (!base) return nullptr;
  static const KernelTable table = make_table(*base);
  return &table;
}

}  // namespace moelite::cpu
