#include "core/experts/budget_auto.h"

#include <algorithm>
#include <cinttypes>

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

}  // namespace moelite
