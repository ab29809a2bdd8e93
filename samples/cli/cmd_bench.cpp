#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"

namespace cli {

namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

}  // namespace

// Prefill: one batch of -p random tokens from an empty cache. Decode: -n single-token steps after
// it. With --n-seq N, N sequences (each its own tokens) are prefilled one after another and then
// decode together: each step evaluates one token of every sequence in one moelite_eval_batch, so
// the tokens share each layer's weight reads and each expert's load. With --contexts C, C contexts
// (N sequences each) do the same on C threads at once, sharing the model (and its expert store)
// but nothing else: tok/s counts every sequence of every context. Each measured -r times (the median run reported, with the slowest and fastest) after one
// untimed warm-up that faults the weights in, so the numbers are compute and memory speed, not first-touch page faults.
namespace {
const Command kBenchCommand = {
    "bench", "-m MODEL [-p N] [-n N] [-r N] [--n-seq N] [--contexts C] [-f TEXT] [--json] [options]",
    "Prefill and decode speed (the median of -r runs after a warm-up, with their spread), with the memory and "
    "storage bounds.",
    with_groups({{{"-p"}, "N", "prompt tokens (default 128)"},
                 {{"-n"}, "N", "decoded tokens (default 32)"},
                 {{"-r"}, "N", "measured runs (default 3): the median is reported, with the slowest and the fastest"},
                 {{"--n-seq"},
                  "N",
                  "sequences decoding together, one token of each per step (default 1); "
                  "tok/s then counts all of them"},
                 {{"--contexts"},
                  "C",
                  "contexts evaluating at once, each on a thread of its own with --n-seq "
                  "sequences (default 1)"},
                 {{"-f"}, "TEXT", "take prompt and decoded tokens from a text file"},
                 {{"--seed"}, "S", "seed of the random tokens (default 42)"},
                 {{"--json"}, "", "print JSON"},
                 {{"--no-warmup"}, "", "no untimed warm-up run"},
                 {{"--no-membw"}, "", "skip the DRAM and storage bandwidth probes"},
                 {{"--storage-gb-s"},
                  "R",
                  "the storage's sustained read speed when it is known (a data sheet, a "
                  "throttled device): the budget bound uses it instead of the measured one"}},
                {&quality_options(), &model_options()})};
}  // namespace

namespace {

// What the command line asks for.
struct BenchSetup {
  int64_t n_prompt = 128, n_gen = 32, reps = 3, seed = 42, seqs_per_context = 1, n_contexts = 1;
  int64_t n_seq = 1;  // sequences over all contexts: context c holds sequences c * seqs_per_context ...
  double given_storage_gbs = 0;
  bool warmup = true;
};

// 0, or the exit code of a usage error.
int parse_bench_args(const Args& args, BenchSetup* b) {
  std::string err;
  if (!args.get_int("-p", 128, &b->n_prompt, &err) || !args.get_int("-n", 32, &b->n_gen, &err) ||
      !args.get_int("--n-seq", 1, &b->seqs_per_context, &err, 1, MOELITE_MAX_SEQUENCES) ||
      !args.get_int("--contexts", 1, &b->n_contexts, &err, 1, 64) || !args.get_int("-r", 3, &b->reps, &err, 1, 1000) ||
      !args.get_int("--seed", 42, &b->seed, &err, INT64_MIN, INT64_MAX))
    return usage_error(err);
  if (b->n_prompt < 1 || b->n_gen < 0 || b->reps < 1) return usage_error("-p must be >= 1, -n >= 0, -r >= 1");
  if (!args.get_double("--storage-gb-s", 0.0, &b->given_storage_gbs, &err)) return usage_error(err);
  if (args.has("--storage-gb-s") && !(b->given_storage_gbs > 0 && b->given_storage_gbs < 1e4))
    return usage_error("--storage-gb-s must be a speed in GB/s above 0 and below 10000");
  b->n_seq = b->seqs_per_context * b->n_contexts;
  b->warmup = !args.has("--no-warmup");
  return 0;
}

// Sequence q's prompt and decoded tokens: prompt[q * n_prompt ..], gen[q * n_gen ..]. Random, or with
// -f TEXT from a text (decode is teacher-forced), so routing, prediction and caching see real text.
int bench_tokens(moelite_model* model, const Args& args, const BenchSetup& b, std::vector<int32_t>* prompt,
                 std::vector<int32_t>* gen) {
  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  std::mt19937 rng(static_cast<uint32_t>(b.seed));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_vocab - 1));
  prompt->resize(static_cast<size_t>(b.n_prompt * b.n_seq));
  gen->resize(static_cast<size_t>(b.n_gen * b.n_seq));
  for (auto& t : *prompt) t = pick(rng);
  for (auto& t : *gen) t = pick(rng);
  if (!args.has("-f")) return 0;
  std::vector<int32_t> text;
  if (int rc = tokenize_file(model, args.get("-f"), &text)) return rc;
  if (static_cast<int64_t>(text.size()) < b.n_prompt + b.n_gen)
    return usage_error("-f: the text has " + std::to_string(text.size()) + " tokens, fewer than -p + -n");
  // Sequence q reads the text from its own offset, spread over the text.
  const int64_t span = b.n_prompt + b.n_gen, room = static_cast<int64_t>(text.size()) - span;
  for (int64_t q = 0; q < b.n_seq; ++q) {
    const auto at = text.begin() + (b.n_seq > 1 ? room * q / (b.n_seq - 1) : 0);
    std::copy(at, at + b.n_prompt, prompt->begin() + q * b.n_prompt);
    std::copy(at + b.n_prompt, at + span, gen->begin() + q * b.n_gen);
  }
  return 0;
}

