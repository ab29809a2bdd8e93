// The kernel table of a real GPU: the launchers of kernels/launchers.inc, each launching the
// kernel's entry point in the fatbin that nvcc compiled from kernels_gpu.cu. The kernel headers are
// included here only for the kernels' types, so that each launch converts its arguments to the
// kernel's own parameter types before packing them: the bytes the driver copies are exactly what
// the entry point expects. Only the type is named (decltype), so no kernel body is compiled for
// the host: the library carries none of the emulator's code.
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

// Each argument converted to its parameter's type, element by element.
template <class Values, class... Args, size_t... I>
Values convert_each(std::index_sequence<I...>, Args&&... args) {
  return Values(static_cast<std::tuple_element_t<I, Values>>(std::forward<Args>(args))...);
}
template <class Values, class... Args>
Values convert(Args&&... args) {
  return convert_each<Values>(std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
}

// The parameter types of a kernel, from the type of a pointer to it.
template <class Kernel>
struct KernelParams;
template <class... Params>
struct KernelParams<void (*)(Params...)> {
  using Values = std::tuple<std::decay_t<Params>...>;
  static constexpr size_t kCount = sizeof...(Params);
};

template <class Kernel, class... Args>
Status launch(StreamHandle s, const char* kernel, int type_id, Dim3 grid, Dim3 block, size_t shared_bytes,
              Args&&... args) {
  using Params = KernelParams<Kernel>;
  static_assert(Params::kCount == sizeof...(Args), "a kernel launch with the wrong number of arguments");
  typename Params::Values values = convert<typename Params::Values>(std::forward<Args>(args)...);
  void* packed[Params::kCount > 0 ? Params::kCount : 1];
  std::apply(
      [&](auto&... v) {
        size_t i = 0;
        ((packed[i++] = static_cast<void*>(&v)), ...);
      },
      values);
  return gpu_launch_packed(s, kernel, type_id, grid, block, shared_bytes, packed);
}

using dim3 = Dim3;
#define MOELITE_LAUNCH(grid, block, shmem, stream, kernel, ...) \
  launch<decltype(&kernel)>(stream, #kernel, type_id, grid, block, shmem, __VA_ARGS__)
#define KERNEL_TABLE_NAME "cuda"
#include "backends/cuda/kernels/launchers.inc"

}  // namespace
}  // namespace driver_kernels

const KernelTable& gpu_kernels() { return driver_kernels::kTable; }

}  // namespace moelite::cuda
