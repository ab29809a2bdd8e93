#include "core/experts/memory_plan.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "core/experts/cache_allocation.h"
#include "core/experts/expert_reads.h"
#include "core/experts/predictor.h"
#include "core/model/model.h"
#include "core/model/profile.h"
#include "platforms/platform.h"

namespace moelite {

namespace {

int64_t moe_layers_of(const Model& m) { return m.hp.n_layer - m.hp.n_dense_lead; }

}  // namespace

ExpertSlotLayout expert_slot_layout(const Model& model) {
  ExpertSlotLayout s;
  s.slot_bytes = ExpertReads(model).slot_bytes();
  return s;
}

ExpertPoolLimits expert_pool_limits(const Model& model, bool per_layer) {
  ExpertPoolLimits l;
  l.slot_bytes = expert_slot_layout(model).slot_bytes;
  // Leading dense blocks (deepseek2) have no experts and get no slots.
  const uint64_t moe_layers = static_cast<uint64_t>(moe_layers_of(model));
  const uint64_t pools = per_layer ? moe_layers : 1;
  l.minimum = l.slot_bytes * static_cast<uint64_t>(model.hp.n_expert_used + kReserveSlots) * pools;
  const uint64_t experts = moe_layers * static_cast<uint64_t>(model.hp.n_expert);
  l.all = l.slot_bytes * (experts + static_cast<uint64_t>(kReserveSlots) * pools);
  return l;
}

Status check_cache_allocation(const std::string& name) {
  if (name != "auto" && name != "global" && name != "uniform" && name != "dp")
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown cache allocation '%s' (available: auto, global, uniform, dp)",
                name.c_str());
  return MOELITE_OK;
}

int64_t slots_for_share(double share, int64_t experts) {
  return kReserveSlots + static_cast<int64_t>(std::ceil(share * static_cast<double>(experts) - 1e-9));
}