// The contexts under test and their two phases: context c's prefill (its sequences one after
// another) and decode (one token of each per step).
class BenchContexts {
 public:
  BenchContexts(const BenchSetup& b, const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen)
      : b_(b), prompt_(prompt), gen_(gen), contexts_(static_cast<size_t>(b.n_contexts), nullptr) {}
  ~BenchContexts() { free(); }
  // 0, or a usage error's exit status (2) for bad --quality-* options, or 1 with the status reported.
  int create(const Args& args, moelite_model* model) {
    moelite_context_params* cp = moelite_context_params_create();
    if (!cp) return report(MOELITE_ERR_OUT_OF_MEMORY, "creating context");
    if (int rc = quality_params_from_args(args, cp)) {
      moelite_context_params_free(cp);
      return rc;
    }
    moelite_status st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(b_.n_prompt + b_.n_gen));
    if (st == MOELITE_OK)
      st = moelite_context_params_set_n_batch(cp, static_cast<int32_t>(std::max(b_.n_prompt, b_.seqs_per_context)));
    if (st == MOELITE_OK) st = moelite_context_params_set_n_seq(cp, static_cast<int32_t>(b_.seqs_per_context));
    for (moelite_context*& c : contexts_)
      if (st == MOELITE_OK) st = moelite_context_create(model, cp, &c);
    moelite_context_params_free(cp);
    return st == MOELITE_OK ? 0 : report(st, "creating context");
  }
  // The quality meter over every context and run (warm-up included): sums and means weighted by
  // the tokens each context compared.
  moelite_quality_stats quality() const {
    moelite_quality_stats all = {sizeof all};
    double kl = 0, agree = 0, predicted = 0, var_kl = 0;
    for (moelite_context* c : contexts_) {
      moelite_quality_stats q = {sizeof q};
      if (!c || moelite_context_quality_stats(c, &q) != MOELITE_OK) continue;
      const double n = double(q.metered_tokens);
      all.gated_tokens += q.gated_tokens;
      all.metered_tokens += q.metered_tokens;
      all.meter_evaluations += q.meter_evaluations;
      all.meter_seconds += q.meter_seconds;
      kl += q.kl_mean * n;
      var_kl += q.kl_stderr * q.kl_stderr * n * n;
      agree += q.top1_agreement * n;
      predicted += q.predicted_loss_metered * n;
      all.threshold = q.threshold;
      all.target_kl = q.target_kl;
    }
    if (all.metered_tokens > 0) {
      const double n = double(all.metered_tokens);
      all.kl_mean = kl / n;
      all.kl_stderr = std::sqrt(var_kl) / n;
      all.top1_agreement = agree / n;
      all.top1_stderr = std::sqrt(all.top1_agreement * (1 - all.top1_agreement) / n);
      all.predicted_loss_metered = predicted / n;
    }
    return all;
  }
  void free() {
    for (moelite_context*& c : contexts_) moelite_context_free(c);
    contexts_.assign(contexts_.size(), nullptr);
  }
  moelite_status prefill(int64_t c) {
    moelite_context* ctx = contexts_[static_cast<size_t>(c)];
    std::vector<int32_t> prompt_seqs(static_cast<size_t>(b_.n_prompt));
    moelite_status s = MOELITE_OK;
    for (int32_t q = 0; q < b_.seqs_per_context; ++q) (void)moelite_context_seq_truncate(ctx, q, 0);
    for (int64_t q = 0; q < b_.seqs_per_context && s == MOELITE_OK; ++q) {
      std::fill(prompt_seqs.begin(), prompt_seqs.end(), static_cast<int32_t>(q));
      s = moelite_eval_batch(ctx, prompt_.data() + (c * b_.seqs_per_context + q) * b_.n_prompt, prompt_seqs.data(),
                             nullptr, static_cast<int32_t>(b_.n_prompt));
    }
    return s;
  }
  moelite_status decode(int64_t c) {
    moelite_context* ctx = contexts_[static_cast<size_t>(c)];
    const int64_t n = b_.seqs_per_context;
    std::vector<int32_t> step_tokens(static_cast<size_t>(n)), step_seqs(static_cast<size_t>(n));
    for (int64_t q = 0; q < n; ++q) step_seqs[static_cast<size_t>(q)] = static_cast<int32_t>(q);
    moelite_status s = MOELITE_OK;
    for (int64_t i = 0; i < b_.n_gen && s == MOELITE_OK; ++i) {
      for (int64_t q = 0; q < n; ++q)
        step_tokens[static_cast<size_t>(q)] = gen_[static_cast<size_t>((c * n + q) * b_.n_gen + i)];
      s = n == 1 ? moelite_eval(ctx, step_tokens.data(), 1, 0)
                 : moelite_eval_batch(ctx, step_tokens.data(), step_seqs.data(), nullptr, static_cast<int32_t>(n));
    }
    return s;
  }
  // Runs a phase for every context, each on a thread of its own when there are several; the first
  // error is the result (its message is printed at once: moelite_last_error is per thread).
  template <class Phase>
  moelite_status on_all(Phase phase) {
    if (b_.n_contexts == 1) return phase(0);
    std::vector<moelite_status> result(static_cast<size_t>(b_.n_contexts), MOELITE_OK);
    std::vector<std::string> why(result.size());
    std::vector<std::thread> threads;
    for (int64_t c = 0; c < b_.n_contexts; ++c)
      threads.emplace_back([&, c] {
        result[static_cast<size_t>(c)] = phase(c);
        if (result[static_cast<size_t>(c)] != MOELITE_OK) why[static_cast<size_t>(c)] = moelite_last_error();
      });
    for (std::thread& t : threads) t.join();
    for (size_t c = 0; c < result.size(); ++c)
      if (result[c] != MOELITE_OK) {
        fprintf(stderr, "context %zu: %s\n", c, why[c].c_str());
        return result[c];
      }
    return MOELITE_OK;
  }

 private:
  const BenchSetup& b_;
  const std::vector<int32_t>& prompt_;
  const std::vector<int32_t>& gen_;
  std::vector<moelite_context*> contexts_;
};

