// The SIMT emulator (see simt.h). Scheduling: the runnable threads of a block wait in a FIFO; the
// running thread keeps the CPU until it reaches a synchronisation point it cannot pass yet, then
// switches straight to the next runnable thread (no trip through a scheduler context). The thread
// whose arrival completes a barrier or warp exchange does not switch at all: it queues the
// waiters and carries on. So a warp shuffle costs one fiber switch per lane.
//
// A fiber abandoned by a deadlock or a kernel fault is never resumed: its stack is reused by the next
// block and the C++ objects on it are never destroyed. Kernels therefore must not hold resources
// (heap memory, locks) across synchronisation points. Nor may they synchronise inside a catch handler:
// the C++ runtime keeps one list of exceptions being handled per OS thread, not per fiber.
#include "backends/cuda/simt/simt.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "fiber.h"

#if MOELITE_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace moelite::simt {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr unsigned kMaxWarps = kMaxThreadsPerBlock / kWarpSize;
// 64 KiB is ample for kernels; ASan's redzones and unoptimised frames need more.
constexpr size_t kStackBytes = MOELITE_SIMT_ASAN ? 256 * 1024 : 64 * 1024;

enum class Waiting : uint8_t { kNothing, kBlockBarrier, kWarpOp, kReturned };
enum class WarpOp : uint8_t { kSyncWarp, kShfl, kShflXor, kShflDown, kShflUp, kBallot, kButterflySum, kButterflyMax };

const char* warp_op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncWarp: return "__syncwarp";
    case WarpOp::kShfl: return "__shfl_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kButterflySum: return "warp_sum (__shfl_xor_sync)";
    case WarpOp::kButterflyMax: return "warp_max (__shfl_xor_sync)";
  }
  return "?";
}

// One emulated CUDA thread.
struct SimThread {
  fiber::Context context;
  Dim3 idx;
  unsigned linear = 0;
  unsigned lane = 0;
  unsigned warp = 0;
  Waiting waiting = Waiting::kNothing;
};

// The exchange area of one warp: each arriving lane leaves its operand; the lane whose arrival
// completes the exchange computes every lane's result, which each lane reads when it resumes
// (before it can arrive at the next exchange, so one area per warp suffices).
struct WarpExchange {
  unsigned live = 0;     // lanes that have not returned
  unsigned arrived = 0;  // lanes waiting at the current exchange
  WarpOp op = WarpOp::kSyncWarp;
  int width = 32;
  uint64_t value[kWarpSize] = {};
  int arg[kWarpSize] = {};  // source lane, lane mask or delta, per lane
  uint64_t result[kWarpSize] = {};
  uint64_t sync_epoch = 0;  // counts completed __syncwarp (shared-memory race checking)
};

// Everything an OS thread needs to run launches; created on its first launch and kept (stacks,
// dynamic shared memory) for the next.
struct Emulator {
  SimThread threads[kMaxThreadsPerBlock];
  WarpExchange warps[kMaxWarps];
  std::vector<fiber::Stack> stacks;
  std::unique_ptr<unsigned char[]> dynamic_shared_storage;
  unsigned char* dynamic_shared = nullptr;  // 16-byte aligned inside the storage
  size_t dynamic_shared_poisoned = 0;

  // The launch and block being run.
  const std::function<void()>* body = nullptr;
  Dim3 grid, block, block_idx;
  unsigned n_threads = 0, n_warps = 0;
  fiber::Context launcher;  // the code that called launch()
  SimThread* current = nullptr;

  // Threads that can run, in the order they will (ring buffer; each thread is queued at most once).
  uint16_t ready[kMaxThreadsPerBlock];
  unsigned ready_head = 0, ready_tail = 0;

  unsigned live_threads = 0;  // threads of the block that have not returned
  uint16_t barrier_waiters[kMaxThreadsPerBlock];
  unsigned barrier_arrived = 0;
  // Shared-memory race checking: a new value at every block start and completed block barrier.
  uint64_t epoch_counter = 0, block_epoch = 0;
  SyncClock clock;  // the running thread's, kept current by refresh_clock() (live_sync_clock())

  std::string fault;              // first kernel fault of the block ("kernel threw: ...", bad mask)
  bool abandoned_fibers = false;  // a fiber was left suspended: its stack holds stale frames

