// RMSNorm over groups of columns and rotary position embedding.
#pragma once
#include "backends/cuda/kernels/dialect.cuh"

namespace moelite::cuda_kernels {

constexpr int kNormThreads = 512;  // a decoding token is one block: more threads, fewer serial loads

// One block per (row, group): y = x / sqrt(mean(x^2) + eps) * w. In place is allowed.
MK_GLOBAL void rms_norm_kernel(const float* x, const float* w, int64_t cols, int64_t group, float eps, float* y) {
  MK_SHARED(float, partial, kNormThreads / 32);
  const int64_t groups = cols / group;
  const int64_t base = int64_t(blockIdx.x / groups) * cols + int64_t(blockIdx.x % groups) * group;
  const int tid = int(threadIdx.x);
  float acc = 0.0f;
  for (int64_t i = tid; i < group; i += kNormThreads) acc += x[base + i] * x[base + i];
  acc = warp_sum(acc);
  if ((tid & 31) == 0) partial[tid >> 5] = acc;
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < kNormThreads / 32; ++j) total += partial[j];
  const float inv = 1.0f / sqrtf(total / float(group) + eps);
  for (int64_t i = tid; i < group; i += kNormThreads) y[base + i] = x[base + i] * inv * (w ? w[i] : 1.0f);
}

// Rotates pairs of each head: one thread per (row, head, pair). cos_sin holds, per row, n_rot/2
// (cos, sin) pairs computed on the host in double (as the CPU backend does).
MK_GLOBAL void rope_kernel(float* x, int64_t rows, int64_t cols, int64_t head_dim, int32_t n_rot, int neox,
                           const float* cos_sin) {
  const int32_t half = n_rot / 2;
  const int64_t heads = cols / head_dim, total = rows * heads * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (heads * half), h = (i / half) % heads, p = i % half;
    float* head = x + t * cols + h * head_dim;
    const int64_t a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    const float c = cos_sin[(t * half + p) * 2], s = cos_sin[(t * half + p) * 2 + 1];
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
  }
}

}  // namespace moelite::cuda_kernels