// Every measured run's prefill and decode times, and the expert-store counters of each run's decode
// (whole model and per layer). A report gives the median run with the fastest and the slowest:
// one run says little on a machine whose speed drifts between minutes.
struct BenchTimes {
  std::vector<double> prefill_s, decode_s;
  std::vector<moelite_expert_stats> stats;                // per run
  std::vector<std::vector<moelite_expert_stats>> layers;  // per run, per layer
};

// The median of `v` (the lower middle of an even count: a run that happened).
size_t median_index(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  return order[(order.size() - 1) / 2];
}

moelite_status run_bench(moelite_model* model, const BenchSetup& b, BenchContexts& contexts, BenchTimes* out) {
  const int32_t n_layers = static_cast<int32_t>(moelite_model_get(model, MOELITE_MODEL_N_LAYERS));
  const int64_t runs = b.reps + (b.warmup ? 1 : 0);
  moelite_status st = MOELITE_OK;
  for (int64_t r = 0; r < runs && st == MOELITE_OK; ++r) {
    double t0 = now();
    st = contexts.on_all([&](int64_t c) { return contexts.prefill(c); });
    double t1 = now();
    moelite_model_reset_expert_stats(model);
    if (st == MOELITE_OK) st = contexts.on_all([&](int64_t c) { return contexts.decode(c); });
    double t2 = now();
    if (r == 0 && b.warmup) continue;  // warm-up: faults the weights in
    out->prefill_s.push_back(t1 - t0);
    out->decode_s.push_back(t2 - t1);
    moelite_expert_stats whole{};
    whole.struct_size = sizeof whole;
    moelite_model_expert_stats(model, -1, &whole);
    out->stats.push_back(whole);
    std::vector<moelite_expert_stats> per_layer(static_cast<size_t>(n_layers), moelite_expert_stats{});
    for (int32_t l = 0; l < n_layers; ++l) {
      per_layer[static_cast<size_t>(l)].struct_size = sizeof(moelite_expert_stats);
      moelite_model_expert_stats(model, l, &per_layer[static_cast<size_t>(l)]);
    }
    out->layers.push_back(std::move(per_layer));
  }
  return st;
}

// The model's facts a report needs, read before the model is freed for the bandwidth probes.
struct BenchModel {
  std::string path, arch, expert_type, backend_name, budget_text, expert_file;
  int threads = 0;
  int64_t active = 0, budget = 0, budget_auto = 0, expert_bytes = 0, dense_bytes = 0, pool_bytes = 0,
          store_peak_bytes = 0, expert_slots = 0;
  double device_gbs = 0;  // a GPU's memory bandwidth, measured through the model's backend (0: CPU)
  moelite_expert_read_probe read_probe{};  // under a budget: the storage at the store's reads
};

// Under a budget: the storage probed with the store's reads (moelite_model_measure_expert_reads)
// through an inspected copy of the model, the loaded one being freed by then.
void probe_storage(BenchModel* m) {
  moelite_model* inspected = nullptr;
  m->read_probe = moelite_expert_read_probe{};
  m->read_probe.struct_size = sizeof m->read_probe;
  moelite_status st = moelite_model_inspect(m->path.c_str(), &inspected);
  if (st == MOELITE_OK) st = moelite_model_measure_expert_reads(inspected, uint64_t{512} << 20, &m->read_probe);
  if (st != MOELITE_OK) {
    fprintf(stderr, "warning: the storage probe: %s\n", moelite_last_error());
    m->read_probe = moelite_expert_read_probe{};
  }
  moelite_model_free(inspected);
}

