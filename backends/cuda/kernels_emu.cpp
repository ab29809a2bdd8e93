// The kernels compiled by the host compiler onto the SIMT emulator (see kernel_table.h).
#include <type_traits>

#include "backends/cuda/emu_launch.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/elementwise.cuh"
#include "backends/cuda/kernels/matmul.cuh"
#include "backends/cuda/kernels/norm_rope.cuh"

namespace moelite::cuda {
namespace emu_kernels {
namespace {

using dim3 = simt::Dim3;
#define MOELITE_LAUNCH(grid, block, shmem, stream, kernel, ...) \
  emu_enqueue_kernel(stream, grid, block, shmem, #kernel, [=] { kernel(__VA_ARGS__); })
#define KERNEL_TABLE_NAME "simt emulator"
#include "backends/cuda/kernels/launchers.inc"

}  // namespace
}  // namespace emu_kernels

const KernelTable& emulator_kernels() { return emu_kernels::kTable; }

}  // namespace moelite::cuda
