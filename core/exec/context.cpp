#include "core/exec/context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cinttypes>
#include <new>
#include <string>
#include <thread>

#include "core/experts/expert_source.h"
#include "platforms/platform.h"
#include "core/experts/predictor.h"
#include "core/forward/layer_forward.h"
#include "core/support/abort_scope.h"
#include "core/support/timeline.h"

namespace moelite {

namespace {
// Rows per output-head product: bounds the scratch of a large vocabulary (150k x 4 B per row).
constexpr int32_t kHeadRows = 32;
}  // namespace

Context::~Context() {
  Backend* be = state_.backend;
  if (!be) return;
  const std::unique_lock<std::mutex> turn = backend_turn();
  for (Act* a : {&state_.x, &state_.xn, &state_.q, &state_.k, &state_.v, &state_.attn, &state_.proj,
                 &state_.router_logits, &state_.moe_out, &state_.shared_out, &state_.head_out})
    if (a->handle) be->free_act(a);
  for (Act* a : state_.mla.all())
    if (a->handle) be->free_act(a);
  for (Sequence& q : seqs_)
    if (q.kv.handle) be->free_kv(&q.kv);
}

uint64_t Context::kv_bytes() const {
  uint64_t floats = 0;
  for (const Sequence& q : seqs_)
    for (int32_t slots : q.kv.slots)
      floats += (q.kv.values ? 2 : 1) * static_cast<uint64_t>(slots) * static_cast<uint64_t>(q.kv.kv_dim);
  return floats * sizeof(float);
}

uint64_t Context::estimate_bytes(const HParams& hp, const ContextOptions& opts) {
  // Mirrors create() below: the same n_ctx and n_batch defaults and the same activations.
  const uint64_t n_ctx = static_cast<uint64_t>(opts.n_ctx > 0 ? opts.n_ctx : std::min(hp.n_ctx_train, 4096));
  const uint64_t nb = static_cast<uint64_t>(std::max<int64_t>(1, std::min<int64_t>(opts.n_batch, n_ctx)));
  const uint64_t q_dim = uint64_t(hp.n_head) * uint64_t(hp.head_dim),
                 kv_dim = uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim);
  const uint64_t v_dim = uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim_v);
  const uint64_t act_floats =
      nb * (5 * uint64_t(hp.n_embd) + q_dim + kv_dim + v_dim + uint64_t(hp.n_head) * uint64_t(hp.head_dim_v) +
            uint64_t(hp.n_expert) + mla_scratch_floats(hp)) +
      std::min<uint64_t>(nb, kHeadRows) * uint64_t(hp.n_vocab);
  uint64_t kv_positions = 0;
  for (const int32_t slots : kv_slots(hp, static_cast<int32_t>(n_ctx), static_cast<int32_t>(nb)))
    kv_positions += uint64_t(slots);
  const uint64_t kv_floats = kv_positions * uint64_t(kv_position_floats(hp)) * uint64_t(std::max(1, opts.n_seq));
  // Gate and up outputs of a batch's routed experts (the CPU backend's per-call scratch).
  const uint64_t expert_floats = 2 * nb * uint64_t(hp.n_expert_used) * uint64_t(hp.n_ff_expert);
  return (act_floats + kv_floats + expert_floats) * sizeof(float);
}

// One cached position's floats per layer: a key row plus a value row, or MLA's single shared row.
int64_t Context::kv_row_floats(const HParams& hp) {
  return hp.mla() ? int64_t{hp.kv_lora_rank} + hp.n_rot : int64_t{hp.n_head_kv} * hp.head_dim;
}

namespace {

// Widths of MlaScratch's activations, in its order (all zero for other architectures: none is
// allocated).
std::array<int64_t, MlaScratch::kCount> mla_widths(const HParams& hp) {
  if (!hp.mla()) return {};
  const int64_t H = hp.n_head, r = hp.kv_lora_rank, rot = hp.n_rot;
  return {std::max<int64_t>(1, hp.q_lora_rank),
          H * hp.head_dim,
          H * rot,
          r + rot,
          r,
          rot,
          r + rot,
          H * (r + rot),
          H * r,
          hp.qk_nope(),
          r,
          r,
          hp.head_dim_v};
}

}  // namespace

uint64_t Context::mla_scratch_floats(const HParams& hp) {
  uint64_t n = 0;
  for (int64_t w : mla_widths(hp)) n += static_cast<uint64_t>(w);
  return n;
}

