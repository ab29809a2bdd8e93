// The SIMT emulator (backends/cuda/simt) against expectations computed by plain host loops: block
// barriers, warp shuffles and votes with CUDA's edge semantics, partial warps, early returns,
// atomics, dynamic shared memory, 3-D grids, and the faults launch() must report (deadlock, bad
// sizes, bad masks, exceptions) without poisoning later launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
// After gtest: the dialect defines threadIdx, blockIdx, blockDim and gridDim as macros.
#include "backends/cuda/kernels/dialect.cuh"

namespace {

namespace simt = moelite::simt;
using moelite::cuda_kernels::shfl;
using moelite::cuda_kernels::shfl_xor;
using moelite::cuda_kernels::bytes_at;
using moelite::cuda_kernels::load_vec16;
using moelite::cuda_kernels::store_vec16;
using simt::Dim3;

unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
unsigned linear_bid() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
unsigned threads_per_block() { return blockDim.x * blockDim.y * blockDim.z; }

int64_t value_of(unsigned block, unsigned thread) { return int64_t{block} * 7919 + thread * 31 + 5; }

// ---- block barriers -------------------------------------------------------------------------------

// A tree reduction in shared memory: correct only if every __syncthreads really separates the steps.
void block_reduce_kernel(int64_t* out) {
  MK_SHARED(int64_t, partial, 1024);
  const unsigned tid = linear_tid();
  const unsigned n = threads_per_block();
  partial[tid] = value_of(linear_bid(), tid);
  __syncthreads();
  unsigned half = 1;
  while (half < n) half <<= 1;
  for (half >>= 1; half > 0; half >>= 1) {
    if (tid < half && tid + half < n) partial[tid] += partial[tid + half];
    __syncthreads();
  }
  if (tid == 0) out[linear_bid()] = partial[0];
}

void expect_block_reduce(Dim3 grid, Dim3 block) {
  const unsigned blocks = grid.x * grid.y * grid.z;
  const unsigned threads = block.x * block.y * block.z;
  std::vector<int64_t> out(blocks, -1);
  ASSERT_EQ(simt::launch(grid, block, 0, [&] { block_reduce_kernel(out.data()); }), MOELITE_OK)
      << moelite::last_error_message();
  for (unsigned b = 0; b < blocks; ++b) {
    int64_t want = 0;
    for (unsigned t = 0; t < threads; ++t) want += value_of(b, t);
    EXPECT_EQ(out[b], want) << "block " << b << " of block size " << block.x << "x" << block.y << "x" << block.z;
  }
}

TEST(Simt, BlockReductionWithSyncthreads) {
  for (unsigned n : {1u, 31u, 32u, 33u, 256u, 1024u}) expect_block_reduce(Dim3(3), Dim3(n));
  expect_block_reduce(Dim3(2, 2), Dim3(8, 4, 2));
  expect_block_reduce(Dim3(1, 1, 2), Dim3(5, 3, 7));
  expect_block_reduce(Dim3(2), Dim3(16, 16, 4));
}

TEST(Simt, EarlyReturnedThreadsDoNotHoldUpTheBarrier) {
  std::vector<int> out(100, -1);
  ASSERT_EQ(simt::launch(Dim3(1), Dim3(100), 0,
                         [&] {
                           MK_SHARED(int, seen, 100);
                           const unsigned tid = threadIdx.x;
                           if (tid % 3 == 0) return;  // a third of the block, spread over every warp
                           seen[tid] = static_cast<int>(tid);
                           __syncthreads();
                           int sum = 0;
                           for (unsigned i = 0; i < 100; ++i) sum += i % 3 == 0 ? 0 : seen[i];
                           __syncthreads();
                           out[tid] = sum;
                         }),
            MOELITE_OK)
      << moelite::last_error_message();
  int want = 0;
  for (int i = 0; i < 100; ++i) want += i % 3 == 0 ? 0 : i;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(out[i], i % 3 == 0 ? -1 : want) << i;
}

// ---- warp exchanges -------------------------------------------------------------------------------

TEST(Simt, WarpSumWithShflXorIsExact) {
  const unsigned blocks = 5, threads = 128;
  std::vector<int> out(blocks * threads, -1);
  ASSERT_EQ(simt::launch(Dim3(blocks), Dim3(threads), 0,
                         [&] {
                           const unsigned tid = threadIdx.x;
                           int v = static_cast<int>(value_of(blockIdx.x, tid) % 1000);
                           for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
                           out[blockIdx.x * threads + tid] = v;
                         }),
            MOELITE_OK)
      << moelite::last_error_message();
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < threads / 32; ++w) {
      int want = 0;
      for (unsigned l = 0; l < 32; ++l) want += static_cast<int>(value_of(b, w * 32 + l) % 1000);
      for (unsigned l = 0; l < 32; ++l) EXPECT_EQ(out[b * threads + w * 32 + l], want) << b << " " << w << " " << l;
    }
}

