// Element-wise kernels: embedding rows, residual add, the FFN activations, the shared expert's
// sigmoid gate and the weighted combine of expert outputs. One thread per element (grid-stride).
#pragma once
#include "backends/cuda/kernels/activation.cuh"
#include "backends/cuda/kernels/dequant.cuh"

namespace moelite::cuda_kernels {

MK_DEVICE int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
MK_DEVICE int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

// out[t] = dequant(table row tokens[t]).
template <int T>
MK_GLOBAL void get_rows_kernel(const uint8_t* table, uint64_t row_bytes, int64_t cols, const int32_t* tokens, int64_t n,
                               float* out) {
  for (int64_t i = global_thread(); i < n * cols; i += grid_threads()) {
    const int64_t t = i / cols, c = i % cols;
    out[i] = dq<T>(table + uint64_t(tokens[t]) * row_bytes, c);
  }
}

MK_GLOBAL void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] += y[i];
}

MK_GLOBAL void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] *= s;
}

MK_GLOBAL void add_bias_kernel(float* x, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t i = global_thread(); i < rows * cols; i += grid_threads()) x[i] += bias[i % cols];
}

// out[t, g * out_stride + out_offset + c] = x[t, g * x_stride + x_offset + c] (Backend::copy_columns).
MK_GLOBAL void copy_columns_kernel(const float* x, int64_t x_cols, int64_t x_stride, int64_t x_offset, float* out,
                                   int64_t out_cols, int64_t out_stride, int64_t out_offset, int64_t rows,
                                   int32_t n_groups, int64_t width) {
  const int64_t per_row = int64_t(n_groups) * width;
  for (int64_t i = global_thread(); i < rows * per_row; i += grid_threads()) {
    const int64_t t = i / per_row, g = (i % per_row) / width, c = i % width;
    out[t * out_cols + g * out_stride + out_offset + c] = x[t * x_cols + g * x_stride + x_offset + c];
  }
}

// h = act(g, u) for n elements (activation.cuh).
MK_GLOBAL void ffn_act_kernel(const float* g, const float* u, float* h, int64_t n, int mode, float alpha, float limit) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) h[i] = ffn_act_value(g[i], u[i], mode, alpha, limit);
}

// x[t] *= sigmoid(s[t]) for rows of `cols` (the shared expert's gate).
MK_GLOBAL void sigmoid_scale_kernel(float* x, const float* s, int64_t rows, int64_t cols) {
  for (int64_t i = global_thread(); i < rows * cols; i += grid_threads()) x[i] *= sigmoid_f(s[i / cols]);
}

// out[t] = sum over slots j in order of weights[t*k+j] * outputs[t*k+j], dropped slots (id < 0)
// skipped: the same order as the CPU backend, independent of the order experts ran in.
MK_GLOBAL void combine_kernel(const float* outputs, const int32_t* ids, const float* weights, int64_t n_tok, int32_t k,
                              int64_t cols, float* out) {
  for (int64_t i = global_thread(); i < n_tok * cols; i += grid_threads()) {
    const int64_t t = i / cols, c = i % cols;
    float acc = 0.0f;
    for (int32_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      if (ids[s] < 0) continue;
      acc += weights[s] * outputs[s * cols + c];
    }
    out[i] = acc;
  }
}

}  // namespace moelite::cuda_kernels
