// Between the emulator's kernel table (kernels_emu.cpp) and its device (runtime_emu.cpp): a
// kernel launch is queued on an emulated stream and runs through the SIMT emulator when the stream
// is drained.
#pragma once
#include <cstddef>
#include <functional>

#include "backends/cuda/kernel_table.h"
#include "backends/cuda/simt/simt.h"

namespace moelite::cuda {

[[nodiscard]] Status emu_enqueue_kernel(StreamHandle s, simt::Dim3 grid, simt::Dim3 block, size_t shared_bytes,
                                        const char* kernel_name, std::function<void()> body);

}  // namespace moelite::cuda