TEST(Simt, FloatWarpSumAndMaxGiveEveryLaneTheSameValue) {
  std::vector<float> sums(64), maxes(64);
  ASSERT_EQ(simt::launch(Dim3(1), Dim3(64), 0,
                         [&] {
                           const float v = static_cast<float>(threadIdx.x) * 0.5f;
                           sums[threadIdx.x] = moelite::cuda_kernels::warp_sum(v);
                           maxes[threadIdx.x] = moelite::cuda_kernels::warp_max(v);
                         }),
            MOELITE_OK);
  for (unsigned t = 0; t < 64; ++t) {
    const unsigned base = t / 32 * 32;
    float want = 0;
    for (unsigned l = 0; l < 32; ++l) want += static_cast<float>(base + l) * 0.5f;  // exact in float
    EXPECT_EQ(sums[t], want);
    EXPECT_EQ(maxes[t], static_cast<float>(base + 31) * 0.5f);
  }
}

// The emulator's warp_sum / warp_max do in one exchange what the GPU does in five shfl_xor steps:
// the same bits, from values whose sums round differently in another order (magnitudes 2^-8 to 2^8,
// both signs), in full warps, a partial warp (70 threads: lanes 0-5 of warp 2) and warps some of
// whose lanes returned before the reduction.
TEST(Simt, WarpSumAndMaxAreTheFiveShflXorStepsBitForBit) {
  for (const unsigned threads : {64u, 70u}) {
    for (const bool early_returns : {false, true}) {
      SCOPED_TRACE(std::to_string(threads) + (early_returns ? " threads, some returned" : " threads"));
      std::vector<uint32_t> got_sum(threads, 0), got_max(threads, 0), want_sum(threads, 0), want_max(threads, 0);
      auto value = [](unsigned t) {
        const uint64_t h = (uint64_t{t} + 1) * 0x9E3779B97F4A7C15ull;
        const float mantissa = 1.0f + static_cast<float>(h >> 41) / 8388608.0f;
        const int exponent = static_cast<int>(h >> 20 & 15) - 8;
        return (h & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
      };
      auto returns_early = [&](unsigned t) { return early_returns && (t % 32 == 7 || t % 32 == 20 || t % 32 == 21); };
      auto run = [&](bool five_steps) {
        return simt::launch(Dim3(2), Dim3(threads), 0, [&] {
          const unsigned t = threadIdx.x;
          if (returns_early(t)) return;
          float s = value(t + blockIdx.x * 1000), m = s;
          if (five_steps) {
            for (int k = 16; k > 0; k >>= 1) s += shfl_xor(s, k);
            for (int k = 16; k > 0; k >>= 1) {
              const float o = shfl_xor(m, k);
              m = o > m ? o : m;
            }
          } else {
            s = moelite::cuda_kernels::warp_sum(s);
            m = moelite::cuda_kernels::warp_max(m);
          }
          if (blockIdx.x == 1) {
            (five_steps ? want_sum : got_sum)[t] = simt::to_bits(s) & 0xffffffffu;
            (five_steps ? want_max : got_max)[t] = simt::to_bits(m) & 0xffffffffu;
          }
        });
      };
      ASSERT_EQ(run(true), MOELITE_OK) << moelite::last_error_message();
      ASSERT_EQ(run(false), MOELITE_OK) << moelite::last_error_message();
      EXPECT_EQ(got_sum, want_sum);
      EXPECT_EQ(got_max, want_max);
      // The sums do depend on the order: adding warp 0's values from lane 0 up differs somewhere.
      float in_lane_order = 0;
      for (unsigned l = 0; l < 32; ++l)
        if (!returns_early(l)) in_lane_order += value(l + 1000);
      if (!early_returns) EXPECT_NE(simt::to_bits(in_lane_order) & 0xffffffffu, want_sum[0]);
    }
  }
}

// What lane `lane` of a warp whose lanes [0, live) hold `lane * 10 + 1` must read, computed the way
// CUDA defines each shuffle.
enum class Kind { kIdx, kXor, kDown, kUp };
int64_t expected_shuffle(Kind kind, unsigned lane, int arg, unsigned width, unsigned live) {
  auto value = [](unsigned l) { return int64_t{l} * 10 + 1; };
  const unsigned segment = lane / width * width;
  long src = lane;
  switch (kind) {
    case Kind::kIdx: src = segment + ((arg % static_cast<int>(width)) + width) % width; break;
    case Kind::kXor: src = lane ^ static_cast<unsigned>(arg); break;
    case Kind::kDown: src = static_cast<long>(lane) + arg; break;
    case Kind::kUp: src = static_cast<long>(lane) - arg; break;
  }
  if (src < static_cast<long>(segment) || src >= static_cast<long>(segment + width)) return value(lane);
  if (src >= static_cast<long>(live)) return value(lane);
  return value(static_cast<unsigned>(src));
}

uint64_t run_shuffle(Kind kind, int64_t v, int arg, int width) {
  switch (kind) {
    case Kind::kIdx: return simt::shfl_bits(0xffffffffu, simt::to_bits(v), arg, width);
    case Kind::kXor: return simt::shfl_xor_bits(0xffffffffu, simt::to_bits(v), arg, width);
    case Kind::kDown: return simt::shfl_down_bits(0xffffffffu, simt::to_bits(v), static_cast<unsigned>(arg), width);
    case Kind::kUp: return simt::shfl_up_bits(0xffffffffu, simt::to_bits(v), static_cast<unsigned>(arg), width);
  }
  return 0;
}

TEST(Simt, ShuffleSemanticsAtEdgesWidthsAndPartialWarps) {
  const Kind kinds[] = {Kind::kIdx, Kind::kXor, Kind::kDown, Kind::kUp};
  const char* names[] = {"shfl", "shfl_xor", "shfl_down", "shfl_up"};
  for (unsigned live : {32u, 20u, 1u})
    for (int width : {32, 16, 8, 1})
      for (int k = 0; k < 4; ++k)
        for (int arg : {0, 1, 3, 7, 8, 15, 16, 31, 33}) {
          std::vector<int64_t> out(live, -1);
          ASSERT_EQ(simt::launch(Dim3(1), Dim3(live), 0,
                                 [&] {
                                   const unsigned lane = simt::lane_id();
                                   // Idx shuffles read from a lane that depends on the reader.
                                   const int a = kinds[k] == Kind::kIdx ? arg + static_cast<int>(lane) : arg;
                                   out[lane] = simt::from_bits<int64_t>(
                                       run_shuffle(kinds[k], int64_t{lane} * 10 + 1, a, width));
                                 }),
                    MOELITE_OK)
              << moelite::last_error_message();
          for (unsigned lane = 0; lane < live; ++lane) {
            const int a = kinds[k] == Kind::kIdx ? arg + static_cast<int>(lane) : arg;
            EXPECT_EQ(out[lane], expected_shuffle(kinds[k], lane, a, static_cast<unsigned>(width), live))
                << names[k] << " lane " << lane << " arg " << a << " width " << width << " live " << live;
          }
        }
}

TEST(Simt, ShflBroadcastsAndRotates) {
  std::vector<int> from_lane5(64), rotated(64);
  ASSERT_EQ(simt::launch(Dim3(1), Dim3(64), 0,
                         [&] {
                           const int v = static_cast<int>(threadIdx.x) * 3;
                           from_lane5[threadIdx.x] = shfl(v, 5);
                           rotated[threadIdx.x] =
                               shfl(v, static_cast<int>(simt::lane_id()) + 1);  // lane 31 reads lane 0
                         }),
            MOELITE_OK);
  for (unsigned t = 0; t < 64; ++t) {
    const unsigned base = t / 32 * 32;
    EXPECT_EQ(from_lane5[t], static_cast<int>(base + 5) * 3);
    EXPECT_EQ(rotated[t], static_cast<int>(base + (t + 1) % 32) * 3);
  }
}

TEST(Simt, BallotCollectsPredicatesOfLiveLanes) {
  for (unsigned n : {32u, 45u, 64u}) {
    std::vector<unsigned> out(n, 0);
    ASSERT_EQ(simt::launch(Dim3(1), Dim3(n), 0,
                           [&] {
                             const unsigned t = threadIdx.x;
                             out[t] = simt::ballot(0xffffffffu, t % 3 == 1 || t == 40);
                           }),
              MOELITE_OK);
    for (unsigned t = 0; t < n; ++t) {
      const unsigned base = t / 32 * 32;
      unsigned want = 0;
      for (unsigned l = 0; l < 32 && base + l < n; ++l)
        if ((base + l) % 3 == 1 || base + l == 40) want |= 1u << l;
      EXPECT_EQ(out[t], want) << "thread " << t << " of " << n;
    }
  }
}

TEST(Simt, WarpOpsCountOnlyLanesThatHaveNotReturned) {
  // Lanes 0..9 return; the rest shuffle among themselves with the full mask or their exact mask.
  std::vector<int> out(32, -1);
  std::vector<unsigned> votes(32, 0);
  ASSERT_EQ(simt::launch(Dim3(1), Dim3(32), 0,
                         [&] {
                           const unsigned lane = simt::lane_id();
                           if (lane < 10) return;
                           const unsigned live = 0xffffffffu << 10;
                           int v = static_cast<int>(lane);
                           v += shfl_xor(v, 1);  // lane pairs (10,11) ... (30,31) are all live
                           simt::sync_warp(live);
                           out[lane] = v;
                           votes[lane] = simt::ballot(live, lane >= 20);
                         }),
            MOELITE_OK)
      << moelite::last_error_message();
  for (unsigned l = 10; l < 32; ++l) {
    EXPECT_EQ(out[l], static_cast<int>(l + (l ^ 1)));
    EXPECT_EQ(votes[l], 0xffffffffu << 20);
  }
}

TEST(Simt, WarpsOfOneBlockExchangeIndependently) {
  // Warp 0 shuffles many times while warp 1 sits at a barrier: neither releases the other.
  std::vector<int> out(64, -1);
  ASSERT_EQ(simt::launch(Dim3(1), Dim3(64), 0,
                         [&] {
                           int v = static_cast<int>(threadIdx.x);
                           if (threadIdx.x < 32)
                             for (int i = 0; i < 10; ++i) v = shfl(v, static_cast<int>(simt::lane_id() + 1) % 32);
                           __syncthreads();
                           out[threadIdx.x] = v;
                         }),
            MOELITE_OK);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], t < 32 ? (t + 10) % 32 : t);
}

