#include "core/moe/gating.h"

#include "core/model/model.h"
#include "core/model/profile.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moelite {

Status make_gating_config(const HParams& hp, const GatingSettings& settings, const Profile* profile,
                          GatingConfig* out) {
  GatingConfig g;
  if (!(settings.threshold >= 0.0f) || !std::isfinite(settings.threshold))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating threshold must be a finite number >= 0");
  if (!(settings.penalty >= 1.0f) || !std::isfinite(settings.penalty))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating penalty must be a finite number >= 1");
  if (settings.substitutes < 0 || settings.substitutes > kMaxGatingSubstitutes)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating substitutes must be in [0, %d]", kMaxGatingSubstitutes);
  g.mode = settings.mode;
  g.threshold = settings.threshold;
  g.penalty = settings.penalty;
  g.substitutes = std::min(settings.substitutes, std::max(0, hp.n_expert - hp.n_expert_used));
  if (settings.mode == GatingMode::Sensitivity || settings.mode == GatingMode::CacheAware) {
    if (profile) {
      for (const LayerProfile& lp : profile->layers) g.sensitivity.push_back(lp.sensitivity);
    } else {
      g.sensitivity.assign(static_cast<size_t>(hp.n_layer), 1.0);
      g.calibrated = false;
    }
  }
  *out = std::move(g);
  return MOELITE_OK;
}

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

namespace {

// Cache-aware substitution for one token, on the slots whose expert is not resident other than
// the token's first (the router's clear choice), lowest weight first. Each is offered the best
// resident candidate the token does not use yet (only that one), with its own router weight w_f:
// - a slot the walk kept takes it when the loss it adds, (w_e - w_f)^2 * s, is below the
//   non-resident bound threshold x penalty: the read is saved for at most the loss a drop could
//   have cost;
// - a slot the walk dropped is revived as it when the loss it takes back, (w_e^2 - (w_e - w_f)^2)
//   * s, is at least threshold: one resident computation is worth that much loss.
// Revived slots move into the kept part of `order`, after the ones the walk kept. Returns the new
// kept count.
int32_t substitute_token(const GatingConfig& config, double s, int32_t k, int32_t kept, int32_t* order,
                         const uint8_t* slot_resident, const std::vector<uint8_t>& resident, const int32_t* cand_ids,
                         const float* cand_w, int32_t n_cand, int32_t* ids, float* w, int64_t* substituted) {
  const double bound = static_cast<double>(config.threshold);
  const double raised = bound * static_cast<double>(config.penalty);
  auto best_candidate = [&]() -> int32_t {
    for (int32_t c = 0; c < n_cand; ++c) {
      const int32_t f = cand_ids[c];
      if (f < 0 || static_cast<size_t>(f) >= resident.size() || resident[static_cast<size_t>(f)] == 0) continue;
      bool used = false;
      for (int32_t i = 0; i < k; ++i) used = used || ids[i] == f;
      if (!used) return c;
    }
    return -1;
  };
  int32_t revived = 0;
  uint64_t revived_slots = 0;  // bit per slot (k <= kMaxSubstitutionK)
  for (int32_t j = k - 1; j >= 1; --j) {
    const int32_t slot = order[j];
    if (slot_resident[slot]) continue;
    const int32_t c = best_candidate();
    if (c < 0) break;  // no resident candidate left for this token
    const double we = static_cast<double>(w[slot]), wf = static_cast<double>(cand_w[c]);
    const double lost = we - wf;
    const bool was_kept = j < kept;
    const bool take = was_kept ? lost * lost * s < raised : (we * we - lost * lost) * s >= bound;
    if (!take) continue;
    ids[slot] = cand_ids[c];
    w[slot] = cand_w[c];
    ++*substituted;
    if (!was_kept) {
      revived_slots |= uint64_t{1} << slot;
      ++revived;
    }
  }
  if (revived > 0)
    std::stable_partition(order + kept, order + k, [&](int32_t slot) { return (revived_slots >> slot) & 1u; });
  return kept + revived;
}

}  // namespace

