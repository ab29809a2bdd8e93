// A batch's routing grouped by expert: the experts used (ascending id) and, per expert, the token
// rows it reads and the (token * k + slot) rows its outputs fill. Slots dropped by adaptive gating
// (id -1) are left out.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace moelite {

class ExpertGroups {
 public:
  explicit ExpertGroups(const Routing& r);
  const std::vector<int32_t>& order() const { return order_; }
  void rows(int32_t expert, std::vector<int32_t>* x_rows, std::vector<int32_t>* out_rows) const;
  // How many (token, slot) pairs the expert serves.
  int32_t uses(int32_t expert) const;

 private:
  int32_t k_;
  std::vector<std::pair<int32_t, int32_t>> pairs_;  // (expert, token * k + slot), sorted
  std::vector<int32_t> order_;
};

}  // namespace moelite