// ---- memory ---------------------------------------------------------------------------------------

TEST(Simt, AtomicsFromManyBlocksCountExactly) {
  int counter = 0;
  float fsum = 0;
  ASSERT_EQ(simt::launch(Dim3(40, 3), Dim3(96), 0,
                         [&] {
                           __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
                           moelite::cuda_kernels::atomic_add_f32(&fsum, 0.5f);
                         }),
            MOELITE_OK);
  EXPECT_EQ(counter, 40 * 3 * 96);
  EXPECT_EQ(fsum, 40 * 3 * 96 * 0.5f);  // exact: every partial sum is a multiple of 0.5 below 2^24
}

TEST(Simt, DynamicSharedMemoryIsPerBlockAndAligned) {
  const unsigned n = 200;
  std::vector<int> out(4 * n, -1);
  bool aligned = true;
  ASSERT_EQ(simt::launch(Dim3(4), Dim3(n), n * sizeof(int),
                         [&] {
                           MK_DYNAMIC_SHARED(int, buf);
                           if (reinterpret_cast<uintptr_t>(buf) % 16 != 0) aligned = false;
                           const unsigned t = threadIdx.x;
                           buf[t] = static_cast<int>(blockIdx.x * 1000 + t);
                           __syncthreads();
                           out[blockIdx.x * n + t] = buf[n - 1 - t];  // written by another thread
                         }),
            MOELITE_OK)
      << moelite::last_error_message();
  EXPECT_TRUE(aligned);
  for (unsigned b = 0; b < 4; ++b)
    for (unsigned t = 0; t < n; ++t) EXPECT_EQ(out[b * n + t], static_cast<int>(b * 1000 + (n - 1 - t)));
}

