// An inference stream over a model: KV cache, scratch activations, the logits of the last batch.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "core/exec/quality_governor.h"
#include "core/exec/quality_meter.h"
#include "core/exec/runtime.h"
#include "core/experts/expert_store.h"
#include "core/experts/predictor.h"
#include "core/forward/eval_state.h"
#include "core/model/model.h"

namespace moelite {

constexpr int32_t kMaxSequences = MOELITE_MAX_SEQUENCES;

struct ContextOptions {
  int32_t n_ctx = 0;  // 0: min(training context, 4096)
  int32_t n_batch = 512;
  int32_t n_seq = 1;  // sequences, each with its own KV cache of n_ctx positions
  moelite_abort_fn abort = nullptr;
  void* abort_user = nullptr;
  moelite_routing_fn on_route = nullptr;
  void* route_user = nullptr;
  // The quality meter's sampling rate in [0, 1] (core/exec/quality_meter.h); 0: off, or with a
  // quality target kDefaultGovernedSampleRate.
  double quality_sample_rate = 0.0;
  // The quality governor (core/exec/quality_governor.h): a target, and the thresholds it may use.
  QualityTarget quality_target;
  double min_threshold = 0.0, max_threshold = 1e30;
};

// The meter's sampling rate under a quality target when none is set: one decode step in eight.
constexpr double kDefaultGovernedSampleRate = 0.125;

// Expert-store counters as they stood at one moment, or the difference of two such (per layer).
// The context's routing counters are its EvalState's (Context::routed_tokens).
struct ExpertCounters {
  std::vector<ExpertLayerStats> store;
  double read_busy_seconds = 0;

  // The store's counters of `client` (the context's) and the store's read-busy time.
  static ExpertCounters take(const Runtime& runtime, int32_t client);
  // Adds after - before (a counter that went down was reset meanwhile: its new value is added).
  void accrue(const ExpertCounters& before, const ExpertCounters& after);
};

class Context {
 public:
  ~Context();
  // The context reads `model` and evaluates through `runtime`; both must outlive it.
  static Status create(const Model& model, Runtime& runtime, const ContextOptions& opts, std::unique_ptr<Context>* out);
  // Host bytes create() allocates for these options (KV cache + scratch activations), plus an
  // allowance for the CPU backend's per-batch expert intermediates: what budget "auto" sets aside.
  static uint64_t estimate_bytes(const HParams& hp, const ContextOptions& opts);

  // Evaluates tokens appended to sequence 0; on any error the sequence is unchanged.
  Status eval(const int32_t* tokens, int32_t n_tokens, bool logits_all);
  // Evaluates tokens of several sequences in one pass: token i is appended to sequence
  // seq_ids[i] (null: all to sequence 0), each sequence's tokens in the order given. Logits are
  // kept for the tokens with want_logits[i] != 0 (null: the last token of each sequence). Tokens
  // of all sequences share each layer's matrix products and expert reads; attention stays within
  // a sequence, so each sequence's logits are bitwise those of evaluating it alone. On any error
  // every sequence is as before the call.
  Status eval_seqs(const int32_t* tokens, const int32_t* seq_ids, const uint8_t* want_logits, int32_t n_tokens);
  // After eval(): token i's logits (logits_all), or the last token's (i = 0 or -1). After
  // eval_seqs(): batch token i's logits, null unless they were wanted. Negative i counts from the end.
  const float* logits(int32_t i) const;

  int32_t n_seq() const { return static_cast<int32_t>(seqs_.size()); }
  int32_t length(int32_t seq = 0) const { return seqs_[static_cast<size_t>(seq)].n_past; }
  // The tokens whose keys and values the sequence's cache holds, in order (length() of them).
  const std::vector<int32_t>& tokens(int32_t seq = 0) const { return seqs_[static_cast<size_t>(seq)].tokens; }
  int32_t n_ctx() const { return n_ctx_; }
  // Most tokens one forward pass takes (eval splits longer inputs).
  int32_t n_batch() const { return opts_.n_batch; }
  // Bytes of keys and values the caches hold for all layers and sequences (what create() allocated).
  uint64_t kv_bytes() const;
  // Keeps the first n_keep tokens (clamped to [0, length()]). With sliding-window layers, a cut
  // back past what their ring still holds keeps nothing: length() says what was kept.
  void truncate(int32_t n_keep, int32_t seq = 0);
  // Positions each layer's cache holds for these settings: n_ctx, or a windowed layer's ring.
  static std::vector<int32_t> kv_slots(const HParams& hp, int32_t n_ctx, int32_t n_batch);
  // Floats of one cached position's key row (also of its value row, unless the model uses MLA's
  // keys-only cache).
  static int64_t kv_row_floats(const HParams& hp);
  // Floats one cached position takes in one full-attention layer: the key row and the value row,
  // or MLA's single row.
  static int64_t kv_position_floats(const HParams& hp) { return kv_row_floats(hp) * (hp.mla() ? 1 : 2); }
  // Floats per batch row of the MLA scratch (0 for other architectures).
  static uint64_t mla_scratch_floats(const HParams& hp);
  const Model& model() const { return model_; }
  void set_abort(moelite_abort_fn fn, void* user) {
    opts_.abort = fn;
    opts_.abort_user = user;
  }
  // What the store counted for this context since its creation or reset_counters() (per layer;
  // read_busy_seconds: the storage's busy time during its evaluations).
  ExpertCounters counters() const;
  const std::vector<uint64_t>& routed_tokens() const { return state_.routed_tokens; }
  const std::vector<uint64_t>& routed_experts() const { return state_.routed_experts; }
  // Whether the context has a backend instance of its own and evaluates while other contexts of
  // the model do: on a backend with create_peer, with every expert resident or with a budget when
  // nothing makes an evaluation's result or its guesses depend on the store's state between its
  // layers (no cache-aware gating; a predictor is cloned for it). Otherwise contexts take turns.
  bool evaluates_concurrently() const { return own_backend_ != nullptr; }
  void reset_counters();
  // The quality meter's totals since the context was made (core/exec/quality_meter.h).
  const QualityTally& quality() const { return quality_; }
  // The gating threshold this context uses now (the governor's, or the model's).
  double gating_threshold() const { return state_.gating ? state_.gating->threshold : 0.0; }
  double quality_target_kl() const { return governor_ ? opts_.quality_target.kl : 0.0; }
  double governor_ratio() const { return governor_ ? governor_->ratio() : 0.0; }
  // Saved state (core/exec/session.cpp): every sequence's tokens and cache rows, written atomically to
  // a versioned file (zstd-compressed where libzstd is present). load() checks the whole file
  // (format, checksum, model, shapes) before it changes anything; it then replaces every sequence
  // (those the file lacks are reset). A device failure while writing the rows back resets them all.
  Status save(const std::string& path) const;
  Status load(const std::string& path);
  // Internal observers of every forward pass (calibration); null to remove.
  void set_hooks(ForwardHooks* hooks) { state_.hooks = hooks; }

