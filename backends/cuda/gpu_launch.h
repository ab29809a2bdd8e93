// Between the GPU's kernel table (kernels_gpu.cpp) and the CUDA driver runtime
// (runtime_cuda.cpp): a kernel is launched by the name of its entry point in the embedded fatbin,
// with its parameters packed as the driver's cuLaunchKernel takes them.
#pragma once
#include <cstddef>

#include "backends/cuda/kernel_table.h"
#include "backends/cuda/launch_shape.h"

namespace moelite::cuda {

// `kernel` is the kernel's name as written in kernels/*.cuh (a string literal, also the cache
// key), `type_id` the weight type of a templated kernel or -1; `params` point at each parameter's
// value, of exactly the kernel's parameter types.
[[nodiscard]] Status gpu_launch_packed(StreamHandle s, const char* kernel, int type_id, Dim3 grid,
                                       Dim3 block, size_t shared_bytes, void** params);

}  // namespace moelite::cuda
