#include "core/moe/tokens_by_expert.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace moelite {

double expected_distinct_experts(int32_t n_expert, int32_t n_expert_used, int32_t n_tokens) {
  if (n_expert <= 0 || n_expert_used <= 0 || n_tokens <= 0) return 0.0;
  const double miss_one = 1.0 - static_cast<double>(std::min(n_expert_used, n_expert)) / n_expert;
  return n_expert * (1.0 - std::pow(miss_one, n_tokens));
}

TokensByExpert::TokensByExpert(const Routing& r) : k_(r.k) {
  const int32_t n = r.n_tokens * r.k;
  pairs_.reserve(static_cast<size_t>(n));
  for (int32_t p = 0; p < n; ++p)
    if (r.ids[static_cast<size_t>(p)] >= 0) pairs_.push_back({r.ids[static_cast<size_t>(p)], p});
  std::sort(pairs_.begin(), pairs_.end());
  for (size_t i = 0; i < pairs_.size(); ++i)
    if (i == 0 || pairs_[i].first != pairs_[i - 1].first) order_.push_back(pairs_[i].first);
}

void TokensByExpert::rows(int32_t expert, std::vector<int32_t>* x_rows, std::vector<int32_t>* out_rows) const {
  x_rows->clear();
  out_rows->clear();
  for (auto it = std::lower_bound(pairs_.begin(), pairs_.end(), std::make_pair(expert, INT32_MIN));
       it != pairs_.end() && it->first == expert; ++it) {
    x_rows->push_back(it->second / k_);
    out_rows->push_back(it->second);
  }
}

int32_t TokensByExpert::uses(int32_t expert) const {
  const auto range = std::equal_range(pairs_.begin(), pairs_.end(), std::make_pair(expert, INT32_MIN),
                                      [](const auto& a, const auto& b) { return a.first < b.first; });
  return static_cast<int32_t>(range.second - range.first);
}

}  // namespace moelite
