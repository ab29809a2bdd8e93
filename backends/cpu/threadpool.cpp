#include "backends/cpu/threadpool.h"

#include <chrono>
#include <new>

#include "backends/cpu/spin_backoff.h"
#include "platforms/system_info.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOELITE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define MOELITE_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define MOELITE_CPU_RELAX() ((void)0)
#endif

namespace moelite::cpu {

namespace {
// How long an idle worker spins before it sleeps: longer than the gaps between the parallel
// regions of a decode step, short enough not to burn a core between user requests. A decode under
// an expert budget waits for reads between experts; a worker that slept through a wait joins the
// next region late (a VM wakes it in tens to hundreds of microseconds), so those experts ran on
// about one thread. OLMoE-shaped model, 25 % budget, 2 threads: a 0.5 ms spin (the former 20000
// pauses) left 48-52 ms/token of decode not waiting on reads, 5 ms 29-32, 50 ms 27-28 (resident
// decode: 19). Measured in time, not iterations: a pause takes 17 ns on Zen 4 and ~40 on Intel.
// A worker preempted while spinning stops spinning for a while (spin_backoff.h): on a machine with
// more runnable threads than cores the spin would hold a core someone else is waiting for.
constexpr int64_t kSpinNs = 5'000'000;
// Pauses between clock reads while spinning.
constexpr int kPausesPerClockRead = 64;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Status ThreadPool::create(int n_threads, std::unique_ptr<ThreadPool>* out, std::vector<int> pin_cpus) {
  // At most what a round's count holds (the API allows MOELITE_MAX_THREADS, far fewer).
  n_threads = n_threads < 1 ? 1 : n_threads > (1 << kCountBits) - 1 ? (1 << kCountBits) - 1 : n_threads;
  std::unique_ptr<ThreadPool> pool(new (std::nothrow) ThreadPool(n_threads));
  if (!pool) return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory for the thread pool");
  try {
    pool->pin_cpus_ = std::move(pin_cpus);
    pool->workers_.reserve(static_cast<size_t>(pool->n_threads_ - 1));
    for (int i = 1; i < pool->n_threads_; ++i) pool->workers_.emplace_back([p = pool.get(), i] { p->worker_main(i); });
  } catch (const std::bad_alloc&) {
    pool->stop_and_join();
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory starting %d compute threads", pool->n_threads_);
  } catch (const std::exception& e) {
    const size_t started = pool->workers_.size();
    pool->stop_and_join();
    pool->workers_.clear();
    return fail(MOELITE_ERR_SYSTEM_LIMIT,
                "the system refused compute thread %zu of %d (%s): lower the thread count or raise the process "
                "limit (ulimit -u, cgroup pids.max)",
                started + 2, pool->n_threads_, e.what());
  }
  *out = std::move(pool);
  return MOELITE_OK;
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    round_.store(next_round(round_.load(std::memory_order_relaxed), 0), std::memory_order_release);
  }
  cv_.notify_all();
  idle_cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

void ThreadPool::run_tasks(int thread) {
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    try {
      (*fn_)(task, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
      next_task_.store(n_tasks_, std::memory_order_relaxed);  // skip the rest
    }
  }
}

void ThreadPool::worker_main(int index) {
  if (!platform::pin_current_thread(pin_cpus_))
    log_msg(MOELITE_LOG_DEBUG, "compute thread %d could not be pinned to the big cores", index);
  uint64_t seen = 0;
  SpinBackoff backoff;  // this worker's: preemption is seen per thread
  for (;;) {
    if (index >= participants_.load(std::memory_order_acquire)) {
      // Left out (contexts share the cores): sleep until let in again, then take part in every
      // call after that moment. The count cannot fall again before those calls have joined (it
      // is set between calls, by the thread that waits for this one in them).
      std::unique_lock<std::mutex> lock(mu_);
      idle_cv_.wait(lock, [&] { return stop_.load() || index < participants_.load(std::memory_order_acquire); });
      if (stop_.load()) return;
      seen = raised_at_round_;
      continue;
    }
    uint64_t gen = round_.load(std::memory_order_acquire);
    // The clock is read only when the next call is not published yet (else no spin follows).
    int64_t last_read = gen == seen ? now_ns() : 0;
    if (gen == seen && backoff.may_spin(last_read)) {
      const int64_t spin_until = last_read + kSpinNs;
      bool preempted = false;
      for (int spin = 1; gen == seen; ++spin) {
        MOELITE_CPU_RELAX();
        gen = round_.load(std::memory_order_acquire);
        if (spin % kPausesPerClockRead != 0) continue;
        const int64_t t = now_ns();
        if (t - last_read > SpinBackoff::kPreemptedGapNs) {
          // Descheduled while spinning: the core is wanted elsewhere. Sleep instead for a while.
          backoff.preempted(t);
          preempted = true;
          break;
        }
        last_read = t;
        if (t >= spin_until) break;
      }
      if (gen != seen && !preempted) backoff.spun_undisturbed(last_read);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return round_.load(std::memory_order_acquire) != seen; });
      gen = round_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    // A call without it. The count comes with the call's number in one word: a worker that wakes
    // late, after the caller has finished that call and started the next, sees the next one's
    // number and count together (or the old ones together), never the old number with the new count.
    if (index >= round_participants(gen)) continue;
    run_tasks(index);
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::set_participants(int n) {
  n = n < 1 ? 1 : n > n_threads_ ? n_threads_ : n;
  const int before = participants_.load(std::memory_order_relaxed);
  if (n == before) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > before) raised_at_round_ = round_.load(std::memory_order_relaxed);
    participants_.store(n, std::memory_order_release);
  }
  if (n > before) idle_cv_.notify_all();
}

void ThreadPool::parallel_for(int64_t n_tasks, const TaskFn& fn) {
  if (n_tasks <= 0) return;
  const int threads = participants_.load(std::memory_order_relaxed);
  if (threads == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  active_.store(threads - 1, std::memory_order_relaxed);
  {
    // The lock orders the publication against a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mu_);
    round_.store(next_round(round_.load(std::memory_order_relaxed), threads), std::memory_order_release);
  }
  cv_.notify_all();
  run_tasks(0);
  // A worker that was preempted (more runnable threads than cores) can take a whole scheduler
  // time slice to finish; after a short spin, yield the core to it instead of burning it.
  for (int spin = 0; active_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 2000) {
      MOELITE_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace moelite::cpu
