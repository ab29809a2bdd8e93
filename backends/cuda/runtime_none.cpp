// Builds without the CUDA toolkit: the emulated device still works, a GPU cannot.
#include "backends/cuda/gpu_runtime.h"

namespace moelite::cuda {

Status open_cuda_runtime(std::unique_ptr<GpuRuntime>*) {
  return fail(MOELITE_ERR_BACKEND_UNAVAILABLE,
              "CUDA backend: this build of moelite has no GPU support (configured without the CUDA toolkit: "
              "MOELITE_CUDA=OFF or nvcc not found); MOELITE_CUDA_EMULATOR=1 runs it on the CPU through the SIMT "
              "emulator");
}

}  // namespace moelite::cuda
