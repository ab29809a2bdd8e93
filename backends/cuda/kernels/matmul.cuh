// Fused dequantize + matrix product for every weight type: y[t] = W x[t] (+ bias).
//
// One warp per (output row, chunk of up to NT tokens: kTokensPerWarp, or 1 in decode's one-token
// kernels). The warp first copies a chunk of its row's bytes (up to kStageBytes: a 2048-column Q8_0
// row whole) into its shared stage with 16-byte loads, every load of the chunk issued before any is
// used, and only then decodes. Lane l takes the columns l, l + 32, l + 64, … of the chunk,
// dequantizes each weight once from the stage and applies it to every token of the chunk; each
// token's 32 partial sums are reduced in a fixed butterfly.
//
// Why the stage: decoding straight from global memory, a warp waited one memory latency per
// 32-column step (one byte per lane), and with only 8 warps an SM on an expert's 1024 rows the
// H200 read experts at 50 GB/s of its 4 TB/s (docs/gpu-notes.md). Staged, a warp has its whole
// chunk (2 KB or more) in flight at once, and the loads are coalesced whatever the type's block
// size (18, 34, 210 … bytes), so no type needs a layout of its own.
//
// The arithmetic of one (row, token) output is the same whatever the batch size, and the same as
// the unstaged kernel's (chunks are multiples of 32 columns, so lane l sums the same columns in the
// same order): prefill and token-by-token decode give bitwise identical results, as the CPU and
// Vulkan backends do, and weights are read once per kTokensPerWarp tokens.
//
// Row maps let one launch serve an expert's scattered tokens: token t reads row x_map[t] of x and
// writes row y_map[t] of y (identity when a map is null).
//
// Each kernel comes in two widths: NT = kTokensPerWarp tokens a warp (prefill, batches) and NT = 1
// (the *_vec kernels: products of one token, i.e. decode). A token's sums do not depend on the
// others', so both give the same bits; the one-token kernels just do not hold 8 tokens' pointers
// and sums, which took most of the 168 registers a thread of the grouped kernels (3 blocks, 12
// warps an SM on an H200: too few to cover the row loads' latency, docs/gpu-notes.md).
#pragma once
#include "backends/cuda/kernels/activation.cuh"
#include "backends/cuda/kernels/dequant.cuh"
#include "backends/cuda/kernels/grouped_product.h"
#include "backends/cuda/kernels/int8_dot.cuh"

