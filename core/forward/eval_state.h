// Per-context evaluation state: the KV cache and the scratch activations of one forward pass.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "core/moe/gating.h"
#include "moelite.h"

namespace moelite {

class ExpertSource;
class RoutingCounters;
class ExpertPredictor;
class TimelineRecorder;

// Internal observers of a forward pass (calibration): host copies of hidden states, and a last
// chance to change a layer's routing (sensitivity measurements). Not part of the public API.
class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Layer l's residual stream after attention (x_mid) and its MoE input (xn), n_tokens x n_embd.
  virtual void on_moe_input(int32_t layer, const float* x_mid, const float* xn, int32_t n_tokens) {}
  // Layer l's routing after gating and before expert_weights_scale; may be modified.
  virtual void on_routing(int32_t layer, Routing* r) {}
  // The residual stream after the last layer (before the output norm), n_tokens x n_embd.
  virtual void on_final(const float* x, int32_t n_tokens) {}
};

// Multi-head latent attention's scratch (deepseek2; see core/model/arch/deepseek2.cpp), n_batch
// rows each; unallocated for other architectures.
struct MlaScratch {
  static constexpr size_t kCount = 13;
  Act qa, q, q_pe, kv_a, latent, k_pe, keys, queries, attn_latent, in_nope, in_latent, out_latent, out_v;
  // Every activation, in this order; allocates nothing (the context's destructor walks it).
  std::array<Act*, kCount> all() {
    return {&qa, &q, &q_pe, &kv_a, &latent, &k_pe, &keys, &queries, &attn_latent, &in_nope, &in_latent, &out_latent,
            &out_v};
  }
};

// Consecutive batch rows [row0, row0 + n) of one sequence, at positions pos0.., attending to that
// sequence's cache. A batch of several sequences is ordered so each sequence's rows are adjacent:
// every other operation works row by row, so only attention needs to know where sequences begin.
struct AttentionSegment {
  int32_t seq = 0;  // the context's sequence
  KvCache* kv = nullptr;
  int32_t row0 = 0, n = 0, pos0 = 0;
};

struct EvalState {
  Backend* backend = nullptr;  // the runtime's, or this context's own instance of it
  const GatingConfig* gating = nullptr;  // the runtime's gating rule
  RoutingCounters* routed = nullptr;     // the runtime's model-wide routing counters
  // Where this context's routed experts come from: its client of the runtime's expert store, or
  // the runtime's resident experts.
  ExpertSource* experts = nullptr;
  // What guesses the experts of later layers: the runtime's predictor, or a clone of it for a
  // context that evaluates while others do; null without one.
  ExpertPredictor* predictor = nullptr;
  // The runtime's trace while one runs (taken at each evaluation's start), else null.
  std::shared_ptr<TimelineRecorder> trace;
  int32_t n_batch = 0;  // rows allocated in each scratch Act
  // The rotary embedding of this context: the model's, with the LongRoPE factors its length picks.
  RopeParams rope, rope_windowed;
  // The batch being computed.
  int32_t n_tokens = 0;
  int32_t pos0 = 0;                  // position of the batch's first row (the routing callback's)
  std::vector<int32_t> positions;    // of every row
  std::vector<AttentionSegment> segments;
  // Scratch, n_batch rows each; layers use views of the first n_tokens rows.
  Act x, xn, q, k, v, attn, proj, router_logits, moe_out, shared_out, head_out;
  MlaScratch mla;
  Routing routing;
  // Pre-gated models: layer l+1's routing, computed at layer l from l's MoE input.
  Routing next_routing;
  bool has_next_routing = false;
  ForwardHooks* hooks = nullptr;
  std::vector<float> host_a, host_b;      // host copies of activations for predictors and hooks
  std::vector<uint8_t> residency;         // cache-aware gating: the layer's experts resident at routing
  GatingCandidates candidates;            // cache-aware substitution: the router's next experts per token
  // Per layer: tokens routed and experts they kept in this context's passes (its expert stats;
  // the runtime's counters sum every context).
  std::vector<uint64_t> routed_tokens, routed_experts;
  // The sensitivity model's loss of what gating left out, summed over this context's tokens and
  // layers (apply_gating's predicted_loss): the quality meter's prediction.
  double predicted_loss = 0.0;
  // The quality meter's exact pass (core/exec/quality_meter.h): counts nothing of its own.
  bool metering = false;
  moelite_routing_fn on_route = nullptr;  // observer of every layer's routing (may be null)
  void* route_user = nullptr;

  Act rows(const Act& a) const { return backend->view_rows(a, 0, n_tokens); }
};

// Writes the batch's k and v rows into each sequence's cache and attends (Backend::attention),
// one call per segment: out rows are q's rows attended within their own sequence.
[[nodiscard]] Status attend_segments(EvalState& s, int32_t layer, const Act& q, const Act& k, const Act& v,
                                     int32_t n_head, int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec,
                                     Act* out);

}  // namespace moelite
