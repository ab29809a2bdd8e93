// Experts routed per layer after gating, and the (token, layer) pairs they serve: the model-wide
// sums every context adds to (moelite_model_expert_stats' routed_tokens and routed_experts). Each
// context also keeps its own (EvalState::routed_tokens). A lock of its own, so stats can be read
// while another thread evaluates.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace moelite {

class RoutingCounters {
 public:
  void reset(int32_t n_layer);
  void add(int32_t layer, uint64_t tokens, uint64_t experts);
  // Sums over `layer` (-1: all layers).
  void totals(int32_t layer, uint64_t* tokens, uint64_t* experts) const;

 private:
  mutable std::mutex mu_;
  std::vector<uint64_t> tokens_, experts_;
};

}  // namespace moelite