namespace moelite::cuda_kernels {

constexpr int kTokensPerWarp = 8;
constexpr int kMatmulWarps = 4;  // warps (rows) per block
constexpr int kUnroll = 8;       // 32-column steps decoded together from the stage
constexpr int kStageBytes = 4096;  // weight bytes a warp stages at a time, over its M matrices
// Per matrix, with M of them (1, or 2 for a gate/up pair, which gets half the bytes each, so both
// kernels take 16.5 KB of shared memory a block and about as many registers):
template <int M>
constexpr int kStageBytesOf = kStageBytes / M;
template <int M>
constexpr int kStageSpanOf = kStageBytesOf<M> + 32;  // + rounding both ends to 16 bytes
template <int M>
constexpr int kStageLoadsOf = (kStageSpanOf<M> / 16 + 31) / 32;  // 16-byte loads a lane
// A chunk of B bytes starting anywhere covers at most B / 16 + 2 aligned 16-byte words.
static_assert(kStageBytes / 16 + 2 <= 32 * kStageLoadsOf<1> && 16 * (kStageBytes / 16 + 2) <= kStageSpanOf<1>,
              "the stage's loads must cover a chunk");
static_assert(kStageBytes / 32 + 2 <= 32 * kStageLoadsOf<2> && 16 * (kStageBytes / 32 + 2) <= kStageSpanOf<2>,
              "the stage's loads must cover a chunk");
constexpr int kStageSpan = kStageSpanOf<1>;

// Copies the chunk of blocks [b0, b0 + nb) of each of the warp's M rows into its part of the
// stage (matrix m at mine + m * kStageSpanOf<M>), every 16-byte load issued before any is stored;
// at[m] receives the offset in the stage where matrix m's chunk starts.
template <int T, int M, class Stage>
MK_DEVICE void stage_chunk(Stage& stage, int64_t mine, int lane, const uint8_t* const (&wr)[M], int64_t b0, int64_t nb,
                           int64_t (&at)[M]) {
  constexpr int64_t kBlockBytes = Layout<T>::bytes, kSpan = kStageSpanOf<M>;
  constexpr int kLoads = kStageLoadsOf<M>;
  const uint8_t* src[M];
  const uint8_t* first[M];
  int64_t words[M];
  Vec16 v[M][kLoads];
  MK_UNROLL
  for (int m = 0; m < M; ++m) {
    src[m] = wr[m] + b0 * kBlockBytes;
    first[m] = src[m] - (reinterpret_cast<uintptr_t>(src[m]) & 15u);
    words[m] = (src[m] + nb * kBlockBytes - first[m] + 15) / 16;
    MK_UNROLL
    for (int u = 0; u < kLoads; ++u)
      if (lane + 32 * u < words[m]) v[m][u] = load_vec16(first[m] + 16 * (lane + 32 * u), src[m], src[m] + nb * kBlockBytes);
  }
  __syncwarp();  // every lane is done reading the previous chunk before the stage is overwritten
  MK_UNROLL
  for (int m = 0; m < M; ++m) {
    MK_UNROLL
    for (int u = 0; u < kLoads; ++u)
      if (lane + 32 * u < words[m]) store_vec16(stage, mine + m * kSpan + 16 * (lane + 32 * u), v[m][u]);
    at[m] = mine + m * kSpan + (src[m] - first[m]);
  }
  __syncwarp();
}

// One warp's rows: acc[m][j] += row r of matrix m (M of them: 1, or 2 for a gate/up pair, whose
// rows are staged side by side and both in flight) times token j's input, for j < n. The stage is
// the block's; this warp uses M * kStageSpanOf<M> bytes of it from `mine`.
template <int T, int M, int NT, class Stage>
MK_DEVICE void warp_row_products(Stage& stage, int64_t mine, int lane, const uint8_t* const (&wr)[M], int64_t cols,
                                 const float* const (&xs)[NT], int n, float (&acc)[M][NT]) {
  // A chunk is whole blocks of the type, and a multiple of 32 columns (blocks are 1, 32 or 256
  // columns; a float chunk is 1024 or 2048).
  constexpr int64_t kBlockCols = Layout<T>::block, kBlockBytes = Layout<T>::bytes;
  constexpr int64_t kChunkBlocks = kStageBytesOf<M> / kBlockBytes;
  static_assert(kChunkBlocks * kBlockCols % 32 == 0, "a chunk must hold whole 32-column steps");
  const int64_t n_blocks = cols / kBlockCols;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
    const int64_t nb = n_blocks - b0 < kChunkBlocks ? n_blocks - b0 : kChunkBlocks;
    int64_t at[M];
    stage_chunk<T, M>(stage, mine, lane, wr, b0, nb, at);
    const int64_t chunk_cols = nb * kBlockCols, c0 = b0 * kBlockCols;
    MK_UNROLL
    for (int m = 0; m < M; ++m) {
      const auto sw = bytes_at(stage, at[m]);
      // kUnroll steps' weights are decoded first, then applied in column order: the sums are those
      // of one step at a time, bit for bit.
      int64_t c = lane;
      for (; c + 32 * (kUnroll - 1) < chunk_cols; c += 32 * kUnroll) {
        float wv[kUnroll];
        for (int u = 0; u < kUnroll; ++u) wv[u] = dq<T>(sw, c + 32 * u);
        for (int u = 0; u < kUnroll; ++u)
          for (int j = 0; j < NT; ++j)
            if (j < n) acc[m][j] += wv[u] * xs[j][c0 + c + 32 * u];
      }
      for (; c < chunk_cols; c += 32) {
        const float wv = dq<T>(sw, c);
        for (int j = 0; j < NT; ++j)
          if (j < n) acc[m][j] += wv * xs[j][c0 + c];
      }
    }
  }
}

