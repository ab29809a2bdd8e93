// The CUDA driver behind gpu_runtime.h, loaded at run time: libcuda.so.1 is dlopen()ed and the
// kernels are a fatbin embedded in the library (compiled by nvcc from kernels_gpu.cu at build
// time). libmoelite therefore links nothing of CUDA -- no runtime library, no initial-exec TLS that
// would stop the library from being dlopen()ed (as cudart_static's does), no driver needed to load
// it -- and a machine without a driver or GPU gets MOELITE_ERR_BACKEND_UNAVAILABLE with the reason.
//
// The driver API's types and entry points are declared here from its documented, stable ABI (the
// `_v2` names are the ones cuda.h maps to), so no CUDA header is needed either.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "backends/cuda/gpu_launch.h"
#include "backends/cuda/gpu_runtime.h"

// The fatbin, placed in .rodata by the assembler (see the CMake rule that compiles kernels_gpu.cu).
extern "C" const unsigned char moelite_cuda_fatbin[];

namespace moelite::cuda {
namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult kSuccess = 0, kErrorOutOfMemory = 2, kErrorNoDevice = 100;
constexpr int kAttrMultiprocessors = 16, kAttrIntegrated = 18, kAttrCcMajor = 75, kAttrCcMinor = 76;
constexpr unsigned kHostAllocPortable = 0x01, kHostAllocDeviceMap = 0x02;
constexpr unsigned kStreamNonBlocking = 0x1, kEventDisableTiming = 0x2;
constexpr int kMinComputeMajor = 7, kMinComputeMinor = 5;  // Turing: the oldest architecture built

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem_v2)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree_v2)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr*, void*, unsigned);
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy_v2)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy_v2)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void**, void**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
};

// Loads libcuda.so.1 once per process; null with *why set when there is none or it lacks a symbol.
const Driver* load_driver(std::string* why) {
  static Driver d;
  static std::string error;
  static const bool ok = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = "no CUDA driver (libcuda.so.1 not found)";
      return false;
    }
