// The dialect the CUDA kernels are written in: plain CUDA C++ where nvcc compiles them
// (kernels_gpu.cu, into a fatbin), and the same source on the CPU through the SIMT emulator (simt/) where
// a host compiler does (kernels_emu.cpp). The kernels use only what is defined here:
//   MK_GLOBAL / MK_DEVICE               kernel / device-function qualifiers
//   MK_SHARED(type, name, count)        a static shared-memory array of the block
//   MK_DYNAMIC_SHARED(type, name)       the block's dynamic shared memory as type*
//   threadIdx, blockIdx, blockDim, gridDim, __syncthreads(), __syncwarp()
//   shfl_xor(v, m), shfl(v, lane), warp_sum(v), warp_max(v)   full-warp exchanges
//   bits_to_float(u), float_to_bits(f), atomic_add_f32(p, v)
#pragma once
#include <cstdint>

#if defined(__CUDACC__)

// Kernels are device functions; kernels_gpu.cu gives each an extern "C" __global__ entry point
// (found by name in the embedded fatbin, see runtime_cuda.cpp).
#define MK_GLOBAL static __device__ __forceinline__
#define MK_DEVICE __device__ __forceinline__
#define MK_SHARED(type, name, count) __shared__ type name[count]
#define MK_DYNAMIC_SHARED(type, name)           \
  extern __shared__ float4 moelite_dyn_smem_[]; \
  type* name = reinterpret_cast<type*>(moelite_dyn_smem_)

namespace moelite::cuda_kernels {
MK_DEVICE float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MK_DEVICE int shfl_xor(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MK_DEVICE float shfl(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
MK_DEVICE int shfl(int v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
MK_DEVICE float bits_to_float(uint32_t u) { return __uint_as_float(u); }
MK_DEVICE uint32_t float_to_bits(float f) { return __float_as_uint(f); }
MK_DEVICE void atomic_add_f32(float* p, float v) { atomicAdd(p, v); }
}  // namespace moelite::cuda_kernels

#else  // the SIMT emulator

#include <cmath>
#include <cstring>

#include "backends/cuda/simt/shared_array.h"
#include "backends/cuda/simt/simt.h"

#define MK_GLOBAL static
#define MK_DEVICE inline
// One block runs at a time on an OS thread, so a thread_local array is exactly the block's shared
// memory; SharedArray checks every access for races and bounds (simt/shared_array.h).
#define MK_SHARED(type, name, count) static thread_local ::moelite::simt::SharedArray<type, count> name
#define MK_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::moelite::simt::dynamic_shared())
#define threadIdx (::moelite::simt::thread_idx())
#define blockIdx (::moelite::simt::block_idx())
#define blockDim (::moelite::simt::block_dim())
#define gridDim (::moelite::simt::grid_dim())
#define __syncthreads() ::moelite::simt::sync_threads()
#define __syncwarp() ::moelite::simt::sync_warp(0xffffffffu)

namespace moelite::cuda_kernels {
template <class T>
inline T shfl_xor(T v, int m) {
  return simt::from_bits<T>(simt::shfl_xor_bits(0xffffffffu, simt::to_bits(v), m, 32));
}
template <class T>
inline T shfl(T v, int lane) {
  return simt::from_bits<T>(simt::shfl_bits(0xffffffffu, simt::to_bits(v), lane, 32));
}
inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline void atomic_add_f32(float* p, float v) {
  // The generic __atomic builtins: the _n forms accept only integers and pointers.
  float cur;
  __atomic_load(p, &cur, __ATOMIC_RELAXED);
  float next = cur + v;
  while (!__atomic_compare_exchange(p, &cur, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) next = cur + v;
}
}  // namespace moelite::cuda_kernels

#endif

namespace moelite::cuda_kernels {
// Sum / max over the 32 lanes of a warp in a fixed butterfly order: every lane gets the same
// result, and the order (hence the rounding) does not depend on anything but the lane values.
MK_DEVICE float warp_sum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}
MK_DEVICE float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) {
    const float o = shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
}
}  // namespace moelite::cuda_kernels
