#include "core/calibrate/calibrate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <thread>

#include "base/quant_ref.h"
#include "core/calibrate/ridge.h"
#include "core/exec/context.h"
#include "core/experts/predictor.h"
#include "core/experts/trace_replay.h"

namespace moelite {

namespace {

// Hidden states kept for predictor fitting are bounded: beyond this many bytes, later tokens only
// contribute routing statistics.
constexpr uint64_t kCaptureBytes = uint64_t{1} << 30;

// out = x / rms(x) * w (n values), in double as the backends do.
void rms_normed(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0.0;
  for (int64_t c = 0; c < n; ++c) ss += static_cast<double>(x[c]) * x[c];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t c = 0; c < n; ++c) out[c] = static_cast<float>(x[c] * inv * w[c]);
}

// What one exact pass records, per (token, layer).
struct Record {
  int32_t n_layer = 0, k = 0, d = 0;
  int64_t capture_limit = 0;         // tokens whose hidden states are kept
  std::vector<int32_t> ids;          // [token][layer][k]
  std::vector<float> weights;        // same, after renormalisation, before the scale
  std::vector<float> x_mid, xn;      // [token][layer][d]: residual after attention, MoE input
  std::vector<float> final_state;    // [token][d], output-normed
  std::vector<uint8_t> window_last;  // 1 for a window's last token (no successor)
};

// Observes exact passes (recording) or perturbs one layer's tail weight (sensitivity passes).
class Hooks final : public ForwardHooks {
 public:
  Hooks(const Model& m, Record* rec) : m_(m), rec_(rec) {}
  void record(int64_t base) {
    base_ = base;
    perturb_layer_ = -1;
  }
  void perturb(int32_t layer, double alpha) {
    perturb_layer_ = layer;
    alpha_ = alpha;
    dropped_sq_ = 0.0;
  }
  double dropped_sq() const { return dropped_sq_; }