void gating_candidates(const float* logits, int32_t n_expert, const Routing& r, int32_t n, GatingCandidates* out) {
  const int32_t k = r.k;
  out->n = n;
  out->ids.assign(static_cast<size_t>(r.n_tokens) * static_cast<size_t>(n), -1);
  out->weights.assign(static_cast<size_t>(r.n_tokens) * static_cast<size_t>(n), 0.0f);
  std::vector<double>& p = out->probs;
  std::vector<int32_t>& rank = out->rank;
  p.resize(static_cast<size_t>(n_expert));
  rank.resize(static_cast<size_t>(n_expert));
  for (int32_t t = 0; t < r.n_tokens; ++t) {
    const float* z = logits + static_cast<size_t>(t) * static_cast<size_t>(n_expert);
    double top = -INFINITY, sum = 0.0;
    for (int32_t e = 0; e < n_expert; ++e) top = std::max(top, static_cast<double>(z[e]));
    for (int32_t e = 0; e < n_expert; ++e) sum += p[static_cast<size_t>(e)] = std::exp(static_cast<double>(z[e]) - top);
    if (!(sum > 0.0) || !std::isfinite(sum)) continue;
    const int32_t* ids = r.ids.data() + static_cast<size_t>(t) * k;
    const float* w = r.weights.data() + static_cast<size_t>(t) * k;
    double routed_p = 0.0, routed_w = 0.0;
    for (int32_t j = 0; j < k; ++j)
      if (ids[j] >= 0 && ids[j] < n_expert) {
        routed_p += p[static_cast<size_t>(ids[j])] / sum;
        routed_w += w[j];
      }
    if (!(routed_p > 0.0)) continue;
    const double factor = routed_w / routed_p / sum;
    // Only the first k + n ranks can hold the candidates (ties: the lower id first).
    const int32_t ranked = std::min(n_expert, k + n);
    std::iota(rank.begin(), rank.end(), 0);
    std::partial_sort(rank.begin(), rank.begin() + ranked, rank.end(), [&](int32_t a, int32_t b) {
      const double pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    int32_t c = 0;
    for (int32_t i = 0; i < ranked && c < n; ++i) {
      const int32_t e = rank[static_cast<size_t>(i)];
      bool routed = false;
      for (int32_t j = 0; j < k; ++j) routed = routed || ids[j] == e;
      if (routed) continue;
      out->ids[static_cast<size_t>(t) * n + c] = e;
      out->weights[static_cast<size_t>(t) * n + c] = static_cast<float>(p[static_cast<size_t>(e)] * factor);
      ++c;
    }
  }
}

int64_t apply_gating(const GatingConfig& config, int32_t layer, Routing* r, std::vector<uint8_t>* resident,
                     const GatingCandidates* candidates, int64_t* substituted, double* predicted_loss) {
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
    // The scale the kept weights are brought back to: all k weights as the router gave them.
    double all = 0.0;
    for (int32_t j = 0; j < k; ++j) all += w[j];
    int32_t original_ids[kMaxSubstitutionK];  // to tell the router's own experts from stand-ins
    const bool track = predicted_loss && sensitive && k <= kMaxSubstitutionK;
    if (track) std::copy(ids, ids + k, original_ids);
    int64_t swapped = 0;
    if (aware && candidates && candidates->n > 0 && k <= kMaxSubstitutionK) {
      const int32_t now_kept =
          substitute_token(config, s, k, kept, order.data(), slot_resident.data(), *resident,
                           candidates->ids.data() + static_cast<size_t>(t) * candidates->n,
                           candidates->weights.data() + static_cast<size_t>(t) * candidates->n, candidates->n, ids,
                           w, &swapped);
      total += now_kept - kept;
      kept = now_kept;
    }
    if (substituted) *substituted += swapped;
    // What this token keeps is loaded for the batch: resident for the tokens after it.
    if (aware)
      for (int32_t j = 0; j < kept; ++j) {
        const int32_t e = ids[order[static_cast<size_t>(j)]];
        if (e >= 0 && static_cast<size_t>(e) < resident->size()) (*resident)[static_cast<size_t>(e)] = 1;
      }
    if (kept == k && swapped == 0) continue;
    double keep = 0.0;
    for (int32_t j = 0; j < kept; ++j) keep += w[order[static_cast<size_t>(j)]];
    if (track) {
      double own = 0.0;  // weight of the router's own experts kept
      for (int32_t j = 0; j < kept; ++j) {
        const int32_t slot = order[static_cast<size_t>(j)];
        if (ids[slot] == original_ids[slot]) own += w[slot];
      }
      *predicted_loss += s * (all - own) * (all - own);
    }
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
