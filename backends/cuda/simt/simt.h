// A small SIMT emulator: runs CUDA-style kernels on the CPU so the CUDA backend's kernel source is
// tested in CI without a GPU (issue 13). Each thread of a block is a fiber with its own stack on the
// launching OS thread; the block's fibers are scheduled cooperatively and switch only at the
// points where CUDA threads synchronise (block barriers, warp barriers, shuffles and votes). Blocks
// run one after another, so a block's shared memory is the OS thread's (see cuda_spelling.h).
//
// Semantics modelled (and checked, where CUDA leaves it undefined and a real GPU would misbehave):
// - grid and block are 3-D; at most 1024 threads per block; warps are 32 consecutive linear thread
//   ids (x fastest, then y, then z), the last warp of a block may be partial;
// - sync_threads(): every thread of the block that has not returned must arrive (exited threads
//   count as arrived, as on sm_70+); a thread that can never arrive (barrier in divergent code that
//   others skip forever) is a deadlock, reported by launch();
// - sync_warp / shuffles / votes: `mask` must name every live lane of the calling warp (the full
//   warp mask 0xffffffff is always accepted and means "the live lanes"); every lane named must reach
//   the same call; a lane that reads from a lane outside [0, 32) or outside `width` gets its own
//   value, as CUDA defines for shfl_up/down at the edges;
// - atomics are real atomics (blocks may one day run on several OS threads).
// launch() returns MOELITE_OK or MOELITE_ERR_BACKEND with a message naming the kernel fault
// (deadlock, bad block size, dynamic shared memory over the limit, unsupported mask).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#include "backends/cuda/launch_shape.h"
#include "base/status.h"

namespace moelite::simt {

using Dim3 = cuda::Dim3;

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 96 * 1024;  // what a launch may ask for (sm_70+ opt-in limit)

// Runs `body` once per thread of grid x block; returns when every thread has returned.
// `body` reads its coordinates through thread_idx() etc. Not reentrant within a kernel.
[[nodiscard]] Status launch(Dim3 grid, Dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body);

// The calling thread's coordinates (valid only inside a launch).
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
unsigned lane_id();      // linear thread id % 32
void* dynamic_shared();  // the block's dynamic shared memory (16-byte aligned)

void sync_threads();
void sync_warp(unsigned mask);

// Warp exchange of a 32-bit value (the kernels use float, int32_t, uint32_t); T is trivially
// copyable and at most 8 bytes.
uint64_t shfl_bits(unsigned mask, uint64_t v, int src_lane, int width);  // from lane src_lane (within width)
uint64_t shfl_xor_bits(unsigned mask, uint64_t v, int lane_mask, int width);
uint64_t shfl_down_bits(unsigned mask, uint64_t v, unsigned delta, int width);
uint64_t shfl_up_bits(unsigned mask, uint64_t v, unsigned delta, int width);
unsigned ballot(unsigned mask, bool pred);
// v summed (or maximised) over the warp's live lanes in the butterfly order of five shfl_xor steps
// (m = 16, 8, 4, 2, 1: v = v + shfl_xor(v, m), a missing lane giving the lane's own value), bit
// for bit what those five exchanges give, in one exchange: the emulator's warp_sum / warp_max
// (dialect.cuh), which the kernels call for every output they reduce.
float warp_butterfly_sum(unsigned mask, float v);
float warp_butterfly_max(unsigned mask, float v);

// Shared-memory race checking (shared_array.h): where the running emulated thread stands in its
// block's synchronisation order.
struct SyncClock {
  uint64_t block_epoch = 0;  // new at every block start and every completed __syncthreads
  uint64_t warp_epoch = 0;   // new at every completed __syncwarp of the thread's warp
  unsigned thread = 0, warp = 0;
  bool valid = false;  // false outside a kernel
};
// The clock as the emulator keeps it for this OS thread: updated at every switch between
// emulated threads, completed barrier and __syncwarp, and `valid` only while an emulated thread
// runs. SharedArray reads it through this pointer on every access (a call and a thread-local
// lookup per access were a sixth of an emulated run). Null before this OS thread's first launch;
// afterwards the same pointer until the OS thread ends.
const SyncClock* live_sync_clock();
// Records a fault found while the block runs (the first one is kept); the block runs on and
// launch() returns MOELITE_ERR_BACKEND with the message.
void report_kernel_fault(const char* message);

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace moelite::simt