// The int8 counterpart of warp_row_products (matmul.cuh): the same staged chunks of the warp's M
// rows, against token j's quantized row xq[j] (layout l), for j < n.
template <int T, int M, int NT, class Stage>
MK_DEVICE void warp_row_products_int8(Stage& stage, int64_t mine, int lane, const uint8_t* const (&wr)[M],
                                      int64_t cols, const uint8_t* const (&xq)[NT], const ActRowLayout& l, int n,
                                      float (&acc)[M][NT]) {
  constexpr int64_t kBlockCols = Layout<T>::block, kBlockBytes = Layout<T>::bytes;
  constexpr int64_t kChunkBlocks = kStageBytesOf<M> / kBlockBytes;
  constexpr int kLanes = kLanesPerBlock<T>, kPerStep = kBlocksPerStep<T>;
  const int64_t n_blocks = cols / kBlockCols;
  const int w0 = (lane % kLanes) * 8;  // the lane's first weight in its block
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
    const int64_t nb = n_blocks - b0 < kChunkBlocks ? n_blocks - b0 : kChunkBlocks;
    int64_t at[M];
    stage_chunk<T, M>(stage, mine, lane, wr, b0, nb, at);
    for (int64_t s = lane / kLanes; s < nb; s += kPerStep) {
      const int64_t block = b0 + s, col = block * kBlockCols + w0;
      MK_UNROLL
      for (int m = 0; m < M; ++m) {
        const auto b = bytes_at(stage, at[m] + s * kBlockBytes);
        uint32_t lo, hi;
        int8_codes<T>(b, w0, &lo, &hi);
        for (int j = 0; j < NT; ++j) {
          if (j >= n) break;
          const uint32_t* a = reinterpret_cast<const uint32_t*>(xq[j] + col);
          const int32_t isum = dp4a(hi, a[1], dp4a(lo, a[0], 0));
          acc[m][j] += int8_term<T>(b, w0, isum, xq[j], l, block);
        }
      }
    }
  }
}

// Rows [blockIdx.x * kMatmulWarps, + kMatmulWarps) of y = W x (+ bias) for tokens
// [blockIdx.y * NT, + NT): in floats from x (kInt8 false), or from the tokens' quantized rows xq
// (int8_dot.cuh) for a quantized T.
template <int T, int NT, bool kInt8>
MK_DEVICE void matmul_rows(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x,
                           const uint8_t* xq, int64_t x_stride, const int32_t* x_map, float* y, int64_t y_stride,
                           const int32_t* y_map, int64_t n_tok, const float* bias) {
  MK_SHARED_BYTES(stage, kMatmulWarps * kStageSpan);
  const int lane = int(threadIdx.x & 31u);
  const int warp = int(threadIdx.x >> 5);
  const int64_t r = int64_t(blockIdx.x) * kMatmulWarps + warp;
  const int64_t t0 = int64_t(blockIdx.y) * NT;
  if (r >= rows) return;  // a whole warp leaves together: shuffles below see full warps
  const int n = n_tok - t0 < NT ? int(n_tok - t0) : NT;
  float acc[1][NT];
  for (int j = 0; j < NT; ++j) acc[0][j] = 0.0f;
  const uint8_t* const wr[1] = {w + uint64_t(r) * row_bytes};
  if constexpr (kInt8) {
    const ActRowLayout l = act_row_layout(act_format_of(T), cols);
    const uint8_t* xs[NT];
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + (j < n ? j : 0);
      xs[j] = xq + (x_map ? int64_t(x_map[t]) : t) * l.bytes;
    }
    warp_row_products_int8<T, 1, NT>(stage, int64_t(warp) * kStageSpan, lane, wr, cols, xs, l, n, acc);
  } else {
    const float* xs[NT];
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + (j < n ? j : 0);
      xs[j] = x + (x_map ? int64_t(x_map[t]) : t) * x_stride;
    }
    warp_row_products<T, 1, NT>(stage, int64_t(warp) * kStageSpan, lane, wr, cols, xs, n, acc);
  }
  const float b = bias ? bias[r] : 0.0f;
  for (int j = 0; j < n; ++j) {
    const float s = warp_sum(acc[0][j]);
    if (lane == 0) {
      const int64_t t = t0 + j;
      y[(y_map ? int64_t(y_map[t]) : t) * y_stride + r] = s + b;
    }
  }
}