std::vector<int32_t> Context::kv_slots(const HParams& hp, int32_t n_ctx, int32_t n_batch) {
  // A windowed layer's batch reads back window - 1 positions before its first token while writing
  // n_batch: the ring holds both, and never more than the context. All windowed layers get the
  // largest window's ring, so one record of which position each slot holds serves them all.
  const int32_t window = hp.max_window();
  const int32_t ring =
      window > 0 ? static_cast<int32_t>(std::min<int64_t>(n_ctx, int64_t{window} - 1 + n_batch)) : n_ctx;
  std::vector<int32_t> slots(static_cast<size_t>(hp.n_layer), n_ctx);
  for (int32_t l = 0; l < hp.n_layer; ++l)
    if (hp.window_of(l) > 0) slots[static_cast<size_t>(l)] = ring;
  return slots;
}

bool Context::ring_serves(const Sequence& seq, int32_t n_keep) const {
  if (seq.ring_pos.empty()) return true;
  const int32_t slots = static_cast<int32_t>(seq.ring_pos.size());
  for (int32_t p = std::max(0, n_keep - ring_window_ + 1); p < n_keep; ++p)
    if (seq.ring_pos[static_cast<size_t>(p % slots)] != p) return false;
  return true;
}

Status Context::create(const Model& model, Runtime& runtime, const ContextOptions& opts,
                       std::unique_ptr<Context>* out) {
  if (model.vocab_only)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the model was loaded vocabulary-only; contexts need its weights");
  std::unique_ptr<Context> c(new (std::nothrow) Context(model, runtime));
  if (!c) return fail(MOELITE_ERR_OUT_OF_MEMORY, "context");
  const HParams& hp = model.hp;
  c->opts_ = opts;
  c->n_ctx_ = opts.n_ctx > 0 ? opts.n_ctx : std::min(hp.n_ctx_train, 4096);
  c->opts_.n_batch = std::max(1, std::min(opts.n_batch, c->n_ctx_));
  EvalState& s = c->state_;
  s.gating = &runtime.gating;
  const GatingConfig& g = runtime.gating;
  const bool sensitive = g.mode == GatingMode::Sensitivity || g.mode == GatingMode::CacheAware;
  if (opts.quality_target.set) {
    if (!sensitive)
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "a quality target steers sensitivity or cache-aware gating; the model was loaded with %s gating",
                  gating_mode_name(g.mode));
    if (!(opts.min_threshold >= 0.0 && opts.max_threshold >= opts.min_threshold && std::isfinite(opts.min_threshold)))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the quality governor's thresholds [%g, %g] are not a range >= 0",
                  opts.min_threshold, opts.max_threshold);
    c->governed_gating_ = g;
    // With a profile it starts from the model's threshold, else near exact (core/exec/quality_governor.h).
    c->governor_ = std::make_unique<QualityGovernor>(opts.quality_target.kl, opts.min_threshold, opts.max_threshold,
                                                     g.calibrated ? g.threshold : 0.0);
    c->governed_gating_.threshold = static_cast<float>(c->governor_->threshold());
    s.gating = &c->governed_gating_;
    if (!(c->opts_.quality_sample_rate > 0.0)) c->opts_.quality_sample_rate = kDefaultGovernedSampleRate;
  } else if (sensitive && !g.calibrated) {
    return fail(MOELITE_ERR_BAD_PROFILE,
                "%s gating needs a calibration profile with per-layer sensitivities (moelite calibrate; "
                "moelite_model_params_set_profile), or a quality target to learn them from "
                "(moelite_context_params_set_quality_target)",
                gating_mode_name(g.mode));
  }
  s.routed = &runtime.routed;
  s.backend = runtime.backend.get();
  s.experts = runtime.experts.get();
  if (runtime.store) {
    c->store_client_ = runtime.store->open_client(&c->store_client_id_);
    s.experts = c->store_client_.get();
  }
  // With every expert resident nothing of the runtime changes during an evaluation but locked
  // counters, so a context with a backend instance of its own evaluates while others do. With a
  // budget the store is shared: it admits each context's rounds so that all of them can load
  // (ExpertStore::open_client), and keeps each context's counters and predictions. A predictor's
  // guesses follow one evaluation's layers (and some learn online), so such a context guesses
  // with a clone of its own. Contexts still take turns (Runtime::eval_mutex) when cache-aware
  // gating reads which experts are resident (a result would depend on another context's loads
  // between two layers), and on a backend with one command stream (no create_peer).
  s.predictor = runtime.predictor.get();
  const bool store_is_shared_safely = runtime.store && runtime.gating.mode != GatingMode::CacheAware;
  if (runtime.experts->all_resident() || store_is_shared_safely) {
    std::unique_ptr<Backend> peer;
    if (runtime.backend->create_peer(&peer) == MOELITE_OK) {
      c->own_backend_ = std::move(peer);
      s.backend = c->own_backend_.get();
      if (runtime.predictor) {
        // A context without a peer (one whose create_peer failed) evaluates with the runtime's
        // predictor under the lock, learning online: copy its state between evaluations.
        std::lock_guard<std::mutex> turn(runtime.eval_mutex);
        c->own_predictor_ = runtime.predictor->clone();
        s.predictor = c->own_predictor_.get();
      }
    }
  }
  s.routed_tokens.assign(static_cast<size_t>(hp.n_layer), 0);
  s.routed_experts.assign(static_cast<size_t>(hp.n_layer), 0);
  s.on_route = opts.on_route;
  s.route_user = opts.route_user;
  s.n_batch = c->opts_.n_batch;
  Backend& be = *s.backend;
  // Released before `c` is freed on a failure below (its destructor takes the turn again).
  const std::unique_lock<std::mutex> turn = c->backend_turn();
  const int64_t nb = s.n_batch;
  const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim, kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
  const int64_t v_dim = int64_t{hp.n_head_kv} * hp.head_dim_v;
  if (v_dim != kv_dim && !hp.mla())
    return fail(MOELITE_ERR_NOT_IMPLEMENTED, "value head size %d differs from key head size %d", hp.head_dim_v,
                hp.head_dim);
  MOELITE_TRY(be.alloc_act(nb, hp.n_embd, &s.x));
  MOELITE_TRY(be.alloc_act(nb, hp.n_embd, &s.xn));
  MOELITE_TRY(be.alloc_act(nb, q_dim, &s.q));
  MOELITE_TRY(be.alloc_act(nb, kv_dim, &s.k));
  MOELITE_TRY(be.alloc_act(nb, v_dim, &s.v));
  MOELITE_TRY(be.alloc_act(nb, int64_t{hp.n_head} * hp.head_dim_v, &s.attn));
  MOELITE_TRY(be.alloc_act(nb, hp.n_embd, &s.proj));
  MOELITE_TRY(be.alloc_act(nb, hp.n_expert, &s.router_logits));
  MOELITE_TRY(be.alloc_act(nb, hp.n_embd, &s.moe_out));
  MOELITE_TRY(be.alloc_act(nb, hp.n_embd, &s.shared_out));
  MOELITE_TRY(be.alloc_act(std::min<int64_t>(nb, kHeadRows), hp.n_vocab, &s.head_out));
  if (hp.mla()) {
    const std::array<int64_t, MlaScratch::kCount> widths = mla_widths(hp);
    const std::array<Act*, MlaScratch::kCount> acts = s.mla.all();
    for (size_t i = 0; i < widths.size(); ++i) MOELITE_TRY(be.alloc_act(nb, widths[i], acts[i]));
  }
  s.rope = hp.rope;
  s.rope_windowed = hp.rope_windowed;
  const std::vector<float>& factors = c->n_ctx_ > hp.rope_n_ctx_orig ? hp.rope_factors_long : hp.rope_factors_short;
  if (!factors.empty()) s.rope.scaling.freq_factors = s.rope_windowed.scaling.freq_factors = factors.data();
  if (opts.n_seq < 1 || opts.n_seq > kMaxSequences)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "n_seq %d is outside 1..%d", opts.n_seq, kMaxSequences);
  const std::vector<int32_t> slots = kv_slots(hp, c->n_ctx_, c->opts_.n_batch);
  c->seqs_.resize(static_cast<size_t>(opts.n_seq));
  for (Sequence& q : c->seqs_) {
    MOELITE_TRY(be.alloc_kv(c->n_ctx_, slots, kv_row_floats(hp), !hp.mla(), &q.kv));
    for (int32_t l = 0; l < hp.n_layer; ++l)
      if (hp.window_of(l) > 0) {
        c->ring_window_ = std::max(c->ring_window_, hp.window_of(l));
        q.ring_pos.assign(static_cast<size_t>(slots[static_cast<size_t>(l)]), -1);
      }
  }
  *out = std::move(c);
  return MOELITE_OK;
}

