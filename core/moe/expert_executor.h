// One layer's routed-expert pass, for every backend and every architecture: the tokens by expert,
// rounds no larger than what the expert source can hold (on the CPU a window that slides along
// the layer's experts as each is released), loads and early preemption, resident-first /
// arrival-order execution, waits for chunks still loading, releases (also on error), and the
// combine in slot order. Backends only compute (backends/backend.h, "routed experts").
#pragma once
#include <functional>

#include "backends/backend.h"
#include "core/experts/expert_source.h"

namespace moelite {

class TimelineRecorder;

// out[t] = sum_j r.weights[t,j] * FFN_{r.ids[t,j]}(x[t]), added in slot order j = 0..k-1 whatever
// the order the experts ran in, so results never depend on which experts were resident. On any
// error every expert this call acquired is released and the error is returned. With a trace
// (may be null), each expert's computation and each wait for a load go on the timeline.
// `shared_expert` (may be null) is the layer's work that needs none of its routed experts (its
// shared expert, writing an output of its own): it runs once, on the CPU while the misses of the
// layer's first round are still loading (after its experts in memory), so that their reads hide
// behind it; on a device backend after the pass.
[[nodiscard]] Status run_routed_experts(Backend& backend, ExpertSource& source, int32_t layer, const FfnKind& kind,
                                        const Act& x, const Routing& r, Act* out, TimelineRecorder* trace = nullptr,
                                        const std::function<Status()>* shared_expert = nullptr);

}  // namespace moelite
