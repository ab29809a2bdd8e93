// Matrix products of one grouped launch (KernelTable::grouped_matmul): the host fills a
// GroupedBatch and passes it by value as the kernel's parameter, so the kernel reads it from the
// constant bank the driver loads with the launch: no copy to the device, and no read of host
// memory by every warp. The layout is plain data shared by the host compiler and nvcc (both LP64),
// so the bytes the host packs are the struct the kernel reads.
#pragma once
#include <cstdint>

namespace moelite::cuda_kernels {

struct GroupedProduct {
  // rows x cols weights in the launch's weight type; w_up: the second matrix of a gate/up pair
  // (same shape and type; null for a plain product).
  const uint8_t* w = nullptr;
  const uint8_t* w_up = nullptr;
  uint64_t row_bytes = 0;
  int64_t rows = 0, cols = 0;
  const float* bias = nullptr;     // rows floats or null
  const float* bias_up = nullptr;  // rows floats or null
  // Token t (of n_tok) reads row x_map[t] of x and writes row y_map[t] of y (identity maps when null).
  // The integer kernels (the _q_ ones) read row x_map[t] of xq instead: the inputs quantized
  // (act_quant.cuh), at the stride of their layout for cols.
  const float* x = nullptr;
  const uint8_t* xq = nullptr;
  int64_t x_stride = 0;
  const int32_t* x_map = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
  const int32_t* y_map = nullptr;
  int64_t n_tok = 0;
  // The product's blocks are blockIdx.x in [first_block, first_block + its row blocks); products
  // are in increasing first_block order.
  int64_t first_block = 0;
};

// What fits in the 4 KB of parameters every architecture from sm_75 accepts.
constexpr int kMaxGroupedProducts = 30;
struct GroupedBatch {
  GroupedProduct p[kMaxGroupedProducts];
  int32_t n = 0;
};
static_assert(sizeof(GroupedBatch) + 16 <= 4096, "a grouped launch's parameters must fit in 4 KB");

}  // namespace moelite::cuda_kernels
