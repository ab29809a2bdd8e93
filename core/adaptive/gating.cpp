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
  else if (name == "cache-aware")
    *out = GatingMode::CacheAware;
  else
    return false;
  return true;
}

const char* gating_mode_name(GatingMode mode) {
  switch (mode) {
    case GatingMode::Sensitivity: return "sensitivity";
    case GatingMode::Score: return "score";
    case GatingMode::CacheAware: return "cache-aware";
    default: return "exact";
  }
}

void gating_rank(const float* weights, int32_t k, int32_t* order) {
  std::iota(order, order + k, 0);
  std::stable_sort(order, order + k, [&](int32_t a, int32_t b) { return weights[a] > weights[b]; });
}

int32_t gating_keep_count(GatingMode mode, float threshold, double s, const float* weights, int32_t k) {
  if (mode == GatingMode::CacheAware) return gating_keep_count_cache_aware(threshold, 1.0f, s, weights, k, nullptr);
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

int32_t gating_keep_count_cache_aware(float threshold, float penalty, double s, const float* weights, int32_t k,
                                      const uint8_t* resident) {
  if (k <= 1) return k;
  std::vector<int32_t> order(static_cast<size_t>(k));
  gating_rank(weights, k, order.data());
  // The same walk as sensitivity mode; only the bound of a non-resident expert is raised. The
  // resident bound is `threshold` itself, compared exactly as sensitivity mode compares it.
  const double raised = static_cast<double>(threshold) * static_cast<double>(penalty);
  double dropped = 0.0;
  int32_t kept = k;
  while (kept > 1) {
    const int32_t slot = order[static_cast<size_t>(kept - 1)];
    const double next = dropped + weights[slot];
    const bool here = resident == nullptr || resident[slot] != 0;
    if (here ? next * next * s >= threshold : next * next * s >= raised) break;
    dropped = next;
    --kept;
  }
  return kept;
}

int64_t apply_gating(const GatingConfig& config, int32_t layer, Routing* r, std::vector<uint8_t>* resident) {
  const int32_t k = r->k;
  if (config.mode == GatingMode::Exact) return int64_t{r->n_tokens} * k;
  const bool sensitive = config.mode == GatingMode::Sensitivity || config.mode == GatingMode::CacheAware;
  const double s = sensitive && layer < static_cast<int32_t>(config.sensitivity.size())
                       ? config.sensitivity[static_cast<size_t>(layer)]
                       : 0.0;
  const bool aware = config.mode == GatingMode::CacheAware && resident != nullptr;
  std::vector<int32_t> order(static_cast<size_t>(k));
  std::vector<uint8_t> slot_resident(static_cast<size_t>(k), 1);
  int64_t total = 0;
  for (int32_t t = 0; t < r->n_tokens; ++t) {
    float* w = r->weights.data() + static_cast<size_t>(t) * k;
    int32_t* ids = r->ids.data() + static_cast<size_t>(t) * k;
    int32_t kept;
    if (aware) {
      for (int32_t j = 0; j < k; ++j) {
        const int32_t e = ids[j];
        slot_resident[static_cast<size_t>(j)] =
            e < 0 || static_cast<size_t>(e) >= resident->size() || (*resident)[static_cast<size_t>(e)] != 0;
      }
      kept = gating_keep_count_cache_aware(config.threshold, config.penalty, s, w, k, slot_resident.data());
    } else {
      kept = gating_keep_count(config.mode, config.threshold, s, w, k);
    }
    total += kept;
    if (aware || kept != k) gating_rank(w, k, order.data());
    // What this token keeps is loaded for the batch: resident for the tokens after it.
    if (aware)
      for (int32_t j = 0; j < kept; ++j) {
        const int32_t e = ids[order[static_cast<size_t>(j)]];
        if (e >= 0 && static_cast<size_t>(e) < resident->size()) (*resident)[static_cast<size_t>(e)] = 1;
      }
    if (kept == k) continue;
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