TEST(Simt, GridCoordinatesCoverEveryThreadOnce) {
  const Dim3 grid(3, 2, 4), block(4, 3, 5);
  const unsigned nb = 3 * 2 * 4, nt = 4 * 3 * 5;
  std::vector<int> hits(nb * nt, 0);
  bool in_range = true;
  ASSERT_EQ(simt::launch(grid, block, 0,
                         [&] {
                           if (threadIdx.x >= blockDim.x || threadIdx.y >= blockDim.y || threadIdx.z >= blockDim.z ||
                               blockIdx.x >= gridDim.x || blockIdx.y >= gridDim.y || blockIdx.z >= gridDim.z ||
                               simt::lane_id() != linear_tid() % 32) {
                             in_range = false;
                             return;
                           }
                           ++hits[linear_bid() * nt + linear_tid()];
                         }),
            MOELITE_OK);
  EXPECT_TRUE(in_range);
  for (unsigned i = 0; i < nb * nt; ++i) EXPECT_EQ(hits[i], 1) << i;
}

// ---- faults ---------------------------------------------------------------------------------------

void expect_normal_launch_works() {
  int counter = 0;
  ASSERT_EQ(simt::launch(Dim3(2), Dim3(64), 0,
                         [&] {
                           __syncthreads();
                           const int v = shfl_xor(1, 1);
                           __atomic_fetch_add(&counter, v, __ATOMIC_RELAXED);
                         }),
            MOELITE_OK)
      << moelite::last_error_message();
  EXPECT_EQ(counter, 128);
}

