// Fused dequantize + matrix product for every weight type: y[t] = W x[t] (+ bias).
//
// One warp per (output row, chunk of up to kTokensPerWarp tokens). Lane l takes the columns l,
// l + 32, l + 64, … of the row, dequantizes each weight once and applies it to every token of the
// chunk, then each token's 32 partial sums are reduced in a fixed butterfly. So each step of the
// warp reads 32 consecutive weights (a sector or two of a quantized row; the block's scale is one
// address for every lane) and 32 consecutive floats of each token. Lanes that took whole 32-column
// chunks each (the first version) made every load touch 32 sectors 34+ bytes apart: on an H200 the
// experts' products ran at 56-65 GB/s of the 4 TB/s the device measures. The
// arithmetic of one (row, token) output is therefore the same whatever the batch size: prefill and
// token-by-token decode give bitwise identical results, as the CPU and Vulkan backends do, and
// weights are read once per kTokensPerWarp tokens.
//
// Row maps let one launch serve an expert's scattered tokens: token t reads row x_map[t] of x and
// writes row y_map[t] of y (identity when a map is null).
#pragma once
#include "backends/cuda/kernels/dequant.cuh"

namespace moelite::cuda_kernels {

constexpr int kTokensPerWarp = 8;
constexpr int kMatmulWarps = 4;  // warps (rows) per block
constexpr int kUnroll = 8;       // 32-column steps whose weights are loaded together

template <int T>
MK_GLOBAL void matmul_kernel(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x,
                             int64_t x_stride, const int32_t* x_map, float* y, int64_t y_stride, const int32_t* y_map,
                             int64_t n_tok, const float* bias) {
  const int lane = int(threadIdx.x & 31u);
  const int64_t r = int64_t(blockIdx.x) * kMatmulWarps + int64_t(threadIdx.x >> 5);
  const int64_t t0 = int64_t(blockIdx.y) * kTokensPerWarp;
  if (r >= rows) return;  // a whole warp leaves together: shuffles below see full warps
  const int n = n_tok - t0 < kTokensPerWarp ? int(n_tok - t0) : kTokensPerWarp;
  const float* xs[kTokensPerWarp];
  float acc[kTokensPerWarp];
  for (int j = 0; j < kTokensPerWarp; ++j) {
    const int64_t t = t0 + (j < n ? j : 0);
    xs[j] = x + (x_map ? int64_t(x_map[t]) : t) * x_stride;
    acc[j] = 0.0f;
  }
  const uint8_t* wr = w + uint64_t(r) * row_bytes;
  // Each step of 32 columns is a new block of the row, so a warp that decoded one step at a time
  // waited a memory latency per step: with one token (decode) the experts' products ran at 40-50
  // us each on an H200. The weights of kUnroll steps are decoded first (independent loads, in
  // flight together) and then applied in column order, so the sums are the same as one step at a
  // time, bit for bit.
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < cols; c += 32 * kUnroll) {
    float wv[kUnroll];
    for (int u = 0; u < kUnroll; ++u) wv[u] = dq<T>(wr, c + 32 * u);
    for (int u = 0; u < kUnroll; ++u)
      for (int j = 0; j < kTokensPerWarp; ++j)
        if (j < n) acc[j] += wv[u] * xs[j][c + 32 * u];
  }
  for (; c < cols; c += 32) {
    const float wv = dq<T>(wr, c);
    for (int j = 0; j < kTokensPerWarp; ++j)
      if (j < n) acc[j] += wv * xs[j][c];
  }
  const float b = bias ? bias[r] : 0.0f;
  for (int j = 0; j < n; ++j) {
    const float s = warp_sum(acc[j]);
    if (lane == 0) {
      const int64_t t = t0 + j;
      y[(y_map ? int64_t(y_map[t]) : t) * y_stride + r] = s + b;
    }
  }
}

}  // namespace moelite::cuda_kernels