  void on_moe_input(int32_t layer, const float* x_mid, const float* xn, int32_t n) override {
    if (perturb_layer_ >= 0) return;
    const size_t d = static_cast<size_t>(rec_->d), L = static_cast<size_t>(rec_->n_layer);
    for (int32_t t = 0; t < n; ++t) {
      const int64_t tok = base_ + t;
      if (tok >= rec_->capture_limit) break;
      const size_t at = (static_cast<size_t>(tok) * L + static_cast<size_t>(layer)) * d;
      std::copy(x_mid + t * d, x_mid + (t + 1) * d, rec_->x_mid.begin() + static_cast<std::ptrdiff_t>(at));
      std::copy(xn + t * d, xn + (t + 1) * d, rec_->xn.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }

  void on_routing(int32_t layer, Routing* r) override {
    const int32_t k = r->k;
    if (perturb_layer_ < 0) {
      const size_t L = static_cast<size_t>(rec_->n_layer);
      for (int32_t t = 0; t < r->n_tokens; ++t) {
        const size_t at = (static_cast<size_t>(base_ + t) * L + static_cast<size_t>(layer)) * static_cast<size_t>(k);
        std::copy(r->ids.begin() + t * k, r->ids.begin() + (t + 1) * k,
                  rec_->ids.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(r->weights.begin() + t * k, r->weights.begin() + (t + 1) * k,
                  rec_->weights.begin() + static_cast<std::ptrdiff_t>(at));
      }
      return;
    }
    if (layer != perturb_layer_ || k < 2) return;
    // The lowest-weight slot (ties: the later slot) is scaled by alpha; the k weights are rescaled
    // to their old sum, as adaptive gating does when it drops an expert.
    for (int32_t t = 0; t < r->n_tokens; ++t) {
      float* w = r->weights.data() + t * k;
      int32_t lo = 0;
      for (int32_t j = 1; j < k; ++j)
        if (w[j] <= w[lo]) lo = j;
      double before = 0.0;
      for (int32_t j = 0; j < k; ++j) before += w[j];
      const double d = (1.0 - alpha_) * w[lo];
      dropped_sq_ += d * d;
      w[lo] = static_cast<float>(w[lo] * alpha_);
      if (alpha_ == 0.0) r->ids[static_cast<size_t>(t * k + lo)] = -1;
      double after = 0.0;
      for (int32_t j = 0; j < k; ++j) after += w[j];
      const float scale = after > 0.0 ? static_cast<float>(before / after) : 1.0f;
      for (int32_t j = 0; j < k; ++j) w[j] *= scale;
    }
  }

  void on_final(const float* x, int32_t n) override {
    if (perturb_layer_ >= 0) return;
    const size_t d = static_cast<size_t>(rec_->d);
    for (int32_t t = 0; t < n; ++t) {
      const int64_t tok = base_ + t;
      rec_->window_last[static_cast<size_t>(tok)] = t + 1 == n;
      if (tok >= rec_->capture_limit) continue;
      rms_normed(x + t * d, m_.output_norm.data(), static_cast<int64_t>(d), m_.hp.rms_eps,
                 rec_->final_state.data() + static_cast<size_t>(tok) * d);
    }
  }

 private:
  const Model& m_;
  Record* rec_;
  int64_t base_ = 0;
  int32_t perturb_layer_ = -1;
  double alpha_ = 1.0, dropped_sq_ = 0.0;
};

// Runs fn(0) .. fn(n - 1) on up to n_threads threads (the caller's included); each index once.
// Where a thread cannot be started, the threads already running (or the caller alone) do the
// rest. fn must not throw (the predictor tasks catch their own std::bad_alloc).
template <class Fn>
void parallel_for(int n_threads, int64_t n, const Fn& fn) {
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < n_threads && t < n; ++t) {
    try {
      threads.emplace_back(work);
    } catch (...) {  // std::system_error, or std::bad_alloc for the thread's state: fewer threads
      break;
    }
  }
  work();
  for (std::thread& t : threads) t.join();
}

// The reference distribution of a window's rows, kept in the form the KL needs: P (probabilities),
// and per row sum_v P_v log P_v and sum_v P_v (1 up to rounding).
struct RefDist {
  int32_t rows = 0, n_vocab = 0;
  std::vector<double> p, plogp, psum;
};

void reference_dist(const float* logits, int32_t rows, int32_t n_vocab, int n_threads, RefDist* out) {
  out->rows = rows;
  out->n_vocab = n_vocab;
  out->p.resize(static_cast<size_t>(rows) * static_cast<size_t>(n_vocab));
  out->plogp.assign(static_cast<size_t>(rows), 0.0);
  out->psum.assign(static_cast<size_t>(rows), 0.0);
  parallel_for(n_threads, rows, [&](int64_t r) {
    const float* l = logits + static_cast<size_t>(r) * n_vocab;
    double* p = out->p.data() + static_cast<size_t>(r) * n_vocab;
    double mx = l[0];
    for (int32_t v = 1; v < n_vocab; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    double sum = 0.0;
    for (int32_t v = 0; v < n_vocab; ++v) sum += (p[v] = std::exp(l[v] - mx));
    const double lse = mx + std::log(sum), inv = 1.0 / sum;
    double plogp = 0.0, psum = 0.0;
    for (int32_t v = 0; v < n_vocab; ++v) {
      p[v] *= inv;
      plogp += p[v] * (l[v] - lse);
      psum += p[v];
    }
    out->plogp[static_cast<size_t>(r)] = plogp;
    out->psum[static_cast<size_t>(r)] = psum;
  });
}

// sum over rows of KL(P || Q), Q given as logits: per row
//   sum_v P_v (log P_v - log Q_v) = sum_v P_v log P_v - sum_v P_v q_v + lse(q) sum_v P_v,
// one exp per logit (the log-sum-exp of q) and no row of log Q stored; in double, as before.
double kl_sum(const RefDist& ref, const float* q_logits, int n_threads, std::vector<double>* row_kl) {
  const int32_t V = ref.n_vocab;
  row_kl->assign(static_cast<size_t>(ref.rows), 0.0);
  parallel_for(n_threads, ref.rows, [&](int64_t r) {
    const float* q = q_logits + static_cast<size_t>(r) * V;
    const double* p = ref.p.data() + static_cast<size_t>(r) * V;
    double mx = q[0];
    for (int32_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(q[v]));
    double sum = 0.0, pq = 0.0;
    for (int32_t v = 0; v < V; ++v) {
      sum += std::exp(q[v] - mx);
      pq += p[v] * q[v];
    }
    const double lse = mx + std::log(sum);
    (*row_kl)[static_cast<size_t>(r)] = ref.plogp[static_cast<size_t>(r)] - pq + lse * ref.psum[static_cast<size_t>(r)];
  });
  double kl = 0.0;  // summed in row order: the same for any thread count
  for (double v : *row_kl) kl += v;
  return kl;
}

// A router (or pre-gate) as a linear map with its bias (if any), for predicting offline as the
// learned predictors do.
LinearMap as_linear_map(const WeightView& w, const std::vector<float>& bias = {}) {
  LinearMap m;
  m.rows = static_cast<int32_t>(w.rows);
  m.n_in = static_cast<int32_t>(w.cols);
  m.w.assign(static_cast<size_t>(w.rows * (w.cols + 1)), 0.0f);
  DequantRowFn dq = dequant_row_fn(w.type);
  for (int64_t r = 0; r < w.rows; ++r) {
    dq(w.data + r * w.row_bytes, m.w.data() + r * (w.cols + 1), w.cols);
    if (!bias.empty()) m.w[static_cast<size_t>(r * (w.cols + 1) + w.cols)] = bias[static_cast<size_t>(r)];
  }
  return m;
}

// Accuracy bookkeeping: used experts of a layer that a predictor named.
struct Hits {
  double named = 0, used = 0;
  void add(const std::vector<int32_t>& predicted, const int32_t* actual, int32_t k) {
    for (int32_t j = 0; j < k; ++j) {
      if (actual[j] < 0) continue;
      used += 1;
      if (std::find(predicted.begin(), predicted.end(), actual[j]) != predicted.end()) named += 1;
    }
  }
  double share() const { return used > 0 ? named / used : std::numeric_limits<double>::quiet_NaN(); }
};

}  // namespace

int64_t default_sensitivity_tokens(int32_t n_layer) {
  return std::max<int64_t>(kMinSensitivityTokens, kSensitivityTokenPasses / (2 * std::max(1, n_layer)));
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status check_calibrate_options(const Runtime& rt, const std::vector<int32_t>& tokens, const CalibrateOptions& o,
                               int32_t n_layer) {
  if (tokens.size() < 2) return fail(MOELITE_ERR_INVALID_ARGUMENT, "calibration needs at least two tokens");
  if (o.window < 2) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the calibration window must be at least 2 tokens");
  if (!(o.holdout > 0.0 && o.holdout < 1.0))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the held-out share must lie in (0, 1)");
  if (!(o.fd_alpha > 0.0 && o.fd_alpha < 1.0))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the finite-difference alpha must lie in (0, 1)");
  if (o.stride < 1 || o.stride >= std::max(2, n_layer))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "the predictor stride must lie in [1, n_layer)");
  if (rt.gating.mode != GatingMode::Exact)
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "calibrate a model loaded with exact gating (the profile describes the exact routing)");
  return MOELITE_OK;
}

// What the phases of calibrate() share: the model's sizes, the windows, the exact passes' record
// and the sensitivity passes' sums, and the progress reported so far.
struct Calibration {
  const Model& m;
  Runtime& rt;
  const CalibrateOptions& o;
  const std::vector<int32_t>& tokens;
  int32_t L, E, k, D, V;
  int64_t n = 0;  // tokens calibrated on
  int n_threads = 1;
  std::vector<int64_t> starts;       // each window's first token
  std::vector<uint8_t> sens_window;  // 1: the window gets sensitivity passes
  int64_t n_sens = 0;
  Record rec;
  // Per layer: the KL divergence of the output with the tail expert dropped (alpha 0) or scaled by
  // fd_alpha, and the squared weight removed.
  std::vector<double> kl_drop, sq_drop, kl_fd, sq_fd;
  int64_t sens_tokens = 0;
  double pass_units = 0, total_units = 0, done_units = 0;

