// A batch's routing by expert: the experts used (ascending id) and, per expert, the token
// rows it reads and the (token * k + slot) rows its outputs fill. Slots dropped by adaptive gating
// (id -1) are left out.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace moelite {

class TokensByExpert {
 public:
  explicit TokensByExpert(const Routing& r);
  const std::vector<int32_t>& order() const { return order_; }
  void rows(int32_t expert, std::vector<int32_t>* x_rows, std::vector<int32_t>* out_rows) const;
  // How many (token, slot) pairs the expert serves.
  int32_t uses(int32_t expert) const;

 private:
  int32_t k_;
  std::vector<std::pair<int32_t, int32_t>> pairs_;  // (expert, token * k + slot), sorted
  std::vector<int32_t> order_;
};

// D(n): distinct experts of one MoE layer that n tokens routed independently and uniformly use,
// E (1 - (1 - k/E)^n): what the batch planner predicts a step reads, and the test of whether a
// prompt's batch uses nearly every expert of a layer (the prefill lookahead).
double expected_distinct_experts(int32_t n_expert, int32_t n_expert_used, int32_t n_tokens);

}  // namespace moelite
