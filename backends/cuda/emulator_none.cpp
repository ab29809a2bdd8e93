// Builds without the SIMT emulator (the default, and what is installed): the emulated device is
// test and development scaffolding, built in only with -DMOELITE_CUDA_EMULATOR=ON.
#include "backends/cuda/gpu_runtime.h"

namespace moelite::cuda {

Status open_emulated_runtime(bool, std::unique_ptr<GpuRuntime>*) {
  return fail(MOELITE_ERR_BACKEND_UNAVAILABLE,
              "MOELITE_CUDA_EMULATOR is set, but this build of moelite has no CUDA emulator (configure with "
              "-DMOELITE_CUDA_EMULATOR=ON, as tools/test.sh does)");
}

}  // namespace moelite::cuda
