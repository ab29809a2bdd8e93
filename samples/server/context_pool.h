// The server's contexts: a fixed set made at start, lent to one request at a time. Contexts of
// one model evaluate at the same time on the CPU (each its own threads, the expert store shared),
// so `--parallel N` requests generate together; more wait for a free context in arrival order.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "moelite.h"

class ContextPool {
 public:
  // Creates n contexts of n_ctx positions; false with the reason in *error.
  bool create(moelite_model* model, int n, int32_t n_ctx, std::string* error);
  ~ContextPool();

  // A context lent to one request, given back when the lease ends.
  class Lease {
   public:
    Lease(ContextPool* pool, size_t index) : pool_(pool), index_(index) {}
    Lease(Lease&& o) noexcept : pool_(o.pool_), index_(o.index_) { o.pool_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    moelite_context* context() const { return pool_->contexts_[index_]; }

   private:
    ContextPool* pool_;
    size_t index_;
  };
  // Waits for a free context (first come, first served). Of the free ones it lends the one whose
  // cache shares the longest prefix with `prompt` (a conversation's next turn finds its earlier
  // turns there and only the new tokens are evaluated).
  Lease acquire(const std::vector<int32_t>& prompt);
  size_t size() const { return contexts_.size(); }
  int32_t n_ctx() const { return n_ctx_; }

 private:
  void release(size_t index);

  std::vector<moelite_context*> contexts_;
  std::vector<bool> busy_;
  int32_t n_ctx_ = 0;
  std::mutex mu_;
  std::condition_variable freed_;
  std::deque<uint64_t> queue_;  // tickets of waiting requests, oldest first
  uint64_t next_ticket_ = 0;
};
