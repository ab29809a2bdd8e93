#include "core/adaptive/gating.h"

#include <algorithm>
#include <numeric>

namespace moelite {

bool parse_gating_mode(const std::string& name, GatingMode* out) {
  if (name == "exact")
    *out = GatingMode::Exact;
  else if (name == "sensitivity")
    *out = GatingMode::Sensitivity;
  else if (name == "score")
    *out = GatingMode::Score;
  else
    return false;
  return true;
}

const char* gating_mode_name(GatingMode mode) {
  switch (mode) {
    case GatingMode::Sensitivity: return "sensitivity";
    case GatingMode::Score: return "score";
    default: return "exact";
  }
}

void gating_rank(const float* weights, int32_t k, int32_t* order) {
  std::iota(order, order + k, 0);
  std::stable_sort(order, order + k, [&](int32_t a, int32_t b) { return weights[a] > weights[b]; });
}

int32_t gating_keep_count(GatingMode mode, float threshold, double s, const float* weights, int32_t k) {
  if (mode == GatingMode::Exact || k <= 1) return k;
  std::vector<int32_t> order(static_cast<size_t>(k));
  gating_rank(weights, k, order.data());
  int32_t kept = k;
  if (mode == GatingMode::Score) {
    while (kept > 1 && weights[order[static_cast<size_t>(kept - 1)]] < threshold) --kept;
    return kept;
  }
  // Sensitivity: grow the dropped tail while its predicted loss stays under the threshold.
  double dropped = 0.0;
  while (kept > 1) {
    const double next = dropped + weights[order[static_cast<size_t>(kept - 1)]];
    if (next * next * s >= threshold) break;
    dropped = next;
    --kept;
  }
  return kept;
}

int64_t apply_gating(const GatingConfig& config, int32_t layer, Routing* r) {
  const int32_t k = r->k;
  if (config.mode == GatingMode::Exact) return int64_t{r->n_tokens} * k;
  const double s = config.mode == GatingMode::Sensitivity && layer < static_cast<int32_t>(config.sensitivity.size())
                       ? config.sensitivity[static_cast<size_t>(layer)]
                       : 0.0;
  std::vector<int32_t> order(static_cast<size_t>(k));
  int64_t total = 0;
  for (int32_t t = 0; t < r->n_tokens; ++t) {
    float* w = r->weights.data() + static_cast<size_t>(t) * k;
    int32_t* ids = r->ids.data() + static_cast<size_t>(t) * k;
    const int32_t kept = gating_keep_count(config.mode, config.threshold, s, w, k);
    total += kept;
    if (kept == k) continue;
    gating_rank(w, k, order.data());
    double all = 0.0, keep = 0.0;
    for (int32_t j = 0; j < k; ++j) all += w[j];
    for (int32_t j = 0; j < kept; ++j) keep += w[order[static_cast<size_t>(j)]];
    const float scale = keep > 0.0 ? static_cast<float>(all / keep) : 1.0f;
    for (int32_t j = kept; j < k; ++j) {
      ids[order[static_cast<size_t>(j)]] = -1;
      w[order[static_cast<size_t>(j)]] = 0.0f;
    }
    for (int32_t j = 0; j < k; ++j) w[j] *= scale;
  }
  return total;
}

}  // namespace moelite
