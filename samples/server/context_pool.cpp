#include "context_pool.h"

#include <algorithm>

bool ContextPool::create(moelite_model* model, int n, int32_t n_ctx, std::string* error) {
  moelite_context_params* cp = moelite_context_params_create();
  if (!cp) {
    *error = "out of memory";
    return false;
  }
  moelite_status st = moelite_context_params_set_n_ctx(cp, n_ctx);
  for (int i = 0; i < n && st == MOELITE_OK; ++i) {
    moelite_context* c = nullptr;
    st = moelite_context_create(model, cp, &c);
    if (st == MOELITE_OK) contexts_.push_back(c);
  }
  moelite_context_params_free(cp);
  if (st != MOELITE_OK) {
    *error = std::string(moelite_status_name(st)) + ": " + moelite_last_error();
    return false;
  }
  busy_.assign(contexts_.size(), false);
  n_ctx_ = moelite_context_n_ctx(contexts_.front());
  return true;
}

ContextPool::~ContextPool() {
  for (moelite_context* c : contexts_) moelite_context_free(c);
}

ContextPool::Lease::~Lease() {
  if (pool_) pool_->release(index_);
}

static size_t shared_prefix(moelite_context* c, const std::vector<int32_t>& prompt) {
  std::vector<int32_t> held(static_cast<size_t>(std::max(1, moelite_context_kv_length(c))));
  int32_t n = 0;
  if (moelite_context_get_tokens(c, held.data(), static_cast<int32_t>(held.size()), &n) != MOELITE_OK) return 0;
  size_t k = 0;
  while (k < static_cast<size_t>(n) && k < prompt.size() && held[k] == prompt[k]) ++k;
  return k;
}

ContextPool::Lease ContextPool::acquire(const std::vector<int32_t>& prompt) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  freed_.wait(lock, [&] {
    return queue_.front() == ticket && std::find(busy_.begin(), busy_.end(), false) != busy_.end();
  });
  queue_.pop_front();
  size_t best = contexts_.size(), best_shared = 0;
  for (size_t i = 0; i < contexts_.size(); ++i) {
    if (busy_[i]) continue;
    const size_t shared = shared_prefix(contexts_[i], prompt);  // a free context: nobody else uses it
    if (best == contexts_.size() || shared > best_shared) {
      best = i;
      best_shared = shared;
    }
  }
  busy_[best] = true;
  freed_.notify_all();  // the next in line may find another free context
  return Lease(this, best);
}

void ContextPool::release(size_t index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_[index] = false;
  }
  freed_.notify_all();
}