BenchModel read_bench_model(moelite_model* model, const Args& args) {
  BenchModel m;
  m.path = args.has("-m") ? args.get("-m") : args.get("--model");
  m.threads = static_cast<int>(moelite_model_get(model, MOELITE_MODEL_THREADS));
  m.active = moelite_model_get(model, MOELITE_MODEL_ACTIVE_BYTES);
  m.budget = moelite_model_get(model, MOELITE_MODEL_EXPERT_BUDGET);
  m.budget_auto = moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO);
  m.budget_text = budget_summary(model);
  m.expert_file = moelite_model_expert_file(model);
  m.arch = moelite_model_arch(model);
  m.expert_type = moelite_model_expert_type(model);
  m.backend_name = moelite_model_backend_name(model);
  m.expert_bytes = moelite_model_get(model, MOELITE_MODEL_EXPERT_BYTES);
  m.dense_bytes = moelite_model_get(model, MOELITE_MODEL_DENSE_BYTES);
  m.pool_bytes = moelite_model_get(model, MOELITE_MODEL_EXPERT_POOL_BYTES);
  m.store_peak_bytes = moelite_model_get(model, MOELITE_MODEL_EXPERT_PEAK_BYTES);
  m.expert_slots = moelite_model_get(model, MOELITE_MODEL_EXPERT_SLOTS);
  // A GPU's decode is bound by its own memory: measured in the same run, through the model's backend
  // (NOT_IMPLEMENTED for the CPU backend, whose bound is the DRAM probe).
  if (!args.has("--no-membw") && moelite_model_measure_device_bandwidth(model, &m.device_gbs) != MOELITE_OK)
    m.device_gbs = 0.0;
  return m;
}

// Everything the report prints, derived from the runs, the model and the bandwidth probes.
struct BenchReport {
  double prefill_tps = 0, decode_tps = 0, decode_gbs = 0, ms_per_step = 0;  // the median run's
  double prefill_min = 0, prefill_max = 0, decode_min = 0, decode_max = 0;  // tok/s: slowest, fastest run
  std::string prefill_runs_json, decode_runs_json;                         // tok/s of each run, in order
  size_t runs = 0;
  int64_t n_generated = 0;
  uint64_t peak_rss = 0;
  double dram_gbs = 0, bound_gbs = 0, bound_tps = 0, efficiency = 0;
  double hit_rate = 1, stall = 0, read_per_token = 0, reads_per_token = 0, misses_per_token = 0;
  std::string policy, predictor;
  double accuracy = 0, timeliness = 0, precision = 0, experts_per_token = 0;
  std::string layers_json;
  double probe_gbs = 0, store_gbs = 0, storage_gbs = 0, budget_bound_tps = 0;
  moelite_expert_read_probe probe{};  // the storage probe (zeros: not taken)
  // Per decode step under a budget, ms: the step, its waits for loads, the storage's busy time
  // (reads in flight), what its reads take at the storage speed, and the memory bound's time.
  double step_ms = 0, wait_ms = 0, read_busy_ms = 0, read_bound_ms = 0, memory_bound_ms = 0;
  char loads_json[64] = "null", penalty_json[64] = "null";
  moelite_quality_stats quality{};  // the quality meter over every context and run
};