  ~Emulator() {
    for (auto& s : stacks) fiber::free_stack(&s);
  }
};

// Owns the OS thread's emulator; the hot paths read the raw pointer below instead (set only while a
// launch runs). Not initial-exec TLS: that would mark libmoelite STATIC_TLS, and dlopen() (Python's
// ctypes) can then fail with "cannot allocate memory in static TLS block".
thread_local std::unique_ptr<Emulator> t_owner;
thread_local Emulator* t_active = nullptr;

const Dim3 kZeroDim{0, 0, 0};

// After the running thread changed, or a barrier or __syncwarp completed: the clock SharedArray reads.
void refresh_clock(Emulator* e) {
  SyncClock& c = e->clock;
  const SimThread* t = e->current;
  c.valid = t != nullptr;
  if (!t) return;
  c.block_epoch = e->block_epoch;
  c.warp_epoch = e->warps[t->warp].sync_epoch;
  c.thread = t->linear;
  c.warp = t->warp;
}

void push_ready(Emulator* e, unsigned t) {
  e->ready[e->ready_tail % kMaxThreadsPerBlock] = static_cast<uint16_t>(t);
  ++e->ready_tail;
}

SimThread* pop_ready(Emulator* e) {
  if (e->ready_head == e->ready_tail) return nullptr;
  const unsigned t = e->ready[e->ready_head % kMaxThreadsPerBlock];
  ++e->ready_head;
  return &e->threads[t];
}

// The running thread can go no further for now: run the next runnable thread, or, when there is none,
// return to the launcher (the block is finished or deadlocked). Returns when this thread is resumed.
void suspend_current(Emulator* e) {
  SimThread* self = e->current;
  SimThread* next = pop_ready(e);
  fiber::Context* to = next ? &next->context : &e->launcher;
  e->current = next;
  refresh_clock(e);
  fiber::switch_to(&self->context, to);
}

// A fault that makes the block meaningless to continue (bad mask, lanes disagreeing). Kept apart from
// abandon_block() so the message's temporaries are destroyed before the fiber is left for good.
void record_fault(Emulator* e, std::string message) {
  if (e->fault.empty()) e->fault = std::move(message);
}

// Leaves the block for good after record_fault(): the remaining fibers are abandoned.
[[noreturn]] void abandon_block(Emulator* e) {
  e->abandoned_fibers = true;
  SimThread* self = e->current;
  e->current = nullptr;
  refresh_clock(e);
  fiber::switch_to(&self->context, &e->launcher);
  std::abort();  // nothing resumes an abandoned fiber
}

