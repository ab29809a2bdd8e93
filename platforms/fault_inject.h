// Test-only fault injection at the OS boundary: "fail the n-th call of kind K". Compiled into
// every build but inert until armed (one relaxed atomic load per call), so the error paths that
// real disks, kernels and allocators rarely take are exercised by tests (tests/test_platform_faults.cpp)
// and can be reproduced from outside with MOELITE_FAULT_INJECT=kind:n (docs/ENVIRONMENT.md).
//
// Every kind is counted whether armed or not, so a test can first count the calls a phase makes
// and then fail each of them in turn. Thread-safe: loader threads count and fail like the caller.
#pragma once
#include <cstdint>

namespace moelite::platform::fault {

enum class Kind : int {
  kOpen = 0,       // File::open
  kRead,           // File::read_at and the batch reader's pread
  kMmap,           // Mapping::map
  kAlloc,          // aligned_alloc_bytes (weights read into memory, the expert pool)
  kUringSubmit,    // io_uring_submit: fails as the kernel would (-EIO), nothing submitted
  kUringComplete,  // an io_uring completion carries -EIO
  kUringBusy,      // io_uring_submit answers -EAGAIN once (transient: the reader must retry)
  kReadEfault,     // a read answers EFAULT: its destination cannot be pinned for I/O (a device's memory
                   // mapped through its PCIe BAR); the reader goes through a bounce buffer instead
  kWrite,          // a write of write_large_file_atomic or write_streamed_file answers ENOSPC (a full disk)
  kCount
};
constexpr int kKindCount = static_cast<int>(Kind::kCount);

const char* kind_name(Kind k);
// "open", "read", "mmap", "alloc", "uring_submit", "uring_complete", "uring_busy", "read_efault",
// "write";
// false if unknown.
bool parse_kind(const char* name, Kind* out);

// The n-th call (1-based, counted from now) of `k` fails; n <= 0 disarms. Resets the counters.
void arm(Kind k, int64_t n);
// The n-th call of `k` does not fail but stalls for `seconds` first (a device that stops
// answering), so timeouts and aborts of waits can be tested.
void arm_stall(Kind k, int64_t n, double seconds);
void disarm();
// Calls of `k` since the last arm()/disarm()/reset_counts(), and whether the armed call came.
int64_t calls(Kind k);
bool fired();
void reset_counts();

// Counts one call of `k`; true when it is the armed one (the caller then fails it). An armed
// stall sleeps here and returns false.
bool should_fail(Kind k);

}  // namespace moelite::platform::fault
