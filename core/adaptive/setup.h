// Applies a calibration profile and the adaptive options to a model being loaded: gating, the
// expert store's per-layer allocation and hot set, and the predictor.
#pragma once
#include "core/expert_store/expert_store.h"
#include "core/model.h"

namespace moelite {

// Reads the profile (if any) and sets the gating rule. MOELITE_ERR_BAD_PROFILE for a profile of
// another model or sensitivity gating without one.
Status setup_adaptive(Model& m, const LoadOptions& opts);

// Store options the profile implies: per-layer quotas from the DP allocation (when the budget
// allows every layer its minimum) and the static policy's use counts.
void plan_expert_store(const Model& m, const LoadOptions& opts, ExpertStoreOptions* so);

}  // namespace moelite
