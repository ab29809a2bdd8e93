#include "core/budget_auto.h"

#include <algorithm>
#include <cinttypes>

#include "core/adaptive/setup.h"
#include "core/context.h"
#include "core/expert_store/expert_store.h"
#include "core/model.h"

namespace moelite {

Status size_auto_budget(const AutoBudgetInputs& in, AutoBudget* out) {
  AutoBudget r;
  r.room = in.room;
  r.context = in.context;
  r.headroom = in.headroom > 0 ? in.headroom : default_headroom(in.room);
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
  // The limits the store will be planned and created with (one definition: setup.h).
  const ExpertStore::Limits limits = planned_store_limits(m, opts);
  AutoBudgetInputs in;
  in.minimum = limits.minimum;
  in.all_experts = limits.cap;
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
