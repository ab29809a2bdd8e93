// Expert predictors: guesses of which experts coming layers will use, made early enough for the
// expert store to load them while the current layer computes. Every predictor only moves loads
// earlier; routing and results never depend on it.
//
//   next-gate    layers l+1..l+depth's routers applied to layer l's residual stream (no training);
//   first-layer  the next token's layer-0 experts from this token's final hidden state (a linear
//                map fitted by `moelite calibrate`);
//   learned      layer l+stride's experts from layer l's MoE input (per-layer linear maps fitted
//                by calibration; ProMoE's stride-ahead predictor);
//   correlation  layer l+1's experts from the experts layer l actually chose, by a co-activation
//                table seeded by calibration and updated online (Klotski);
//   pregate      models with pre-gate routers (blk.N.ffn_pregate_inp.weight) route layer N+1 at
//                layer N, so the prediction is the routing itself (Pre-gated MoE, Read-ME).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/status.h"
#include "core/experts/cache_policy.h"

namespace moelite {

struct Model;
struct Profile;

// Predictions are made for decode-sized batches only: a prefill batch needs most experts anyway
// (core/forward/moe_block.cpp names all of the next layer's experts for one: the prefill lookahead).
// A step of several sequences decoding together (one or a few tokens each) is decode-sized: what
// counts is the rows per sequence, not the batch's rows.
constexpr int32_t kMaxPredictTokens = 4;
inline bool decode_sized(int32_t n_tokens, size_t n_sequences) {
  return static_cast<int64_t>(n_tokens) <=
         static_cast<int64_t>(kMaxPredictTokens) * static_cast<int64_t>(n_sequences > 0 ? n_sequences : 1);
}

// What a predictor sees of a forward pass once a layer has routed: the batch's residual stream on
// the backend and scratch it may overwrite, the layer's routing, and the routing a pre-gate already
// chose for the next layer. Narrower than the pass's state on purpose: predictors only move loads
// earlier, so they read the pass and never steer it.
struct LayerObservation {
  Backend* backend = nullptr;
  int32_t n_tokens = 0;
  Act x;        // the residual stream after the layer's attention, n_tokens x n_embd
  Act scratch;  // n_tokens x n_embd the predictor may overwrite
  Act logits;   // n_tokens x n_expert the predictor may overwrite
  const Routing* routing = nullptr;       // the layer's, after gating
  const Routing* next_routing = nullptr;  // the next layer's, from a pre-gate router (null: none)
  const float* hidden = nullptr;          // host copy of the layer's MoE input when wants_hidden()
};

class ExpertPredictor {
 public:
  virtual ~ExpertPredictor() = default;
  virtual const char* name() const = 0;
  // Whether after_layer needs a host copy of layer l's MoE input (a readback on GPU backends).
  virtual bool wants_hidden() const { return false; }
  // Whether after_token needs the final hidden state.
  virtual bool wants_final() const { return false; }
  // Layer `layer` has routed (`seen`). Appends predictions for later layers; fails only when a
  // backend operation it uses fails.
  [[nodiscard]] virtual Status after_layer(const Model& m, int32_t layer, const LayerObservation& seen,
                                           std::vector<Prediction>* out) = 0;
  // After the last layer: `final_state` is the batch's last token's hidden state after the output
  // norm (n_embd floats). Appends predictions for the next token's layers.
  virtual void after_token(const float* final_state, std::vector<Prediction>* out) {}
  // A predictor of the same kind and configuration for another context, so that contexts can
  // evaluate at the same time, each guessing from its own layers: its scratch and per-evaluation
  // state are its own; fitted weights (a profile's maps) are shared, read-only; online state
  // (correlation's counts) starts as this one's and then learns from its context's tokens alone.
  virtual std::unique_ptr<ExpertPredictor> clone() const = 0;
};

// "none" gives a null predictor. Learned predictors need a profile holding their weights;
// "pregate" needs a model with pre-gate routers. MOELITE_ERR_INVALID_ARGUMENT naming the
// available predictors for an unknown name, or for correlation tables beyond
// kMaxCorrelationBytes; MOELITE_ERR_BAD_PROFILE for a missing fit. With out == nullptr the same
// checks run and nothing is built (a model without a budget has no use for a predictor).
Status make_predictor(const std::string& name, int32_t depth, const Model& m, const Profile* profile,
                      std::unique_ptr<ExpertPredictor>* out);
const char* predictor_names();
// MOELITE_ERR_INVALID_ARGUMENT unless every name of the list is a known predictor (what a model
// or profile must offer is checked by make_predictor at load).
Status check_predictor_name(const std::string& name);

// The names of a predictor list ("learned,first-layer" -> learned, first-layer; one name -> itself).
std::vector<std::string> predictor_list(const std::string& names);

// The k highest scores' indices, highest first (ties: lower index first).
std::vector<int32_t> top_indices(const float* scores, int32_t n, int32_t k);

// Klotski's co-activation table between two consecutive layers: counts[i * E + j] = tokens that
// used expert i in the first layer and j in the second.
//
// The tables of a model take (layers - 1) x experts^2 floats, which a hostile or merely huge
// model can make enormous (4096 experts, 64 layers: 4 GiB). Beyond kMaxCorrelationBytes the
// correlation predictor is refused at load and left out of calibration; real models need a few MiB
// (128 experts x 48 layers: 3 MiB; 256 x 61: 15 MiB).
constexpr uint64_t kMaxCorrelationBytes = uint64_t{64} << 20;
uint64_t correlation_table_bytes(int32_t n_layer, int32_t n_expert);

class CorrelationTable {
 public:
  CorrelationTable() = default;
  CorrelationTable(int32_t n_expert, std::vector<float> counts);
  void add(const int32_t* from, int32_t n_from, const int32_t* to, int32_t n_to);
  // scores[j] = mean over the given experts i (ids < 0 skipped) of P(j | i), add-one smoothed.
  void scores(const int32_t* from, int32_t n_from, float* out) const;
  const std::vector<float>& counts() const { return counts_; }

 private:
  int32_t n_ = 0;
  std::vector<float> counts_, row_sum_;
};

}  // namespace moelite