#define LOAD(fn)                                                     \
  if (!(d.fn = reinterpret_cast<decltype(d.fn)>(dlsym(lib, #fn)))) { \
    error = "the CUDA driver lacks " #fn " (too old)";               \
    return false;                                                    \
  }
    LOAD(cuInit)
    LOAD(cuDriverGetVersion)
    LOAD(cuDeviceGetCount)
    LOAD(cuDeviceGet) LOAD(cuDeviceGetName) LOAD(cuDeviceGetAttribute) LOAD(cuDeviceTotalMem_v2)
        LOAD(cuDevicePrimaryCtxRetain) LOAD(cuDevicePrimaryCtxRelease_v2) LOAD(cuCtxSetCurrent) LOAD(cuMemAlloc_v2)
            LOAD(cuMemFree_v2) LOAD(cuMemHostAlloc) LOAD(cuMemFreeHost) LOAD(cuMemHostGetDevicePointer_v2)
                LOAD(cuMemcpyAsync) LOAD(cuStreamCreate) LOAD(cuStreamDestroy_v2) LOAD(cuStreamSynchronize)
                    LOAD(cuStreamWaitEvent) LOAD(cuEventCreate) LOAD(cuEventDestroy_v2) LOAD(cuEventRecord)
                        LOAD(cuEventSynchronize) LOAD(cuModuleLoadData) LOAD(cuModuleUnload) LOAD(cuModuleGetFunction)
                            LOAD(cuLaunchKernel) LOAD(cuGetErrorString)
#undef LOAD
                                return true;  // the library stays loaded for the process's life
  }();
  if (!ok) *why = error;
  return ok ? &d : nullptr;
}

class DriverRuntime;

// A stream handle knows its runtime, so a kernel launch needs nothing else.
struct GpuStream {
  CUstream stream = nullptr;
  DriverRuntime* rt = nullptr;
};

class DriverRuntime final : public GpuRuntime {
 public:
  DriverRuntime(const Driver* d, CUdevice dev, CUcontext ctx, CUmodule module, DeviceInfo info)
      : d_(d), dev_(dev), ctx_(ctx), module_(module), info_(std::move(info)) {}
  ~DriverRuntime() override {
    current();
    d_->cuModuleUnload(module_);
    d_->cuDevicePrimaryCtxRelease_v2(dev_);
  }

  const DeviceInfo& info() const override { return info_; }
  const KernelTable& kernels() const override { return gpu_kernels(); }

  Status check(CUresult r, const char* what) const {
    if (r == kSuccess) return MOELITE_OK;
    const char* s = nullptr;
    d_->cuGetErrorString(r, &s);
    return fail(r == kErrorOutOfMemory ? MOELITE_ERR_OUT_OF_MEMORY : MOELITE_ERR_BACKEND, "CUDA %s: %s (error %d)",
                what, s ? s : "unknown error", r);
  }
  // Driver calls act on the calling thread's current context; contexts may evaluate from any thread.
  void current() const { d_->cuCtxSetCurrent(ctx_); }

  Status device_alloc(size_t bytes, void** out) override {
    current();
    CUdeviceptr p = 0;
    MOELITE_TRY(check(d_->cuMemAlloc_v2(&p, bytes ? bytes : 1), "cuMemAlloc"));
    *out = reinterpret_cast<void*>(p);
    return MOELITE_OK;
  }
  void device_free(void* p) override {
    if (!p) return;
    current();
    d_->cuMemFree_v2(reinterpret_cast<CUdeviceptr>(p));
  }
  Status host_alloc_mapped(size_t bytes, void** host, void** device) override {
    current();
    MOELITE_TRY(check(d_->cuMemHostAlloc(host, bytes, kHostAllocPortable | kHostAllocDeviceMap), "cuMemHostAlloc"));
    CUdeviceptr dp = 0;
    if (Status st = check(d_->cuMemHostGetDevicePointer_v2(&dp, *host, 0), "cuMemHostGetDevicePointer");
        st != MOELITE_OK) {
      d_->cuMemFreeHost(*host);
      return st;
    }
    *device = reinterpret_cast<void*>(dp);
    return MOELITE_OK;
  }
  void host_free_mapped(void* host) override {
    if (!host) return;
    current();
    d_->cuMemFreeHost(host);
  }
  Status stream_create(StreamHandle* out) override {
    current();
    auto* s = new GpuStream();
    s->rt = this;
    if (Status st = check(d_->cuStreamCreate(&s->stream, kStreamNonBlocking), "cuStreamCreate"); st != MOELITE_OK) {
      delete s;
      return st;
    }
    *out = s;
    return MOELITE_OK;
  }
  void stream_destroy(StreamHandle h) override {
    current();
    auto* s = static_cast<GpuStream*>(h);
    d_->cuStreamDestroy_v2(s->stream);
    delete s;
  }
  Status event_create(EventHandle* out) override {
    current();
    CUevent e = nullptr;
    MOELITE_TRY(check(d_->cuEventCreate(&e, kEventDisableTiming), "cuEventCreate"));
    *out = e;
    return MOELITE_OK;
  }
  void event_destroy(EventHandle e) override {
    current();
    d_->cuEventDestroy_v2(static_cast<CUevent>(e));
  }
  Status copy_async(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    current();  // unified addressing: one copy call for every direction
    return check(
        d_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes, stream(s)),
        "cuMemcpyAsync");
  }
  Status event_record(EventHandle e, StreamHandle s) override {
    current();
    return check(d_->cuEventRecord(static_cast<CUevent>(e), stream(s)), "cuEventRecord");
  }
  Status stream_wait(StreamHandle s, EventHandle e) override {
    current();
    return check(d_->cuStreamWaitEvent(stream(s), static_cast<CUevent>(e), 0), "cuStreamWaitEvent");
  }
  Status event_sync(EventHandle e) override {
    current();
    return check(d_->cuEventSynchronize(static_cast<CUevent>(e)), "cuEventSynchronize");
  }
  Status stream_sync(StreamHandle s) override {
    current();
    return check(d_->cuStreamSynchronize(stream(s)), "cuStreamSynchronize");
  }

  Status launch(StreamHandle s, const char* kernel, int type_id, Dim3 grid, Dim3 block, size_t shared_bytes,
                void** params) {
    current();
    CUfunction fn = nullptr;
    {
      std::lock_guard<std::mutex> lock(functions_mu_);
      auto it = functions_.find({kernel, type_id});
      if (it == functions_.end()) {
        // moelite_<kernel name before any template arguments>[_<type id>], as kernels_gpu.cu names them.
        std::string name = "moelite_" + std::string(kernel, std::strcspn(kernel, "<"));
        if (type_id >= 0) name += "_" + std::to_string(type_id);
        MOELITE_TRY(check(d_->cuModuleGetFunction(&fn, module_, name.c_str()), name.c_str()));
        it = functions_.emplace(std::make_pair(kernel, type_id), fn).first;
      }
      fn = it->second;
    }
    return check(d_->cuLaunchKernel(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                    static_cast<unsigned>(shared_bytes), stream(s), params, nullptr),
                 "cuLaunchKernel");
  }

 private:
  static CUstream stream(StreamHandle s) { return static_cast<GpuStream*>(s)->stream; }

  const Driver* d_;
  CUdevice dev_;
  CUcontext ctx_;
  CUmodule module_;
  DeviceInfo info_;
  std::mutex functions_mu_;
  std::map<std::pair<const char*, int>, CUfunction> functions_;
};