ExpertCounters ExpertCounters::take(const Runtime& runtime, int32_t client) {
  ExpertCounters c;
  // Without a store only the routing counters move (the context's store counters stay empty and
  // read as zeros), so a resident evaluation copies nothing else.
  if (runtime.store) {
    c.store = runtime.store->client_stats(client);
    c.read_busy_seconds = runtime.store->read_busy_seconds();
  }
  return c;
}

void ExpertCounters::accrue(const ExpertCounters& before, const ExpertCounters& after) {
  auto add = [](auto& into, auto b, auto a) { into += a >= b ? a - b : a; };
  const size_t n = after.store.size();
  if (store.size() < n) store.resize(n);
  const ExpertLayerStats none{};
  for (size_t l = 0; l < n; ++l) {
    const ExpertLayerStats &b = l < before.store.size() ? before.store[l] : none, &a = after.store[l];
    ExpertLayerStats& t = store[l];
    ExpertLayerStats::for_each_counter([&](auto counter) { add(t.*counter, b.*counter, a.*counter); });
  }
  add(read_busy_seconds, before.read_busy_seconds, after.read_busy_seconds);
}

ExpertCounters Context::counters() const {
  ExpertCounters c;
  c.accrue(counters_baseline_, ExpertCounters::take(runtime_, store_client_id_));
  c.read_busy_seconds = read_busy_seconds_;
  return c;
}

