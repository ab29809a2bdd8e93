// The Q8_0-activation kernels of the 256-bit x86 tables (Q8_0, Q4_0 and MXFP4 weights), written
// once over the integer dot product of one 32-byte block, which each table supplies:
//   avx2     SignTransferDot: |w| * (a * sign(w)) through maddubs (u8 x s8 -> s16 pairs) and madd;
//   avxvnni  VnniDot (quant_avxvnni.cpp): vpdpbusd on the activations biased to unsigned.
// Both give the block's 8 int32 lane sums (lane l: the products of bytes 4l..4l+3) exactly, so the
// float work after them is the same and the two tables' results are the same bits.
//
// Each including file compiles this with its own flags (-mavx2, -mavxvnni, ...), so everything here
// sits in an anonymous namespace (see rows_entry.h for why).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cpu/quant.h"
#include "backends/cpu/simd/rows_entry.h"

namespace moelite::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

using namespace blocks;

inline float fp16(const uint8_t p[2]) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 32 nibbles of a Q4_0/Q4_1/Q5 block in element order: low nibbles, then high nibbles.
inline __m256i nibbles(const uint8_t qs[16]) {
  const __m128i q = load128(qs);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

// The avx2 integer dot product: the sign of w moves onto a, so maddubs sees |w| (unsigned) against
// a signed. Exact for every weight byte (-128 included: |w| reads as 128 unsigned) and activation
// codes in [-127, 127] (what the quantizers produce): a pair sum is at most 2 * 128 * 127 < 2^15.
// A dot policy gives kBiasedActivations (whether lanes() takes the activation codes xor 0x80: the
// rows and prepare_q8_0 follow it), Weights (a block's weight side, formed once per call's block),
// weights(codes) and lanes(weights, activation codes) -> the 8 int32 lane sums.
struct SignTransferDot {
  static constexpr bool kBiasedActivations = false;
  struct Weights {
    __m256i q, abs_q;
  };
  static Weights weights(__m256i q) { return {q, _mm256_sign_epi8(q, q)}; }
  static __m256i lanes(const Weights& w, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs_q, _mm256_sign_epi8(a, w.q)), _mm256_set1_epi16(1));
  }
};

// Q8_0 and Q4_0 against Q8_0 activations, written once for K = 1..4 activation rows (see
// rows_entry.h): each weight block is loaded and decoded once (codes, the integer dot's weight
// side, scale), then every activation row runs the K = 1 sequence in accumulators of its own, two
// per row (even and odd blocks, so consecutive FMAs do not wait on each other). vec_dot, multi-dot
// and the prepared entry are therefore bit-identical. Per block and row: the integer dot (8 int32
// lane sums), a conversion, and one FMA by dw * da.
//
// Batched products (prefill) spend most of their time here, and at 4 rows per call the weight
// side is a small part of it: what is left per (block, row) is the activation side. A prepared
// activation row (prepare_q8_0) holds the int8 codes of all blocks (biased to unsigned where the
// dot takes them so) and then their scales as floats, so the fp16 conversion of da is done once
// per token instead of once per weight row.
// Each weight format gives its block's signed codes and its scale broadcast to 8 lanes.
template <class B>
__m256 fp16_scale(const B& b) {
  return _mm256_set1_ps(fp16(b.d));
}
struct Q8Codes {
  using Block = Q8_0;
  static __m256i codes(const Q8_0& b) { return load256(b.qs); }
  static __m256 scale(const Q8_0& b) { return fp16_scale(b); }
};
struct Q4Codes {
  using Block = Q4_0;
  static __m256i codes(const Q4_0& b) { return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8)); }
  static __m256 scale(const Q4_0& b) { return fp16_scale(b); }
};
// mxfp4_half_scale of every E8M0 byte: the scale is one broadcast load instead of a compare,
// shifts, a select and a move to the vector unit per 32 weights.
struct Mxfp4ScaleTable {
  float v[256];
  Mxfp4ScaleTable() {
    for (int e = 0; e < 256; ++e) v[e] = mxfp4_half_scale(static_cast<uint8_t>(e));
  }
};
const Mxfp4ScaleTable kMxfp4Scales;
// MXFP4: a nibble indexes the (doubled) E2M1 values, one table lookup per byte lane.
struct Mxfp4Codes {
  using Block = MXFP4;
  static __m256i codes(const MXFP4& b) {
    const __m128i values = load128(kMxfp4Values);
    return _mm256_shuffle_epi8(_mm256_set_m128i(values, values), nibbles(b.qs));
  }
  static __m256 scale(const MXFP4& b) { return _mm256_broadcast_ss(&kMxfp4Scales.v[b.e]); }
};
// One activation row: plain Q8_0 blocks (codes biased by xor 0x80 on the fly when kBiased), or the
// prepared layout (nb x 32 codes, biased when prepared so, then nb floats).
template <bool kBiased>
struct PlainQ8Row {
  const Q8_0* y;
  void init(const void* row, int64_t /*nb*/) { y = static_cast<const Q8_0*>(row); }
  __m256i codes(int64_t i) const {
    const __m256i q = load256(y[i].qs);
    return kBiased ? _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))) : q;
  }
  __m256 scale(int64_t i) const { return _mm256_set1_ps(fp16(y[i].d)); }
};
struct PreparedQ8Row {
  const uint8_t* q;
  const uint8_t* d;
  void init(const void* row, int64_t nb) {
    q = static_cast<const uint8_t*>(row);
    d = q + 32 * nb;
  }
  __m256i codes(int64_t i) const { return load256(q + 32 * i); }
  // A broadcast from memory is a load alone, no shuffle on the vector pipes.
  __m256 scale(int64_t i) const { return _mm256_broadcast_ss(reinterpret_cast<const float*>(d + 4 * i)); }
};
size_t prepared_bytes_q8_0(int64_t n) { return static_cast<size_t>(n / kQK) * (32 + 4); }
// Prepares a row for the kernels over `Dot` (codes biased where Dot takes them so).
template <class Dot>
void prepare_q8_0(const void* a_row, int64_t n, void* out) {
  constexpr bool kBiased = Dot::kBiasedActivations;
  const Q8_0* y = static_cast<const Q8_0*>(a_row);
  const int64_t nb = n / kQK;
  uint8_t* q = static_cast<uint8_t*>(out);
  uint8_t* d = q + 32 * nb;
  for (int64_t i = 0; i < nb; ++i) {
    std::memcpy(q + 32 * i, y[i].qs, 32);
    if (kBiased)
      for (int b = 0; b < 32; ++b) q[32 * i + b] ^= 0x80;
    const float f = fp16(y[i].d);
    std::memcpy(d + 4 * i, &f, 4);
  }
}