TEST(Simt, ThreadsThatReturnCountAsArrivedAtBarriers) {
  // Warp 1 leaves the loop one barrier early and returns: warp 0's last barrier still releases.
  std::vector<int> rounds_done(64, 0);
  ASSERT_EQ(simt::launch(Dim3(2), Dim3(64), 0,
                         [&] {
                           const int rounds = threadIdx.x < 32 ? 4 : 3;
                           for (int i = 0; i < rounds; ++i) __syncthreads();
                           if (blockIdx.x == 1) rounds_done[threadIdx.x] = rounds;
                         }),
            MOELITE_OK)
      << moelite::last_error_message();
  for (int t = 0; t < 64; ++t) EXPECT_EQ(rounds_done[t], t < 32 ? 4 : 3);
}

TEST(Simt, DeadlockIsReportedAndLaterLaunchesWork) {
  // Half of every warp skips the barrier of round 2 and so reaches the warp reduction one barrier
  // early: those lanes wait at the shuffle for lanes that wait at a barrier for them.
  int reached_the_end = 0;
  const moelite::Status st = simt::launch(Dim3(2), Dim3(64), 0, [&] {
    for (int i = 0; i < 4; ++i)
      if (i != 2 || simt::lane_id() < 16) __syncthreads();
    (void)moelite::cuda_kernels::warp_sum(1.0f);
    ++reached_the_end;
  });
  ASSERT_EQ(st, MOELITE_ERR_BACKEND);
  const std::string msg = moelite::last_error_message();
  EXPECT_NE(msg.find("deadlock in block (0,0,0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32 of 64 threads wait at __syncthreads, 32 at a warp operation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("warp 0 has lanes at __syncthreads and lanes at a warp operation"), std::string::npos) << msg;
  EXPECT_EQ(reached_the_end, 0);  // and block (1,0,0) never ran
  expect_normal_launch_works();
}

TEST(Simt, DivergentSyncWithinAWarpIsReported) {
  const moelite::Status st = simt::launch(Dim3(1), Dim3(32), 0, [&] {
    if (simt::lane_id() < 16) {
      __syncthreads();
    } else {
      (void)shfl_xor(1, 1);
    }
  });
  ASSERT_EQ(st, MOELITE_ERR_BACKEND);
  const std::string msg = moelite::last_error_message();
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("divergent"), std::string::npos) << msg;
  expect_normal_launch_works();
}

TEST(Simt, BadMasksAndWidthsAreReported) {
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(32), 0, [] { (void)simt::shfl_xor_bits(0x0000ffffu, 1, 1, 32); }),
            MOELITE_ERR_BACKEND);
  EXPECT_NE(std::string(moelite::last_error_message()).find("unsupported mask"), std::string::npos)
      << moelite::last_error_message();
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(32), 0, [] { (void)simt::shfl_bits(0xffffffffu, 1, 0, 12); }),
            MOELITE_ERR_BACKEND);
  EXPECT_NE(std::string(moelite::last_error_message()).find("width 12"), std::string::npos);
  // Lanes meeting at different kinds of warp operation.
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(32), 0,
                         [] {
                           if (simt::lane_id() == 3)
                             (void)simt::ballot(0xffffffffu, true);
                           else
                             (void)shfl_xor(1, 1);
                         }),
            MOELITE_ERR_BACKEND);
  expect_normal_launch_works();
}

TEST(Simt, BadLaunchShapesAreRefused) {
  auto nothing = [] {};
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(0), 0, nothing), MOELITE_ERR_BACKEND);
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(1025), 0, nothing), MOELITE_ERR_BACKEND);
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(32, 32, 2), 0, nothing), MOELITE_ERR_BACKEND);
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(65536, 65536, 1), 0, nothing),
            MOELITE_ERR_BACKEND);  // product overflows 32 bits
  EXPECT_EQ(simt::launch(Dim3(0, 1, 1), Dim3(32), 0, nothing), MOELITE_ERR_BACKEND);
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(32), simt::kMaxDynamicShared + 1, nothing), MOELITE_ERR_BACKEND);
  EXPECT_NE(std::string(moelite::last_error_message()).find("dynamic shared"), std::string::npos);
  EXPECT_EQ(simt::launch(Dim3(1), Dim3(32, 32, 1), simt::kMaxDynamicShared, nothing), MOELITE_OK);
}

TEST(Simt, LaunchInsideAKernelIsRefused) {
  std::atomic<int> refused{0};
  ASSERT_EQ(simt::launch(Dim3(1), Dim3(4), 0,
                         [&] {
                           if (simt::launch(Dim3(1), Dim3(1), 0, [] {}) == MOELITE_ERR_BACKEND) ++refused;
                         }),
            MOELITE_OK);
  EXPECT_EQ(refused.load(), 4);
}

