// What the CUDA backend needs of a device: memory, streams, events and a kernel table. Two
// implementations: the CUDA driver on a real GPU (runtime_cuda.cpp, built with nvcc present) and an
// emulated device on the host (runtime_emu.cpp, built with -DMOELITE_CUDA_EMULATOR=ON), which runs
// the same kernel source through the SIMT emulator and models device memory, streams and events --
// so everything above this interface is tested in CI without a GPU.
//
// Streams are in-order queues. The emulator runs a stream's work only when something waits for it
// (stream_sync, event_sync, a stream waiting on an event of another), so host code that reads a
// result without waiting, or frees memory a queued operation still uses, fails its tests as it
// would fail on a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda/kernel_table.h"
#include "base/status.h"

namespace moelite::cuda {

using EventHandle = void*;

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  bool integrated = false;  // shares memory with the CPU (Jetson): zero-copy expert slots
  bool emulated = false;
  uint64_t total_memory = 0;
  int multiprocessors = 0;
};

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;
  virtual const DeviceInfo& info() const = 0;
  virtual const KernelTable& kernels() const = 0;

  [[nodiscard]] virtual Status device_alloc(size_t bytes, void** out) = 0;
  // Waits for the device first, as cudaFree does, so no queued work still uses the memory.
  virtual void device_free(void* p) = 0;
  // Pinned host memory mapped into the device's address space: `*host` for the CPU, `*device` for
  // kernels (the same address under unified addressing). Copies from it run asynchronously; on an
  // integrated device kernels read it in place.
  [[nodiscard]] virtual Status host_alloc_mapped(size_t bytes, void** host, void** device) = 0;
  virtual void host_free_mapped(void* host) = 0;

  [[nodiscard]] virtual Status stream_create(StreamHandle* out) = 0;
  virtual void stream_destroy(StreamHandle s) = 0;
  [[nodiscard]] virtual Status event_create(EventHandle* out) = 0;
  virtual void event_destroy(EventHandle e) = 0;

  // Copies in stream order; `src` must stay valid until the copy has run (pinned or device memory
  // for an asynchronous copy, or memory the caller keeps until it synchronises).
  [[nodiscard]] virtual Status copy_async(void* dst, const void* src, size_t bytes, StreamHandle s) = 0;
  [[nodiscard]] virtual Status event_record(EventHandle e, StreamHandle s) = 0;
  // Work queued on `s` after this call starts only once `e`'s recorded point has run.
  [[nodiscard]] virtual Status stream_wait(StreamHandle s, EventHandle e) = 0;
  // These two wait on the host and return the first error of the work they waited for.
  [[nodiscard]] virtual Status event_sync(EventHandle e) = 0;
  [[nodiscard]] virtual Status stream_sync(StreamHandle s) = 0;
};

// The emulated device (MOELITE_CUDA_EMULATOR): `integrated` models a Jetson-like unified-memory
// device, otherwise a discrete GPU whose memory the backend must copy experts into. Built into the
// library only when configured with -DMOELITE_CUDA_EMULATOR=ON (tests and development; the
// installed product has no use for it): otherwise MOELITE_ERR_BACKEND_UNAVAILABLE saying so
// (emulator_none.cpp).
Status open_emulated_runtime(bool integrated, std::unique_ptr<GpuRuntime>* out);
// Test hook (tests/test_backend_faults.cpp): the n-th emulated device operation from now on fails
// (0: none). An allocation fails at once with MOELITE_ERR_OUT_OF_MEMORY; a copy or kernel is queued
// and fails when it runs, so the failure surfaces at the next synchronisation, as a GPU fault does.
void emu_fail_nth_operation_for_testing(int64_t n);
// The first usable CUDA device; MOELITE_ERR_BACKEND_UNAVAILABLE with the reason otherwise (built
// without nvcc, no driver, no device, compute capability below 7.5, kernels that do not load).
Status open_cuda_runtime(std::unique_ptr<GpuRuntime>* out);

}  // namespace moelite::cuda
