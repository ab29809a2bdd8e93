// The CUDA runtime behind gpu_runtime.h. Linked statically (cudart_static), which loads the driver
// (libcuda.so.1) at run time: a machine without a driver or GPU still loads moelite and gets
// MOELITE_ERR_BACKEND_UNAVAILABLE with the reason.
#include <cuda_runtime.h>

#include <cstdio>

#include "backends/cuda/gpu_runtime.h"

namespace moelite::cuda {
namespace {

constexpr int kMinComputeMajor = 7, kMinComputeMinor = 5;  // Turing: the oldest architecture built

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return MOELITE_OK;
  const Status st = e == cudaErrorMemoryAllocation ? MOELITE_ERR_OUT_OF_MEMORY : MOELITE_ERR_BACKEND;
  return fail(st, "CUDA %s: %s", what, cudaGetErrorString(e));
}

class CudaRuntime final : public GpuRuntime {
 public:
  CudaRuntime(int device, const cudaDeviceProp& p) : device_(device) {
    info_.name = p.name;
    info_.cc_major = p.major;
    info_.cc_minor = p.minor;
    info_.integrated = p.integrated != 0;
    info_.total_memory = p.totalGlobalMem;
    info_.multiprocessors = p.multiProcessorCount;
  }
  const DeviceInfo& info() const override { return info_; }
  const KernelTable& kernels() const override { return gpu_kernels(); }

  Status device_alloc(size_t bytes, void** out) override { return check(cudaMalloc(out, bytes), "cudaMalloc"); }
  void device_free(void* p) override {
    if (p) (void)cudaFree(p);
  }
  Status host_alloc_mapped(size_t bytes, void** host, void** device) override {
    MOELITE_TRY(check(cudaHostAlloc(host, bytes, cudaHostAllocMapped), "cudaHostAlloc"));
    if (Status st = check(cudaHostGetDevicePointer(device, *host, 0), "cudaHostGetDevicePointer"); st != MOELITE_OK) {
      (void)cudaFreeHost(*host);
      return st;
    }
    return MOELITE_OK;
  }
  void host_free_mapped(void* host) override {
    if (host) (void)cudaFreeHost(host);
  }
  Status stream_create(StreamHandle* out) override {
    cudaStream_t s;
    MOELITE_TRY(check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    *out = s;
    return MOELITE_OK;
  }
  void stream_destroy(StreamHandle s) override { (void)cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  Status event_create(EventHandle* out) override {
    cudaEvent_t e;
    MOELITE_TRY(check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
    *out = e;
    return MOELITE_OK;
  }
  void event_destroy(EventHandle e) override { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  Status copy_async(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)), "cudaMemcpyAsync");
  }
  Status event_record(EventHandle e, StreamHandle s) override {
    return check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)), "cudaEventRecord");
  }
  Status stream_wait(StreamHandle s, EventHandle e) override {
    return check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0),
                 "cudaStreamWaitEvent");
  }
  Status event_sync(EventHandle e) override {
    return check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
  }
  Status stream_sync(StreamHandle s) override {
    return check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }

 private:
  int device_;
  DeviceInfo info_;
};

}  // namespace

Status open_cuda_runtime(std::unique_ptr<GpuRuntime>* out) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e != cudaSuccess || count == 0) {
    const char* why = e == cudaErrorInsufficientDriver       ? "no CUDA driver (libcuda.so.1) or one older than CUDA 13"
                      : e == cudaErrorNoDevice || count == 0 ? "no CUDA device"
                                                             : cudaGetErrorString(e);
    (void)cudaGetLastError();
    return fail(MOELITE_ERR_BACKEND_UNAVAILABLE,
                "CUDA backend: %s (MOELITE_CUDA_EMULATOR=1 runs it on the CPU through the SIMT emulator)", why);
  }
  char first_refusal[256] = "";
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    if (p.major < kMinComputeMajor || (p.major == kMinComputeMajor && p.minor < kMinComputeMinor)) {
      if (!first_refusal[0])
        std::snprintf(first_refusal, sizeof first_refusal, "%s has compute capability %d.%d, below the 7.5 built for",
                      p.name, p.major, p.minor);
      continue;
    }
    MOELITE_TRY(check(cudaSetDevice(d), "cudaSetDevice"));
    *out = std::make_unique<CudaRuntime>(d, p);
    return MOELITE_OK;
  }
  return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "CUDA backend: no usable device: %s",
              first_refusal[0] ? first_refusal : "device properties could not be read");
}

}  // namespace moelite::cuda
