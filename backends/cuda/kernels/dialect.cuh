// The dialect the CUDA kernels are written in: plain CUDA C++ where nvcc compiles them
// (kernels_gpu.cu, into a fatbin), and the same source on the CPU through the SIMT emulator (simt/) where
// a host compiler does (kernels_emu.cpp). The kernels use only what is defined here:
//   MK_GLOBAL / MK_DEVICE               kernel / device-function qualifiers
//   MK_SHARED(type, name, count)        a static shared-memory array of the block
//   MK_DYNAMIC_SHARED(type, name)       the block's dynamic shared memory as type*
//   threadIdx, blockIdx, blockDim, gridDim, __syncthreads(), __syncwarp()
//   shfl_xor(v, m), shfl(v, lane), warp_sum(v), warp_max(v)   full-warp exchanges (warp_sum/max:
//                                       five shfl_xor steps on a GPU, one exchange in the emulator)
//   bits_to_float(u), float_to_bits(f), atomic_add_f32(p, v)
//   half_bits_to_float(h)               an fp16 value from its 16 bits
//   float_to_half_bits(f)               the fp16 nearest f (ties to even), as its 16 bits
//   dp4a(a, b, c)                       c + the dot product of a's and b's four signed bytes
//   byte_perm(x, y, s)                  four bytes picked from the 8 of y:x by s's selectors
//   mul_rn(a, b), add_rn(a, b)          one rounding each: never fused into a multiply-add, so
//                                       the GPU and the emulator round alike
//   stage_u32(p)                        the 4 bytes at p of a shared stage (any alignment)
//   MK_UNROLL                           unroll the next loop (small fixed trip counts: keeps arrays
//                                       indexed by its counter in registers)
//   MK_SHARED_BYTES(name, count)        a 16-byte aligned shared byte array of the block, filled
//   Vec16, load_vec16(p, lo, hi),       16 bytes at a time from a 16-byte aligned global address
//   store_vec16(name, at, v),           (of which only [lo, hi) is meaningful), and read back as a
//   bytes_at(name, at)                  byte pointer (dq<T> and the other byte readers take it)
#pragma once
#include <cstdint>

#if defined(__CUDACC__)

#include <cuda_fp16.h>

#define MK_UNROLL _Pragma("unroll")

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
// The conversion instruction: the same value as the emulator's decode from the bits for every
// finite value and infinity (NaN payloads may differ; no weight holds one).
MK_DEVICE float half_bits_to_float(uint32_t h) { return __half2float(__ushort_as_half(static_cast<unsigned short>(h))); }
MK_DEVICE uint32_t float_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
// The integer dot product instruction (sm_61 and later; every architecture built is sm_75+).
MK_DEVICE int32_t dp4a(uint32_t a, uint32_t b, int32_t c) { return __dp4a(int(a), int(b), c); }
MK_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) { return __byte_perm(x, y, s); }
MK_DEVICE float mul_rn(float a, float b) { return __fmul_rn(a, b); }
MK_DEVICE float add_rn(float a, float b) { return __fadd_rn(a, b); }
// Four bytes of shared memory at any address: the aligned word, or two and a funnel shift (a
// block of 34 or 18 bytes puts its codes at every alignment).
MK_DEVICE uint32_t stage_u32(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const uint32_t shift = uint32_t(a & 3u) * 8u;
  return shift ? __funnelshift_r(w[0], w[1], shift) : w[0];
}

struct Vec16 {
  uint32_t w[4];
};
#define MK_SHARED_BYTES(name, count)                   \
  __shared__ uint4 name##_vec16_[((count) + 15) / 16]; \
  uint8_t* const name = reinterpret_cast<uint8_t*>(name##_vec16_)
// One 16-byte load through the read-only path. The bytes outside [lo, hi) come along: they lie in
// the same aligned 16 bytes as bytes of the tensor, hence in its allocation's page.
MK_DEVICE Vec16 load_vec16(const uint8_t* p, const uint8_t* /*lo*/, const uint8_t* /*hi*/) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  return Vec16{{v.x, v.y, v.z, v.w}};
}
MK_DEVICE void store_vec16(uint8_t* s, int64_t at, const Vec16& v) {
  *reinterpret_cast<uint4*>(s + at) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}
