// Integer products of quantized weights with quantized activations (act_quant.cuh): what the
// CPU backend's dot products compute (backends/cpu/quant_scalar.cpp), on the GPU's dp4a.
//
// A lane takes 8 consecutive weights of a block: 4 lanes share a 32-weight block (8 blocks a warp
// step), the 32 lanes of a warp one 256-weight super-block of the K-quants. It turns its 8 weights'
// codes into two words of signed bytes from the shared stage (int8_codes), takes the dot product
// with the token's 8 activation codes in two dp4a, and scales that integer sum by the weight
// block's and the activation block's scales (int8_term) into its float partial sum; the warp's
// butterfly sums the 32 partials at the end, as the float kernels do.
//
// The integer sums are exactly the CPU's (integers add in any order); the floats differ from the
// CPU's only in the order of additions (a lane's part of a block is scaled on its own), like the
// CPU's SIMD tables, and are tested against the scalar reference with the same tolerance. A
// token's result does not depend on the other tokens of its launch: one token alone and the same
// token in a batch give the same bits.
#pragma once
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/dequant.cuh"

namespace moelite::cuda_kernels {

// Lanes on one block of type T (each 8 weights), and blocks a warp covers in a step.
template <int T>
constexpr int kLanesPerBlock = Layout<T>::block == 256 ? 32 : 4;
template <int T>
constexpr int kBlocksPerStep = 32 / kLanesPerBlock<T>;

// k subtracted from each byte of u, whose bytes are below 128 (k <= 128): the results as signed
// bytes, with no borrow from one byte into the next.
MK_DEVICE uint32_t sub_bytes(uint32_t u, uint32_t k) { return ((u | 0x80808080u) - k * 0x01010101u) ^ 0x80808080u; }

// The low 4 bits of `bits` as bit 0 of each byte (bit k to bit 8k).
MK_DEVICE uint32_t spread4(uint32_t bits) { return ((bits & 15u) * 0x00204081u) & 0x01010101u; }

// MXFP4's E2M1 codes of the 4 bytes of a (each a code 0..15) as the doubled values, signed bytes in
// [-12, 12] (base/quant_ref.h's kMxfp4Values): a table of 16 bytes looked up with two byte
// permutes (codes 0..7 and 8..15) and a per-byte select on each code's bit 3.
MK_DEVICE uint32_t mxfp4_doubled(uint32_t a) {
  constexpr uint32_t kPositive0 = 0x03020100u, kPositive1 = 0x0C080604u;  // 0 1 2 3 | 4 6 8 12
  constexpr uint32_t kNegative0 = 0xFDFEFF00u, kNegative1 = 0xF4F8FAFCu;  // 0 -1 -2 -3 | -4 -6 -8 -12
  const uint32_t select = (a & 7u) | ((a >> 4) & 0x70u) | ((a >> 8) & 0x700u) | ((a >> 12) & 0x7000u);
  const uint32_t positive = byte_perm(kPositive0, kPositive1, select);
  const uint32_t negative = byte_perm(kNegative0, kNegative1, select);
  const uint32_t sign = ((a >> 3) & 0x01010101u) * 0xFFu;
  return (positive & ~sign) | (negative & sign);
}

// The codes of weights w0 .. w0 + 7 of the block at b (w0 a multiple of 8) as signed bytes: lo
// holds w0 .. w0 + 3, hi the next four. The same integers as base/quant_ref's codes_* (offsets such
// as Q4_0's 8 subtracted).
template <int T, class P>
MK_DEVICE void int8_codes(P b, int w0, uint32_t* lo, uint32_t* hi) {
  if constexpr (T == kQ8_0) {
    *lo = stage_u32(b + 2 + w0);
    *hi = stage_u32(b + 6 + w0);
  } else if constexpr (T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1 || T == kMXFP4) {
    // Element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of byte j - 16.
    constexpr int qs = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : T == kQ5_1 ? 8 : 1;
    const uint32_t shift = w0 >= 16 ? 4u : 0u;
    uint32_t a = (stage_u32(b + qs + (w0 & 15)) >> shift) & 0x0F0F0F0Fu;
    uint32_t c = (stage_u32(b + qs + (w0 & 15) + 4) >> shift) & 0x0F0F0F0Fu;
    if constexpr (T == kQ5_0 || T == kQ5_1) {  // the fifth bit of element j is bit j of qh
      const uint32_t qh = stage_u32(b + (T == kQ5_0 ? 2 : 4)) >> w0;
      a |= spread4(qh) << 4;
      c |= spread4(qh >> 4) << 4;
    }
    if constexpr (T == kQ4_0) a = sub_bytes(a, 8), c = sub_bytes(c, 8);
    if constexpr (T == kQ5_0) a = sub_bytes(a, 16), c = sub_bytes(c, 16);
    if constexpr (T == kMXFP4) a = mxfp4_doubled(a), c = mxfp4_doubled(c);
    *lo = a;
    *hi = c;
  } else if constexpr (T == kQ2_K || T == kQ3_K) {
    // 2-bit codes of element e: byte base + 32 * (e / 128) + e % 32, bits 2 * ((e / 32) % 4).
    constexpr int qs = T == kQ2_K ? 16 : 32;
    const int at = qs + 32 * (w0 >> 7) + (w0 & 31);
    const uint32_t shift = 2u * uint32_t((w0 >> 5) & 3);
    uint32_t a = (stage_u32(b + at) >> shift) & 0x03030303u;
    uint32_t c = (stage_u32(b + at + 4) >> shift) & 0x03030303u;
    if constexpr (T == kQ3_K) {  // minus 4 unless the element's bit of hmask is set
      const uint32_t hs = uint32_t(w0 >> 5);
      a = sub_bytes(a | (((stage_u32(b + (w0 & 31)) >> hs) & 0x01010101u) << 2), 4);
      c = sub_bytes(c | (((stage_u32(b + (w0 & 31) + 4) >> hs) & 0x01010101u) << 2), 4);
    }
    *lo = a;
    *hi = c;
  } else if constexpr (T == kQ4_K || T == kQ5_K) {
    // Element e: nibble (e / 32) % 2 of byte qs + 32 * (e / 64) + e % 32; Q5_K's fifth bit is bit
    // 2 * (e / 64) + (e / 32) % 2 of byte 16 + e % 32.
    constexpr int qs = T == kQ4_K ? 16 : 48;
    const int c64 = w0 >> 6, l = w0 & 31;
    const uint32_t hi_nibble = uint32_t((w0 >> 5) & 1);
    uint32_t a = (stage_u32(b + qs + 32 * c64 + l) >> (4u * hi_nibble)) & 0x0F0F0F0Fu;
    uint32_t c = (stage_u32(b + qs + 32 * c64 + l + 4) >> (4u * hi_nibble)) & 0x0F0F0F0Fu;
    if constexpr (T == kQ5_K) {
      const uint32_t bit = 2u * uint32_t(c64) + hi_nibble;
      a |= ((stage_u32(b + 16 + l) >> bit) & 0x01010101u) << 4;
      c |= ((stage_u32(b + 20 + l) >> bit) & 0x01010101u) << 4;
    }
    *lo = a;
    *hi = c;
  } else if constexpr (T == kQ6_K) {
    // Element e = 128 h + 32 part + l: a nibble of ql (byte 64 h + l + 32 (part % 2), high half for
    // part >= 2) and two bits of qh (byte 128 + 32 h + l, bits 2 part), minus 32.
    const int h = w0 >> 7, part = (w0 >> 5) & 3, l = w0 & 31;
    const int ql = 64 * h + l + ((part & 1) ? 32 : 0), qh = 128 + 32 * h + l;
    const uint32_t nshift = part >= 2 ? 4u : 0u, hshift = 2u * uint32_t(part);
    *lo = sub_bytes(((stage_u32(b + ql) >> nshift) & 0x0F0F0F0Fu) | (((stage_u32(b + qh) >> hshift) & 0x03030303u) << 4),
                    32);
    *hi = sub_bytes(
        ((stage_u32(b + ql + 4) >> nshift) & 0x0F0F0F0Fu) | (((stage_u32(b + qh + 4) >> hshift) & 0x03030303u) << 4), 32);
  }
}

// The lane's share of block `block` of the row (its weights w0 .. w0 + 7, whose integer dot product
// with the activation codes is isum), scaled as the CPU's dot product scales the block: the weight
// block's scales at b, the activation row's scales (and sums) in the row at x.
template <int T, class P>
MK_DEVICE float int8_term(P b, int w0, int32_t isum, const uint8_t* x, const ActRowLayout& l, int64_t block) {
  const float da = reinterpret_cast<const float*>(x + l.scales)[block];
  if constexpr (T == kQ8_0 || T == kQ4_0 || T == kQ5_0) return f16(b) * da * float(isum);
  if constexpr (T == kMXFP4) {
    const uint32_t e = b[0];
    const float half_scale = bits_to_float(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23));
    return half_scale * da * float(isum);
  }
  if constexpr (T == kQ4_1 || T == kQ5_1) {
    // d * da * sum(q * a) + m * s: the block's one lane with w0 = 0 adds the min's term.
    const float t = f16(b) * da * float(isum);
    return w0 == 0 ? t + f16(b + 2) * reinterpret_cast<const float*>(x + l.sums)[block] : t;
  }
  // K-quants: the super-block's d * da * sum_g(scale_g * isum_g) - dmin * da * sum_g(min_g * asum_g),
  // with the activation's sums per 16 codes; a lane holds half a 16-element group.
  const int32_t* asum = reinterpret_cast<const int32_t*>(x + l.sums) + block * 16;
  if constexpr (T == kQ2_K) {
    const uint32_t sc = b[w0 >> 4];
    const int32_t mins = (w0 & 15) == 0 ? int32_t(sc >> 4) * asum[w0 >> 4] : 0;
    return f16(b + 80) * da * float(int32_t(sc & 15u) * isum) - f16(b + 82) * da * float(mins);
  }
  if constexpr (T == kQ3_K) {
    const uint32_t g = uint32_t(w0 >> 4);
    const uint32_t sl = (b[96 + (g & 7u)] >> (4 * (g >> 3))) & 15u;
    const uint32_t sh = (b[104 + (g & 3u)] >> (2 * (g >> 2))) & 3u;
    return f16(b + 108) * da * float((int32_t(sl | (sh << 4)) - 32) * isum);
  }
  if constexpr (T == kQ4_K || T == kQ5_K) {
    float sc, mn;
    scale_min_k4(b + 4, uint32_t(w0 >> 5), &sc, &mn);
    const int32_t mins = (w0 & 31) == 0 ? int32_t(mn) * (asum[(w0 >> 4)] + asum[(w0 >> 4) + 1]) : 0;
    return f16(b) * da * float(int32_t(sc) * isum) - f16(b + 2) * da * float(mins);
  }
  if constexpr (T == kQ6_K) return f16(b + 208) * da * float(i8(b + 192 + (w0 >> 4)) * isum);
  return 0.0f;
}

}  // namespace moelite::cuda_kernels
