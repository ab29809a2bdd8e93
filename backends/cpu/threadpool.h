// A fork-join pool for the CPU backend. Decode runs dozens of short parallel regions per token,
// so idle workers spin briefly before sleeping: waking a sleeping thread costs tens of
// microseconds, which at decode speeds would be a visible share of every token.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moelite::cpu {

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(task, thread_index) for every task in [0, n_tasks), spread over all threads
  // (the caller works too), and returns when all calls have returned. Tasks are handed out
  // dynamically; callers must not depend on which thread runs which task.
  using TaskFn = std::function<void(int64_t task, int thread)>;
  void parallel_for(int64_t n_tasks, const TaskFn& fn);

 private:
  void worker_main(int index);
  void run_tasks(int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  int64_t n_tasks_ = 0;
  const TaskFn* fn_ = nullptr;
};

}  // namespace moelite::cpu