// Over plain Q8_0 activation rows, or over rows prepared by prepare_q8_0<Dot> (kPrepared); the
// row type follows from Dot, so a kernel never reads codes biased otherwise than its dot expects.
template <class Dot, class W, bool kPrepared = false>
struct Q8Dot {
  using Act = std::conditional_t<kPrepared, PreparedQ8Row, PlainQ8Row<Dot::kBiasedActivations>>;
  template <int K>
  struct Rows {
    static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
      const auto* x = static_cast<const typename W::Block*>(w);
      const int64_t nb = n / kQK;
      Act y[K];
      // Two arrays, and every loop over them unrolled: otherwise GCC keeps them in memory and
      // zeroes them with `rep stos` on every call.
      __m256 even[K], odd[K];
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) {
        y[j].init(act_row<uint8_t>(a, stride, j), nb);
        even[j] = odd[j] = _mm256_setzero_ps();
      }
      auto block = [&](int64_t i, __m256(&acc)[K]) {
        const typename Dot::Weights q = Dot::weights(W::codes(x[i]));
        // dw * da as a vector product of broadcasts: the same single rounding as a scalar product.
        const __m256 dw = W::scale(x[i]);
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          const __m256i p = Dot::lanes(q, y[j].codes(i));
          acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, y[j].scale(i)), _mm256_cvtepi32_ps(p), acc[j]);
        }
      };
      int64_t i = 0;
      for (; i + 2 <= nb; i += 2) {
        block(i, even);
        block(i + 1, odd);
      }
      if (i < nb) block(i, even);
#pragma GCC unroll 4
      for (int j = 0; j < K; ++j) out[j] = hsum(_mm256_add_ps(even[j], odd[j]));
    }
  };
};
// The prepared entry: one weight row (PreparedTile::rows = 1) against `count` prepared rows.
template <class Dot, class W>
void prepared_q8_rows(int64_t n, float* out, size_t /*out_stride*/, const void* w, size_t /*w_stride*/,
                      const void* a, size_t a_stride, int count) {
  dot_multi<Q8Dot<Dot, W, true>::template Rows>(n, out, w, a, a_stride, count);
}

// A table's entries for one weight format: vec_dot, multi-dot and the one-row prepared entry.
template <class Dot, class W>
void set_q8_kernel(KernelTable& t, TensorType type) {
  set_vec_dot<dot_one<Q8Dot<Dot, W>::template Rows>>(t, type, dot_multi<Q8Dot<Dot, W>::template Rows>);
  set_prepared(t, type, {prepare_q8_0<Dot>, prepared_bytes_q8_0, prepared_q8_rows<Dot, W>, 1});
}
// Q8_0, Q4_0 (which reads the same, prepared, Q8_0 activations) and MXFP4 over `Dot`.
template <class Dot>
void set_q8_kernels(KernelTable& t) {
  set_q8_kernel<Dot, Q8Codes>(t, TensorType::Q8_0);
  set_q8_kernel<Dot, Q4Codes>(t, TensorType::Q4_0);
  set_q8_kernel<Dot, Mxfp4Codes>(t, TensorType::MXFP4);
}

}  // namespace
}  // namespace moelite::cpu