  Calibration(const Model& model, Runtime& runtime, const CalibrateOptions& options, const std::vector<int32_t>& t)
      : m(model),
        rt(runtime),
        o(options),
        tokens(t),
        L(model.hp.n_layer),
        E(model.hp.n_expert),
        k(model.hp.n_expert_used),
        D(model.hp.n_embd),
        V(model.hp.n_vocab) {}
  size_t slot(int64_t t, int32_t l) const { return static_cast<size_t>((t * L + l) * k); }
  const float* xn_at(int64_t t, int32_t l) const { return rec.xn.data() + static_cast<size_t>((t * L + l) * D); }
  // The k experts token t used at layer l as a multi-hot vector of E.
  void multi_hot(int64_t t, int32_t l, std::vector<float>* y) const {
    std::fill(y->begin(), y->end(), 0.0f);
    for (int32_t j = 0; j < k; ++j)
      if (rec.ids[slot(t, l) + static_cast<size_t>(j)] >= 0)
        (*y)[static_cast<size_t>(rec.ids[slot(t, l) + static_cast<size_t>(j)])] = 1.0f;
  }
  // Adds `units` of work done; false when the progress callback asks to stop.
  bool report(double units) {
    done_units += units;
    return !o.progress || o.progress(static_cast<float>(std::min(1.0, done_units / total_units)), o.progress_user) != 0;
  }
};

Status cancelled() { return fail(MOELITE_ERR_PROGRESS_ABORTED, "calibration cancelled by the progress callback"); }

// The tokens, the record's buffers, the windows and those the sensitivity passes run on: evenly
// spread over the corpus, enough of them for o.sensitivity_tokens (all when that covers the corpus).
void plan_calibration(Calibration& c) {
  const CalibrateOptions& o = c.o;
  // A last window of one token has nothing to score: it is left out.
  c.n = static_cast<int64_t>(c.tokens.size());
  if (c.n > o.window && c.n % o.window == 1) --c.n;
  const int64_t n = c.n;
  Record& rec = c.rec;
  rec.n_layer = c.L;
  rec.k = c.k;
  rec.d = c.D;
  const uint64_t per_token = (uint64_t(2) * uint64_t(c.L) + 1) * uint64_t(c.D) * sizeof(float);
  rec.capture_limit = std::min<int64_t>(n, static_cast<int64_t>(kCaptureBytes / per_token));
  rec.ids.assign(static_cast<size_t>(n * c.L * c.k), -1);
  rec.weights.assign(static_cast<size_t>(n * c.L * c.k), 0.0f);
  rec.x_mid.assign(static_cast<size_t>(rec.capture_limit * c.L * c.D), 0.0f);
  rec.xn.assign(rec.x_mid.size(), 0.0f);
  rec.final_state.assign(static_cast<size_t>(rec.capture_limit * c.D), 0.0f);
  rec.window_last.assign(static_cast<size_t>(n), 0);
  c.n_threads = std::max(1, c.rt.backend->n_threads());

  for (int64_t w0 = 0; w0 < n; w0 += o.window) {
    if (std::min<int64_t>(o.window, n - w0) < 2 && w0 > 0) break;
    c.starts.push_back(w0);
  }
  const int64_t n_windows = static_cast<int64_t>(c.starts.size());
  const int64_t sens_budget = o.sensitivity_tokens < 0 ? default_sensitivity_tokens(c.L) : o.sensitivity_tokens;
  if (c.k >= 2)
    c.n_sens = sens_budget == 0 || sens_budget >= n
                   ? n_windows
                   : std::clamp<int64_t>((sens_budget + o.window - 1) / o.window, 1, n_windows);
  c.sens_window.assign(static_cast<size_t>(n_windows), 0);
  for (int64_t j = 0; j < c.n_sens; ++j) c.sens_window[static_cast<size_t>(j * n_windows / c.n_sens)] = 1;
  // Progress in forward passes (the sensitivity passes cost a little more: the KL), plus the
  // fitting afterwards, guessed at a twentieth of the passes.
  c.pass_units = static_cast<double>(n_windows + 2 * c.L * c.n_sens);
  c.total_units = c.pass_units * 1.05 + 1.0;
  for (std::vector<double>* v : {&c.kl_drop, &c.sq_drop, &c.kl_fd, &c.sq_fd}) v->assign(static_cast<size_t>(c.L), 0.0);
}

// The forward passes: every window once exactly (recording routing and hidden states), and each
// sensitivity window once more per MoE layer and perturbation.
Status run_passes(Calibration& c) {
  const CalibrateOptions& o = c.o;
  const HParams& hp = c.m.hp;
  ContextOptions co;
  co.n_ctx = o.window;
  co.n_batch = o.window;
  std::unique_ptr<Context> ctx;
  MOELITE_TRY(Context::create(c.m, c.rt, co, &ctx));
  Hooks hooks(c.m, &c.rec);
  ctx->set_hooks(&hooks);
  RefDist ref;
  std::vector<double> row_kl;
  double t_ref = 0.0, t_pass = 0.0, t_kl = 0.0;
  auto stop = [&]() {
    ctx->set_hooks(nullptr);
    return cancelled();
  };
  const int64_t n_windows = static_cast<int64_t>(c.starts.size());
  for (int64_t wi = 0; wi < n_windows; ++wi) {
    const int64_t w0 = c.starts[static_cast<size_t>(wi)];
    const int32_t len = static_cast<int32_t>(std::min<int64_t>(o.window, c.n - w0));
    const bool sens = c.sens_window[static_cast<size_t>(wi)] != 0;
    Clock::time_point t0 = Clock::now();
    ctx->truncate(0);
    hooks.record(w0);
    // Only the sensitivity windows need the logits of every row.
    MOELITE_TRY(ctx->eval(c.tokens.data() + w0, len, sens));
    t_ref += seconds_since(t0);
    if (!c.report(1.0)) return stop();
    if (!sens) continue;
    t0 = Clock::now();
    reference_dist(ctx->logits(0), len, c.V, c.n_threads, &ref);
    t_kl += seconds_since(t0);
    c.sens_tokens += len;
    for (int32_t l = hp.n_dense_lead; l < c.L; ++l) {  // leading dense blocks have no routing to perturb
      for (int pass = 0; pass < 2; ++pass) {
        t0 = Clock::now();
        ctx->truncate(0);
        hooks.perturb(l, pass == 0 ? 0.0 : o.fd_alpha);
        MOELITE_TRY(ctx->eval(c.tokens.data() + w0, len, true));
        t_pass += seconds_since(t0);
        t0 = Clock::now();
        const double kl = kl_sum(ref, ctx->logits(0), c.n_threads, &row_kl);
        t_kl += seconds_since(t0);
        (pass == 0 ? c.kl_drop : c.kl_fd)[static_cast<size_t>(l)] += kl;
        (pass == 0 ? c.sq_drop : c.sq_fd)[static_cast<size_t>(l)] += hooks.dropped_sq();
        if (!c.report(1.0)) return stop();
      }
    }
  }
  ctx->set_hooks(nullptr);
  log_msg(MOELITE_LOG_INFO,
          "calibrate: %lld windows of %d tokens, %lld with sensitivity passes (%lld tokens); reference passes %.2f s, "
          "sensitivity passes %.2f s, KL %.2f s",
          static_cast<long long>(n_windows), o.window, static_cast<long long>(c.n_sens),
          static_cast<long long>(c.sens_tokens), t_ref, t_pass, t_kl);
  return MOELITE_OK;
}

// Per layer: the sensitivities (KL per squared weight removed), expert use counts and the mean
// tail weight.
void layer_statistics(const Calibration& c, Profile* p) {
  p->layers.resize(static_cast<size_t>(c.L));
  for (int32_t l = 0; l < c.L; ++l) {
    const size_t at = static_cast<size_t>(l);
    LayerProfile& lp = p->layers[at];
    lp.sensitivity = c.sq_drop[at] > 0 ? c.kl_drop[at] / c.sq_drop[at] : 0.0;
    lp.sensitivity_fd = c.sq_fd[at] > 0 ? c.kl_fd[at] / c.sq_fd[at] : 0.0;
    lp.expert_counts.assign(static_cast<size_t>(c.E), 0);
    double tail = 0.0;
    for (int64_t t = 0; t < c.n; ++t) {
      const int32_t* ids = c.rec.ids.data() + c.slot(t, l);
      const float* w = c.rec.weights.data() + c.slot(t, l);
      for (int32_t j = 0; j < c.k; ++j)
        if (ids[j] >= 0) lp.expert_counts[static_cast<size_t>(ids[j])]++;
      tail += *std::min_element(w, w + c.k);
    }
    lp.mean_tail_weight = tail / static_cast<double>(c.n);
  }
}

// Experts per token under sensitivity gating, at each threshold of the grid.
void gating_table(const Calibration& c, Profile* p) {
  const HParams& hp = c.m.hp;
  std::vector<double> grid = c.o.thresholds;
  if (grid.empty())
    for (int i = 0; i <= 8; ++i) grid.push_back(std::pow(10.0, -4.0 + 0.5 * i));
  for (double T : grid) {
    GatingPoint g;
    g.threshold = T;
    int64_t kept = 0, reduced = 0;
    for (int64_t t = 0; t < c.n; ++t)
      for (int32_t l = hp.n_dense_lead; l < c.L; ++l) {
        const int32_t n_kept =
            gating_keep_count(GatingMode::Sensitivity, static_cast<float>(T),
                              p->layers[static_cast<size_t>(l)].sensitivity, c.rec.weights.data() + c.slot(t, l), c.k);
        kept += n_kept;
        reduced += n_kept < c.k;
      }
    const double routed = static_cast<double>(c.n) * static_cast<double>(hp.n_moe_layers());
    g.experts_per_token = static_cast<double>(kept) / routed;
    g.share_reduced = static_cast<double>(reduced) / routed;
    p->gating.push_back(g);
  }
}

// Hit curves: the calibration routing replayed through per-layer LRU caches of every size.
Status hit_curves(const Calibration& c, Profile* p) {
  Trace trace;
  trace.n_layers = c.L;
  trace.n_experts = c.E;
  trace.top_k = c.k;
  for (int64_t t = 0; t < c.n; ++t)
    for (int32_t l = 0; l < c.L; ++l) {
      TraceEntry e;
      e.token = t;
      e.layer = l;
      for (int32_t j = 0; j < c.k; ++j)
        if (c.rec.ids[c.slot(t, l) + static_cast<size_t>(j)] >= 0)
          e.experts.push_back(c.rec.ids[c.slot(t, l) + static_cast<size_t>(j)]);
      trace.entries.push_back(std::move(e));
    }
  // One stack-distance pass gives every capacity (what `replay(trace, "lru", c)` gives per c);
  // below top-k, where replay cannot run, the curve stays 0.
  std::vector<std::vector<double>> curves;
  MOELITE_TRY(lru_hit_curves(trace, &curves));
  for (int32_t l = 0; l < c.L; ++l) {
    std::vector<double>& curve = p->layers[static_cast<size_t>(l)].hit_curve;
    curve.assign(static_cast<size_t>(c.E) + 1, 0.0);
    for (int32_t q = c.k; q <= c.E; ++q)
      curve[static_cast<size_t>(q)] = curves[static_cast<size_t>(l)][static_cast<size_t>(q)];
  }
  return MOELITE_OK;
}

// The learned, first-layer, next-gate and pregate predictors: fitted on the first (1 - holdout) of
// the captured tokens, scored on the rest. The fits and scorings are independent per layer: tasks
// spread over the backend's threads, each writing only its own outputs (the accuracy rows are
// created beforehand).
Status fit_predictors(const Calibration& c, Profile* p) {
  const HParams& hp = c.m.hp;
  const int32_t L = c.L, E = c.E, k = c.k, D = c.D;
  const Record& rec = c.rec;
  const int64_t cap = rec.capture_limit;
  const int64_t n_train = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(cap) * (1.0 - c.o.holdout)));
  const int32_t stride = c.o.stride;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::function<Status()>> tasks;