BenchReport make_report(const Args& args, const BenchSetup& b, const BenchTimes& t, const BenchModel& m,
                        uint64_t peak_rss) {
  BenchReport r;
  // Tokens per second of all sequences together (per sequence: that over n_seq), of the median run;
  // the expert store's counters are that run's decode.
  const size_t mid_prefill = median_index(t.prefill_s), mid = median_index(t.decode_s);
  const moelite_expert_stats& st = t.stats[mid];
  const double decode_s = t.decode_s[mid];
  r.n_generated = b.n_gen * b.n_seq;
  r.runs = t.decode_s.size();
  auto tok_s = [](double tokens, const std::vector<double>& seconds, double* lo, double* hi, std::string* runs) {
    *lo = 1e300, *hi = 0;
    *runs = "[";
    for (size_t i = 0; i < seconds.size(); ++i) {
      const double v = tokens > 0 ? tokens / seconds[i] : 0.0;
      *lo = std::min(*lo, v), *hi = std::max(*hi, v);
      char buf[32];
      snprintf(buf, sizeof buf, "%s%.3f", i ? ", " : "", v);
      *runs += buf;
    }
    *runs += "]";
  };
  tok_s(double(b.n_prompt * b.n_seq), t.prefill_s, &r.prefill_min, &r.prefill_max, &r.prefill_runs_json);
  tok_s(double(r.n_generated), t.decode_s, &r.decode_min, &r.decode_max, &r.decode_runs_json);
  r.prefill_tps = double(b.n_prompt * b.n_seq) / t.prefill_s[mid_prefill];
  r.decode_tps = b.n_gen > 0 ? double(r.n_generated) / decode_s : 0.0;
  r.ms_per_step = b.n_gen > 0 ? 1000.0 * decode_s / b.n_gen : 0.0;
  r.decode_gbs = r.decode_tps * static_cast<double>(m.active) / 1e9;
  r.peak_rss = peak_rss;
  // The decode bound: active weight bytes per token over the memory the weights stream from (the
  // DRAM read bandwidth with the same number of threads, or a GPU's own).
  r.dram_gbs = args.has("--no-membw") ? 0.0 : measure_read_bandwidth(m.threads, size_t{1} << 30);
  r.bound_gbs = m.device_gbs > 0 ? m.device_gbs : r.dram_gbs;
  // A step reads at least one token's active bytes, so n_seq sequences decode at most n_seq times
  // one sequence's bound (a loose bound for n_seq > 1: their experts overlap).
  r.bound_tps = r.bound_gbs > 0 ? double(b.n_seq) * r.bound_gbs * 1e9 / static_cast<double>(m.active) : 0.0;
  r.efficiency = r.bound_tps > 0 ? r.decode_tps / r.bound_tps : 0.0;
  // Expert store (decode only, median run): hit rate, share of decode time spent waiting for loads
  // (contexts wait at the same time: their waits are shared out over them).
  r.hit_rate = st.activations ? double(st.hits) / double(st.activations) : 1.0;
  r.stall = decode_s > 0 && b.n_gen > 0 ? st.wait_seconds / (decode_s * double(b.n_contexts)) : 0.0;
  r.read_per_token = b.n_gen > 0 ? double(st.bytes_read) / double(r.n_generated) : 0.0;
  r.reads_per_token = b.n_gen > 0 ? double(st.reads) / double(r.n_generated) : 0.0;
  r.misses_per_token = b.n_gen > 0 ? double(st.misses) / double(r.n_generated) : 0.0;
  r.policy = m.budget > 0 ? args.get("--policy", "cyclic") : "resident";
  // Prediction (decode, median run): share of the experts used that were predicted, that were fully
  // loaded when needed, and experts computed per token and layer (adaptive gating).
  const double act = st.activations ? double(st.activations) : 1.0;
  r.accuracy = double(st.predicted) / act;
  r.timeliness = double(st.ready_when_needed) / act;
  r.precision = st.predictions ? double(st.predicted) / double(st.predictions) : 0.0;
  r.experts_per_token = st.routed_tokens ? double(st.routed_experts) / double(st.routed_tokens) : 0.0;
  r.predictor = args.get("--predictor", "none");
  // Per layer: [hit rate, prediction accuracy, timeliness, on-demand loads per token].
  r.layers_json = "[";
  for (size_t l = 0; l < t.layers[mid].size(); ++l) {
    const moelite_expert_stats& ls = t.layers[mid][l];
    const double a = ls.activations ? double(ls.activations) : 1.0;
    char buf[256];
    snprintf(buf, sizeof buf,
             "%s{\"layer\": %zu, \"hit_rate\": %.4f, \"accuracy\": %.4f, \"timeliness\": %.4f, "
             "\"on_demand_loads_per_token\": %.4f}",
             l ? ", " : "", l, double(ls.hits) / a, double(ls.predicted) / a, double(ls.ready_when_needed) / a,
             b.n_gen > 0 ? double(ls.misses) / double(r.n_generated) : 0.0);
    r.layers_json += buf;
  }
  r.layers_json += "]";
  // Under a budget the bound also counts the misses' reads from storage, assuming they overlap
  // perfectly with computation: a step cannot take less than either stream. The storage's speed is
  // the faster of a probe that reads experts the way the store does (moelite_model_measure_expert_reads:
  // their sizes, alignment and reads in flight; taken after the runs) and what the store itself
  // read at while it had reads in flight during the median decode run: a shared virtual disk's
  // speed drifts by 2x between minutes, and a probe alone then made the "bound" slower than the
  // decode it bounds. Both overstate a device that bursts after idle time (a token bucket: a cloud
  // disk, a cgroup's throttle): the store reads fast after each idle gap and the sustained rate is
  // lower. Where the sustained speed is known, --storage-gb-s gives it instead.
  r.probe = m.read_probe;
  r.probe_gbs = r.probe.read_gb_per_s;
  r.store_gbs = st.read_busy_seconds > 0 ? double(st.bytes_read) / st.read_busy_seconds / 1e9 : 0.0;
  r.storage_gbs = b.given_storage_gbs > 0 ? b.given_storage_gbs
                  : r.probe_gbs > 0       ? std::max(r.probe_gbs, r.store_gbs)
                                          : 0.0;
  // Where a step's time went (median run, per decode step): computing, or waiting for loads (the
  // contexts' waits overlap: shared out over them); and the storage: reading (a read in flight),
  // of which the bound's share at the storage speed, or idle. A step above the budget bound has
  // idle storage while loads were still to come (prediction too late, too few reads in flight) or
  // reads slower than the storage allows (small reads, a shallow queue).
  if (m.budget > 0 && b.n_gen > 0) {
    const double steps = double(b.n_gen);
    r.step_ms = 1000.0 * decode_s / steps;
    r.wait_ms = std::min(r.step_ms, 1000.0 * st.wait_seconds / double(b.n_contexts) / steps);
    r.read_busy_ms = std::min(r.step_ms, 1000.0 * st.read_busy_seconds / steps);
    if (r.storage_gbs > 0) r.read_bound_ms = 1000.0 * r.read_per_token * double(b.n_seq) / (r.storage_gbs * 1e9);
    if (r.bound_gbs > 0) r.memory_bound_ms = 1000.0 * static_cast<double>(m.active) / (r.bound_gbs * 1e9);
  }
  if (m.budget > 0 && r.bound_gbs > 0 && r.storage_gbs > 0) {
    // Per step: at least one token's active bytes from memory, and what the step read from storage.
    const double t_mem = static_cast<double>(m.active) / (r.bound_gbs * 1e9);
    const double t_io = r.read_per_token * double(b.n_seq) / (r.storage_gbs * 1e9);
    r.budget_bound_tps = double(b.n_seq) / std::max(t_mem, t_io);
  }
  // Expert reads from storage per decoded token (budget only): demand loads plus speculative loads
  // started, each one expert read. And cache-aware gating's penalty as this machine measures it:
  // 1 + t_read / t_compute of one expert, a decode step being memory bound (include/moelite.h).
  if (m.budget > 0 && b.n_gen > 0)
    snprintf(r.loads_json, sizeof r.loads_json, "%.4f",
             double(st.misses + st.prefetches_issued) / double(r.n_generated));
  if (r.storage_gbs > 0 && r.bound_gbs > 0)
    snprintf(r.penalty_json, sizeof r.penalty_json, "%.2f", 1.0 + r.bound_gbs / r.storage_gbs);
  return r;
}

