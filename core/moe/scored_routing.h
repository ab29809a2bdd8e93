// Routing by expert scores on the host, for what the backends' softmax route() does not cover:
// sigmoid scores, a selection bias, group-limited selection (DeepSeek-V3's router).
#pragma once
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "core/model/model.h"

namespace moelite {

// Whether routing with this selection bias (may be empty) needs route_scores() rather than
// Backend::route.
bool needs_scored_routing(const HParams& hp, const std::vector<float>& selection_bias);

// For each of n tokens: scores = softmax or sigmoid of its n_expert logits; selection scores =
// scores + bias (bias may be null); with expert groups, every expert outside the n_group_used
// groups with the highest sums of their two best selection scores is excluded (ties to the lower
// group); the top k selection scores pick the experts (ties to the lower id, best first), each
// weighted by its unbiased score; renormalised to sum 1 (the sum clamped below at 2^-14, as
// llama.cpp does) when hp.norm_topk. expert_weights_scale is applied by the caller, as for every
// routing. A NaN logit never wins a selection; a row without numbers yields dropped slots.
void route_scores(const HParams& hp, const float* logits, int32_t n, const float* bias, Routing* r);

}  // namespace moelite
