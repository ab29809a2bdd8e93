// The CUDA backend's kernels as a table of launch functions. The same kernel source is compiled
// twice: by nvcc into the fatbin a GPU runs (kernels_gpu.cu; launched by kernels_gpu.cpp) and by
// the host compiler for the SIMT emulator (kernels_emu.cpp); each side fills one table, and the
// backend computes through whichever its runtime (gpu_runtime.h) hands it. Pointers are device pointers; `stream` is the runtime's stream handle.
// A launcher returns a Status for what it can tell at launch (bad configuration, unsupported type);
// failures while the kernel runs are reported by the runtime's next synchronisation.
#pragma once
#include <cstdint>

#include "backends/cuda/kernels/act_layout.h"
#include "backends/cuda/kernels/grouped_product.h"
#include "base/status.h"
#include "base/types.h"

namespace moelite::cuda {

using StreamHandle = void*;
using cuda_kernels::GroupedBatch;
using cuda_kernels::GroupedProduct;
using cuda_kernels::kMaxGroupedProducts;

struct WeightArg {  // a weight matrix in device memory, in its file format
  TensorType type = TensorType::F32;
  const uint8_t* data = nullptr;
  uint64_t row_bytes = 0;
  int64_t rows = 0, cols = 0;
};

struct MatmulArgs {
  WeightArg w;
  const float* x = nullptr;
  const uint8_t* xq = nullptr;     // or the inputs quantized (quantize_act): the integer product
  int64_t x_stride = 0;            // floats between input rows (x)
  const int32_t* x_map = nullptr;  // input row of token t (null: t)
  float* y = nullptr;
  int64_t y_stride = 0;
  const int32_t* y_map = nullptr;
  int64_t n_tok = 0;
  const float* bias = nullptr;  // w.rows floats or null
};

struct KernelTable {
  const char* name;  // "cuda" or "simt emulator"
  bool (*supports)(TensorType t);
  Status (*matmul)(StreamHandle s, const MatmulArgs& a);
  Status (*get_rows)(StreamHandle s, const WeightArg& table, const int32_t* tokens, int64_t n, float* out);
  Status (*rms_norm)(StreamHandle s, const float* x, const float* w, int64_t rows, int64_t cols, int64_t group,
                     float eps, float* y);
  Status (*rope)(StreamHandle s, float* x, int64_t rows, int64_t cols, int64_t head_dim, int32_t n_rot, bool neox,
                 const float* cos_sin);
  // Causal attention of n_tok tokens (the first at position pos0) over the cache (position j in
  // slot j % slots; window > 0: each token sees its last `window` positions; sinks: n_head device
  // floats or null), split into chunks of positions; `partial` holds
  // n_tok * n_head * attention_chunks(pos0 + n_tok) * (head_dim_v + 2) floats. A value is the first
  // head_dim_v floats of its kv head's row in cache_v (cache_k itself for a keys-only cache).
  Status (*attention)(StreamHandle s, const float* q, const float* cache_k, const float* cache_v, float* out,
                      float* partial, int32_t n_tok, int32_t pos0, int32_t n_head, int32_t n_head_kv, int64_t head_dim,
                      int64_t head_dim_v, int64_t kv_dim, int32_t slots, int32_t window, const float* sinks,
                      float scale);
  Status (*copy_columns)(StreamHandle s, const float* x, int64_t x_cols, int64_t x_stride, int64_t x_offset,
                         float* out, int64_t out_cols, int64_t out_stride, int64_t out_offset, int64_t rows,
                         int32_t n_groups, int64_t width);
  Status (*route)(StreamHandle s, const float* logits, int64_t n_tok, int32_t n_expert, int32_t k, bool renorm,
                  int32_t* ids, float* weights);
  Status (*add)(StreamHandle s, float* x, const float* y, int64_t n);
  Status (*scale)(StreamHandle s, float* x, float v, int64_t n);
  Status (*add_bias)(StreamHandle s, float* x, const float* bias, int64_t rows, int64_t cols);
  Status (*ffn_act)(StreamHandle s, const float* g, const float* u, float* h, int64_t n, int mode, float alpha,
                    float limit);
  Status (*sigmoid_scale)(StreamHandle s, float* x, const float* gate, int64_t rows, int64_t cols);
  Status (*combine)(StreamHandle s, const float* outputs, const int32_t* ids, const float* weights, int64_t n_tok,
                    int32_t k, int64_t cols, float* out);
  // Every product of `batch` (all of weight type `type`, laid out by grouped_layout) in one launch
  // of total_blocks x (max_tokens / 8, rounded up) blocks; the batch travels as the kernel's
  // parameter. gate_up: each product is a gate/up pair, and y receives act(gate, up) (ffn_act's
  // mode, alpha and limit) instead of a product. int8: the integer products, from each product's
  // quantized inputs (xq) of a quantized type.
  Status (*grouped_matmul)(StreamHandle s, TensorType type, const GroupedBatch& batch, int64_t total_blocks,
                           int64_t max_tokens, bool gate_up, bool int8, int act_mode, float alpha, float limit);
  // Rows r < n_rows of x (x_stride floats apart; row x_map[r] when a map is given), cols values
  // each, quantized into row r of `out` in an activation format (kernels/act_quant.cuh: the CPU's
  // Q8_0, Q8_1 or Q8_K codes and scales, bit for bit), rows act_row_layout(format, cols).bytes apart.
  Status (*quantize_act)(StreamHandle s, int format, const float* x, int64_t x_stride, const int32_t* x_map,
                         int64_t n_rows, int64_t cols, uint8_t* out);
};

// Rows of a product one block of a grouped launch covers (the kernels' kMatmulWarps).
constexpr int64_t kGroupedRowsPerBlock = 4;
// Sets each product's first_block in order; returns the launch's total blocks.
inline int64_t grouped_layout(GroupedBatch* b) {
  int64_t next = 0;
  for (int32_t i = 0; i < b->n; ++i) {
    b->p[i].first_block = next;
    next += (b->p[i].rows + kGroupedRowsPerBlock - 1) / kGroupedRowsPerBlock;
  }
  return next;
}

// Positions per chunk of the split attention, and the chunks a context of n_pos positions needs.
constexpr int32_t kAttentionChunk = 256;
inline int32_t attention_chunks(int32_t n_pos) { return (n_pos + kAttentionChunk - 1) / kAttentionChunk; }

// The emulator's table (always built) and the GPU's (only in builds with the CUDA toolkit).
const KernelTable& emulator_kernels();
const KernelTable& gpu_kernels();

}  // namespace moelite::cuda
