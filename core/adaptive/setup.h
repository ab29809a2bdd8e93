// Applies a calibration profile and the adaptive options to a runtime being created: gating, the
// expert store's per-layer allocation and hot set, and the predictor.
#pragma once
#include "core/adaptive/profile.h"
#include "core/expert_store/expert_store.h"
#include "core/model.h"

namespace moelite {

// Reads the profile (if any) and sets the gating rule. MOELITE_ERR_BAD_PROFILE for a profile of
// another model or sensitivity gating without one.
Status setup_adaptive(const Model& m, const LoadOptions& opts, std::unique_ptr<Profile>* profile, GatingConfig* gating);

// Store options from the cache allocation and the profile: one global pool, equal per-layer
// quotas, or quotas from the DP allocation over the profile's hit curves and predictor accuracy;
// and the static policy's use counts. "dp" without a profile: MOELITE_ERR_BAD_PROFILE; a budget
// below every layer's minimum: MOELITE_ERR_BUDGET_TOO_SMALL; an unknown name:
// MOELITE_ERR_INVALID_ARGUMENT.
// MOELITE_ERR_INVALID_ARGUMENT unless `name` is auto, global, uniform or dp.
Status check_cache_allocation(const std::string& name);
// The allocation the store is planned with: "auto" with per-layer quotas asked for
// (expert_per_layer) is "uniform"; any other name as given.
std::string effective_cache_allocation(const LoadOptions& opts);
// The smallest budget plan_expert_store + ExpertStore::create accept for these options, and the
// most they allocate: what the auto budget must respect. Per-layer minimums for "uniform" and
// "dp" ("auto" falls back to one global pool when per-layer quotas do not fit); the per-layer cap
// wherever quotas may be per layer (all but "global").
ExpertStore::Limits planned_store_limits(const Model& m, const LoadOptions& opts);
Status plan_expert_store(const Model& m, const Profile* profile, const LoadOptions& opts, ExpertStoreOptions* so);

}  // namespace moelite