void Context::reset_counters() {
  counters_baseline_ = ExpertCounters::take(runtime_, store_client_id_);
  read_busy_seconds_ = 0;
  std::fill(state_.routed_tokens.begin(), state_.routed_tokens.end(), 0);
  std::fill(state_.routed_experts.begin(), state_.routed_experts.end(), 0);
}

Status Context::eval(const int32_t* tokens, int32_t n_tokens, bool logits_all) {
  if (n_tokens <= 0 || !tokens) return fail(MOELITE_ERR_INVALID_ARGUMENT, "eval needs at least one token");
  std::vector<uint8_t> want;
  if (logits_all) want.assign(static_cast<size_t>(n_tokens), 1);
  MOELITE_TRY(eval_seqs(tokens, nullptr, logits_all ? want.data() : nullptr, n_tokens));
  logits_row_of_.clear();  // eval()'s indexing: every token's row, or only the last one's
  return MOELITE_OK;
}

namespace {

// Where a call's tokens go: each sequence's tokens side by side, sequences in id order (a counting
// sort keeps the given order within a sequence), and each token's row of logits, its place among
// the wanted ones in this order (-1: none wanted).
struct BatchLayout {
  std::vector<int32_t> order;   // batch position -> index of the token in the call
  std::vector<int32_t> row_of;  // index in the call -> row of logits, or -1
  int32_t n_rows = 0;
};

BatchLayout lay_out_batch(const int32_t* seq_ids, const uint8_t* want_logits, int32_t n_tokens,
                          const std::vector<int32_t>& count) {
  auto seq_of = [&](int32_t i) { return seq_ids ? seq_ids[i] : 0; };
  const size_t n_seq = count.size();
  BatchLayout l;
  l.order.resize(static_cast<size_t>(n_tokens));
  std::vector<int32_t> first(n_seq + 1, 0);
  for (size_t q = 0; q < n_seq; ++q) first[q + 1] = first[q] + count[q];
  std::vector<int32_t> next(first.begin(), first.end() - 1);
  for (int32_t i = 0; i < n_tokens; ++i) l.order[static_cast<size_t>(next[static_cast<size_t>(seq_of(i))]++)] = i;
  l.row_of.assign(static_cast<size_t>(n_tokens), -1);
  for (int32_t j = 0; j < n_tokens; ++j) {
    const int32_t i = l.order[static_cast<size_t>(j)];
    const bool last_of_seq = j + 1 == first[static_cast<size_t>(seq_of(i)) + 1];
    if (want_logits ? want_logits[i] != 0 : last_of_seq) l.row_of[static_cast<size_t>(i)] = l.n_rows++;
  }
  return l;
}

// The "evaluate" span of a call on the timeline, recorded however the call ends.
class EvaluationSpan {
 public:
  EvaluationSpan(const std::shared_ptr<TimelineRecorder>& trace, int32_t n_tokens)
      : trace_(trace), start_(trace ? TimelineRecorder::now_us() : 0.0), n_tokens_(n_tokens) {}
  ~EvaluationSpan() {
    if (trace_)
      trace_->complete("evaluate", "context", "evaluation", start_, TimelineRecorder::now_us(), {{"tokens", n_tokens_}});
  }

 private:
  std::shared_ptr<TimelineRecorder> trace_;
  double start_;
  int32_t n_tokens_;
};

// Contexts evaluating at once on backend instances of their own split the cores: each counts
// itself in for the call (eval_batch sets its share per layer).
class ConcurrentEvaluation {
 public:
  explicit ConcurrentEvaluation(std::atomic<int32_t>* count) : count_(count) {
    if (count_) count_->fetch_add(1);
  }
  ~ConcurrentEvaluation() {
    if (count_) count_->fetch_sub(1);
  }