void print_bench_json(const Args& args, const BenchSetup& b, const BenchModel& m, const BenchReport& r) {
  printf("{\"model\": \"%s\", \"arch\": \"%s\", \"expert_type\": \"%s\", \"backend\": \"%s\", \"threads\": %" PRId64
         ", \"n_prompt\": %" PRId64 ", \"n_gen\": %" PRId64 ", \"n_seq\": %" PRId64 ", \"contexts\": %" PRId64
         ", \"runs\": %zu, \"prefill_tok_s\": %.3f, \"prefill_tok_s_min\": %.3f, \"prefill_tok_s_max\": %.3f"
         ", \"prefill_tok_s_runs\": %s, \"decode_tok_s\": %.3f, \"decode_tok_s_min\": %.3f, \"decode_tok_s_max\": %.3f"
         ", \"decode_tok_s_runs\": %s, \"decode_tok_s_per_seq\": %.3f"
         ", \"decode_ms_per_token\": %.3f, \"active_bytes_per_token\": %" PRId64
         ", \"decode_weight_gb_s\": %.3f"
         ", \"dram_read_gb_s\": %.2f, \"device_memory_gb_s\": %.2f, \"bound_memory\": \"%s\""
         ", \"decode_bound_tok_s\": %.3f, \"decode_fraction_of_bound\": %.4g"
         ", \"expert_bytes\": %" PRId64 ", \"dense_bytes\": %" PRId64 ", \"peak_rss_bytes\": %" PRIu64
         ", \"expert_budget_bytes\": %" PRId64 ", \"expert_store_pool_bytes\": %" PRId64
         ", \"expert_store_peak_bytes\": %" PRId64 ", \"expert_slots\": %" PRId64
         ", \"policy\": \"%s\""
         ", \"hit_rate\": %.4f, \"stall_fraction\": %.4f, \"bytes_read_per_token\": %.0f, \"reads_per_token\": %.3f"
         ", \"expert_file\": \"%s\""
         ", \"misses_per_token\": %.3f, \"storage_read_gb_s\": %.3f, \"storage_probe_gb_s\": %.3f"
         ", \"store_read_gb_s\": %.3f, \"storage_speed_given\": %s, \"budget_bound_tok_s\": %.3f"
         ", \"decode_fraction_of_budget_bound\": %.3f, \"predictor\": \"%s\", \"prefetch_accuracy\": %.4f"
         ", \"prefetch_precision\": %.4f, \"timeliness\": %.4f, \"on_demand_loads_per_token\": %.3f"
         ", \"loads_per_token\": %s, \"suggested_gating_penalty\": %s"
         ", \"experts_per_token\": %.4f, \"gating\": \"%s\", \"threshold\": %s, \"gating_penalty\": %s, "
         "\"gating_substitutes\": %s"
         ", \"profile\": \"%s\""
         ", \"allocation\": \"%s\", \"budget_auto\": %" PRId64
         ", \"budget_summary\": \"%s\", \"text\": %s"
         ", \"quality\": {\"gated_tokens\": %" PRIu64 ", \"metered_tokens\": %" PRIu64 ", \"kl_mean\": %.6g"
         ", \"kl_stderr\": %.6g, \"top1_agreement\": %.6g, \"predicted_loss_metered\": %.6g, \"threshold\": %.6g"
         ", \"target_kl\": %.6g, \"meter_seconds\": %.4f}"
         ", \"storage_probe\": {\"read_gb_s\": %.3f, \"reads_per_s\": %.1f, \"read_bytes\": %.0f"
         ", \"reads_in_flight\": %d, \"copy_gb_s\": %.2f}"
         ", \"step_ms\": {\"step\": %.3f, \"compute\": %.3f, \"load_wait\": %.3f, \"read_busy\": %.3f"
         ", \"read_bound\": %.3f, \"read_idle\": %.3f, \"memory_bound\": %.3f}"
         ", \"layers\": %s}\n",
         json_escape(m.path).c_str(), m.arch.c_str(), m.expert_type.c_str(), json_escape(m.backend_name).c_str(),
         static_cast<int64_t>(m.threads), b.n_prompt, b.n_gen, b.n_seq, b.n_contexts, r.runs, r.prefill_tps,
         r.prefill_min, r.prefill_max, r.prefill_runs_json.c_str(), r.decode_tps, r.decode_min, r.decode_max,
         r.decode_runs_json.c_str(), r.decode_tps / double(b.n_seq), r.ms_per_step, m.active, r.decode_gbs, r.dram_gbs, m.device_gbs,
         m.device_gbs > 0 ? "device" : "dram", r.bound_tps, r.efficiency, m.expert_bytes, m.dense_bytes, r.peak_rss,
         m.budget, m.pool_bytes, m.store_peak_bytes, m.expert_slots, r.policy.c_str(), r.hit_rate, r.stall,
         r.read_per_token, r.reads_per_token, json_escape(m.expert_file).c_str(), r.misses_per_token, r.storage_gbs, r.probe_gbs, r.store_gbs,
         b.given_storage_gbs > 0 ? "true" : "false", r.budget_bound_tps,
         r.budget_bound_tps > 0 ? r.decode_tps / r.budget_bound_tps : 0.0, json_escape(r.predictor).c_str(), r.accuracy,
         r.precision, r.timeliness, r.misses_per_token, r.loads_json, r.penalty_json, r.experts_per_token,
         json_escape(args.get("--gating", "exact")).c_str(), args.json_number("--threshold", 0).c_str(),
         args.json_number("--gating-penalty", 4).c_str(), args.json_number("--gating-substitutes", 0).c_str(),
         json_escape(args.get("--profile")).c_str(),
         json_escape(args.get("--allocation", args.has("--per-layer") ? "uniform" : "auto")).c_str(), m.budget_auto,
         json_escape(m.budget_text).c_str(),
         args.has("-f") ? ("\"" + json_escape(args.get("-f")) + "\"").c_str() : "null", r.quality.gated_tokens,
         r.quality.metered_tokens, r.quality.kl_mean, r.quality.kl_stderr, r.quality.top1_agreement,
         r.quality.predicted_loss_metered, r.quality.threshold, r.quality.target_kl, r.quality.meter_seconds,
         r.probe.read_gb_per_s, r.probe.reads_per_s, r.probe.read_bytes, r.probe.reads_in_flight, r.probe.copy_gb_per_s,
         r.step_ms, r.step_ms - r.wait_ms, r.wait_ms, r.read_busy_ms, r.read_bound_ms, r.step_ms - r.read_busy_ms,
         r.memory_bound_ms, r.layers_json.c_str());
}