TEST(Simt, ExceptionInAKernelIsReported) {
  std::atomic<int> finished{0};
  const moelite::Status st = simt::launch(Dim3(3), Dim3(64), 0, [&] {
    if (blockIdx.x == 1 && threadIdx.x == 40) throw std::runtime_error("lane 8 of warp 1 gave up");
    __syncthreads();  // the others still get past the barrier: the thrower counts as returned
    ++finished;
  });
  ASSERT_EQ(st, MOELITE_ERR_BACKEND);
  const std::string msg = moelite::last_error_message();
  EXPECT_NE(msg.find("kernel threw: lane 8 of warp 1 gave up"), std::string::npos) << msg;
  EXPECT_EQ(finished.load(), 64 + 63);  // block 0, then block 1 but the thrower; block 2 never runs
  expect_normal_launch_works();
}

TEST(Simt, CoordinatesOutsideALaunchAreZero) {
  EXPECT_EQ(threadIdx.x, 0u);
  EXPECT_EQ(blockIdx.y, 0u);
  EXPECT_EQ(blockDim.z, 0u);
  EXPECT_EQ(gridDim.x, 0u);
  EXPECT_EQ(simt::dynamic_shared(), nullptr);
}

// ---- speed (numbers for the record; asserts only correctness) --------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Simt, SpeedOfSwitchesAndWarpReductions) {
  // The best of a few runs: the figures are for the record (a loaded machine only slows them down).
  double switch_ns = 1e30, reduce_ms = 1e30;
  for (int repeat = 0; repeat < 5; ++repeat) {
    // Each __syncwarp of a full warp is one switch per lane.
    const int rounds = 20000;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(simt::launch(Dim3(1), Dim3(32), 0,
                           [&] {
                             for (int i = 0; i < rounds; ++i) __syncwarp();
                           }),
              MOELITE_OK);
    switch_ns = std::min(switch_ns, seconds_since(t0) * 1e9 / (32.0 * rounds));

    // 1M threads: 32768 rows of 32 values, one warp per row, 8 rows per block, a 5-step shfl_xor
    // butterfly each (6 switches per thread with its return; warp_sum does it in one exchange).
    const unsigned rows = 1u << 15, rows_per_block = 8;
    std::vector<float> sums(rows);
    t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(simt::launch(Dim3(rows / rows_per_block), Dim3(32, rows_per_block), 0,
                           [&] {
                             const unsigned row = blockIdx.x * rows_per_block + threadIdx.y;
                             float s = static_cast<float>(threadIdx.x & 3);
                             for (int m = 16; m > 0; m >>= 1) s += shfl_xor(s, m);
                             if (threadIdx.x == 0) sums[row] = s;
                           }),
              MOELITE_OK);
    reduce_ms = std::min(reduce_ms, seconds_since(t0) * 1e3);
    for (unsigned r = 0; r < rows; ++r) ASSERT_EQ(sums[r], 48.0f) << r;
  }
  std::printf("[simt] %.1f ns per fiber switch; warp reduction of 32768 rows (1M threads, 5 shfl_xor each): %.1f ms\n",
              switch_ns, reduce_ms);
}

}  // namespace

// ---- shared-memory race checking (simt/shared_array.h) ---------------------------------------

namespace {

// Runs `body` as a kernel of `blocks` x `threads`; the status and the message of a fault.
std::pair<moelite_status, std::string> run_kernel(unsigned threads, const std::function<void()>& body,
                                                  unsigned blocks = 1) {
  const moelite_status st = simt::launch(Dim3(blocks), Dim3(threads), 0, body);
  return {st, st == MOELITE_OK ? std::string() : std::string(moelite::last_error_message())};
}

}  // namespace

TEST(SimtSharedMemory, AMissingBarrierIsARace) {
  std::vector<int> out(64);
  // Thread 0 writes, everyone reads: without __syncthreads the readers race with the writer,
  // whichever order the emulator runs them in.
  auto racy = run_kernel(64, [&] {
    MK_SHARED(int, value, 1);
    if (threadIdx.x == 0) value[0] = 42;
    out[threadIdx.x] = value[0];
  });
  EXPECT_EQ(racy.first, MOELITE_ERR_BACKEND);
  EXPECT_NE(racy.second.find("shared-memory race: write then read"), std::string::npos) << racy.second;
  auto fine = run_kernel(64, [&] {
    MK_SHARED(int, value, 1);
    if (threadIdx.x == 0) value[0] = 42;
    __syncthreads();
    out[threadIdx.x] = value[0];
  });
  EXPECT_EQ(fine.first, MOELITE_OK) << fine.second;
  for (int v : out) EXPECT_EQ(v, 42);
  // The next launch is unaffected by the earlier fault.
  EXPECT_EQ(run_kernel(32, [] {}).first, MOELITE_OK);
}

