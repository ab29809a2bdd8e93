#include "core/moe/routing_counters.h"

namespace moelite {

void RoutingCounters::reset(int32_t n_layer) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_.assign(static_cast<size_t>(n_layer), 0);
  experts_.assign(static_cast<size_t>(n_layer), 0);
}

void RoutingCounters::add(int32_t layer, uint64_t tokens, uint64_t experts) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[static_cast<size_t>(layer)] += tokens;
  experts_[static_cast<size_t>(layer)] += experts;
}

void RoutingCounters::totals(int32_t layer, uint64_t* tokens, uint64_t* experts) const {
  std::lock_guard<std::mutex> lock(mu_);
  *tokens = *experts = 0;
  for (size_t l = 0; l < tokens_.size(); ++l) {
    if (layer >= 0 && static_cast<size_t>(layer) != l) continue;
    *tokens += tokens_[l];
    *experts += experts_[l];
  }
}

}  // namespace moelite
