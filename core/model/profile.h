// A calibration profile: what `moelite calibrate` measured about one model on a corpus, and the
// predictor weights it fitted. Read by the loader to set adaptive gating (per-layer sensitivity),
// the per-layer cache allocation (hit curves, predictor accuracy), the static policy's hot set
// (expert use counts) and the learned predictors.
//
// Files: PROFILE.json (statistics, human-readable, versioned) and, when predictor weights were
// fitted, PROFILE.json.bin beside it (little-endian float32 arrays, described by the JSON's
// "tensors" list). Both are validated completely: a malformed profile, or one made for another
// model, is refused with MOELITE_ERR_BAD_PROFILE and a message naming what is wrong.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace moelite {

struct HParams;

// A linear predictor: scores = W · [x, 1], W of rows x (n_in + 1) floats (bias last).
struct LinearMap {
  int32_t rows = 0;
  int32_t n_in = 0;
  std::vector<float> w;
  bool empty() const { return rows == 0; }
  // scores[r] for r < rows; x has n_in floats.
  void apply(const float* x, float* scores) const;
};

struct LayerProfile {
  // AdapMoE sensitivity S_l (see docs/ARCHITECTURE.md, "Calibration"): the drop estimator and
  // its finite-difference counterpart.
  double sensitivity = 0.0;
  double sensitivity_fd = 0.0;
  double mean_tail_weight = 0.0;        // mean weight of the lowest-weight top-k expert
  std::vector<uint64_t> expert_counts;  // tokens routed to each expert
  // hit_curve[c]: hit rate of a cache of c experts holding only this layer's experts (LRU),
  // replaying the calibration routing; c = 0..n_expert (0 below top-k, where it cannot run).
  std::vector<double> hit_curve;
};

// Average experts per token and share of (token, layer) pairs using fewer than top-k experts
// under sensitivity gating at a threshold, computed from the calibration routing.
struct GatingPoint {
  double threshold = 0.0;
  double experts_per_token = 0.0;
  double share_reduced = 0.0;
};

struct Profile {
  static constexpr int32_t kVersion = 1;
  std::string arch;
  int32_t n_layer = 0, n_expert = 0, n_expert_used = 0, n_embd = 0;
  int64_t n_tokens = 0;  // calibration tokens
  int32_t window = 0;
  int64_t sensitivity_tokens = 0;  // of those, the tokens the sensitivities were measured on (0: not recorded)
  std::vector<LayerProfile> layers;
  std::vector<GatingPoint> gating;
  // Held-out prediction accuracy per predictor name and target layer: the share of the experts a
  // layer used that the predictor named beforehand (NaN where it does not predict that layer).
  std::map<std::string, std::vector<double>> accuracy;

  // Predictor weights.
  int32_t learned_stride = 1;
  LinearMap first_layer;                        // next token's layer-0 experts from the final state
  std::vector<LinearMap> learned;               // [l]: layer l + stride's experts from layer l's MoE input
  std::vector<std::vector<float>> correlation;  // [l]: n_expert x n_expert counts, layer l -> l + 1

  // Writes PROFILE (and PROFILE.bin when there are weights), each through a temporary file renamed
  // into place, so an existing profile is never left half-written.
  Status save(const std::string& path) const;
  static Status load(const std::string& path, Profile* out);
  // MOELITE_ERR_BAD_PROFILE unless the profile was made for a model of these dimensions.
  Status check_model(const HParams& hp) const;
};

}  // namespace moelite