TEST(SimtSharedMemory, OverwritingWhatOthersStillReadIsARace) {
  // Everyone reads element 0, then thread 5 overwrites it: a second barrier is needed in between
  // (the pattern of reusing a reduction's scratch).
  auto racy = run_kernel(64, [] {
    MK_SHARED(float, scratch, 1);
    if (threadIdx.x == 0) scratch[0] = 1.0f;
    __syncthreads();
    const float v = scratch[0];
    if (threadIdx.x == 5) scratch[0] = v + 1.0f;
  });
  EXPECT_EQ(racy.first, MOELITE_ERR_BACKEND);
  EXPECT_NE(racy.second.find("read then write"), std::string::npos) << racy.second;
  auto fine = run_kernel(64, [] {
    MK_SHARED(float, scratch, 1);
    if (threadIdx.x == 0) scratch[0] = 1.0f;
    __syncthreads();
    const float v = scratch[0];
    __syncthreads();
    if (threadIdx.x == 5) scratch[0] = v + 1.0f;
  });
  EXPECT_EQ(fine.first, MOELITE_OK) << fine.second;
  auto two_writers = run_kernel(64, [] {
    MK_SHARED(int, slot, 1);
    if (threadIdx.x < 2) slot[0] = static_cast<int>(threadIdx.x);
  });
  EXPECT_NE(two_writers.second.find("two writes"), std::string::npos) << two_writers.second;
}

TEST(SimtSharedMemory, SyncwarpOrdersLanesOfOneWarpOnly) {
  auto within_warp = run_kernel(64, [] {
    MK_SHARED(int, per_warp, 2);
    if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = 7;
    __syncwarp();
    const int v = per_warp[threadIdx.x / 32];
    (void)v;
  });
  EXPECT_EQ(within_warp.first, MOELITE_OK) << within_warp.second;
  auto across_warps = run_kernel(64, [] {
    MK_SHARED(int, per_warp, 2);
    if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = 7;
    __syncwarp();
    const int v = per_warp[1 - threadIdx.x / 32];  // the other warp's slot: needs __syncthreads
    (void)v;
  });
  EXPECT_EQ(across_warps.first, MOELITE_ERR_BACKEND);
  EXPECT_NE(across_warps.second.find("race"), std::string::npos) << across_warps.second;
}

TEST(SimtSharedMemory, SeveralReadersOfOneWarpAreOrderedByItsSyncwarp) {
  // Every lane of each warp reads its warp's slot, then lane 3 overwrites it: a __syncwarp in
  // between orders all the readers (a matrix product's stage, refilled chunk after chunk); without
  // it, or when the readers include another warp's lanes, it is a race.
  auto staged = run_kernel(64, [] {
    MK_SHARED(int, per_warp, 2);
    if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = 7;
    __syncwarp();
    const int v = per_warp[threadIdx.x / 32];
    __syncwarp();
    if (threadIdx.x % 32 == 3) per_warp[threadIdx.x / 32] = v + 1;
  });
  EXPECT_EQ(staged.first, MOELITE_OK) << staged.second;
  auto no_syncwarp = run_kernel(64, [] {
    MK_SHARED(int, per_warp, 2);
    if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = 7;
    __syncwarp();
    const int v = per_warp[threadIdx.x / 32];
    if (threadIdx.x % 32 == 3) per_warp[threadIdx.x / 32] = v + 1;
  });
  EXPECT_NE(no_syncwarp.second.find("read then write"), std::string::npos) << no_syncwarp.second;
  auto readers_of_two_warps = run_kernel(64, [] {
    MK_SHARED(int, value, 1);
    if (threadIdx.x == 0) value[0] = 7;
    __syncthreads();
    const int v = value[0];
    __syncwarp();
    if (threadIdx.x == 3) value[0] = v + 1;  // warp 1 read it too: only __syncthreads orders that
  });
  EXPECT_NE(readers_of_two_warps.second.find("read then write"), std::string::npos) << readers_of_two_warps.second;
}