namespace {

// Whether the profile has what the DP allocation needs: a hit curve for every layer.
bool has_hit_curves(const Model& m, const Profile* p) {
  if (!p || p->layers.size() != static_cast<size_t>(m.hp.n_layer)) return false;
  for (const LayerProfile& lp : p->layers)
    if (lp.hit_curve.size() != static_cast<size_t>(m.hp.n_expert) + 1) return false;
  return true;
}

// Budget auto: the bytes, from the memory measured when loading started. The limits are those of
// the allocation's layout ("auto" may end up as either: its minimum is one global pool's, its most
// the per-layer layout's).
Status size_auto(const Model& m, const ExpertMemoryRequest& rq, const std::string& allocation, AutoBudget* out) {
  const ExpertPoolLimits low = expert_pool_limits(m, allocation == "uniform" || allocation == "dp");
  const ExpertPoolLimits high = expert_pool_limits(m, allocation != "global");
  AutoBudgetInputs in;
  in.minimum = low.minimum;
  in.all_experts = high.all;
  in.room = m.memory_room_at_load;
  in.dense = m.dense_bytes * (rq.dense_counted_twice ? 2 : 1);
  in.context = rq.context_bytes;
  in.headroom = rq.budget.headroom;
  MOELITE_TRY(size_auto_budget(in, out));
  log_msg(MOELITE_LOG_INFO,
          "expert budget auto: %" PRIu64 " bytes (%s) from %" PRIu64 " available - %" PRIu64 " dense - %" PRIu64
          " context - %" PRIu64 " headroom",
          out->budget, out->all_resident ? "every expert fits" : "streaming", in.room, in.dense, in.context,
          out->headroom);
  return MOELITE_OK;
}

Status too_small(const Model& m, uint64_t budget, const ExpertPoolLimits& l, bool per_layer) {
  return fail(MOELITE_ERR_BUDGET_TOO_SMALL,
              "an expert budget of %" PRIu64 " bytes is below the minimum working set of %" PRIu64
              " bytes (%d experts of one token plus %d in flight%s, %" PRIu64 " bytes per expert slot)",
              budget, l.minimum, m.hp.n_expert_used, kReserveSlots, per_layer ? ", in every layer's quota" : "",
              l.slot_bytes);
}

// The DP allocation of `slots` over the MoE layers from the profile's hit curves and the accuracy of
// the predictors in use. False in *done (and no error) where "auto" should fall back to one pool.
Status allocate_by_profile(const Model& m, const ExpertMemoryRequest& rq, bool asked, int64_t slots,
                           std::vector<int32_t>* quotas, bool* done) {
  *done = false;
  const HParams& hp = m.hp;
  const Profile& p = *rq.profile;
  const int32_t k = hp.n_expert_used;
  const int32_t min_q = k + kReserveSlots, max_q = std::max(min_q, hp.n_expert);
  const int64_t moe_layers = moe_layers_of(m);
  if (slots < moe_layers * min_q) {
    if (asked)
      return fail(MOELITE_ERR_BUDGET_TOO_SMALL,
                  "the DP cache allocation needs %d slots per layer (%" PRIu64
                  " bytes in all); the budget holds %" PRId64 " slots",
                  min_q, uint64_t(moe_layers) * uint64_t(min_q) * expert_slot_layout(m).slot_bytes, slots);
    log_msg(MOELITE_LOG_INFO,
            "expert store: the budget holds %" PRId64
            " slots, fewer than %d per layer; one global pool instead of "
            "the profile's per-layer allocation",
            slots, min_q);
    return MOELITE_OK;
  }
  // Prediction takes loads off the critical path in proportion to its measured accuracy (of the
  // best of the predictors in use, layer by layer).
  std::vector<const std::vector<double>*> used;
  for (const std::string& name : predictor_list(rq.predictors)) {
    const auto it = p.accuracy.find(name);
    if (it != p.accuracy.end()) used.push_back(&it->second);
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
      const double hit = p.layers[static_cast<size_t>(l)].hit_curve[static_cast<size_t>(std::min(q, hp.n_expert))];
      a.loss.push_back(expected_demand_loads(k, hit, accuracy));
    }
  }
  if (allocation_too_large(layers, slots)) {
    if (asked)
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "the DP cache allocation over %d layers x %" PRId64
                  " slots is too large to solve at load; use --allocation global or uniform",
                  hp.n_layer, slots);
    log_msg(MOELITE_LOG_INFO, "expert store: %d layers x %" PRId64 " slots is too large for the DP; one global pool",
            hp.n_layer, slots);
    return MOELITE_OK;
  }
  double loss = 0.0;
  MOELITE_TRY(allocate_cache(layers, slots, quotas, &loss));
  std::string text;
  for (int32_t q : *quotas) text += (text.empty() ? "" : " ") + std::to_string(q);
  log_msg(MOELITE_LOG_INFO,
          "expert store: per-layer slots from the profile's DP allocation: %s (expected %.3f on-demand loads/token)",
          text.c_str(), loss);
  *done = true;
  return MOELITE_OK;
}

// Slots of a pool layout for the budget (bytes already resolved for auto).
int64_t slots_of(const ExpertBudget& b, uint64_t bytes, const ExpertPoolLimits& l, int64_t experts, int64_t pools) {
  if (b.kind == ExpertBudget::Kind::Share) return pools * slots_for_share(b.share, experts / pools);
  return static_cast<int64_t>(std::min(bytes, l.all) / l.slot_bytes);
}

}  // namespace