  // learned: layer l's MoE input -> layer l + stride's experts.
  p->learned.assign(static_cast<size_t>(L), LinearMap());
  std::vector<double>& acc_learned = p->accuracy["learned"];
  acc_learned.assign(static_cast<size_t>(L), nan);
  for (int32_t l = hp.n_dense_lead; l + stride < L; ++l)  // from and to layers with routing
    tasks.push_back([&, l]() -> Status {
      std::vector<float> y(static_cast<size_t>(E)), scores(static_cast<size_t>(E));
      RidgeAccumulator ridge(D, E);
      for (int64_t t = 0; t < n_train; ++t) {
        c.multi_hot(t, l + stride, &y);
        ridge.add(c.xn_at(t, l), y.data());
      }
      MOELITE_TRY(ridge.solve(1e-3, &p->learned[static_cast<size_t>(l)]));
      Hits h;
      for (int64_t t = n_train; t < cap; ++t) {
        p->learned[static_cast<size_t>(l)].apply(c.xn_at(t, l), scores.data());
        h.add(top_indices(scores.data(), E, k), rec.ids.data() + c.slot(t, l + stride), k);
      }
      acc_learned[static_cast<size_t>(l + stride)] = h.share();
      return MOELITE_OK;
    });

  // first-layer: this token's final state -> the next token's experts in the first layer that has
  // them (layer 0, or the first after deepseek2's leading dense blocks), within a window.
  std::vector<double>& acc_first = p->accuracy["first-layer"];
  const int32_t first_moe = hp.n_dense_lead;
  acc_first.assign(static_cast<size_t>(L), nan);
  tasks.push_back([&]() -> Status {
    std::vector<float> y(static_cast<size_t>(E)), scores(static_cast<size_t>(E));
    RidgeAccumulator ridge(D, E);
    for (int64_t t = 0; t + 1 < n_train; ++t) {
      if (rec.window_last[static_cast<size_t>(t)]) continue;
      c.multi_hot(t + 1, first_moe, &y);
      ridge.add(rec.final_state.data() + static_cast<size_t>(t) * D, y.data());
    }
    if (ridge.samples() == 0) return MOELITE_OK;
    MOELITE_TRY(ridge.solve(1e-3, &p->first_layer));
    Hits h;
    for (int64_t t = n_train; t + 1 < cap; ++t) {
      if (rec.window_last[static_cast<size_t>(t)]) continue;
      p->first_layer.apply(rec.final_state.data() + static_cast<size_t>(t) * D, scores.data());
      h.add(top_indices(scores.data(), E, k), rec.ids.data() + c.slot(t + 1, first_moe), k);
    }
    acc_first[static_cast<size_t>(first_moe)] = h.share();
    return MOELITE_OK;
  });