 private:
  std::atomic<int32_t>* count_;
};

// The storage's read-busy time during a call, added to the context's when the call ends. The store
// keeps each context's counters apart (its client), but busy time is the storage's, shared with
// contexts evaluating at the same time.
class ReadBusyAccrual {
 public:
  ReadBusyAccrual(const ExpertStore* store, double* total)
      : store_(store), total_(total), before_(store ? store->read_busy_seconds() : 0.0) {}
  ~ReadBusyAccrual() {
    if (!store_) return;
    const double after = store_->read_busy_seconds();
    *total_ += after >= before_ ? after - before_ : after;  // lower: reset meanwhile
  }

 private:
  const ExpertStore* store_;
  double* total_;
  double before_;
};

}  // namespace

Status Context::check_batch(const int32_t* tokens, const int32_t* seq_ids, int32_t n_tokens,
                            std::vector<int32_t>* count) const {
  const HParams& hp = model_.hp;
  if (n_tokens <= 0 || !tokens) return fail(MOELITE_ERR_INVALID_ARGUMENT, "eval needs at least one token");
  const int32_t n_seq = this->n_seq();
  count->assign(static_cast<size_t>(n_seq), 0);
  for (int32_t i = 0; i < n_tokens; ++i) {
    const int32_t q = seq_ids ? seq_ids[i] : 0;
    if (tokens[i] < 0 || tokens[i] >= hp.n_vocab)
      return fail(MOELITE_ERR_BAD_TOKEN, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                  hp.n_vocab);
    if (q < 0 || q >= n_seq)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "sequence id %d at index %d is outside 0..%d", q, i, n_seq - 1);
    ++(*count)[static_cast<size_t>(q)];
  }
  for (int32_t q = 0; q < n_seq; ++q) {
    const int32_t have = seqs_[static_cast<size_t>(q)].n_past, add = (*count)[static_cast<size_t>(q)];
    if (add > n_ctx_ - have)
      return fail(MOELITE_ERR_CONTEXT_FULL, "%d tokens do not fit sequence %d: %d of %d context positions are used",
                  add, q, have, n_ctx_);
  }
  return MOELITE_OK;
}

void Context::roll_back(const std::vector<int32_t>& start) {
  for (size_t q = 0; q < seqs_.size(); ++q) {
    Sequence& seq = seqs_[q];
    seq.n_past = start[q];                // cache rows past n_past are dead; the sequence is as before...
    if (!ring_serves(seq, seq.n_past)) {  // ...unless earlier batches of this call moved a window's ring past it
      seq.n_past = 0;
      seq.tokens.clear();
    }
  }
}

