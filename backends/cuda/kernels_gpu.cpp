// The kernel table of a real GPU: the launchers of kernels/launchers.inc, each launching the
// kernel's entry point in the fatbin that nvcc compiled from kernels_gpu.cu. The kernel headers are
// compiled here too (for the host, unused) only so that each launch converts its arguments to the
// kernel's own parameter types before packing them: the bytes the driver copies are exactly what
// the entry point expects.
#include <tuple>
#include <type_traits>
#include <utility>

#include "backends/cuda/gpu_launch.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/elementwise.cuh"
#include "backends/cuda/kernels/matmul.cuh"
#include "backends/cuda/kernels/norm_rope.cuh"

namespace moelite::cuda {
namespace driver_kernels {
namespace {

template <class... Params, class... Args>
Status launch(StreamHandle s, void (*)(Params...), const char* kernel, int type_id, simt::Dim3 grid, simt::Dim3 block,
              size_t shared_bytes, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "a kernel launch with the wrong number of arguments");
  std::tuple<std::decay_t<Params>...> values(static_cast<std::decay_t<Params>>(std::forward<Args>(args))...);
  void* packed[sizeof...(Params) > 0 ? sizeof...(Params) : 1];
  std::apply(
      [&](auto&... v) {
        size_t i = 0;
        ((packed[i++] = static_cast<void*>(&v)), ...);
      },
      values);
  return gpu_launch_packed(s, kernel, type_id, grid, block, shared_bytes, packed);
}

using dim3 = simt::Dim3;
#define MOELITE_LAUNCH(grid, block, shmem, stream, kernel, ...) \
  launch(stream, &kernel, #kernel, type_id, grid, block, shmem, __VA_ARGS__)
#define KERNEL_TABLE_NAME "cuda"
#include "backends/cuda/kernels/launchers.inc"

}  // namespace
}  // namespace driver_kernels

const KernelTable& gpu_kernels() { return driver_kernels::kTable; }

}  // namespace moelite::cuda
