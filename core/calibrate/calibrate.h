// Offline calibration (`moelite calibrate`, moelite_calibrate): runs a model over a corpus and
// measures what the adaptive machinery needs (docs/ARCHITECTURE.md, "Calibration"):
//   * per-layer sensitivity S_l, by the drop estimator and by finite differences (on a sample of
//     the windows, CalibrateOptions::sensitivity_tokens);
//   * expert use counts, experts per token under sensitivity gating at a grid of thresholds;
//   * per-layer LRU hit-rate curves against cache size;
//   * the first-layer, learned and correlation predictors, fitted on the first part of the
//     corpus, and every predictor's accuracy per layer on the held-out rest.
#pragma once
#include <cstdint>
#include <vector>

#include "core/exec/runtime.h"
#include "core/model/model.h"
#include "core/model/profile.h"

namespace moelite {

struct CalibrateOptions {
  int32_t window = 256;            // tokens per evaluation window (each from an empty cache)
  int32_t stride = 1;              // learned predictors look this many layers ahead
  double holdout = 0.25;           // share of the tokens kept out of predictor fitting
  double fd_alpha = 0.9;           // finite-difference check: the tail weight scaled by this
  std::vector<double> thresholds;  // gating table; empty: a log grid 1e-4 .. 1
  // Tokens the sensitivity passes (2 x n_layer perturbed forward passes per window) run on: whole
  // windows evenly spread over the corpus, as many as cover this count. 0: every window;
  // negative: default_sensitivity_tokens(n_layer). Everything else uses every token.
  int64_t sensitivity_tokens = -1;
  moelite_progress_fn progress = nullptr;
  void* progress_user = nullptr;
};

// The default sensitivity sample: about kSensitivityTokenPasses perturbed token-passes in all
// (2 x n_layer per token), so their cost does not grow with depth, but never fewer than
// kMinSensitivityTokens tokens: 32768 for 6 layers, 49152 for 4, 8192 for 24.
constexpr int64_t kSensitivityTokenPasses = 393216;
constexpr int64_t kMinSensitivityTokens = 4096;
int64_t default_sensitivity_tokens(int32_t n_layer);

// MOELITE_ERR_INVALID_ARGUMENT for fewer than two tokens, a model loaded with non-exact gating,
// or bad options; evaluation errors pass through. The model must not be evaluated by other
// contexts meanwhile.
Status calibrate(const Model& m, Runtime& runtime, const std::vector<int32_t>& tokens, const CalibrateOptions& options,
                 Profile* out);

}  // namespace moelite