 private:
  Context(const Model& model, Runtime& runtime) : model_(model), runtime_(runtime) {}
  // One sequence's cache, its length and tokens.
  struct Sequence {
    KvCache kv;
    int32_t n_past = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> ring_pos;  // sliding-window models: the position each ring slot holds (-1: none)
  };
  // Runs one forward pass over state_.segments' rows; the logits of rows head_rows[0..n_head)
  // (ascending) go to logits_out, one after another.
  Status eval_batch(const int32_t* tokens, int32_t n, const int32_t* head_rows, int32_t n_head, float* logits_out);
  // The quality meter on the batch just evaluated (state_'s segments, every one a single token at
  // a sampled position): the same batch again with exact routing, its cache rows saved before and
  // restored after, each head row's next-token distribution compared with `gated_logits`'.
  Status meter_batch(const int32_t* tokens, int32_t n, const int32_t* head_rows, int32_t n_head,
                     const float* gated_logits, double predicted_loss);
  // eval_seqs' argument checks: tokens in the vocabulary, sequence ids in range, room in each
  // sequence; *count gets each sequence's tokens.
  Status check_batch(const int32_t* tokens, const int32_t* seq_ids, int32_t n_tokens, std::vector<int32_t>* count) const;
  // After a failed call: every sequence back to its length at the call's start (`start`), or empty
  // where a sliding window's ring no longer holds what that length needs.
  void roll_back(const std::vector<int32_t>& start);
  Status lock_abortable(std::unique_lock<std::mutex>* lock);
  // The turn on the runtime's backend (Runtime::eval_mutex) for work outside an evaluation that
  // uses it (allocating and freeing this context's activations and caches, reading and writing
  // its cache for a session): a device backend's command stream is not for two threads at once.
  // Not held (and not needed) with a backend instance of this context's own.
  std::unique_lock<std::mutex> backend_turn() const;
  Status predict_next_token(int32_t n);
  // Whether every sliding-window ring still holds the positions the token at n_keep will read.
  bool ring_serves(const Sequence& seq, int32_t n_keep) const;
  // The first position whose cache rows layer l still holds for the sequence: 0 for a full
  // layer, for a windowed layer's ring the start of the positions it holds before n_past.
  int32_t first_held(const Sequence& seq, int32_t layer) const;

  const Model& model_;
  Runtime& runtime_;
  // This context's own backend instance (see evaluates_concurrently), or null: the runtime's.
  // Declared before state_, whose activations and caches it allocated, so it outlives them.
  std::unique_ptr<Backend> own_backend_;
  // Under a budget: this context's client of the store (state_.experts), and its id.
  std::unique_ptr<ExpertSource> store_client_;
  int32_t store_client_id_ = -1;
  // A context evaluating at the same time as others guesses with a predictor of its own
  // (ExpertPredictor::clone; state_.predictor), null otherwise (the runtime's, under its lock).
  std::unique_ptr<ExpertPredictor> own_predictor_;
  ContextOptions opts_;
  int32_t n_ctx_ = 0;
  std::vector<Sequence> seqs_;
  int32_t ring_window_ = 0;  // sliding-window models: the largest window
  EvalState state_;
  std::vector<float> logits_;
  int32_t logits_rows_ = 0;
  // After eval_seqs: the row of logits_ of each batch token (-1: none); empty after eval().
  std::vector<int32_t> logits_row_of_;
  QualityTally quality_;
  // With a quality target: this context's copy of the gating rule, whose threshold the governor sets.
  GatingConfig governed_gating_;
  std::unique_ptr<QualityGovernor> governor_;
  std::vector<float> meter_logits_, meter_keys_, meter_values_;  // the meter's scratch
  ExpertCounters counters_baseline_;  // the store's counters of this context at the last reset
  double read_busy_seconds_ = 0;      // accrued over evaluations since then
};

}  // namespace moelite
