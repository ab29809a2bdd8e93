// Adaptive top-k gating (AdapMoE, generalised beyond top-2): after the model's own top-k and
// renormalisation, a token may use fewer experts where the layer tolerates it.
//
//   sensitivity: drop the lowest-weight experts while (sum of dropped weights)^2 * S_l < T, where
//                S_l is layer l's sensitivity from a calibration profile (a second-order model of
//                the loss change: dropping weight d costs about S_l * d^2);
//   score:       drop every expert whose weight is below T (a fixed-threshold baseline);
//   cache-aware: sensitivity gating whose threshold depends on where the expert is: T for one
//                resident in (or already loading into) the expert store when the layer is routed,
//                T x P for one that would have to be read from storage (P >= 1, the penalty).
//                Rationale: T is an exchange rate between predicted loss and the time dropping an
//                expert saves, normalised to the time of computing one resident expert (t_c).
//                Dropping a non-resident expert also saves its read, t_c + t_r, so it may cost up
//                to T x (1 + t_r / t_c) of loss: P = 1 + t_r / t_c. A decode step is memory bound,
//                so t_r / t_c ~ (memory bandwidth) / (storage bandwidth), which `moelite bench`
//                measures and reports as suggested_gating_penalty. With every expert resident
//                (no budget) it is sensitivity gating exactly.
// Both keep at least the top expert, and rescale the kept weights so that they sum to what all k
// weights summed to (the layer's output keeps its scale). Dropped slots get id -1 and weight 0;
// the backend skips them. Off (exact) by default: exact mode never changes a result.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace moelite {

enum class GatingMode { Exact, Sensitivity, Score, CacheAware };

// The cache-aware penalty when none is given: a fixed, documented factor (a storage read taken as
// costing 3 resident expert computations, t_r / t_c = 3), so results do not depend on a timing
// measured at load. Tune it with moelite_model_params_set_gating_penalty / --gating-penalty.
constexpr float kDefaultGatingPenalty = 4.0f;

// The most router ranks after top-k that cache-aware substitution may search (an API bound; the
// model's own n_expert - k bounds it further at load).
constexpr int32_t kMaxGatingSubstitutes = 1 << 16;
// Substitution handles tokens of at most this many experts (a bit per slot); with more, cache-aware
// gating runs without it.
constexpr int32_t kMaxSubstitutionK = 64;

struct HParams;
struct Profile;

// The gating asked for (moelite_model_params_set_gating and its neighbours).
struct GatingSettings {
  GatingMode mode = GatingMode::Exact;
  float threshold = 0.0f;
  float penalty = kDefaultGatingPenalty;  // cache-aware: threshold factor for non-resident experts
  int32_t substitutes = 0;  // cache-aware: router ranks after top-k searched for a resident stand-in
};

struct GatingConfig {
  GatingMode mode = GatingMode::Exact;
  float threshold = 0.0f;
  std::vector<double> sensitivity;  // per layer (sensitivity and cache-aware modes)
  // The sensitivities came from a calibration profile. Without one they are all 1, which only the
  // quality governor may use (it learns their scale from the quality meter; core/exec/quality_governor.h).
  bool calibrated = true;
  float penalty = kDefaultGatingPenalty;  // cache-aware: threshold factor for non-resident experts (>= 1)
  int32_t substitutes = 0;  // cache-aware: router ranks beyond top-k searched for a resident stand-in (0: off)
};

// Cache-aware substitution's candidates: for each token, the router's next `n` experts after its
// top-k (ids, and weights on the scale of the routing's weights), best first.
struct GatingCandidates {
  int32_t n = 0;
  std::vector<int32_t> ids;    // n_tokens * n
  std::vector<float> weights;  // n_tokens * n
  // Scratch of gating_candidates, kept between calls so a layer's call allocates nothing.
  std::vector<double> probs;
  std::vector<int32_t> rank;
};

// The rule for a model: the settings checked (MOELITE_ERR_INVALID_ARGUMENT naming the one out of
// range), substitutes capped at n_expert - k, and the per-layer sensitivities from the calibration
// profile, which sensitivity and cache-aware gating need -- without one they are 1 and the config
// is not `calibrated`: a context then needs a quality target (Context::create says so).
Status make_gating_config(const HParams& hp, const GatingSettings& settings, const Profile* profile,
                          GatingConfig* out);

// "exact", "sensitivity", "score", "cache-aware" -> mode; false for other names.
bool parse_gating_mode(const std::string& name, GatingMode* out);
const char* gating_mode_name(GatingMode mode);

// How many of the k weights (any order) the rule keeps: the kept ones are the largest (ties: the
// lower slot index ranks higher). `s` is the layer's sensitivity (sensitivity mode only).
int32_t gating_keep_count(GatingMode mode, float threshold, double s, const float* weights, int32_t k);

// Cache-aware: like sensitivity mode, but slot j (in the given order of the k weights) is dropped
// while (sum of dropped weights)^2 * s < threshold x (resident[j] ? 1 : penalty), walking up from
// the lowest weight and stopping at the first expert kept (so the kept ones are still the largest,
// and the first is always kept). resident == nullptr: every slot resident (= sensitivity mode,
// bitwise: the same comparisons in the same precision).
int32_t gating_keep_count_cache_aware(float threshold, float penalty, double s, const float* weights, int32_t k,
                                      const uint8_t* resident);

// Applies the rule to every token of `r` at `layer`; returns the number of experts kept over all
// tokens. Exact mode leaves `r` untouched and returns n_tokens * k.
//
// `resident` (cache-aware mode only; nullptr: every expert resident) is the layer's residency at
// routing time, one byte per expert id (non-zero: resident or already loading; ids beyond its size
// count as resident). Tokens are gated in order, and each expert a token keeps is marked resident
// for the later tokens of the batch: it is loaded once for the whole batch anyway. So the result
// depends on the store's state (budget, policy, allocation, earlier evaluations) and on how the
// evaluation is split into batches -- deterministic for a given sequence of evaluations, but not
// equal to the resident result.
//
// `predicted_loss` (may be null) accumulates the sensitivity model's loss of what was left out:
// per token S_l * d^2, d the weight of the router's top-k experts the token does not use (a
// substitute's weight does not count against it). Sensitivity and cache-aware modes only.
int64_t apply_gating(const GatingConfig& config, int32_t layer, Routing* r, std::vector<uint8_t>* resident = nullptr,
                     const GatingCandidates* candidates = nullptr, int64_t* substituted = nullptr,
                     double* predicted_loss = nullptr);

// The router's next `n` experts after each token's top-k in `r`, from its logits (n_tokens rows
// of n_expert, softmax routing), with weights on the routing's scale (the factor between each
// token's routing weights and its softmax probabilities). Candidates a token lacks are id -1.
void gating_candidates(const float* logits, int32_t n_expert, const Routing& r, int32_t n, GatingCandidates* out);

// Slot order of one token's weights, largest first (ties: lower slot first): the order in which
// the rule keeps experts.
void gating_rank(const float* weights, int32_t k, int32_t* order);

}  // namespace moelite