MK_DEVICE const uint8_t* bytes_at(const uint8_t* s, int64_t at) { return s + at; }
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

#else  // the SIMT emulator

#include <cmath>
#include <cstring>

#include "backends/cuda/simt/shared_array.h"
#include "backends/cuda/simt/simt.h"
#include "base/quant_ref.h"

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
#define MK_UNROLL _Pragma("GCC unroll 8")
// A shared byte array as 32-bit words with race checking (simt::SharedBytes reads bytes of it).
// It lives on the heap, one per OS thread: a thread_local array of this size would be allocated
// and cleared for every thread of every process that loads the library.
#define MK_SHARED_BYTES(name, count) \
  static thread_local auto& name =   \
      ::moelite::simt::thread_shared<::moelite::simt::SharedArray<uint32_t, ((count) + 15) / 16 * 4>>()

namespace moelite::cuda_kernels {
struct Vec16 {
  uint32_t w[4];
};
// The bytes of [p, p + 16) that lie in [lo, hi), little-endian; the others read as zero and are
// not touched, so AddressSanitizer sees only the tensor's own bytes read.
inline Vec16 load_vec16(const uint8_t* p, const uint8_t* lo, const uint8_t* hi) {
  Vec16 v{{0, 0, 0, 0}};
  for (int k = 0; k < 16; ++k)
    if (p + k >= lo && p + k < hi) v.w[k >> 2] |= uint32_t(p[k]) << (8 * (k & 3));
  return v;
}
template <size_t N>
inline void store_vec16(simt::SharedArray<uint32_t, N>& s, int64_t at, const Vec16& v) {
  for (int k = 0; k < 4; ++k) s[size_t(at / 4 + k)] = v.w[k];
}
template <size_t N>
inline simt::SharedBytes<N> bytes_at(simt::SharedArray<uint32_t, N>& s, int64_t at) {
  return simt::SharedBytes<N>(&s, at);
}
// fp16 from its bits in float operations (zero and subnormals as mantissa * 2^-24, exact).
inline float half_bits_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    const float f = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (exponent == 31)
    bits = sign | 0x7F800000u | (mantissa << 13);
  else
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t float_to_half_bits(float f) { return fp32_to_fp16(f); }
inline int32_t dp4a(uint32_t a, uint32_t b, int32_t c) {
  uint32_t s = uint32_t(c);  // wraps as the instruction does
  for (int k = 0; k < 4; ++k) s += uint32_t(int32_t(int8_t(a >> (8 * k))) * int32_t(int8_t(b >> (8 * k))));
  return int32_t(s);
}
// PRMT's default mode: output byte i is byte (s >> 4i) & 7 of y:x, or with bit 3 of that selector
// set, that byte's sign bit copied into all eight bits.
inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t bytes = (uint64_t(y) << 32) | x;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 15u;
    uint32_t b = uint32_t(bytes >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) b = (b & 0x80u) ? 0xFFu : 0u;
    out |= b << (8 * i);
  }
  return out;
}
// kernels_emu.cpp is compiled with -ffp-contract=off: a product and a sum stay two roundings.
inline float mul_rn(float a, float b) { return a * b; }
inline float add_rn(float a, float b) { return a + b; }
template <size_t N>
inline uint32_t stage_u32(simt::SharedBytes<N> p) {
  return p.word(0);
}

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
// The GPU's five shfl_xor steps (m = 16 … 1, v = v + shfl_xor(v, m), or the larger of the two),
// computed bit for bit as those steps give them but in one warp exchange instead of five: the
// kernels reduce every output this way, and each exchange is a switch through all 32 lanes
// (test_simt.cpp checks both against the five shuffles).
inline float warp_sum(float v) { return simt::warp_butterfly_sum(0xffffffffu, v); }
inline float warp_max(float v) { return simt::warp_butterfly_max(0xffffffffu, v); }
}  // namespace moelite::cuda_kernels

#endif
