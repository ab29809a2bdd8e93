// Backend selection. GPU backends register here as they are built; a build without them still
// links and answers with the reason (the MLX no_gpu pattern).
#include <atomic>
#include <memory>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#if MOELITE_HAVE_VULKAN
#include "backends/vulkan/vk_backend.h"
#endif
#if MOELITE_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace moelite {

Status create_backend(BackendKind kind, int32_t n_threads, std::unique_ptr<Backend>* out) {
  switch (kind) {
    case BackendKind::Auto: {
#if MOELITE_HAVE_CUDA
      // A usable CUDA GPU first (never the emulator, which is for tests); probed once per process.
      static std::atomic<bool> no_cuda{false};
      if (!no_cuda.load()) {
        std::unique_ptr<cuda::GpuRuntime> rt;
        if (cuda::open_cuda_runtime(&rt) == MOELITE_OK &&
            cuda::CudaBackend::create_with(std::move(rt), out) == MOELITE_OK)
          return MOELITE_OK;
        no_cuda.store(true);
        clear_error();
      }
#endif
#if MOELITE_HAVE_VULKAN
      // A GPU when there is one; a CPU implementation of Vulkan (lavapipe) never beats the CPU
      // backend. Probing loads every Vulkan driver, so a machine found without a GPU is not
      // probed again by later loads in this process.
      static std::atomic<bool> no_gpu{false};
      if (!no_gpu.load()) {
        if (vk::VulkanBackend::create(false, out) == MOELITE_OK) return MOELITE_OK;
        no_gpu.store(true);
        clear_error();
      }
#endif
      return cpu::CpuBackend::create(n_threads, out);
    }
    case BackendKind::Cpu: return cpu::CpuBackend::create(n_threads, out);
    case BackendKind::Vulkan:
#if MOELITE_HAVE_VULKAN
      return vk::VulkanBackend::create(true, out);
#else
      return fail(MOELITE_ERR_BACKEND_UNAVAILABLE,
                  "the Vulkan backend is not part of this build of moelite (built without the Vulkan loader/headers "
                  "or glslc); use the CPU backend");
#endif
    case BackendKind::Cuda:
#if MOELITE_HAVE_CUDA
      return cuda::CudaBackend::create(out);
#else
      return fail(MOELITE_ERR_BACKEND_UNAVAILABLE,
                  "this build of moelite has no CUDA backend (configured with MOELITE_CUDA=OFF); use the CPU or "
                  "Vulkan backend");
#endif
  }
  return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown backend %d", static_cast<int>(kind));
}

}  // namespace moelite