Status Context::eval_seqs(const int32_t* tokens, const int32_t* seq_ids, const uint8_t* want_logits, int32_t n_tokens) {
  const HParams& hp = model_.hp;
  std::vector<int32_t> count;
  MOELITE_TRY(check_batch(tokens, seq_ids, n_tokens, &count));
  auto seq_of = [&](int32_t i) { return seq_ids ? seq_ids[i] : 0; };
  BatchLayout layout = lay_out_batch(seq_ids, want_logits, n_tokens, count);
  std::vector<float> out(static_cast<size_t>(layout.n_rows) * static_cast<size_t>(hp.n_vocab));
  std::vector<int32_t> start(seqs_.size());
  for (size_t q = 0; q < seqs_.size(); ++q) start[q] = seqs_[q].n_past;

  // Waits below (this lock, the expert store's loads) poll this context's abort callback.
  AbortScope abort_scope(opts_.abort, opts_.abort_user);
  state_.trace = std::atomic_load(&runtime_.trace);
  const EvaluationSpan span(state_.trace, n_tokens);
  std::unique_lock<std::mutex> lock(runtime_.eval_mutex, std::defer_lock);
  if (!own_backend_) MOELITE_TRY(lock_abortable(&lock));
  const ConcurrentEvaluation concurrent(own_backend_ ? &runtime_.concurrent_evaluations : nullptr);
  const ReadBusyAccrual busy(runtime_.store, &read_busy_seconds_);
  std::vector<int32_t> batch_tokens, head_rows;
  int32_t rows_done = 0;
  for (int32_t done = 0; done < n_tokens;) {
    const int32_t n = std::min(opts_.n_batch, n_tokens - done);
    EvalState& s = state_;
    batch_tokens.clear();
    head_rows.clear();
    s.positions.clear();
    s.segments.clear();
    for (int32_t j = done; j < done + n; ++j) {
      const int32_t i = layout.order[static_cast<size_t>(j)], q = seq_of(i), row = j - done;
      Sequence& seq = seqs_[static_cast<size_t>(q)];
      if (s.segments.empty() || s.segments.back().seq != q)
        s.segments.push_back(AttentionSegment{q, &seq.kv, row, 0, seq.n_past});
      const int32_t pos = s.segments.back().pos0 + s.segments.back().n++;
      batch_tokens.push_back(tokens[i]);
      s.positions.push_back(pos);
      if (layout.row_of[static_cast<size_t>(i)] >= 0) head_rows.push_back(row);
      // Recorded before the batch runs: a failure part way may have overwritten these slots in
      // some windowed layers, and the rollback below must assume it did.
      if (!seq.ring_pos.empty()) seq.ring_pos[static_cast<size_t>(pos) % seq.ring_pos.size()] = pos;
    }
    Status st;
    const bool gated = runtime_.gating.mode != GatingMode::Exact;
    const double predicted_before = s.predicted_loss;
    float* const batch_logits = out.data() + static_cast<size_t>(rows_done) * static_cast<size_t>(hp.n_vocab);
    try {
      st = eval_batch(batch_tokens.data(), n, head_rows.data(), static_cast<int32_t>(head_rows.size()), batch_logits);
      // The quality meter takes decode steps (a token per sequence) at sampled positions.
      bool metered = st == MOELITE_OK && gated && opts_.quality_sample_rate > 0.0 && !head_rows.empty() &&
                     quality_meter_samples(opts_.quality_sample_rate, s.segments[0].seq, s.segments[0].pos0,
                                           quality_.tokens);
      for (const AttentionSegment& g : s.segments) metered = metered && g.n == 1;
      if (metered)
        st = meter_batch(batch_tokens.data(), n, head_rows.data(), static_cast<int32_t>(head_rows.size()),
                         batch_logits, s.predicted_loss - predicted_before);
    } catch (const std::bad_alloc&) {  // cleaned up below like any other failure
      st = fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory during evaluation");
    }
    if (st == MOELITE_OK && gated) {
      quality_.tokens += static_cast<uint64_t>(n);
      quality_.predicted_loss += s.predicted_loss - predicted_before;
      if (governor_) {  // the next batch gates at the governor's new threshold
        governor_->on_evaluated(n, s.predicted_loss - predicted_before);
        governed_gating_.threshold = static_cast<float>(governor_->threshold());
      }
    }
    if (st != MOELITE_OK) {
      // Let a device finish (or drop) what was recorded before the failure, so the next call
      // starts clean; the first failure's message is the one reported.
      const std::string msg = last_error_message();
      (void)state_.backend->sync();
      fail(st, "%s", msg.c_str());
      roll_back(start);
      return st;
    }
    for (const AttentionSegment& g : s.segments) seqs_[static_cast<size_t>(g.seq)].n_past += g.n;
    rows_done += static_cast<int32_t>(head_rows.size());
    done += n;
  }
  for (int32_t j = 0; j < n_tokens; ++j) {
    const int32_t i = layout.order[static_cast<size_t>(j)];
    seqs_[static_cast<size_t>(seq_of(i))].tokens.push_back(tokens[i]);
  }
  logits_ = std::move(out);
  logits_rows_ = layout.n_rows;
  logits_row_of_ = std::move(layout.row_of);
  return MOELITE_OK;
}

