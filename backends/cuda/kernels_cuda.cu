// The kernels compiled by nvcc for a GPU (see kernel_table.h).
#include <cuda_runtime.h>

#include <type_traits>

#include "backends/cuda/kernel_table.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/elementwise.cuh"
#include "backends/cuda/kernels/matmul.cuh"
#include "backends/cuda/kernels/norm_rope.cuh"

namespace moelite::cuda {
namespace nvcc_kernels {
namespace {

// A launch reports configuration errors at once; faults while the kernel runs surface at the next
// synchronisation (the runtime's stream_sync / event_sync).
Status launch_status(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return MOELITE_OK;
  return fail(MOELITE_ERR_BACKEND, "CUDA launch of %s: %s", kernel, cudaGetErrorString(e));
}

#define MOELITE_LAUNCH(grid, block, shmem, stream, kernel, ...) \
  (kernel<<<grid, block, shmem, static_cast<cudaStream_t>(stream)>>>(__VA_ARGS__), launch_status(#kernel))
#define KERNEL_TABLE_NAME "cuda"
#include "backends/cuda/kernels/launchers.inc"

}  // namespace
}  // namespace nvcc_kernels

const KernelTable& gpu_kernels() { return nvcc_kernels::kTable; }

}  // namespace moelite::cuda