TEST(SimtSharedMemory, StagedBytesReadBackAsWritten) {
  // MK_SHARED_BYTES filled with load_vec16 from an unaligned span: the bytes in the span come back
  // in order at their offset, and load_vec16 reads nothing outside [lo, hi).
  std::vector<uint8_t> src(64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(3 * i + 1);
  std::vector<int> got(32, -1);
  auto r = run_kernel(32, [&] {
    MK_SHARED_BYTES(stage, 64);
    const uint8_t* lo = src.data() + 5;
    const uint8_t* hi = src.data() + 45;
    const uint8_t* first = lo - (reinterpret_cast<uintptr_t>(lo) & 15u);
    const int64_t words = (hi - first + 15) / 16;
    if (threadIdx.x < words) store_vec16(stage, 16 * threadIdx.x, load_vec16(first + 16 * threadIdx.x, lo, hi));
    __syncwarp();
    const auto bytes = bytes_at(stage, lo - first);
    got[threadIdx.x] = bytes[threadIdx.x];
  });
  ASSERT_EQ(r.first, MOELITE_OK) << r.second;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], src[static_cast<size_t>(5 + i)]) << i;
}

TEST(SimtSharedMemory, StageWordsAtAnyOffsetAreTheirFourBytes) {
  // stage_u32 (the integer products' reads of weight codes) at every alignment: the four bytes at
  // the offset, little-endian, as four byte reads give them.
  std::vector<uint8_t> src(64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(7 * i + 3);
  std::vector<uint32_t> got(32, 0), want(32, 0);
  auto r = run_kernel(32, [&] {
    MK_SHARED_BYTES(stage, 64);
    if (threadIdx.x < 4) store_vec16(stage, 16 * threadIdx.x, load_vec16(src.data() + 16 * threadIdx.x, src.data(),
                                                                       src.data() + src.size()));
    __syncwarp();
    const auto bytes = bytes_at(stage, 0);
    got[threadIdx.x] = moelite::cuda_kernels::stage_u32(bytes + threadIdx.x);
  });
  ASSERT_EQ(r.first, MOELITE_OK) << r.second;
  for (uint32_t i = 0; i < 32; ++i)
    EXPECT_EQ(got[i], uint32_t(src[i]) | uint32_t(src[i + 1]) << 8 | uint32_t(src[i + 2]) << 16 | uint32_t(src[i + 3]) << 24)
        << "offset " << i;
}

TEST(SimtDialect, Dp4aIsTheSumOfFourSignedByteProductsAndWraps) {
  using moelite::cuda_kernels::dp4a;
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t a = rng(), b = rng();
    const int32_t c = static_cast<int32_t>(rng());
    int64_t want = c;
    for (int k = 0; k < 4; ++k) want += int64_t(int8_t(a >> (8 * k))) * int8_t(b >> (8 * k));
    EXPECT_EQ(dp4a(a, b, c), static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(want))));
  }
  EXPECT_EQ(dp4a(0x80808080u, 0x80808080u, 0), 4 * 128 * 128);
  EXPECT_EQ(dp4a(0x7F7F7F7Fu, 0x81818181u, 0), -4 * 127 * 127);
  EXPECT_EQ(dp4a(0x00000001u, 0x00000001u, 0x7FFFFFFF), INT32_MIN);  // wraps as the instruction does
}

TEST(SimtDialect, BytePermPicksBytesAndReplicatesSigns) {
  // PRMT's default mode as the PTX manual defines it, selector by selector.
  using moelite::cuda_kernels::byte_perm;
  const uint32_t x = 0x83828180u, y = 0x07060504u;  // bytes 0..3 with the sign bit set, 4..7 without
  EXPECT_EQ(byte_perm(x, y, 0x3210u), x);
  EXPECT_EQ(byte_perm(x, y, 0x7654u), y);
  EXPECT_EQ(byte_perm(x, y, 0x0415u), 0x80048105u);
  EXPECT_EQ(byte_perm(x, y, 0x8C00u), 0xFF008080u);  // selector 8: byte 0's sign, C: byte 4's
}

TEST(SimtSharedMemory, BlocksAndLaunchesStartClean) {
  // Each block writes then reads its own values after a barrier: no state of an earlier block or
  // launch counts against it.
  for (int launch = 0; launch < 2; ++launch) {
    auto r = run_kernel(
        32,
        [] {
          MK_SHARED(int, v, 32);
          v[threadIdx.x] = static_cast<int>(blockIdx.x);
          __syncthreads();
          const int mine = v[(threadIdx.x + 1) % 32];
          (void)mine;
        },
        4);
    EXPECT_EQ(r.first, MOELITE_OK) << r.second;
  }
}

TEST(SimtSharedMemory, AnIndexOutOfBoundsIsAFault) {
  auto r = run_kernel(32, [] {
    MK_SHARED(int, v, 8);
    v[threadIdx.x] = 1;  // threads 8..31 are past the end
  });
  EXPECT_EQ(r.first, MOELITE_ERR_BACKEND);
  EXPECT_NE(r.second.find("out of bounds"), std::string::npos) << r.second;
}
