// A fork-join pool for the CPU backend. Decode runs dozens of short parallel regions per token,
// so idle workers spin for up to 5 ms before sleeping: waking a sleeping thread costs tens to
// hundreds of microseconds, which at decode speeds would be a visible share of every token (and
// under an expert budget, where regions are separated by waits for reads, a worker that slept
// joined each expert late). After the last region of a request a worker burns at most 5 ms. A
// worker the OS preempts while it spins (more runnable threads than cores) sleeps at once between
// regions for a while instead (spin_backoff.h).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"

namespace moelite::cpu {

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads - 1 workers are started. When the OS refuses a
  // thread (ulimit -u, cgroup pids.max, out of memory for its stack), the workers already running
  // are stopped and joined before MOELITE_ERR_SYSTEM_LIMIT returns: nothing is left waiting on a
  // pool that was never finished.
  //
  // `pin_cpus` non-empty: every worker restricts itself to these CPUs (the big cores of a
  // big.LITTLE CPU, platform::big_cores()), so no worker lands on a little core that would hold
  // each fork-join region back. The calling thread belongs to the application and is left alone.
  // A CPU the OS refuses (outside a cgroup cpuset) leaves that worker unpinned: pinning is a
  // speed hint, never a reason to fail.
  [[nodiscard]] static Status create(int n_threads, std::unique_ptr<ThreadPool>* out,
                                     std::vector<int> pin_cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  const std::vector<int>& pinned_cpus() const { return pin_cpus_; }

  // Calls fn(task, thread_index) for every task in [0, n_tasks), spread over all threads
  // (the caller works too), and returns when all calls have returned. Tasks are handed out
  // dynamically; callers must not depend on which thread runs which task. If fn throws, the
  // remaining tasks are skipped, every thread finishes, and the first exception is rethrown here
  // (never on a worker, where it would terminate the process).
  using TaskFn = std::function<void(int64_t task, int thread)>;
  void parallel_for(int64_t n_tasks, const TaskFn& fn);
  // Threads (the caller included) that take part in the next parallel_for calls, 1..size()
  // (clamped): pools of contexts evaluating at the same time share the cores instead of
  // oversubscribing them (a fork-join region waits for its slowest thread, and a preempted one
  // takes a whole time slice). Workers left out sleep, without spinning, until they are in again.
  // Called by the thread that calls parallel_for, between calls.
  void set_participants(int n);
  int participants() const { return participants_.load(std::memory_order_relaxed); }

 private:
  explicit ThreadPool(int n_threads) : n_threads_(n_threads), participants_(n_threads) {}
  void stop_and_join();
  void worker_main(int index);
  void run_tasks(int thread);

  int n_threads_;
  std::vector<int> pin_cpus_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  // The current call: its number in the high bits, how many threads take part in it (the
  // caller included) in the low kCountBits, one word so a worker reads both of the same call.
  static constexpr int kCountBits = 16;  // MOELITE_MAX_THREADS (512) fits
  static uint64_t next_round(uint64_t round, int participants) {
    return (((round >> kCountBits) + 1) << kCountBits) | static_cast<uint64_t>(participants);
  }
  static int round_participants(uint64_t round) { return static_cast<int>(round & ((1u << kCountBits) - 1)); }
  std::atomic<uint64_t> round_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  // set_participants: the count, and the round when it last rose (a worker let in again takes
  // part in every parallel_for after it).
  std::atomic<int> participants_{1};
  uint64_t raised_at_round_ = 0;  // under mu_
  std::condition_variable idle_cv_;  // workers left out wait here
  int64_t n_tasks_ = 0;
  const TaskFn* fn_ = nullptr;
  std::mutex error_mu_;
  std::exception_ptr error_;  // the first exception a task threw in the current parallel_for
};

}  // namespace moelite::cpu