Status unavailable(const char* fmt, const char* detail) {
  char why[512];
  std::snprintf(why, sizeof why, fmt, detail);
  return fail(MOELITE_ERR_BACKEND_UNAVAILABLE,
              "CUDA backend: %s (MOELITE_CUDA_EMULATOR=1 runs it on the CPU through the SIMT emulator)", why);
}

}  // namespace

Status gpu_launch_packed(StreamHandle s, const char* kernel, int type_id, Dim3 grid, Dim3 block,
                         size_t shared_bytes, void** params) {
  return static_cast<GpuStream*>(s)->rt->launch(s, kernel, type_id, grid, block, shared_bytes, params);
}

Status open_cuda_runtime(std::unique_ptr<GpuRuntime>* out) {
  std::string why;
  const Driver* d = load_driver(&why);
  if (!d) return unavailable("%s", why.c_str());
  CUresult r = d->cuInit(0);
  int count = 0;
  if (r == kSuccess) r = d->cuDeviceGetCount(&count);
  if (r == kErrorNoDevice || (r == kSuccess && count == 0)) return unavailable("%s", "no CUDA device");
  if (r != kSuccess) {
    const char* s = nullptr;
    d->cuGetErrorString(r, &s);
    return unavailable("the CUDA driver failed to start: %s", s ? s : "unknown error");
  }
  char refusal[256] = "";
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    char name[256] = "";
    int major = 0, minor = 0, integrated = 0, sms = 0;
    size_t total = 0;
    if (d->cuDeviceGet(&dev, i) != kSuccess || d->cuDeviceGetName(name, sizeof name, dev) != kSuccess ||
        d->cuDeviceGetAttribute(&major, kAttrCcMajor, dev) != kSuccess ||
        d->cuDeviceGetAttribute(&minor, kAttrCcMinor, dev) != kSuccess)
      continue;
    if (major < kMinComputeMajor || (major == kMinComputeMajor && minor < kMinComputeMinor)) {
      if (!refusal[0])
        std::snprintf(refusal, sizeof refusal, "%s has compute capability %d.%d, below the 7.5 built for", name, major,
                      minor);
      continue;
    }
    d->cuDeviceGetAttribute(&integrated, kAttrIntegrated, dev);
    d->cuDeviceGetAttribute(&sms, kAttrMultiprocessors, dev);
    d->cuDeviceTotalMem_v2(&total, dev);
    CUcontext ctx = nullptr;
    if (d->cuDevicePrimaryCtxRetain(&ctx, dev) != kSuccess) continue;
    d->cuCtxSetCurrent(ctx);
    CUmodule module = nullptr;
    if (CUresult mr = d->cuModuleLoadData(&module, moelite_cuda_fatbin); mr != kSuccess) {
      // No machine code for this GPU and its driver cannot JIT the PTX (older than the toolkit).
      d->cuDevicePrimaryCtxRelease_v2(dev);
      const char* s = nullptr;
      d->cuGetErrorString(mr, &s);
      std::snprintf(refusal, sizeof refusal, "the kernels do not load on %s (sm_%d%d): %s", name, major, minor,
                    s ? s : "unknown error");
      continue;
    }
    DeviceInfo info;
    info.name = name;
    info.cc_major = major;
    info.cc_minor = minor;
    info.integrated = integrated != 0;
    info.total_memory = total;
    info.multiprocessors = sms;
    *out = std::make_unique<DriverRuntime>(d, dev, ctx, module, std::move(info));
    return MOELITE_OK;
  }
  return unavailable("no usable CUDA device: %s", refusal[0] ? refusal : "device properties could not be read");
}

}  // namespace moelite::cuda
