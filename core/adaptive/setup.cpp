#include "core/adaptive/setup.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "core/adaptive/allocation.h"
#include "core/adaptive/predictor.h"
#include "core/adaptive/profile.h"

namespace moelite {

Status setup_adaptive(const Model& m, const LoadOptions& opts, std::unique_ptr<Profile>* profile,
                      GatingConfig* gating) {
  if (!opts.profile_path.empty()) {
    auto p = std::make_unique<Profile>();
    MOELITE_TRY(Profile::load(opts.profile_path, p.get()));
    MOELITE_TRY(p->check_model(m.hp));
    *profile = std::move(p);
  }
  if (!(opts.gating_threshold >= 0.0f) || !std::isfinite(opts.gating_threshold))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating threshold must be a finite number >= 0");
  gating->mode = opts.gating;
  gating->threshold = opts.gating_threshold;
  if (!(opts.gating_penalty >= 1.0f) || !std::isfinite(opts.gating_penalty))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating penalty must be a finite number >= 1");
  gating->penalty = opts.gating_penalty;
  if (opts.gating_substitutes < 0 || opts.gating_substitutes > kMaxGatingSubstitutes)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating substitutes must be in [0, %d]", kMaxGatingSubstitutes);
  gating->substitutes = std::min(opts.gating_substitutes, std::max(0, m.hp.n_expert - m.hp.n_expert_used));
  if (opts.gating == GatingMode::Sensitivity || opts.gating == GatingMode::CacheAware) {
    if (!*profile)
      return fail(MOELITE_ERR_BAD_PROFILE,
                  "%s gating needs a calibration profile with per-layer "
                  "sensitivities (moelite calibrate; moelite_model_params_set_profile)",
                  gating_mode_name(opts.gating));
    for (const LayerProfile& lp : (*profile)->layers) gating->sensitivity.push_back(lp.sensitivity);
  }
  return MOELITE_OK;
}

Status check_cache_allocation(const std::string& name) {
  if (name != "auto" && name != "global" && name != "uniform" && name != "dp")
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown cache allocation '%s' (available: auto, global, uniform, dp)",
                name.c_str());
  return MOELITE_OK;
}

std::string effective_cache_allocation(const LoadOptions& opts) {
  return opts.expert_per_layer && opts.cache_allocation == "auto" ? std::string("uniform") : opts.cache_allocation;
}

ExpertStore::Limits planned_store_limits(const Model& m, const LoadOptions& opts) {
  const std::string mode = effective_cache_allocation(opts);
  ExpertStore::Limits l = ExpertStore::limits(m, mode == "uniform" || mode == "dp");
  l.cap = ExpertStore::limits(m, mode != "global").cap;
  return l;
}

Status plan_expert_store(const Model& m, const Profile* p, const LoadOptions& opts, ExpertStoreOptions* so) {
  const std::string mode = effective_cache_allocation(opts);
  MOELITE_TRY(check_cache_allocation(mode));
  so->per_layer = mode == "uniform";
  const HParams& hp = m.hp;
  if (p) {
    for (const LayerProfile& lp : p->layers)
      so->expert_counts.insert(so->expert_counts.end(), lp.expert_counts.begin(), lp.expert_counts.end());
    if (so->expert_counts.size() != static_cast<size_t>(hp.n_layer) * static_cast<size_t>(hp.n_expert))
      so->expert_counts.clear();
  }
  if (mode == "global" || mode == "uniform") return MOELITE_OK;

  // DP allocation: needs every layer's hit curve and room for every layer's minimum quota.
  bool curves = p != nullptr;
  for (size_t l = 0; curves && l < p->layers.size(); ++l)
    curves = p->layers[l].hit_curve.size() == static_cast<size_t>(hp.n_expert) + 1;
  if (!curves) {
    if (mode == "auto") return MOELITE_OK;
    return fail(MOELITE_ERR_BAD_PROFILE,
                "the DP cache allocation needs a calibration profile with per-layer hit curves");
  }
  const ExpertStore::Limits limits = ExpertStore::limits(m, true);
  const uint64_t slot_bytes = limits.slot_bytes;
  const int32_t k = hp.n_expert_used;
  const int64_t slots = static_cast<int64_t>(std::min(opts.expert_budget_bytes, limits.cap) / slot_bytes);
  // Each layer's quota: at least the store's per-layer minimum (ExpertStore::create checks it).
  const int32_t min_q = k + ExpertStore::kReserveSlots, max_q = std::max(min_q, hp.n_expert);
  const int32_t moe_layers = hp.n_layer - hp.n_dense_lead;  // dense blocks get no slots
  if (slots < int64_t{moe_layers} * min_q) {
    if (mode == "dp")
      return fail(MOELITE_ERR_BUDGET_TOO_SMALL,
                  "the DP cache allocation needs %d slots per layer (%" PRIu64
                  " bytes in all); "
                  "the budget holds %" PRId64 " slots",
                  min_q, uint64_t(moe_layers) * uint64_t(min_q) * slot_bytes, slots);
    log_msg(MOELITE_LOG_INFO,
            "expert store: the budget holds %" PRId64
            " slots, fewer than %d per layer; "
            "one global pool instead of the profile's per-layer allocation",
            slots, min_q);
    return MOELITE_OK;
  }
  // Prediction takes loads off the critical path in proportion to its measured accuracy (of the
  // best of the predictors in use, layer by layer).
  std::vector<const std::vector<double>*> used;
  for (const std::string& name : predictor_list(opts.expert_predictor)) {
    const auto it = p->accuracy.find(name);
    if (it != p->accuracy.end()) used.push_back(&it->second);
  }
  std::vector<AllocationLayer> layers(static_cast<size_t>(hp.n_layer));
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    AllocationLayer& a = layers[static_cast<size_t>(l)];
    if (!hp.is_moe_layer(l)) {
      a.min_size = a.max_size = 0;
      a.loss.push_back(0.0);
      continue;
    }
    a.min_size = min_q;
    a.max_size = max_q;
    double accuracy = 0.0;
    for (const std::vector<double>* acc : used)
      if (std::isfinite((*acc)[static_cast<size_t>(l)])) accuracy = std::max(accuracy, (*acc)[static_cast<size_t>(l)]);
    for (int32_t q = min_q; q <= max_q; ++q) {
      const double hit = p->layers[static_cast<size_t>(l)].hit_curve[static_cast<size_t>(std::min(q, hp.n_expert))];
      a.loss.push_back(expected_demand_loads(k, hit, accuracy));
    }
  }
  if (allocation_too_large(layers, slots)) {
    if (mode == "dp")
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "the DP cache allocation over %d layers x %" PRId64
                  " slots is too large to solve at load; use --allocation global or uniform",
                  hp.n_layer, slots);
    log_msg(MOELITE_LOG_INFO, "expert store: %d layers x %" PRId64 " slots is too large for the DP; one global pool",
            hp.n_layer, slots);
    return MOELITE_OK;
  }
  std::vector<int32_t> sizes;
  double loss = 0.0;
  MOELITE_TRY(allocate_cache(layers, slots, &sizes, &loss));
  so->per_layer = true;
  so->layer_slots = sizes;
  std::string text;
  for (int32_t q : sizes) text += (text.empty() ? "" : " ") + std::to_string(q);
  log_msg(MOELITE_LOG_INFO,
          "expert store: per-layer slots from the profile's DP allocation: %s (expected %.3f on-demand loads/token)",
          text.c_str(), loss);
  return MOELITE_OK;
}

}  // namespace moelite
