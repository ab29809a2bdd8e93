// Adaptive top-k gating (AdapMoE, generalised beyond top-2): after the model's own top-k and
// renormalisation, a token may use fewer experts where the layer tolerates it.
//
//   sensitivity: drop the lowest-weight experts while (sum of dropped weights)^2 * S_l < T, where
//                S_l is layer l's sensitivity from a calibration profile (a second-order model of
//                the loss change: dropping weight d costs about S_l * d^2);
//   score:       drop every expert whose weight is below T (a fixed-threshold baseline).
// Both keep at least the top expert, and rescale the kept weights so that they sum to what all k
// weights summed to (the layer's output keeps its scale). Dropped slots get id -1 and weight 0;
// the backend skips them. Off (exact) by default: exact mode never changes a result.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace moelite {

enum class GatingMode { Exact, Sensitivity, Score };

struct GatingConfig {
  GatingMode mode = GatingMode::Exact;
  float threshold = 0.0f;
  std::vector<double> sensitivity;  // per layer (sensitivity mode)
};

// "exact", "sensitivity", "score" -> mode; false for other names.
bool parse_gating_mode(const std::string& name, GatingMode* out);
const char* gating_mode_name(GatingMode mode);

// How many of the k weights (any order) the rule keeps: the kept ones are the largest (ties: the
// lower slot index ranks higher). `s` is the layer's sensitivity (sensitivity mode only).
int32_t gating_keep_count(GatingMode mode, float threshold, double s, const float* weights, int32_t k);

// Applies the rule to every token of `r` at `layer`; returns the number of experts kept over all
// tokens. Exact mode leaves `r` untouched and returns n_tokens * k.
int64_t apply_gating(const GatingConfig& config, int32_t layer, Routing* r);

// Slot order of one token's weights, largest first (ties: lower slot first): the order in which
// the rule keeps experts.
void gating_rank(const float* weights, int32_t k, int32_t* order);

}  // namespace moelite
