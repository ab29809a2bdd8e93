// The GPU's kernels: compiled by nvcc into a fatbin (machine code for each architecture built plus
// PTX), which the build embeds in the library and runtime_cuda.cpp loads through the CUDA driver.
// Each kernel of kernels/*.cuh gets an extern "C" entry point named moelite_<kernel>[_<type id>],
// the name kernels_gpu.cpp launches it by; the static_asserts keep each entry's parameters those of
// its kernel, which is what the host side packs.
#include <type_traits>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/elementwise.cuh"
#include "backends/cuda/kernels/matmul.cuh"
#include "backends/cuda/kernels/norm_rope.cuh"

using namespace moelite::cuda_kernels;

#define SAME_PARAMS(entry, kernel) \
  static_assert(std::is_same_v<decltype(&entry), decltype(&kernel)>, "entry point and kernel differ")

// The products' entry points, each for a kernel of matmul.cuh's signature (the 8-token kernels and
// their one-token `_vec` variants share one).
#define PRODUCT_ENTRY(kernel, T)                                                                                  \
  extern "C" __global__ void moelite_##kernel##_##T(                                                              \
      const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x, int64_t x_stride,         \
      const int32_t* x_map, float* y, int64_t y_stride, const int32_t* y_map, int64_t n_tok, const float* bias) { \
    kernel<T>(w, row_bytes, rows, cols, x, x_stride, x_map, y, y_stride, y_map, n_tok, bias);                     \
  }                                                                                                               \
  SAME_PARAMS(moelite_##kernel##_##T, kernel<T>);
#define GROUPED_ENTRY(kernel, T)                                                              \
  extern "C" __global__ void moelite_##kernel##_##T(GroupedBatch batch) { kernel<T>(batch); } \
  SAME_PARAMS(moelite_##kernel##_##T, kernel<T>);
#define GATE_UP_ENTRY(kernel, T)                                                                                  \
  extern "C" __global__ void moelite_##kernel##_##T(GroupedBatch batch, int act_mode, float alpha, float limit) { \
    kernel<T>(batch, act_mode, alpha, limit);                                                                     \
  }                                                                                                               \
  SAME_PARAMS(moelite_##kernel##_##T, kernel<T>);

#define MATMUL_ENTRY(T)                                                                                          \
  PRODUCT_ENTRY(matmul_kernel, T)                                                                                \
  PRODUCT_ENTRY(matmul_vec_kernel, T)                                                                            \
  GROUPED_ENTRY(grouped_matmul_kernel, T)                                                                        \
  GROUPED_ENTRY(grouped_matmul_vec_kernel, T)                                                                    \
  GATE_UP_ENTRY(grouped_gate_up_kernel, T)                                                                       \
  GATE_UP_ENTRY(grouped_gate_up_vec_kernel, T)                                                                   \
  extern "C" __global__ void moelite_get_rows_kernel_##T(const uint8_t* table, uint64_t row_bytes, int64_t cols, \
                                                         const int32_t* tokens, int64_t n, float* out) {         \
    get_rows_kernel<T>(table, row_bytes, cols, tokens, n, out);                                                  \
  }                                                                                                              \
  SAME_PARAMS(moelite_get_rows_kernel_##T, get_rows_kernel<T>);

// The integer products (quantized types only): the inputs are quantized rows (act_quant.cuh).
#define PRODUCT_Q_ENTRY(kernel, T)                                                                          \
  extern "C" __global__ void moelite_##kernel##_##T(const uint8_t* w, uint64_t row_bytes, int64_t rows,     \
                                                    int64_t cols, const uint8_t* x, const int32_t* x_map,   \
                                                    float* y, int64_t y_stride, const int32_t* y_map,       \
                                                    int64_t n_tok, const float* bias) {                     \
    kernel<T>(w, row_bytes, rows, cols, x, x_map, y, y_stride, y_map, n_tok, bias);                         \
  }                                                                                                         \
  SAME_PARAMS(moelite_##kernel##_##T, kernel<T>);
#define INT8_ENTRY(T)                                \
  PRODUCT_Q_ENTRY(matmul_q_kernel, T)                \
  PRODUCT_Q_ENTRY(matmul_q_vec_kernel, T)            \
  GROUPED_ENTRY(grouped_matmul_q_kernel, T)          \
  GROUPED_ENTRY(grouped_matmul_q_vec_kernel, T)      \
  GATE_UP_ENTRY(grouped_gate_up_q_kernel, T)         \
  GATE_UP_ENTRY(grouped_gate_up_q_vec_kernel, T)

MATMUL_ENTRY(0)
MATMUL_ENTRY(1)
MATMUL_ENTRY(2)
MATMUL_ENTRY(3)
MATMUL_ENTRY(6)
MATMUL_ENTRY(7)
MATMUL_ENTRY(8)
MATMUL_ENTRY(10)
MATMUL_ENTRY(11)
MATMUL_ENTRY(12)
MATMUL_ENTRY(13)
MATMUL_ENTRY(14)
MATMUL_ENTRY(30)
MATMUL_ENTRY(39)

INT8_ENTRY(2)
INT8_ENTRY(3)
INT8_ENTRY(6)
INT8_ENTRY(7)
INT8_ENTRY(8)
INT8_ENTRY(10)
INT8_ENTRY(11)
INT8_ENTRY(12)
INT8_ENTRY(13)
INT8_ENTRY(14)
INT8_ENTRY(39)

extern "C" __global__ void moelite_quantize_act_kernel(int format, const float* x, int64_t x_stride,
                                                       const int32_t* x_map, int64_t n_rows, int64_t cols,
                                                       uint8_t* out) {
  quantize_act_kernel(format, x, x_stride, x_map, n_rows, cols, out);
}
SAME_PARAMS(moelite_quantize_act_kernel, quantize_act_kernel);

extern "C" __global__ void moelite_add_kernel(float* x, const float* y, int64_t n) { add_kernel(x, y, n); }
SAME_PARAMS(moelite_add_kernel, add_kernel);
extern "C" __global__ void moelite_scale_kernel(float* x, float s, int64_t n) { scale_kernel(x, s, n); }
SAME_PARAMS(moelite_scale_kernel, scale_kernel);
extern "C" __global__ void moelite_add_bias_kernel(float* x, const float* bias, int64_t rows, int64_t cols) {
  add_bias_kernel(x, bias, rows, cols);
}
SAME_PARAMS(moelite_add_bias_kernel, add_bias_kernel);
extern "C" __global__ void moelite_copy_columns_kernel(const float* x, int64_t x_cols, int64_t x_stride,
                                                       int64_t x_offset, float* out, int64_t out_cols,
                                                       int64_t out_stride, int64_t out_offset, int64_t rows,
                                                       int32_t n_groups, int64_t width) {
  copy_columns_kernel(x, x_cols, x_stride, x_offset, out, out_cols, out_stride, out_offset, rows, n_groups, width);
}
SAME_PARAMS(moelite_copy_columns_kernel, copy_columns_kernel);
extern "C" __global__ void moelite_ffn_act_kernel(const float* g, const float* u, float* h, int64_t n, int mode,
                                                  float alpha, float limit) {
  ffn_act_kernel(g, u, h, n, mode, alpha, limit);
}
SAME_PARAMS(moelite_ffn_act_kernel, ffn_act_kernel);
extern "C" __global__ void moelite_sigmoid_scale_kernel(float* x, const float* s, int64_t rows, int64_t cols) {
  sigmoid_scale_kernel(x, s, rows, cols);
}
SAME_PARAMS(moelite_sigmoid_scale_kernel, sigmoid_scale_kernel);
extern "C" __global__ void moelite_combine_kernel(const float* outputs, const int32_t* ids, const float* weights,
                                                  int64_t n_tok, int32_t k, int64_t cols, float* out) {
  combine_kernel(outputs, ids, weights, n_tok, k, cols, out);
}
SAME_PARAMS(moelite_combine_kernel, combine_kernel);
extern "C" __global__ void moelite_rms_norm_kernel(const float* x, const float* w, int64_t cols, int64_t group,
                                                   float eps, float* y) {
  rms_norm_kernel(x, w, cols, group, eps, y);
}
SAME_PARAMS(moelite_rms_norm_kernel, rms_norm_kernel);
extern "C" __global__ void moelite_rope_kernel(float* x, int64_t rows, int64_t cols, int64_t head_dim, int32_t n_rot,
                                               int neox, const float* cos_sin) {
  rope_kernel(x, rows, cols, head_dim, n_rot, neox, cos_sin);
}
SAME_PARAMS(moelite_rope_kernel, rope_kernel);
extern "C" __global__ void moelite_attention_chunk_kernel(const float* q, const float* cache_k, const float* cache_v,
                                                          float* partial, int32_t pos0, int32_t n_head,
                                                          int32_t n_head_kv, int64_t head_dim, int64_t head_dim_v,
                                                          int64_t kv_dim, int32_t slots, int32_t window, float scale) {
  attention_chunk_kernel(q, cache_k, cache_v, partial, pos0, n_head, n_head_kv, head_dim, head_dim_v, kv_dim, slots,
                         window, scale);
}
SAME_PARAMS(moelite_attention_chunk_kernel, attention_chunk_kernel);
extern "C" __global__ void moelite_attention_merge_kernel(const float* partial, int32_t n_chunks, int32_t n_head,
                                                          int64_t head_dim, const float* sinks, float* out) {
  attention_merge_kernel(partial, n_chunks, n_head, head_dim, sinks, out);
}
SAME_PARAMS(moelite_attention_merge_kernel, attention_merge_kernel);
extern "C" __global__ void moelite_route_kernel(const float* logits, int64_t n_tok, int32_t n_expert, int32_t k,
                                                int renorm, int32_t* ids, float* weights) {
  route_kernel(logits, n_tok, n_expert, k, renorm, ids, weights);
}
SAME_PARAMS(moelite_route_kernel, route_kernel);
