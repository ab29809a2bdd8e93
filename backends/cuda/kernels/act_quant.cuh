// Activations quantized for the integer products (int8_dot.cuh): each input row is turned once
// into int8 codes with a scale per block, in the CPU backend's dot formats and with its arithmetic
// (backends/cpu/quant_scalar.cpp, itself ggml's reference quantizers), so a row's codes and scales
// are the CPU's bit for bit:
//   Q8_0 (for Q4_0, Q5_0, Q8_0, MXFP4 weights): blocks of 32, d = amax / 127 rounded to fp16,
//        q = round-half-away(x * (1 / d));
//   Q8_1 (for Q4_1, Q5_1): as Q8_0, plus s = fp16(sum(q) * d) per block;
//   Q8_K (for Q2_K ... Q6_K): blocks of 256, iscale = -127 / (the element of largest magnitude,
//        the first of equals), q = min(round-to-even(iscale * x), 127), d = 1 / iscale in f32,
//        and the sum of each 16 codes.
//
// The rows' layout: act_layout.h.
#pragma once
#include "backends/cuda/kernels/act_layout.h"
#include "backends/cuda/kernels/dialect.cuh"

namespace moelite::cuda_kernels {

constexpr int kQuantizeWarps = 4;  // warps (blocks of the format) per thread block

// Row r of the n_rows x cols input (x_stride floats apart; row x_map[r] when a map is given) into
// row r of `out`. One warp per block of the format: a 32-value block a lane per value, a 256-value
// block eight consecutive values a lane. grid.x covers every (row, block), kQuantizeWarps a block.
MK_GLOBAL void quantize_act_kernel(int format, const float* x, int64_t x_stride, const int32_t* x_map, int64_t n_rows,
                                   int64_t cols, uint8_t* out) {
  const int lane = int(threadIdx.x & 31u);
  const int64_t per_row = cols / act_block(format);
  const int64_t job = int64_t(blockIdx.x) * kQuantizeWarps + int64_t(threadIdx.x >> 5);
  if (job >= n_rows * per_row) return;  // whole warps leave together
  const int64_t r = job / per_row, b = job % per_row;
  const float* src = x + (x_map ? int64_t(x_map[r]) : r) * x_stride;
  const ActRowLayout l = act_row_layout(format, cols);
  uint8_t* row = out + r * l.bytes;
  float* scales = reinterpret_cast<float*>(row + l.scales);
  if (format != kActQ8_K) {
    const float v = src[b * 32 + lane];
    const float amax = warp_max(fabsf(v));  // fabsf: -0 counts as +0, as the CPU's fabs
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = int(roundf(v * id));  // half away from zero, as the CPU's std::roundf
    row[b * 32 + lane] = uint8_t(int8_t(q));
    int sum = q;
    for (int m = 16; m > 0; m >>= 1) sum += shfl_xor(sum, m);
    if (lane == 0) {
      scales[b] = half_bits_to_float(float_to_half_bits(d));
      if (format == kActQ8_1)
        reinterpret_cast<float*>(row + l.sums)[b] = half_bits_to_float(float_to_half_bits(float(sum) * d));
    }
    return;
  }
  // Q8_K: lane l holds values 8l .. 8l + 7 of the block. The scale's element is the first of the
  // largest magnitude: each lane's first, then the lowest index among the lanes' equals.
  float v[8];
  float amax = 0.0f, max = 0.0f;
  int at = 1 << 30;
  for (int k = 0; k < 8; ++k) {
    v[k] = src[b * 256 + 8 * lane + k];
    const float a = fabsf(v[k]);
    if (a > amax) amax = a, max = v[k], at = 8 * lane + k;
  }
  for (int m = 16; m > 0; m >>= 1) {
    const float o_amax = shfl_xor(amax, m), o_max = shfl_xor(max, m);
    const int o_at = shfl_xor(at, m);
    if (o_amax > amax || (o_amax == amax && o_at < at)) amax = o_amax, max = o_max, at = o_at;
  }
  float d = 0.0f;
  int sum8 = 0;
  uint8_t* codes = row + b * 256 + 8 * lane;
  if (amax == 0.0f) {
    for (int k = 0; k < 8; ++k) codes[k] = 0;
  } else {
    const float iscale = -127.0f / max;
    for (int k = 0; k < 8; ++k) {
      const int q = int(rintf(iscale * v[k]));  // to nearest even, as the CPU's std::nearbyintf
      const int c = q < 127 ? q : 127;
      codes[k] = uint8_t(int8_t(c));
      sum8 += c;
    }
    d = 1.0f / iscale;
  }
  // Sums of 16 codes: lanes 2g and 2g + 1 hold group g.
  const int sum16 = sum8 + shfl_xor(sum8, 1);
  if ((lane & 1) == 0) reinterpret_cast<int32_t*>(row + l.sums)[b * 16 + lane / 2] = sum16;
  if (lane == 0) scales[b] = d;
}

}  // namespace moelite::cuda_kernels
