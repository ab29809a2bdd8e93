#include "core/budget_auto.h"

#include <algorithm>
#include <cinttypes>

#include "core/context.h"
#include "core/expert_store/expert_store.h"
#include "core/model.h"

namespace moelite {

Status size_auto_budget(const AutoBudgetInputs& in, AutoBudget* out) {
  AutoBudget r;
  r.room = in.room;
  r.context = in.context;
  r.headroom = in.headroom > 0 ? in.headroom : std::max(kMinAutoHeadroom, in.room / 10);
  // Saturating: a room smaller than what must be set aside gives 0, reported below.
  uint64_t left = in.room;
  for (uint64_t take : {in.dense, in.context, r.headroom}) left = left > take ? left - take : 0;
  if (left < in.minimum)
    return fail(MOELITE_ERR_BUDGET_TOO_SMALL,
                "expert budget auto: %" PRIu64 " bytes available (min of MemAvailable and the cgroup's room) - %" PRIu64
                " dense weights - %" PRIu64 " KV cache and scratch - %" PRIu64 " headroom = %" PRIu64
                " bytes, below the minimum working set of %" PRIu64 " bytes",
                in.room, in.dense, in.context, r.headroom, left, in.minimum);
  r.all_resident = left >= in.all_experts;
  r.budget = std::min(left, in.all_experts);
  *out = r;
  return MOELITE_OK;
}

Status choose_auto_budget(const Model& m, const LoadOptions& opts, bool dense_copied_to_shared_device,
                          AutoBudget* out) {
  const bool per_layer = opts.expert_per_layer || opts.cache_allocation == "uniform";
  uint64_t slot_bytes = 0;
  AutoBudgetInputs in;
  in.minimum = ExpertStore::minimum_budget(m, per_layer, &slot_bytes);
  const uint64_t n_experts = uint64_t(m.hp.n_layer) * uint64_t(m.hp.n_expert);
  // The store's own cap: one slot per expert plus its reserve slots (expert_store.cpp).
  const uint64_t reserve = uint64_t(ExpertStore::kReserveSlots) * (per_layer ? uint64_t(m.hp.n_layer) : 1);
  in.all_experts = slot_bytes * (n_experts + reserve);
  in.room = m.memory_room_at_load;
  in.dense = m.dense_bytes * (dense_copied_to_shared_device ? 2 : 1);
  in.context = Context::estimate_bytes(m.hp, ContextOptions{});
  in.headroom = opts.budget_headroom_bytes;
  MOELITE_TRY(size_auto_budget(in, out));
  log_msg(MOELITE_LOG_INFO,
          "expert budget auto: %" PRIu64 " bytes (%s) from %" PRIu64 " available - %" PRIu64 " dense - %" PRIu64
          " context - %" PRIu64 " headroom",
          out->budget, out->all_resident ? "every expert fits" : "streaming", in.room, in.dense, in.context,
          out->headroom);
  return MOELITE_OK;
}

}  // namespace moelite