// "[slowest .. fastest]" of the runs' tok/s.
std::string spread(double lo, double hi) {
  char buf[64];
  snprintf(buf, sizeof buf, "[%.2f .. %.2f]", lo, hi);
  return buf;
}

void print_bench_text(const Args& args, const BenchSetup& b, const BenchModel& m, const BenchReport& r) {
  printf("model     %s (%s, experts %s)\nbackend   %s, %" PRId64 " threads\n", m.path.c_str(), m.arch.c_str(),
         m.expert_type.c_str(), m.backend_name.c_str(), static_cast<int64_t>(m.threads));
  printf("budget    %s\n", m.budget_text.c_str());
  printf("runs      %zu measured%s: tok/s below is the median run's, [slowest .. fastest] beside it\n", r.runs,
         args.has("--no-warmup") ? "" : " after a warm-up");
  const std::string prefill_spread = spread(r.prefill_min, r.prefill_max), decode_spread = spread(r.decode_min, r.decode_max);
  printf("prefill   %" PRId64 " tokens: %.2f tok/s %s\n", b.n_prompt, r.prefill_tps, prefill_spread.c_str());
  if (b.n_contexts > 1)
    printf("decode    %" PRId64 " contexts x %" PRId64 " sequences x %" PRId64
           " tokens: %.2f tok/s in all %s, %.2f per sequence (%.2f ms/step)\n",
           b.n_contexts, b.seqs_per_context, b.n_gen, r.decode_tps, decode_spread.c_str(), r.decode_tps / double(b.n_seq),
           r.ms_per_step);
  else if (b.n_seq > 1)
    printf("decode    %" PRId64 " sequences x %" PRId64
           " tokens: %.2f tok/s in all %s, %.2f per sequence (%.2f ms/step)\n",
           b.n_seq, b.n_gen, r.decode_tps, decode_spread.c_str(), r.decode_tps / double(b.n_seq), r.ms_per_step);
  else
    printf("decode    %" PRId64 " tokens: %.2f tok/s %s (%.2f ms/token, %.2f GB/s of weights)\n", b.n_gen,
           r.decode_tps, decode_spread.c_str(), r.ms_per_step, r.decode_gbs);
  if (r.bound_gbs > 0)
    printf("bound     %.2f tok/s at %.1f GB/s %s (%.1f MB/token): decode at %.0f%% of it\n", r.bound_tps, r.bound_gbs,
           m.device_gbs > 0 ? "device memory (copy)" : "DRAM read", m.active / 1e6, 100.0 * r.efficiency);
  if (m.budget > 0)
    printf("experts   budget %.1f MiB (%" PRId64
           " slots, %s): hit rate %.3f, %.2f MB read/token in %.1f reads, stalled %.0f%% of decode\n"
           "          read from %s\n",
           m.budget / 1048576.0, m.expert_slots, r.policy.c_str(), r.hit_rate, r.read_per_token / 1e6, r.reads_per_token,
           100.0 * r.stall, m.expert_file.c_str());
  if (m.budget > 0 && r.predictor != "none")
    printf("predict   %s: accuracy %.3f, precision %.3f, timeliness %.3f, %.3f on-demand loads/token\n",
           r.predictor.c_str(), r.accuracy, r.precision, r.timeliness, r.misses_per_token);
  if (r.experts_per_token > 0 && args.has("--gating"))
    printf("gating    %s, threshold %s: %.3f experts/token%s\n", args.get("--gating").c_str(),
           args.get("--threshold", "0").c_str(), r.experts_per_token,
           m.budget > 0 ? (", " + std::string(r.loads_json) + " expert loads/token").c_str() : "");
  if (r.quality.metered_tokens > 0)
    printf("quality   vs exact routing, %" PRIu64 " tokens compared: KL %.4f +- %.4f nats/token, top-1 agreement "
           "%.3f | predicted %.4f | meter %.0f ms%s\n",
           r.quality.metered_tokens, r.quality.kl_mean, r.quality.kl_stderr, r.quality.top1_agreement,
           r.quality.predicted_loss_metered, 1000.0 * r.quality.meter_seconds,
           r.quality.target_kl > 0 ? (", target " + std::to_string(r.quality.target_kl)).c_str() : "");
  if (strcmp(r.penalty_json, "null") != 0)
    printf("penalty   cache-aware gating penalty suggested by this machine: %s (1 + memory / storage bandwidth)\n",
           r.penalty_json);
  if (r.budget_bound_tps > 0)
    printf(
        "bound     %.2f tok/s under the budget (storage %.2f GB/s%s: probe %.2f, store's reads %.2f): decode "
        "at %.0f%% of it\n",
        r.budget_bound_tps, r.storage_gbs, b.given_storage_gbs > 0 ? " as given" : "", r.probe_gbs, r.store_gbs,
        100.0 * r.decode_tps / r.budget_bound_tps);
  if (r.probe.reads_in_flight > 0)
    printf("storage   probe at the store's reads: %.2f GB/s, %.0f reads/s of %.0f KiB, %d in flight; a DRAM copy of "
           "what lands %.1f GB/s\n",
           r.probe.read_gb_per_s, r.probe.reads_per_s, r.probe.read_bytes / 1024.0, r.probe.reads_in_flight,
           r.probe.copy_gb_per_s);
  if (r.step_ms > 0)
    printf("per step  %.2f ms: computing %.2f, waiting for loads %.2f | storage reading %.2f (%.2f at the storage "
           "speed, %.2f slower), idle %.2f | bound %.2f (memory %.2f, reads %.2f)\n",
           r.step_ms, r.step_ms - r.wait_ms, r.wait_ms, r.read_busy_ms, std::min(r.read_bound_ms, r.read_busy_ms),
           std::max(0.0, r.read_busy_ms - r.read_bound_ms), r.step_ms - r.read_busy_ms,
           std::max(r.memory_bound_ms, r.read_bound_ms), r.memory_bound_ms, r.read_bound_ms);
  printf("peak RSS  %.1f MiB\n", r.peak_rss / 1048576.0);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kBenchCommand, &args, &rc)) return rc;
  BenchSetup setup;
  if (int rc = parse_bench_args(args, &setup)) return rc;
  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  std::unique_ptr<moelite_model, void (*)(moelite_model*)> model_guard(model, free_model);
  std::vector<int32_t> prompt, gen;
  if (int rc = bench_tokens(model, args, setup, &prompt, &gen)) return rc;
  BenchContexts contexts(setup, prompt, gen);
  if (int rc = contexts.create(args, model)) return rc;
  BenchTimes times;
  if (moelite_status st = run_bench(model, setup, contexts, &times); st != MOELITE_OK) return report(st, "benchmark");
  const uint64_t peak_rss = peak_rss_bytes();  // before the bandwidth probes allocate their buffers
  BenchModel facts = read_bench_model(model, args);
  const moelite_quality_stats quality = contexts.quality();
  // The probes allocate buffers of their own (1 GiB for DRAM). The model goes first, so that under
  // a memory cap that fits the budget the peak is the larger of the two, not their sum.
  contexts.free();
  model_guard.reset();
  if (facts.budget > 0 && !args.has("--no-membw")) probe_storage(&facts);
  BenchReport r = make_report(args, setup, times, facts, peak_rss);
  r.quality = quality;
  if (args.has("--json"))
    print_bench_json(args, setup, facts, r);
  else
    print_bench_text(args, setup, facts, r);
  return 0;
}

}  // namespace cli
