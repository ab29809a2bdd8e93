// Fused dequantize + matrix product for every weight type: y[t] = W x[t] (+ bias).
//
// One warp per (output row, chunk of up to kTokensPerWarp tokens). Lane l takes the 32-column
// chunks l, l + 32, l + 64, … of the row, dequantizes each weight once and applies it to every
// token of the chunk, then each token's 32 partial sums are reduced in a fixed butterfly. The
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
  for (int64_t c0 = int64_t(lane) * 32; c0 < cols; c0 += 32 * 32) {
    const int64_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
    for (int64_t c = c0; c < c1; ++c) {
      const float wv = dq<T>(wr, c);
      for (int j = 0; j < kTokensPerWarp; ++j)
        if (j < n) acc[j] += wv * xs[j][c];
    }
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
