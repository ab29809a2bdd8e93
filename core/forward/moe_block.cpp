#include "base/options.h"
#include "core/forward/moe_block.h"

#include <cstdlib>

#include "core/experts/expert_source.h"
#include "core/experts/predictor.h"
#include "core/moe/expert_executor.h"
#include "core/moe/routing_counters.h"
#include "core/moe/scored_routing.h"
#include "core/moe/tokens_by_expert.h"
#include "core/support/timeline.h"

namespace moelite {

namespace {

// Host copy of the first n_tokens rows of `a` into `buf`.
Status host_rows(EvalState& s, const Act& a, std::vector<float>* buf, const float** out) {
  buf->resize(static_cast<size_t>(s.n_tokens) * static_cast<size_t>(a.cols));
  MOELITE_TRY(s.backend->read_rows(a, 0, s.n_tokens, buf->data()));
  *out = buf->data();
  return MOELITE_OK;
}

// Routing from router weights `w` (and bias, may be empty) on the MoE input `xn`; `selection_bias`
// (may be empty) is the layer's exp_probs_b, which only its own router uses. Softmax routing runs
// on the backend; sigmoid scores, selection biases and expert groups (DeepSeek-V3) on the host,
// from the logits.
Status route_with(const Model& m, EvalState& s, const WeightView& w, const std::vector<float>& bias, const Act& xn,
                  const std::vector<float>& selection_bias, Routing* out) {
  Act logits = s.rows(s.router_logits);
  MOELITE_TRY(s.backend->matmul(w, xn, bias.empty() ? nullptr : bias.data(), &logits));
  if (!needs_scored_routing(m.hp, selection_bias))
    return s.backend->route(logits, m.hp.n_expert_used, m.hp.norm_topk, out);
  const float* host;
  MOELITE_TRY(host_rows(s, logits, &s.host_a, &host));
  route_scores(m.hp, host, s.n_tokens, selection_bias.empty() ? nullptr : selection_bias.data(), out);
  return MOELITE_OK;
}

// Prefill lookahead. Under a budget the reads of layer l + 1's experts begin when that layer
// routes: after layer l's experts have computed and layer l + 1's attention has run, while the
// storage idles (bench model, 25 % budget, a 256-token prompt: every layer read all 64 experts,
// 190-220 ms of reads in a 280-310 ms layer). A batch whose tokens between them use nearly every
// expert of a layer will use nearly every expert of the next one too, so as soon as layer l has
// routed such a batch names all of layer l + 1's experts to the store, which issues the reads after
// this layer's own, into slots nobody pins, without evicting another guess (a guess that finds no
// slot is dropped; speculation is best effort, and routing and results never depend on it).
// Only where this layer's experts fit the store at once (one round: later rounds' demand loads
// would evict the guesses first), and not with cache-aware gating, whose choice reads what is
// resident and must stay a function of the evaluations. MOELITE_PREFILL_LOOKAHEAD=0 turns it off
// (for measuring).
bool prefill_lookahead_wanted(const Model& m, const EvalState& s, int32_t l) {
  bool on = true;
  option_flag(Option::PrefillLookahead, &on);  // per call, so a test can compare
  if (!on) return false;
  if (l + 1 >= m.hp.n_layer || !m.hp.is_moe_layer(l + 1) || s.experts->all_resident()) return false;
  if (decode_sized(s.n_tokens, s.segments.size()) || s.gating->mode == GatingMode::CacheAware) return false;
  // Routing spread evenly leaves a given expert unused by n tokens with probability (1 - k/E)^n
  // (tokens_by_expert.h's expected distinct experts are E times one less that): at most a tenth, so at
  // most a tenth of the guesses are wasted reads.
  if (expected_distinct_experts(m.hp.n_expert, m.hp.n_expert_used, s.n_tokens) < 0.9 * m.hp.n_expert) return false;
  return static_cast<int64_t>(TokensByExpert(s.routing).order().size()) <= s.experts->capacity(l);
}

}  // namespace

Status moe_forward(const Model& m, EvalState& s, int32_t l, const Act& x, const Act& xn, Act* out,
                   const std::function<Status()>* shared_expert) {
  const GatingConfig& gating = *s.gating;
  const LayerWeights& w = m.layers[static_cast<size_t>(l)];
  if (s.hooks) {
    const float *x_host, *xn_host;
    MOELITE_TRY(host_rows(s, x, &s.host_a, &x_host));
    MOELITE_TRY(host_rows(s, xn, &s.host_b, &xn_host));
    s.hooks->on_moe_input(l, x_host, xn_host, s.n_tokens);
  }
  const double route_start = s.trace ? TimelineRecorder::now_us() : 0.0;
  // Pre-gated models chose this layer's experts at the previous layer.
  // router_logits keep this layer's own logits only when it routed itself and has no pre-gate.
  const bool own_logits = !s.has_next_routing && !w.pregate.valid();
  if (s.has_next_routing)
    std::swap(s.routing, s.next_routing);
  else
    MOELITE_TRY(route_with(m, s, w.router, w.router_bias, xn, w.exp_probs_b, &s.routing));
  s.has_next_routing = w.pregate.valid();
  if (s.has_next_routing) MOELITE_TRY(route_with(m, s, w.pregate, {}, xn, {}, &s.next_routing));

  // Cache-aware gating asks the store what is resident now (after the previous layer's loads);
  // with every expert resident it is sensitivity gating.
  std::vector<uint8_t>* resident = nullptr;
  if (gating.mode == GatingMode::CacheAware && !s.experts->all_resident()) {
    s.experts->residency(l, m.hp.n_expert, &s.residency);
    resident = &s.residency;
  }
  // Substitution reads the router's logits for its candidates (softmax routing only: other
  // scorings are on the host and have no stand-in rule yet).
  const GatingCandidates* candidates = nullptr;
  if (resident && gating.substitutes > 0 && own_logits && !needs_scored_routing(m.hp, w.exp_probs_b)) {
    const float* host;
    MOELITE_TRY(host_rows(s, s.rows(s.router_logits), &s.host_a, &host));
    gating_candidates(host, m.hp.n_expert, s.routing, gating.substitutes, &s.candidates);
    candidates = &s.candidates;
  }
  int64_t substituted = 0;
  const int64_t kept = apply_gating(gating, l, &s.routing, resident, candidates, &substituted, &s.predicted_loss);
  if (s.trace)
    s.trace->complete("route", "router", "evaluation", route_start, TimelineRecorder::now_us(),
                      {{"layer", l}, {"tokens", s.n_tokens}, {"experts", kept}});
  if (!s.metering) {  // the meter's exact pass is not what the context computed
    s.routed->add(l, static_cast<uint64_t>(s.n_tokens), static_cast<uint64_t>(kept));
    s.routed_tokens[static_cast<size_t>(l)] += static_cast<uint64_t>(s.n_tokens);
    s.routed_experts[static_cast<size_t>(l)] += static_cast<uint64_t>(kept);
  }
  if (s.hooks) s.hooks->on_routing(l, &s.routing);
  if (m.hp.expert_weights_scale != 1.0f)
    for (float& w_j : s.routing.weights) w_j *= m.hp.expert_weights_scale;
  if (s.on_route)
    s.on_route(l, s.pos0, s.n_tokens, s.routing.k, s.routing.ids.data(), s.routing.weights.data(), s.route_user);
  if (s.predictor && decode_sized(s.n_tokens, s.segments.size())) {
    std::vector<Prediction> guesses;
    const float* hidden = nullptr;
    if (s.predictor->wants_hidden()) MOELITE_TRY(host_rows(s, xn, &s.host_b, &hidden));
    LayerObservation seen;
    seen.backend = s.backend;
    seen.n_tokens = s.n_tokens;
    seen.x = x;
    seen.scratch = s.rows(s.proj);
    seen.logits = s.rows(s.router_logits);
    seen.routing = &s.routing;
    seen.next_routing = s.has_next_routing ? &s.next_routing : nullptr;
    seen.hidden = hidden;
    MOELITE_TRY(s.predictor->after_layer(m, l, seen, &guesses));
    if (!guesses.empty()) s.experts->hint(guesses, l);
  } else if (prefill_lookahead_wanted(m, s, l)) {
    std::vector<Prediction> next(static_cast<size_t>(m.hp.n_expert));
    for (int32_t e = 0; e < m.hp.n_expert; ++e) next[static_cast<size_t>(e)] = {{l + 1, e}, kCertain};
    s.experts->hint(next, l);
  }
  return run_routed_experts(*s.backend, *s.experts, l, m.expert_ffn, xn, s.routing, out, s.trace.get(), shared_expert);
}

}  // namespace moelite
