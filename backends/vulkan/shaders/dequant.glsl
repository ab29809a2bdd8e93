// Weight decoding for every GGUF type the CPU backend computes with: dq(row, i) is element i of
// the row starting at byte `row` of the weight buffer W. Bytes are read from 32-bit words, so no
// 8- or 16-bit storage feature is needed. Layouts follow backends/cpu/quant_scalar.cpp (the
// reference these shaders are tested against) bit for bit.
//
// The including shader declares `layout(constant_id = 0) const uint WTYPE` and binds
// `readonly buffer { uint W[]; }`.

uint wbyte(uint off) { return (W[off >> 2] >> ((off & 3u) << 3)) & 0xFFu; }
uint wu16(uint off) { return wbyte(off) | (wbyte(off + 1u) << 8); }
uint wu32(uint off) { return wu16(off) | (wu16(off + 2u) << 16); }
float wf16(uint off) { return unpackHalf2x16(wu16(off)).x; }
int wi8(uint off) { return int(wbyte(off) << 24) >> 24; }

const uint T_F32 = 0u, T_F16 = 1u, T_Q4_0 = 2u, T_Q4_1 = 3u, T_Q5_0 = 6u, T_Q5_1 = 7u, T_Q8_0 = 8u;
const uint T_Q2_K = 10u, T_Q3_K = 11u, T_Q4_K = 12u, T_Q5_K = 13u, T_Q6_K = 14u, T_BF16 = 30u, T_MXFP4 = 39u;

// Q4_K / Q5_K: six-bit scale and min of sub-block s (0..7) from the 12 packed bytes at p.
void scale_min_k4(uint p, uint s, out float sc, out float mn) {
  if (s < 4u) {
    sc = float(wbyte(p + s) & 63u);
    mn = float(wbyte(p + s + 4u) & 63u);
  } else {
    sc = float((wbyte(p + s + 4u) & 15u) | ((wbyte(p + s - 4u) >> 6) << 4));
    mn = float((wbyte(p + s + 4u) >> 4) | ((wbyte(p + s) >> 6) << 4));
  }
}

float dq(uint row, uint i) {
  if (WTYPE == T_F32) return uintBitsToFloat(W[(row >> 2) + i]);
  if (WTYPE == T_F16) return wf16(row + 2u * i);
  if (WTYPE == T_BF16) return uintBitsToFloat(wu16(row + 2u * i) << 16);
  if (WTYPE == T_MXFP4) {
    // E2M1 code (low nibble: element j < 16, high: j >= 16) as the doubled value in [-12, 12],
    // times the E8M0 byte's 2^(e - 128) built from its bits (subnormal for e < 2).
    const uint j = i & 31u;
    const uint b = row + (i >> 5) * 17u;
    const uint byte = wbyte(b + 1u + (j & 15u));
    const uint code = j < 16u ? (byte & 15u) : (byte >> 4);
    const uint m = code & 7u;
    const int doubled = m < 5u ? int(m) : m == 5u ? 6 : m == 6u ? 8 : 12;
    const uint e = wbyte(b);
    const float scale = uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
    return float((code & 8u) != 0u ? -doubled : doubled) * scale;
  }
  if (WTYPE == T_Q4_0 || WTYPE == T_Q4_1 || WTYPE == T_Q5_0 || WTYPE == T_Q5_1 || WTYPE == T_Q8_0) {
    const uint j = i & 31u;
    if (WTYPE == T_Q8_0) {
      const uint b = row + (i >> 5) * 34u;
      return float(wi8(b + 2u + j)) * wf16(b);
    }
    // 4-bit codes: element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of j - 16.
    const uint bytes = WTYPE == T_Q4_0 ? 18u : WTYPE == T_Q4_1 ? 20u : WTYPE == T_Q5_0 ? 22u : 24u;
    const uint b = row + (i >> 5) * bytes;
    const uint qs = b + (WTYPE == T_Q4_0 ? 2u : WTYPE == T_Q4_1 ? 4u : WTYPE == T_Q5_0 ? 6u : 8u);
    const uint byte = wbyte(qs + (j & 15u));
    uint q = j < 16u ? (byte & 15u) : (byte >> 4);
    if (WTYPE == T_Q5_0 || WTYPE == T_Q5_1) q |= ((wu32(b + (WTYPE == T_Q5_0 ? 2u : 4u)) >> j) & 1u) << 4;
    const float d = wf16(b);
    if (WTYPE == T_Q4_0) return (float(q) - 8.0) * d;
    if (WTYPE == T_Q5_0) return (float(q) - 16.0) * d;
    return float(q) * d + wf16(b + 2u);
  }
  // K-quants: 256 elements per super-block.
  const uint e = i & 255u;
  if (WTYPE == T_Q2_K) {
    const uint b = row + (i >> 8) * 84u;
    const uint q = (wbyte(b + 16u + 32u * (e >> 7) + (e & 31u)) >> (2u * ((e >> 5) & 3u))) & 3u;
    const uint sc = wbyte(b + (e >> 4));
    return wf16(b + 80u) * float(sc & 15u) * float(q) - wf16(b + 82u) * float(sc >> 4);
  }
  if (WTYPE == T_Q3_K) {
    const uint b = row + (i >> 8) * 110u;
    const int low = int((wbyte(b + 32u + 32u * (e >> 7) + (e & 31u)) >> (2u * ((e >> 5) & 3u))) & 3u);
    const bool high = ((wbyte(b + (e & 31u)) >> (e >> 5)) & 1u) != 0u;
    const uint g = e >> 4;
    const uint sl = (wbyte(b + 96u + (g & 7u)) >> (4u * (g >> 3))) & 15u;
    const uint sh = (wbyte(b + 104u + (g & 3u)) >> (2u * (g >> 2))) & 3u;
    const int sc = int(sl | (sh << 4)) - 32;
    return wf16(b + 108u) * float(sc) * float(low - (high ? 0 : 4));
  }
  if (WTYPE == T_Q4_K || WTYPE == T_Q5_K) {
    const uint bytes = WTYPE == T_Q4_K ? 144u : 176u;
    const uint b = row + (i >> 8) * bytes;
    const uint c = e >> 6, l = e & 31u, hi = (e >> 5) & 1u;
    const uint byte = wbyte(b + (WTYPE == T_Q4_K ? 16u : 48u) + 32u * c + l);
    uint q = hi == 1u ? (byte >> 4) : (byte & 15u);
    if (WTYPE == T_Q5_K) q |= ((wbyte(b + 16u + l) >> (2u * c + hi)) & 1u) << 4;
    float sc, mn;
    scale_min_k4(b + 4u, e >> 5, sc, mn);
    return wf16(b) * sc * float(q) - wf16(b + 2u) * mn;
  }
  if (WTYPE == T_Q6_K) {
    const uint b = row + (i >> 8) * 210u;
    const uint h = e >> 7, r = e & 127u, l = r & 31u, part = r >> 5;
    const uint ql = wbyte(b + 64u * h + l + ((part & 1u) == 1u ? 32u : 0u));
    const uint nib = part >= 2u ? (ql >> 4) : (ql & 15u);
    const uint qh = (wbyte(b + 128u + 32u * h + l) >> (2u * part)) & 3u;
    const int q = int(nib | (qh << 4)) - 32;
    return wf16(b + 208u) * float(wi8(b + 192u + (e >> 4))) * float(q);
  }
  return 0.0;
}