  // next-gate (depth 1) and pregate: routers applied on the host, as the live predictors do on the backend.
  std::vector<double>& acc_ng = p->accuracy["next-gate"];
  acc_ng.assign(static_cast<size_t>(L), nan);
  std::vector<double> acc_pg(static_cast<size_t>(L), nan);
  bool any_pregate = false;
  for (int32_t l = hp.n_dense_lead; l + 1 < L; ++l) {  // a dense block records no MoE input
    const WeightView& pg = c.m.layers[static_cast<size_t>(l)].pregate;
    const bool has_pregate = pg.valid() && pg.data;
    any_pregate = any_pregate || has_pregate;
    tasks.push_back([&, l, has_pregate]() -> Status {
      std::vector<float> normed(static_cast<size_t>(D)), scores(static_cast<size_t>(E));
      const LayerWeights& next = c.m.layers[static_cast<size_t>(l + 1)];
      const LinearMap router = as_linear_map(next.router, next.router_bias);
      Hits h;
      for (int64_t t = n_train; t < cap; ++t) {
        rms_normed(rec.x_mid.data() + static_cast<size_t>((t * L + l) * D), next.ffn_norm.data(), D, hp.rms_eps,
                   normed.data());
        router.apply(normed.data(), scores.data());
        h.add(top_indices(scores.data(), E, k), rec.ids.data() + c.slot(t, l + 1), k);
      }
      acc_ng[static_cast<size_t>(l + 1)] = h.share();
      if (has_pregate) {
        const LinearMap pre = as_linear_map(c.m.layers[static_cast<size_t>(l)].pregate);
        Hits hp_hits;
        for (int64_t t = n_train; t < cap; ++t) {
          pre.apply(c.xn_at(t, l), scores.data());
          hp_hits.add(top_indices(scores.data(), E, k), rec.ids.data() + c.slot(t, l + 1), k);
        }
        acc_pg[static_cast<size_t>(l + 1)] = hp_hits.share();
      }
      return MOELITE_OK;
    });
  }
  std::vector<Status> task_status(tasks.size(), MOELITE_OK);
  std::vector<std::string> task_error(tasks.size());
  parallel_for(c.n_threads, static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    const size_t at = static_cast<size_t>(i);
    try {
      task_status[at] = tasks[at]();
      if (task_status[at] != MOELITE_OK) task_error[at] = last_error_message();  // this thread's message
    } catch (const std::bad_alloc&) {
      task_status[at] = MOELITE_ERR_OUT_OF_MEMORY;
      task_error[at] = "out of memory fitting the predictors";
    }
  });
  for (size_t i = 0; i < tasks.size(); ++i)
    if (task_status[i] != MOELITE_OK) return fail(task_status[i], "%s", task_error[i].c_str());
  if (any_pregate) p->accuracy["pregate"] = acc_pg;
  return MOELITE_OK;
}

