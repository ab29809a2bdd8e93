// Activations quantized for the CUDA backend's integer products: the formats and the layout of a
// quantized row, plain code shared by the host (the backend sizes its buffers with it) and the
// kernels (act_quant.cuh writes the rows, int8_dot.cuh reads them).
//
// Device layout of one row of `cols` values (act_row_layout): the codes (cols bytes), then a float
// scale per block (fp16-rounded d for Q8_0 / Q8_1, the f32 d for Q8_K), then Q8_1's float s per
// block or Q8_K's int32 sums per 16 codes; each part starts 16-byte aligned and rows follow each
// other at `bytes`. The codes are read 8 bytes a lane and the scales one float a block, all aligned.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MOELITE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MOELITE_HOST_DEVICE inline
#endif

namespace moelite::cuda_kernels {

enum ActFormat : int { kActQ8_0 = 0, kActQ8_1 = 1, kActQ8_K = 2 };

struct ActRowLayout {
  int64_t scales = 0, sums = 0, bytes = 0;  // byte offsets in a row, and the row's stride
};

MOELITE_HOST_DEVICE int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

MOELITE_HOST_DEVICE int64_t act_block(int format) { return format == kActQ8_K ? 256 : 32; }

MOELITE_HOST_DEVICE ActRowLayout act_row_layout(int format, int64_t cols) {
  ActRowLayout l;
  const int64_t blocks = cols / act_block(format);
  l.scales = align16(cols);
  l.sums = align16(l.scales + 4 * blocks);
  const int64_t sums = format == kActQ8_1 ? 4 * blocks : format == kActQ8_K ? 4 * (cols / 16) : 0;
  l.bytes = align16(l.sums + sums);
  return l;
}

// The activation format a weight type's integer product reads (the CPU's dot_type), -1 for the
// float types, whose products stay in floats.
MOELITE_HOST_DEVICE int act_format_of(int weight_type_id) {
  switch (weight_type_id) {
    case 2:   // Q4_0
    case 6:   // Q5_0
    case 8:   // Q8_0
    case 39:  // MXFP4
      return kActQ8_0;
    case 3:  // Q4_1
    case 7:  // Q5_1
      return kActQ8_1;
    case 10: case 11: case 12: case 13: case 14:  // Q2_K ... Q6_K
      return kActQ8_K;
    default: return -1;
  }
}

}  // namespace moelite::cuda_kernels
