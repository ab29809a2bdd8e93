// Backend selection. GPU backends register here as they are built; a build without them still
// links and answers with the reason (the MLX no_gpu pattern).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#if MOELITE_HAVE_VULKAN
#include "backends/vulkan/vk_backend.h"
#endif
#if MOELITE_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace moelite {

namespace {

// BackendKind::Auto: CUDA on an NVIDIA GPU (Jetson's integrated one included) when built, else
// Vulkan on a GPU, else the CPU. `why` collects the reason each earlier choice was passed over.
Status create_auto_backend(int32_t n_threads, std::unique_ptr<Backend>* out, std::string* why) {
  auto note = [&](const std::string& s) {
    if (why) *why += (why->empty() ? "" : "; ") + s;
  };
#if MOELITE_HAVE_CUDA
  {
    // A usable CUDA GPU first (never the emulator, which is for tests); probed once per process.
    static std::atomic<bool> no_cuda{false};
    static std::string no_cuda_reason;  // written once, before no_cuda is set
    if (!no_cuda.load()) {
      std::unique_ptr<cuda::GpuRuntime> rt;
      if (cuda::open_cuda_runtime(&rt) == MOELITE_OK && cuda::CudaBackend::create_with(std::move(rt), out) == MOELITE_OK) {
        note("cuda: an NVIDIA GPU through the CUDA driver");
        return MOELITE_OK;
      }
      static std::once_flag once;
      std::call_once(once, [] { no_cuda_reason = last_error_message(); });
      no_cuda.store(true);
      clear_error();
    }
    note("cuda skipped: " + no_cuda_reason);
  }
#else
  note("cuda skipped: not in this build");
#endif
#if MOELITE_HAVE_VULKAN
  {
    // A GPU when there is one; a CPU implementation of Vulkan (lavapipe) never beats the CPU
    // backend. Probing loads every Vulkan driver, so a machine found without a GPU is not
    // probed again by later loads in this process.
    static std::atomic<bool> no_gpu{false};
    static std::string no_gpu_reason;
    if (!no_gpu.load()) {
      if (vk::VulkanBackend::create(false, out) == MOELITE_OK) {
        note("vulkan: a GPU device");
        return MOELITE_OK;
      }
      static std::once_flag once;
      std::call_once(once, [] { no_gpu_reason = last_error_message(); });
      no_gpu.store(true);
      clear_error();
    }
    note("vulkan skipped: " + no_gpu_reason);
  }
#else
  note("vulkan skipped: not in this build");
#endif
  note("cpu: no GPU backend available");
  return cpu::CpuBackend::create(n_threads, out);
}

}  // namespace

AutoBackendChoice explain_auto_backend() {
  AutoBackendChoice c;
  std::unique_ptr<Backend> be;
  if (create_auto_backend(1, &be, &c.reason) == MOELITE_OK && be) {
    c.kind = be->kind();
  } else {
    c.reason += std::string("; failed: ") + last_error_message();
    clear_error();
  }
  return c;
}

Status create_backend(BackendKind kind, int32_t n_threads, std::unique_ptr<Backend>* out) {
  switch (kind) {
    case BackendKind::Auto: return create_auto_backend(n_threads, out, nullptr);
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