// correlation: co-activation counts of consecutive layers; scored on held-out tokens with the
// table of the training tokens, saved with the counts of all tokens (the live table's seed).
void fit_correlation(const Calibration& c, Profile* p) {
  const HParams& hp = c.m.hp;
  const int32_t L = c.L, E = c.E, k = c.k;
  if (correlation_table_bytes(L, E) > kMaxCorrelationBytes) {
    log_msg(MOELITE_LOG_WARN, "calibrate: %d experts x %d layers is too many for correlation tables; skipped", E, L);
    return;
  }
  const int32_t* ids = c.rec.ids.data();
  std::vector<double>& acc = p->accuracy["correlation"];
  acc.assign(static_cast<size_t>(L), std::numeric_limits<double>::quiet_NaN());
  p->correlation.assign(static_cast<size_t>(std::max(0, L - 1)), {});
  const int64_t split = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(c.n) * (1.0 - c.o.holdout)));
  std::vector<float> scores(static_cast<size_t>(E));
  for (int32_t l = hp.n_dense_lead; l + 1 < L; ++l) {
    CorrelationTable table(E, {});
    for (int64_t t = 0; t < split; ++t) table.add(ids + c.slot(t, l), k, ids + c.slot(t, l + 1), k);
    Hits h;
    for (int64_t t = split; t < c.n; ++t) {
      table.scores(ids + c.slot(t, l), k, scores.data());
      h.add(top_indices(scores.data(), E, k), ids + c.slot(t, l + 1), k);
    }
    acc[static_cast<size_t>(l + 1)] = h.share();
    for (int64_t t = split; t < c.n; ++t) table.add(ids + c.slot(t, l), k, ids + c.slot(t, l + 1), k);
    p->correlation[static_cast<size_t>(l)] = table.counts();
  }
}

}  // namespace