std::string hex32(unsigned v) {
  char text[16];
  snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// ---- warp exchanges -----------------------------------------------------------------------------

// warp_sum / warp_max: every lane's result of the five shfl_xor steps, in the order they take.
void butterfly_results(WarpExchange& w) {
  float v[kWarpSize];
  for (unsigned l = 0; l < kWarpSize; ++l) v[l] = from_bits<float>(w.value[l]);
  for (unsigned m = 16; m > 0; m >>= 1) {
    float next[kWarpSize];
    for (unsigned l = 0; l < kWarpSize; ++l) {
      if (!(w.arrived >> l & 1u)) continue;
      // A lane that has returned (or is missing from a partial warp) gives the lane its own value.
      const float other = w.arrived >> (l ^ m) & 1u ? v[l ^ m] : v[l];
      next[l] = w.op == WarpOp::kButterflySum ? v[l] + other : (other > v[l] ? other : v[l]);
    }
    for (unsigned l = 0; l < kWarpSize; ++l)
      if (w.arrived >> l & 1u) v[l] = next[l];
  }
  for (unsigned m = w.arrived; m; m &= m - 1) {
    const unsigned l = static_cast<unsigned>(__builtin_ctz(m));
    w.result[l] = to_bits(v[l]);
  }
}

uint64_t exchange_result(const WarpExchange& w, unsigned lane) {
  const uint64_t own = w.value[lane];
  const unsigned width = static_cast<unsigned>(w.width);
  const unsigned segment = lane & ~(width - 1);  // first lane of this lane's width-wide segment
  const unsigned in_segment = lane & (width - 1);
  const unsigned arg = static_cast<unsigned>(w.arg[lane]);
  unsigned src = lane;
  switch (w.op) {
    case WarpOp::kSyncWarp:
    case WarpOp::kButterflySum:
    case WarpOp::kButterflyMax: return 0;  // complete_warp_exchange does not ask
    case WarpOp::kBallot: {
      unsigned bits = 0;
      for (unsigned m = w.arrived; m; m &= m - 1) {
        const unsigned l = static_cast<unsigned>(__builtin_ctz(m));
        if (w.value[l]) bits |= 1u << l;
      }
      return bits;
    }
    case WarpOp::kShfl: src = segment + (arg & (width - 1)); break;
    case WarpOp::kShflXor:
      src = lane ^ arg;
      if (arg >= kWarpSize || (src & ~(width - 1)) != segment) return own;
      break;
    case WarpOp::kShflDown:
      if (arg >= width || in_segment + arg >= width) return own;
      src = lane + arg;
      break;
    case WarpOp::kShflUp:
      if (arg > in_segment) return own;
      src = lane - arg;
      break;
  }
  // A lane that has returned (or does not exist in a partial warp) has no value to give.
  if (!(w.arrived >> src & 1u)) return own;
  return w.value[src];
}

// Every live lane of the warp has arrived: compute the results and make the waiting lanes runnable
// (except `running`, the lane that completed the exchange and carries on; kWarpSize for none).
void complete_warp_exchange(Emulator* e, unsigned warp, unsigned running_lane) {
  WarpExchange& w = e->warps[warp];
  if (w.op == WarpOp::kBallot) {
    const uint64_t bits = exchange_result(w, 0);
    for (unsigned m = w.arrived; m; m &= m - 1) w.result[__builtin_ctz(m)] = bits;
  } else if (w.op == WarpOp::kButterflySum || w.op == WarpOp::kButterflyMax) {
    butterfly_results(w);
  } else if (w.op != WarpOp::kSyncWarp) {
    for (unsigned m = w.arrived; m; m &= m - 1) {
      const unsigned l = static_cast<unsigned>(__builtin_ctz(m));
      w.result[l] = exchange_result(w, l);
    }
  }
  const unsigned first_thread = warp * kWarpSize;
  for (unsigned m = w.arrived; m; m &= m - 1) {
    const unsigned l = static_cast<unsigned>(__builtin_ctz(m));
    if (l == running_lane) continue;
    e->threads[first_thread + l].waiting = Waiting::kNothing;
    push_ready(e, first_thread + l);
  }
  w.arrived = 0;
  if (w.op == WarpOp::kSyncWarp) {
    ++w.sync_epoch;
    refresh_clock(e);  // the lane that completed it runs on
  }
}

std::string describe_block(const Emulator* e) {
  const Dim3& b = e->block_idx;
  return "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
}

uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Emulator* e = t_active;
  if (!e || !e->current) return op == WarpOp::kBallot ? (value ? 1u : 0u) : value;  // outside a launch
  SimThread* self = e->current;
  WarpExchange& w = e->warps[self->warp];
  if (width <= 0 || width > static_cast<int>(kWarpSize) || (width & (width - 1)) != 0) {
    record_fault(e, "SIMT emulator: " + std::string(warp_op_name(op)) + " with width " + std::to_string(width) +
                        " (must be a power of two <= 32) in " + describe_block(e));
    abandon_block(e);
  }
  if (mask != kFullMask && mask != w.live) {
    record_fault(e, "SIMT emulator: unsupported mask " + hex32(mask) + " in " + warp_op_name(op) + " (warp " +
                        std::to_string(self->warp) + " of " + describe_block(e) + ", live lanes " + hex32(w.live) +
                        "): a mask must be 0xffffffff or exactly the warp's live lanes");
    abandon_block(e);
  }
  if (w.arrived == 0) {
    w.op = op;
    w.width = width;
  } else if (w.op != op || w.width != width) {
    record_fault(e, "SIMT emulator: lanes of warp " + std::to_string(self->warp) + " in " + describe_block(e) +
                        " meet at different warp operations (" + warp_op_name(w.op) + " and " + warp_op_name(op) +
                        ", or different widths)");
    abandon_block(e);
  }
  const unsigned lane = self->lane;
  w.value[lane] = value;
  w.arg[lane] = arg;
  w.arrived |= 1u << lane;
  if (w.arrived == w.live) {
    complete_warp_exchange(e, self->warp, lane);
  } else {
    self->waiting = Waiting::kWarpOp;
    suspend_current(e);
  }
  return w.result[lane];
}