template <int T>
MK_GLOBAL void matmul_kernel(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x,
                             int64_t x_stride, const int32_t* x_map, float* y, int64_t y_stride, const int32_t* y_map,
                             int64_t n_tok, const float* bias) {
  matmul_rows<T, kTokensPerWarp, false>(w, row_bytes, rows, cols, x, nullptr, x_stride, x_map, y, y_stride, y_map,
                                        n_tok, bias);
}
template <int T>
MK_GLOBAL void matmul_vec_kernel(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x,
                                 int64_t x_stride, const int32_t* x_map, float* y, int64_t y_stride,
                                 const int32_t* y_map, int64_t n_tok, const float* bias) {
  matmul_rows<T, 1, false>(w, row_bytes, rows, cols, x, nullptr, x_stride, x_map, y, y_stride, y_map, n_tok, bias);
}
// The integer products: x is the tokens' quantized rows (act_quant.cuh), row x_map[t] for token t.
template <int T>
MK_GLOBAL void matmul_q_kernel(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const uint8_t* x,
                               const int32_t* x_map, float* y, int64_t y_stride, const int32_t* y_map, int64_t n_tok,
                               const float* bias) {
  matmul_rows<T, kTokensPerWarp, true>(w, row_bytes, rows, cols, nullptr, x, 0, x_map, y, y_stride, y_map, n_tok,
                                       bias);
}
template <int T>
MK_GLOBAL void matmul_q_vec_kernel(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, const uint8_t* x,
                                   const int32_t* x_map, float* y, int64_t y_stride, const int32_t* y_map,
                                   int64_t n_tok, const float* bias) {
  matmul_rows<T, 1, true>(w, row_bytes, rows, cols, nullptr, x, 0, x_map, y, y_stride, y_map, n_tok, bias);
}