Status calibrate(const Model& m, Runtime& rt, const std::vector<int32_t>& tokens, const CalibrateOptions& o,
                 Profile* out) {
  const HParams& hp = m.hp;
  MOELITE_TRY(check_calibrate_options(rt, tokens, o, hp.n_layer));
  Calibration c(m, rt, o, tokens);
  plan_calibration(c);
  MOELITE_TRY(run_passes(c));
  const Clock::time_point t_post = Clock::now();

  Profile p;
  p.arch = hp.arch;
  p.n_layer = c.L;
  p.n_expert = c.E;
  p.n_expert_used = c.k;
  p.n_embd = c.D;
  p.n_tokens = c.n;
  p.window = o.window;
  p.sensitivity_tokens = c.sens_tokens;
  p.learned_stride = o.stride;
  layer_statistics(c, &p);
  gating_table(c, &p);
  MOELITE_TRY(hit_curves(c, &p));
  const double t_curves = seconds_since(t_post);
  if (!c.report(c.pass_units * 0.01)) return cancelled();
  MOELITE_TRY(fit_predictors(c, &p));
  const double t_predictors = seconds_since(t_post) - t_curves;
  if (!c.report(c.pass_units * 0.04)) return cancelled();
  fit_correlation(c, &p);
  log_msg(MOELITE_LOG_INFO, "calibrate: hit curves %.2f s, predictors %.2f s (%d threads), the rest %.2f s", t_curves,
          t_predictors, c.n_threads, seconds_since(t_post) - t_curves - t_predictors);
  if (o.progress) o.progress(1.0f, o.progress_user);
  *out = std::move(p);
  return MOELITE_OK;
}

}  // namespace moelite