// ---- block barrier ------------------------------------------------------------------------------

// Every live thread has arrived: make the waiters runnable (except `running`, the thread whose
// arrival completed the barrier and carries on; null for none).
void release_barrier(Emulator* e, const SimThread* running) {
  for (unsigned i = 0; i < e->barrier_arrived; ++i) {
    SimThread& t = e->threads[e->barrier_waiters[i]];
    if (&t == running) continue;
    t.waiting = Waiting::kNothing;
    push_ready(e, t.linear);
  }
  e->barrier_arrived = 0;
  e->block_epoch = ++e->epoch_counter;
  refresh_clock(e);  // the thread that completed it runs on
}

// ---- thread life --------------------------------------------------------------------------------

// A thread has returned: it no longer holds up the block barrier or its warp's exchanges.
void retire_current(Emulator* e) {
  SimThread* self = e->current;
  self->waiting = Waiting::kReturned;
  --e->live_threads;
  WarpExchange& w = e->warps[self->warp];
  w.live &= ~(1u << self->lane);
  if (w.arrived != 0 && w.arrived == w.live) complete_warp_exchange(e, self->warp, kWarpSize);
  if (e->barrier_arrived != 0 && e->barrier_arrived == e->live_threads) release_barrier(e, nullptr);
}

// The whole life of one emulated thread. noexcept: nothing may unwind past a fiber's first frame (there
// is no caller there), so a failure even to record the kernel's exception terminates.
void fiber_main() noexcept {
  fiber::on_entry();
  Emulator* e = t_active;
  try {
    (*e->body)();
  } catch (const std::exception& ex) {
    if (e->fault.empty()) e->fault = std::string("SIMT emulator: kernel threw: ") + ex.what();
  } catch (...) {
    if (e->fault.empty()) e->fault = "SIMT emulator: kernel threw an exception that is not a std::exception";
  }
  retire_current(e);
  SimThread* self = e->current;
  fiber::forget_entry_frame(e->stacks[self->linear]);
  SimThread* next = pop_ready(e);
  e->current = next;
  refresh_clock(e);
  fiber::exit_to(&self->context, next ? &next->context : &e->launcher);
  std::abort();  // a returned fiber is never resumed
}

// ---- launch -------------------------------------------------------------------------------------

Status prepare_stacks(Emulator* e, unsigned n) {
  try {
    e->stacks.reserve(n);
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "SIMT emulator: out of memory for %u fiber stacks", n);
  }
  while (e->stacks.size() < n) {
    fiber::Stack s;
    if (!fiber::allocate_stack(kStackBytes, &s)) {
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "SIMT emulator: cannot map a %zu-byte fiber stack", kStackBytes);
    }
    e->stacks.push_back(s);  // no reallocation: reserved above
  }
  return MOELITE_OK;
}

// Under ASan, the bytes of dynamic shared memory beyond what the launch asked for are poisoned, so a
// kernel reading past its allocation is reported.
void limit_dynamic_shared(Emulator* e, size_t bytes) {
#if MOELITE_SIMT_ASAN
  __asan_unpoison_memory_region(e->dynamic_shared, kMaxDynamicShared);
  __asan_poison_memory_region(e->dynamic_shared + bytes, kMaxDynamicShared - bytes);
#else
  (void)e;
  (void)bytes;
#endif
}

Status validate(Dim3 grid, Dim3 block, size_t dynamic_shared_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock) {
    return fail(MOELITE_ERR_BACKEND, "SIMT emulator: block of %ux%ux%u threads (must be 1..%u)", block.x, block.y,
                block.z, kMaxThreadsPerBlock);
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    return fail(MOELITE_ERR_BACKEND, "SIMT emulator: empty grid %ux%ux%u", grid.x, grid.y, grid.z);
  }
  if (dynamic_shared_bytes > kMaxDynamicShared) {
    return fail(MOELITE_ERR_BACKEND, "SIMT emulator: %zu bytes of dynamic shared memory (at most %zu)",
                dynamic_shared_bytes, kMaxDynamicShared);
  }
  return MOELITE_OK;
}

