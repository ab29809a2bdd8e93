#include "backends/cpu/interleaved_rows.h"

#include <cmath>
#include <cstring>

#include "base/quant_ref.h"

namespace moelite::cpu {

using blocks::kQKK;
using blocks::Q4_K;
using blocks::Q5_K;
using blocks::Q8_K;

size_t group_bytes_q4_k(int64_t n) { return static_cast<size_t>(n / kQKK) * sizeof(Q4KGroup8); }
size_t group_bytes_q5_k(int64_t n) { return static_cast<size_t>(n / kQKK) * sizeof(Q5KGroup8); }

namespace {

// Q4_K's part of a group from row r's super-block b (Q4_K or Q5_K: the same fields).
template <typename Block>
void repack_low(const Block& b, int r, Q4KGroup8* g) {
  std::memcpy(g->d + 2 * r, b.d, 2);
  std::memcpy(g->dmin + 2 * r, b.dmin, 2);
  uint8_t sc[8], mn[8];
  unpack_scales_q4k(b.scales, sc, mn);
  for (int s = 0; s < 8; ++s) {
    g->scales[s][r] = sc[s];
    g->mins[s][r] = mn[s];
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 8; ++l) std::memcpy(g->qs[c][l][r], b.qs + 32 * c + 4 * l, 4);
}

template <typename Block>
const Block& block_of(const void* rows, size_t row_bytes, int r, int64_t i) {
  return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + static_cast<size_t>(r) * row_bytes)[i];
}

// Code e (0..255) of row r in super-block g: its low four bits.
int code_of(const Q4KGroup8& g, int r, int e) {
  const int c = e / 64, k = e % 64;
  const int byte = 32 * c + k % 32;  // of the row's qs
  const uint8_t v = g.qs[c][(byte % 32) / 4][r][byte % 4];
  return k < 32 ? (v & 0x0f) : (v >> 4);
}
// ... and with its fifth bit (codes_q5_k's order).
int code_of(const Q5KGroup8& g, int r, int e) {
  const int c = e / 64, k = e % 64, l = k % 32;
  const int fifth = (g.qh[l / 4][r][l % 4] >> (2 * c + (k < 32 ? 0 : 1))) & 1;
  return code_of(g.low, r, e) | fifth << 4;
}

const Q4KGroup8& low_part(const Q4KGroup8& g) { return g; }
const Q4KGroup8& low_part(const Q5KGroup8& g) { return g.low; }

template <typename Group>
void dot_group8_reference(int64_t n, float* out, size_t out_stride, const void* group, const void* a_rows,
                          size_t a_stride, int count) {
  const auto* groups = static_cast<const Group*>(group);
  for (int j = 0; j < count; ++j) {
    const auto* y = reinterpret_cast<const Q8_K*>(static_cast<const uint8_t*>(a_rows) + static_cast<size_t>(j) * a_stride);
    for (int r = 0; r < kGroupRows; ++r) {
      float acc = 0.0f, accm = 0.0f;
      for (int64_t i = 0; i < n / kQKK; ++i) {
        const Group& full = groups[i];
        const Q4KGroup8& g = low_part(full);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; ++s) {
          int32_t dot = 0;
          for (int e = 32 * s; e < 32 * s + 32; ++e) dot += code_of(full, r, e) * y[i].qs[e];
          isum += g.scales[s][r] * dot;
          msum += g.mins[s][r] * (q8k_bsum(y[i], 2 * s) + q8k_bsum(y[i], 2 * s + 1));
        }
        const float da = q8k_d(y[i]);
        acc = std::fma(load_fp16(g.d + 2 * r) * da, static_cast<float>(isum), acc);
        accm = std::fma(load_fp16(g.dmin + 2 * r) * da, static_cast<float>(msum), accm);
      }
      out[static_cast<size_t>(r) * out_stride + static_cast<size_t>(j)] = acc - accm;
    }
  }
}

}  // namespace

void repack_q4_k_group8(const void* rows, size_t row_bytes, int64_t n, void* group) {
  auto* dst = static_cast<Q4KGroup8*>(group);
  for (int64_t i = 0; i < n / kQKK; ++i)
    for (int r = 0; r < kGroupRows; ++r) repack_low(block_of<Q4_K>(rows, row_bytes, r, i), r, &dst[i]);
}

void repack_q5_k_group8(const void* rows, size_t row_bytes, int64_t n, void* group) {
  auto* dst = static_cast<Q5KGroup8*>(group);
  for (int64_t i = 0; i < n / kQKK; ++i)
    for (int r = 0; r < kGroupRows; ++r) {
      const Q5_K& b = block_of<Q5_K>(rows, row_bytes, r, i);
      repack_low(b, r, &dst[i].low);
      for (int l = 0; l < 8; ++l) std::memcpy(dst[i].qh[l][r], b.qh + 4 * l, 4);
    }
}

void dot_q4_k_group8_reference(int64_t n, float* out, size_t out_stride, const void* group, size_t /*w_stride*/,
                               const void* a_rows, size_t a_stride, int count) {
  dot_group8_reference<Q4KGroup8>(n, out, out_stride, group, a_rows, a_stride, count);
}

void dot_q5_k_group8_reference(int64_t n, float* out, size_t out_stride, const void* group, size_t /*w_stride*/,
                               const void* a_rows, size_t a_stride, int count) {
  dot_group8_reference<Q5KGroup8>(n, out, out_stride, group, a_rows, a_stride, count);
}

}  // namespace moelite::cpu