Status Context::meter_batch(const int32_t* tokens, int32_t n, const int32_t* head_rows, int32_t n_head,
                            const float* gated_logits, double predicted_loss) {
  const double t0 = platform::now_seconds();
  const double trace_start = state_.trace ? TimelineRecorder::now_us() : 0.0;
  EvalState& s = state_;
  Backend& be = *s.backend;
  const int32_t n_layer = model_.hp.n_layer;
  // The gated pass's cache rows of these positions, which the exact pass overwrites.
  const int64_t kv_dim = s.segments[0].kv->kv_dim;
  const size_t row_floats = static_cast<size_t>(kv_dim);
  const size_t rows = s.segments.size() * static_cast<size_t>(n_layer);
  meter_keys_.resize(rows * row_floats);
  meter_values_.resize(rows * row_floats);
  auto slot_of = [](const AttentionSegment& g, int32_t l) { return g.pos0 % g.kv->slots[static_cast<size_t>(l)]; };
  size_t at = 0;
  for (const AttentionSegment& g : s.segments)
    for (int32_t l = 0; l < n_layer; ++l, at += row_floats)
      MOELITE_TRY(be.read_kv(*g.kv, l, slot_of(g, l), 1, meter_keys_.data() + at,
                             g.kv->values ? meter_values_.data() + at : nullptr));
  // The exact pass: exact routing, no predictor, no observers, no routing counters.
  meter_logits_.resize(static_cast<size_t>(n_head) * static_cast<size_t>(model_.hp.n_vocab));
  static const GatingConfig kExact;
  const GatingConfig* gating = s.gating;
  ExpertPredictor* predictor = s.predictor;
  ForwardHooks* hooks = s.hooks;
  const moelite_routing_fn on_route = s.on_route;
  s.gating = &kExact;
  s.predictor = nullptr;
  s.hooks = nullptr;
  s.on_route = nullptr;
  s.metering = true;
  Status st = eval_batch(tokens, n, head_rows, n_head, meter_logits_.data());
  s.gating = gating;
  s.predictor = predictor;
  s.hooks = hooks;
  s.on_route = on_route;
  s.metering = false;
  // The context keeps the gated rows, whatever the exact pass did.
  at = 0;
  for (const AttentionSegment& g : s.segments)
    for (int32_t l = 0; l < n_layer; ++l, at += row_floats) {
      const Status put = be.write_kv(g.kv, l, slot_of(g, l), 1, meter_keys_.data() + at,
                                     g.kv->values ? meter_values_.data() + at : nullptr);
      if (st == MOELITE_OK) st = put;
    }
  MOELITE_TRY(st);
  const size_t n_vocab = static_cast<size_t>(model_.hp.n_vocab);
  double kl_batch = 0.0;
  for (int32_t r = 0; r < n_head; ++r) {
    const NextTokenComparison c = compare_next_token(meter_logits_.data() + static_cast<size_t>(r) * n_vocab,
                                                     gated_logits + static_cast<size_t>(r) * n_vocab,
                                                     model_.hp.n_vocab);
    ++quality_.metered;
    quality_.kl_sum += c.kl;
    kl_batch += c.kl;
    quality_.kl_squares += c.kl * c.kl;
    quality_.top1_agreements += c.same_top1 ? 1 : 0;
  }
  quality_.predicted_metered += predicted_loss;
  if (governor_) governor_->on_metered(n_head, kl_batch, predicted_loss);
  ++quality_.exact_passes;
  quality_.meter_seconds += platform::now_seconds() - t0;
  // On the timeline: the exact pass with its cache rows saved and restored (its layers and
  // experts show inside it, as any evaluation's do).
  if (s.trace)
    s.trace->complete("quality meter", "context", "evaluation", trace_start, TimelineRecorder::now_us(),
                      {{"tokens", n}, {"kl_ppm", static_cast<int64_t>(kl_batch / n_head * 1e6)}});
  return MOELITE_OK;
}

std::unique_lock<std::mutex> Context::backend_turn() const {
  if (own_backend_) return std::unique_lock<std::mutex>();
  return std::unique_lock<std::mutex>(runtime_.eval_mutex);
}