// Thread coordinates and warp membership are the same for every block of a launch.
void lay_out_threads(Emulator* e) {
  const Dim3& b = e->block;
  unsigned linear = 0;
  for (unsigned z = 0; z < b.z; ++z)
    for (unsigned y = 0; y < b.y; ++y)
      for (unsigned x = 0; x < b.x; ++x, ++linear) {
        SimThread& t = e->threads[linear];
        t.idx = Dim3(x, y, z);
        t.linear = linear;
        t.lane = linear % kWarpSize;
        t.warp = linear / kWarpSize;
      }
}

std::string describe_deadlock(const Emulator* e) {
  unsigned at_barrier = 0, at_warp_op = 0, returned = 0;
  std::string mixed;
  for (unsigned w = 0; w < e->n_warps; ++w) {
    bool barrier = false, warp_op = false;
    for (unsigned t = w * kWarpSize; t < e->n_threads && t < (w + 1) * kWarpSize; ++t) {
      switch (e->threads[t].waiting) {
        case Waiting::kBlockBarrier: ++at_barrier, barrier = true; break;
        case Waiting::kWarpOp: ++at_warp_op, warp_op = true; break;
        case Waiting::kReturned: ++returned; break;
        case Waiting::kNothing: break;
      }
    }
    if (barrier && warp_op && mixed.empty()) {
      mixed = "; warp " + std::to_string(w) +
              " has lanes at __syncthreads and lanes at a warp operation at once (divergent synchronisation)";
    }
  }
  return "SIMT emulator: deadlock in " + describe_block(e) + ": " + std::to_string(at_barrier) + " of " +
         std::to_string(e->n_threads) + " threads wait at __syncthreads, " + std::to_string(at_warp_op) +
         " at a warp operation (shuffle, vote, __syncwarp), " + std::to_string(returned) + " returned" + mixed;
}

// Runs every thread of one block to its end; false (with e->fault set) on a kernel fault or deadlock.
bool run_block(Emulator* e) {
  e->ready_head = e->ready_tail = 0;
  e->barrier_arrived = 0;
  e->block_epoch = ++e->epoch_counter;
  e->live_threads = e->n_threads;
  for (unsigned w = 0; w < e->n_warps; ++w) {
    const unsigned lanes = e->n_threads - w * kWarpSize;
    e->warps[w].live = lanes >= kWarpSize ? kFullMask : (1u << lanes) - 1;
    e->warps[w].arrived = 0;
  }
  if (e->abandoned_fibers) {
    for (const auto& s : e->stacks) fiber::forget_abandoned_frames(s);
    e->abandoned_fibers = false;
  }
  for (unsigned t = 0; t < e->n_threads; ++t) {
    e->threads[t].waiting = Waiting::kNothing;
    fiber::prepare(&e->threads[t].context, e->stacks[t], &fiber_main);
    push_ready(e, t);
  }
  e->current = pop_ready(e);
  refresh_clock(e);
  fiber::switch_to(&e->launcher, &e->current->context);
  // Back here when no thread can run: all returned, a deadlock, or a fault abandoned the block.
  e->current = nullptr;
  refresh_clock(e);
  if (e->live_threads != 0) {
    e->abandoned_fibers = true;
    if (e->fault.empty()) e->fault = describe_deadlock(e);
  }
  return e->fault.empty();
}

Emulator* emulator_for_this_thread() {
  if (!t_owner) {
    std::unique_ptr<Emulator> e(new (std::nothrow) Emulator);
    if (!e) return nullptr;
    // 16 bytes of slack so the dynamic shared memory can start 16-byte aligned.
    e->dynamic_shared_storage.reset(new (std::nothrow) unsigned char[kMaxDynamicShared + 16]);
    if (!e->dynamic_shared_storage) return nullptr;
    const auto base = reinterpret_cast<uintptr_t>(e->dynamic_shared_storage.get());
    e->dynamic_shared = e->dynamic_shared_storage.get() + ((16 - base % 16) % 16);
    t_owner = std::move(e);
  }
  return t_owner.get();
}

}  // namespace