Status plan_expert_memory(const Model& m, const ExpertMemoryRequest& rq, ExpertMemoryPlan* out) {
  ExpertMemoryPlan plan;
  plan.budget = rq.budget;
  plan.streams = rq.budget.streams();
  plan.layout = expert_slot_layout(m);
  const HParams& hp = m.hp;
  const int64_t moe_layers = moe_layers_of(m), experts = moe_layers * hp.n_expert;
  MOELITE_TRY(check_cache_allocation(rq.allocation));
  if (!plan.streams) {
    plan.n_slots = experts;
    plan.limits = expert_pool_limits(m, false);
    plan.all_resident = true;
    *out = std::move(plan);
    return MOELITE_OK;
  }
  if (plan.layout.slot_bytes == 0 || moe_layers <= 0 || hp.n_expert <= 0)
    return fail(MOELITE_ERR_BAD_SHAPE, "an expert budget needs routed experts with bytes; this model has none");
  // Model::load refuses experts of no rows; a model that has them anyway (one built another way) must
  // not reach the store, whose slots, reads and quotas are sized by these bytes.
  for (int32_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    const LayerExperts& ex = m.layers[static_cast<size_t>(l)].experts;
    const ExpertWeights w = ex.present() ? ex.expert(0) : ExpertWeights{};
    for (const WeightView* v : {&w.gate, &w.up, &w.down})
      if (v->rows < 1 || v->row_bytes == 0)
        return fail(MOELITE_ERR_BAD_SHAPE, "an expert budget needs routed experts with bytes; layer %d's have none", l);
  }
  // The static policy's hot set from the profile's use counts.
  if (rq.profile) {
    for (const LayerProfile& lp : rq.profile->layers)
      plan.expert_counts.insert(plan.expert_counts.end(), lp.expert_counts.begin(), lp.expert_counts.end());
    if (plan.expert_counts.size() != static_cast<size_t>(hp.n_layer) * static_cast<size_t>(hp.n_expert))
      plan.expert_counts.clear();
  }
  // The allocation: "auto" is dp where the profile allows it (decided below), else global.
  const bool dp_asked = rq.allocation == "dp";
  if (dp_asked && !has_hit_curves(m, rq.profile))
    return fail(MOELITE_ERR_BAD_PROFILE,
                "the DP cache allocation needs a calibration profile with per-layer hit curves");
  const bool try_dp = dp_asked || (rq.allocation == "auto" && has_hit_curves(m, rq.profile));
  uint64_t bytes = rq.budget.bytes;
  if (rq.budget.kind == ExpertBudget::Kind::Auto) {
    MOELITE_TRY(size_auto(m, rq, rq.allocation, &plan.auto_budget));
    bytes = plan.auto_budget.budget;
  }

  if (try_dp) {
    const ExpertPoolLimits l = expert_pool_limits(m, true);
    const int64_t slots = slots_of(rq.budget, bytes, l, experts, 1) +
                          (rq.budget.kind == ExpertBudget::Kind::Share ? (moe_layers - 1) * kReserveSlots : 0);
    bool done = false;
    MOELITE_TRY(
        allocate_by_profile(m, rq, dp_asked, std::min<int64_t>(slots, l.all / l.slot_bytes), &plan.layer_slots, &done));
    if (done) {
      plan.allocation = "dp";
      plan.limits = l;
      for (int32_t q : plan.layer_slots) plan.n_slots += q;
    }
  }
  if (plan.allocation.empty()) {
    const bool uniform = rq.allocation == "uniform";
    plan.allocation = uniform ? "uniform" : "global";
    plan.limits = expert_pool_limits(m, uniform);
    const int64_t pools = uniform ? moe_layers : 1;
    int64_t slots = slots_of(rq.budget, bytes, plan.limits, experts, pools);
    if (uniform) {
      const int32_t quota = static_cast<int32_t>(slots / moe_layers);
      plan.layer_slots.assign(static_cast<size_t>(hp.n_layer), 0);
      for (int32_t l = hp.n_dense_lead; l < hp.n_layer; ++l) plan.layer_slots[static_cast<size_t>(l)] = quota;
      slots = int64_t{quota} * moe_layers;
      if (quota < hp.n_expert_used + kReserveSlots)
        return too_small(
            m,
            rq.budget.kind == ExpertBudget::Kind::Share ? static_cast<uint64_t>(slots) * plan.layout.slot_bytes : bytes,
            plan.limits, true);
    } else if (slots < hp.n_expert_used + kReserveSlots) {
      return too_small(
          m,
          rq.budget.kind == ExpertBudget::Kind::Share ? static_cast<uint64_t>(slots) * plan.layout.slot_bytes : bytes,
          plan.limits, false);
    }
    plan.n_slots = slots;
  }
  // What the budget is in bytes: what was given, or for a share the pool it pays for.
  plan.budget_bytes = rq.budget.kind == ExpertBudget::Kind::Share ? plan.pool_bytes() : bytes;
  // Every expert has a slot of its own: in one pool, or in each layer's quota.
  plan.all_resident = plan.n_slots >= experts;
  for (int32_t l = hp.n_dense_lead; l < hp.n_layer && plan.per_layer(); ++l)
    plan.all_resident = plan.all_resident && plan.layer_slots[static_cast<size_t>(l)] >= hp.n_expert;
  plan.device_tier_slots = plan.n_slots;
  *out = std::move(plan);
  return MOELITE_OK;
}

}  // namespace moelite