// Every product of the batch (a kernel parameter) in one launch: block x belongs
// to the product whose first_block is the largest not above it, and covers kMatmulWarps of its
// rows; block y is a chunk of NT of its tokens. With M = 2 each product is a gate/up
// pair and the warp writes act(gate row + bias, up row + bias_up) (activation.cuh), the values the
// separate products and ffn_act would give, bit for bit. One launch for a layer's experts instead
// of four per expert: a decode step's experts were about 30 launches a layer, each a few
// microseconds of launch and a partly idle GPU (1024 rows fill 8 warps an SM).
template <int T, int M, int NT, bool kInt8>
MK_DEVICE void grouped_products(const GroupedBatch& batch, int act_mode, float alpha, float limit) {
  MK_SHARED_BYTES(stage, kMatmulWarps * M * kStageSpanOf<M>);
  const int lane = int(threadIdx.x & 31u);
  const int warp = int(threadIdx.x >> 5);
  int32_t lo = 0, hi = batch.n - 1;  // the last product starting at or before this block
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (batch.p[mid].first_block <= int64_t(blockIdx.x))
      lo = mid;
    else
      hi = mid - 1;
  }
  const GroupedProduct& p = batch.p[lo];
  const int64_t r = (int64_t(blockIdx.x) - p.first_block) * kMatmulWarps + warp;
  const int64_t t0 = int64_t(blockIdx.y) * NT;
  if (r >= p.rows || t0 >= p.n_tok) return;  // whole warps leave together
  const int n = p.n_tok - t0 < NT ? int(p.n_tok - t0) : NT;
  float acc[M][NT];
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < M; ++m) acc[m][j] = 0.0f;
  const uint8_t* wr[M];
  wr[0] = p.w + uint64_t(r) * p.row_bytes;
  if constexpr (M == 2) wr[1] = p.w_up + uint64_t(r) * p.row_bytes;
  const int64_t mine = int64_t(warp) * M * kStageSpanOf<M>;
  if constexpr (kInt8) {
    const ActRowLayout l = act_row_layout(act_format_of(T), p.cols);
    const uint8_t* xs[NT];
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + (j < n ? j : 0);
      xs[j] = p.xq + (p.x_map ? int64_t(p.x_map[t]) : t) * l.bytes;
    }
    warp_row_products_int8<T, M, NT>(stage, mine, lane, wr, p.cols, xs, l, n, acc);
  } else {
    const float* xs[NT];
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + (j < n ? j : 0);
      xs[j] = p.x + (p.x_map ? int64_t(p.x_map[t]) : t) * p.x_stride;
    }
    warp_row_products<T, M, NT>(stage, mine, lane, wr, p.cols, xs, n, acc);
  }
  const float b = p.bias ? p.bias[r] : 0.0f;
  float b_up = 0.0f;
  if constexpr (M == 2) b_up = p.bias_up ? p.bias_up[r] : 0.0f;
  MK_UNROLL
  for (int j = 0; j < NT; ++j) {
    if (j >= n) break;
    const float s = warp_sum(acc[0][j]) + b;
    float out = s;
    if constexpr (M == 2) out = ffn_act_value(s, warp_sum(acc[1][j]) + b_up, act_mode, alpha, limit);
    if (lane == 0) {
      const int64_t t = t0 + j;
      p.y[(p.y_map ? int64_t(p.y_map[t]) : t) * p.y_stride + r] = out;
    }
  }
}

template <int T>
MK_GLOBAL void grouped_matmul_kernel(GroupedBatch batch) {
  grouped_products<T, 1, kTokensPerWarp, false>(batch, 0, 0.0f, 0.0f);
}
template <int T>
MK_GLOBAL void grouped_matmul_vec_kernel(GroupedBatch batch) {
  grouped_products<T, 1, 1, false>(batch, 0, 0.0f, 0.0f);
}
template <int T>
MK_GLOBAL void grouped_gate_up_kernel(GroupedBatch batch, int act_mode, float alpha, float limit) {
  grouped_products<T, 2, kTokensPerWarp, false>(batch, act_mode, alpha, limit);
}
template <int T>
MK_GLOBAL void grouped_gate_up_vec_kernel(GroupedBatch batch, int act_mode, float alpha, float limit) {
  grouped_products<T, 2, 1, false>(batch, act_mode, alpha, limit);
}
// The integer products of a batch: each product's inputs are its quantized rows p.xq.
template <int T>
MK_GLOBAL void grouped_matmul_q_kernel(GroupedBatch batch) {
  grouped_products<T, 1, kTokensPerWarp, true>(batch, 0, 0.0f, 0.0f);
}
template <int T>
MK_GLOBAL void grouped_matmul_q_vec_kernel(GroupedBatch batch) {
  grouped_products<T, 1, 1, true>(batch, 0, 0.0f, 0.0f);
}
template <int T>
MK_GLOBAL void grouped_gate_up_q_kernel(GroupedBatch batch, int act_mode, float alpha, float limit) {
  grouped_products<T, 2, kTokensPerWarp, true>(batch, act_mode, alpha, limit);
}
template <int T>
MK_GLOBAL void grouped_gate_up_q_vec_kernel(GroupedBatch batch, int act_mode, float alpha, float limit) {
  grouped_products<T, 2, 1, true>(batch, act_mode, alpha, limit);
}

}  // namespace moelite::cuda_kernels