Status launch(Dim3 grid, Dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  if (t_active) return fail(MOELITE_ERR_BACKEND, "SIMT emulator: launch() called from inside a kernel");
  MOELITE_TRY(validate(grid, block, dynamic_shared_bytes));
  Emulator* e = emulator_for_this_thread();
  if (!e) return fail(MOELITE_ERR_OUT_OF_MEMORY, "SIMT emulator: out of memory for the emulator state");
  e->n_threads = block.x * block.y * block.z;
  e->n_warps = (e->n_threads + kWarpSize - 1) / kWarpSize;
  MOELITE_TRY(prepare_stacks(e, e->n_threads));
  e->grid = grid;
  e->block = block;
  e->body = &body;
  e->fault.clear();
  lay_out_threads(e);
  limit_dynamic_shared(e, dynamic_shared_bytes);

  t_active = e;
  bool ok = true;
  for (unsigned z = 0; ok && z < grid.z; ++z)
    for (unsigned y = 0; ok && y < grid.y; ++y)
      for (unsigned x = 0; ok && x < grid.x; ++x) {
        e->block_idx = Dim3(x, y, z);
        if (!run_block(e)) {
          ok = false;
          break;
        }
      }
  t_active = nullptr;
  e->body = nullptr;
  if (!ok) return fail(MOELITE_ERR_BACKEND, "%s", e->fault.c_str());
  return MOELITE_OK;
}

const Dim3& thread_idx() {
  const Emulator* e = t_active;
  return e && e->current ? e->current->idx : kZeroDim;
}
const Dim3& block_idx() {
  const Emulator* e = t_active;
  return e ? e->block_idx : kZeroDim;
}
const Dim3& block_dim() {
  const Emulator* e = t_active;
  return e ? e->block : kZeroDim;
}
const Dim3& grid_dim() {
  const Emulator* e = t_active;
  return e ? e->grid : kZeroDim;
}
unsigned lane_id() {
  const Emulator* e = t_active;
  return e && e->current ? e->current->lane : 0;
}
void* dynamic_shared() {
  const Emulator* e = t_active;
  return e ? e->dynamic_shared : nullptr;
}

const SyncClock* live_sync_clock() {
  const Emulator* e = t_owner.get();
  return e ? &e->clock : nullptr;
}

void report_kernel_fault(const char* message) {
  Emulator* e = t_active;
  if (e && e->fault.empty()) e->fault = "SIMT emulator: " + describe_block(e) + ": " + message;
}

void sync_threads() {
  Emulator* e = t_active;
  if (!e || !e->current) return;
  SimThread* self = e->current;
  e->barrier_waiters[e->barrier_arrived++] = static_cast<uint16_t>(self->linear);
  if (e->barrier_arrived == e->live_threads) {
    release_barrier(e, self);
    return;
  }
  self->waiting = Waiting::kBlockBarrier;
  suspend_current(e);
}

void sync_warp(unsigned mask) { warp_exchange(WarpOp::kSyncWarp, mask, 0, 0, static_cast<int>(kWarpSize)); }

uint64_t shfl_bits(unsigned mask, uint64_t v, int src_lane, int width) {
  return warp_exchange(WarpOp::kShfl, mask, v, src_lane, width);
}
uint64_t shfl_xor_bits(unsigned mask, uint64_t v, int lane_mask, int width) {
  return warp_exchange(WarpOp::kShflXor, mask, v, lane_mask, width);
}
uint64_t shfl_down_bits(unsigned mask, uint64_t v, unsigned delta, int width) {
  return warp_exchange(WarpOp::kShflDown, mask, v, static_cast<int>(delta), width);
}
uint64_t shfl_up_bits(unsigned mask, uint64_t v, unsigned delta, int width) {
  return warp_exchange(WarpOp::kShflUp, mask, v, static_cast<int>(delta), width);
}
unsigned ballot(unsigned mask, bool pred) {
  return static_cast<unsigned>(warp_exchange(WarpOp::kBallot, mask, pred ? 1 : 0, 0, static_cast<int>(kWarpSize)));
}
float warp_butterfly_sum(unsigned mask, float v) {
  return from_bits<float>(warp_exchange(WarpOp::kButterflySum, mask, to_bits(v), 0, static_cast<int>(kWarpSize)));
}
float warp_butterfly_max(unsigned mask, float v) {
  return from_bits<float>(warp_exchange(WarpOp::kButterflyMax, mask, to_bits(v), 0, static_cast<int>(kWarpSize)));
}

}  // namespace moelite::simt
