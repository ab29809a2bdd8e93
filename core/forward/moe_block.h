// The mixture-of-experts half of a layer, shared by every architecture: routing (or the routing a
// pre-gate chose one layer earlier), adaptive gating, the routing counters, calibration hooks, the
// routing callback, expert weight scaling, the predictor's guesses for coming layers, and then the
// routed-expert pass (core/moe/expert_executor.h). An architecture with a block of its own calls
// this instead of repeating any of it.
#pragma once
#include <functional>

#include "core/forward/eval_state.h"
#include "core/model/model.h"

namespace moelite {

// out = sum_j w_j * expert_j(xn) for the batch in `s`; `x` is the residual stream (after
// attention) and `xn` the normed MoE input. Leaves the layer's routing in s.routing.
// `shared_expert` (may be null) computes the block's shared expert into an output of its own; it
// runs once, where the routed pass can hide expert reads behind it (run_routed_experts).
[[nodiscard]] Status moe_forward(const Model& m, EvalState& s, int32_t layer, const Act& x, const Act& xn, Act* out,
                                 const std::function<Status()>* shared_expert = nullptr);

}  // namespace moelite