// Contexts of one model take turns (Runtime::eval_mutex). A context whose turn is far off (another
// one is prefilling a long prompt) must still honour its abort callback, so the lock is polled
// rather than waited for (only by contexts that have a callback; the others block as before).
Status Context::lock_abortable(std::unique_lock<std::mutex>* lock) {
  if (!opts_.abort) {
    lock->lock();  // nothing to poll: block
    return MOELITE_OK;
  }
  if (lock->try_lock()) return MOELITE_OK;
  for (;;) {
    if (opts_.abort && opts_.abort(opts_.abort_user))
      return fail(MOELITE_ERR_ABORTED, "evaluation aborted by the abort callback while waiting for another context");
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(kAbortPollSeconds);
    while (std::chrono::steady_clock::now() < until) {
      if (lock->try_lock()) return MOELITE_OK;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

Status Context::eval_batch(const int32_t* tokens, int32_t n, const int32_t* head_rows, int32_t n_head,
                           float* logits_out) {
  const Model& m = model_;
  const HParams& hp = m.hp;
  EvalState& s = state_;
  Backend& be = *s.backend;
  s.n_tokens = n;
  s.pos0 = s.positions.front();

  Act x = s.rows(s.x);
  s.has_next_routing = false;
  MOELITE_TRY(be.get_rows(m.tok_embd, tokens, n, &x));
  if (hp.embedding_scale != 1.0f) MOELITE_TRY(be.scale(&x, hp.embedding_scale));
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    if (opts_.abort && opts_.abort(opts_.abort_user))
      return fail(MOELITE_ERR_ABORTED, "evaluation aborted by the abort callback at layer %d", l);
    // Each layer takes this context's share of the threads as it stands now: all of them alone,
    // an equal part while other contexts evaluate (a pool each would oversubscribe the cores).
    if (own_backend_)
      be.limit_threads(std::max(1, be.n_threads() / std::max(1, runtime_.concurrent_evaluations.load())));
    MOELITE_TRY(forward_layer(m, s, l));
  }
  if (s.hooks) {
    s.host_a.resize(static_cast<size_t>(n) * static_cast<size_t>(hp.n_embd));
    MOELITE_TRY(be.read_rows(x, 0, n, s.host_a.data()));
    s.hooks->on_final(s.host_a.data(), n);
  }
  if (s.predictor && s.predictor->wants_final() && decode_sized(n, s.segments.size()))
    MOELITE_TRY(predict_next_token(n));
  // Work a device backend recorded and ran without being waited for fails here at the latest.
  if (n_head == 0) return be.sync();

  // Output head, only on the rows whose logits are wanted: runs of adjacent rows at a time.
  for (int32_t j = 0; j < n_head;) {
    const int32_t r0 = head_rows[j];
    int32_t rows = 1;
    while (j + rows < n_head && rows < kHeadRows && head_rows[j + rows] == r0 + rows) ++rows;
    Act xr = be.view_rows(s.x, r0, rows), xn = be.view_rows(s.xn, r0, rows);
    Act head = be.view_rows(s.head_out, 0, rows);
    MOELITE_TRY(be.rms_norm(xr, m.output_norm.data(), hp.n_embd, hp.rms_eps, &xn));
    if (!m.output_norm_b.empty()) MOELITE_TRY(be.add_bias(&xn, m.output_norm_b.data()));
    MOELITE_TRY(be.matmul(m.output, xn, m.output_b.empty() ? nullptr : m.output_b.data(), &head));
    float* dst = logits_out + static_cast<size_t>(j) * hp.n_vocab;
    MOELITE_TRY(be.read_rows(head, 0, rows, dst));
    if (hp.logit_scale != 1.0f) {  // as llama.cpp: times the float 1 / logit_scale
      const float inv = 1.0f / hp.logit_scale;
      for (size_t i = 0; i < static_cast<size_t>(rows) * static_cast<size_t>(hp.n_vocab); ++i) dst[i] *= inv;
    }
    j += rows;
  }
  return be.sync();
}

// The next token's first layers are guessed from this token's final state (output-normed, as the
// output head sees it), so their experts load while the caller samples.
Status Context::predict_next_token(int32_t n) {
  const Model& m = model_;
  EvalState& s = state_;
  Backend& be = *s.backend;
  // Each sequence's next token follows its last row (one sequence: the batch's last row); the
  // guesses of all of them go to the store as one hint, which replaces the one before. The batch
  // is decode-sized, so norming and reading back all its rows at once costs less than a call and
  // a read-back per sequence (a row's norm does not depend on the rows beside it).
  const size_t width = static_cast<size_t>(m.hp.n_embd);
  Act rows = be.view_rows(s.x, 0, n), normed = be.view_rows(s.xn, 0, n);
  MOELITE_TRY(be.rms_norm(rows, m.output_norm.data(), m.hp.n_embd, m.hp.rms_eps, &normed));
  s.host_b.resize(static_cast<size_t>(n) * width);
  MOELITE_TRY(be.read_rows(normed, 0, n, s.host_b.data()));
  std::vector<Prediction> guesses;
  auto guess_after = [&](int32_t row) {
    s.predictor->after_token(s.host_b.data() + static_cast<size_t>(row) * width, &guesses);
  };
  if (s.segments.empty()) guess_after(n - 1);
  for (const AttentionSegment& g : s.segments) guess_after(g.row0 + g.n - 1);
  if (!guesses.empty()) s.experts->hint(guesses, -1);
  return MOELITE_OK;
}

const float* Context::logits(int32_t i) const {
  if (logits_rows_ == 0) return nullptr;
  const int32_t n = logits_row_of_.empty() ? logits_rows_ : static_cast<int32_t>(logits_row_of_.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return nullptr;
  const int32_t row = logits_row_of_.empty() ? i : logits_row_of_[static_cast<size_t>(i)];
  if (row < 0) return nullptr;
  return logits_.data() + static_cast<size_t>(row) * static_cast<size_t>(model_.hp.n_vocab);
}

void Context::truncate(int32_t n_keep, int32_t seq_id) {
  Sequence& seq = seqs_[static_cast<size_t>(seq_id)];
  seq.n_past = std::clamp(n_keep, 0, seq.n_past);
  if (!ring_serves(seq, seq.n_past)) seq.n_past = 0;  // a window's ring no longer holds what the next token reads
  seq.tokens.resize(static_cast<size_t>(seq.n_past));
  logits_.clear();
  logits_rows_ = 0;
  logits_row_of_.clear();
}

}  // namespace moelite
