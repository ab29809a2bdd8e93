#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
// but nothing else: tok/s counts every sequence of every context. Each measured -r times (best run reported) after one untimed warm-up that faults the weights
// in, so the numbers are compute and memory speed, not first-touch page faults.
namespace {
const Command kBenchCommand = {"bench",
                               "-m MODEL [-p N] [-n N] [-r N] [--n-seq N] [--contexts C] [-f TEXT] [--json] [options]",
                               "Prefill and decode speed (best of -r runs after a warm-up), with the memory and "
                               "storage bounds.",
                               with_groups({{{"-p"}, "N", "prompt tokens (default 128)"},
                                            {{"-n"}, "N", "decoded tokens (default 32)"},
                                            {{"-r"}, "N", "measured runs (default 1)"},
                                            {{"--n-seq"}, "N",
                                             "sequences decoding together, one token of each per step (default 1); "
                                             "tok/s then counts all of them"},
                                            {{"--contexts"}, "C",
                                             "contexts evaluating at once, each on a thread of its own with --n-seq "
                                             "sequences (default 1)"},
                                            {{"-f"}, "TEXT", "take prompt and decoded tokens from a text file"},
                                            {{"--seed"}, "S", "seed of the random tokens (default 42)"},
                                            {{"--json"}, "", "print JSON"},
                                            {{"--no-warmup"}, "", "no untimed warm-up run"},
                                            {{"--no-membw"}, "", "skip the DRAM and storage bandwidth probes"},
                                            {{"--storage-gb-s"}, "R",
                                             "the storage's sustained read speed when it is known (a data sheet, a "
                                             "throttled device): the budget bound uses it instead of the measured one"}},
                                           {&model_options()})};
}  // namespace

int cmd_bench(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kBenchCommand, &args, &rc)) return rc;
  std::string err;
  int64_t n_prompt, n_gen, reps, seed, seqs_per_context, n_contexts;
  if (!args.get_int("-p", 128, &n_prompt, &err) || !args.get_int("-n", 32, &n_gen, &err) ||
      !args.get_int("--n-seq", 1, &seqs_per_context, &err, 1, MOELITE_MAX_SEQUENCES) ||
      !args.get_int("--contexts", 1, &n_contexts, &err, 1, 64) ||
      !args.get_int("-r", 1, &reps, &err) || !args.get_int("--seed", 42, &seed, &err, INT64_MIN, INT64_MAX))
    return usage_error(err);
  if (n_prompt < 1 || n_gen < 0 || reps < 1) return usage_error("-p must be >= 1, -n >= 0, -r >= 1");
  double given_storage_gbs = 0;
  if (!args.get_double("--storage-gb-s", 0.0, &given_storage_gbs, &err)) return usage_error(err);
  if (args.has("--storage-gb-s") && !(given_storage_gbs > 0 && given_storage_gbs < 1e4))
    return usage_error("--storage-gb-s must be a speed in GB/s above 0 and below 10000");

  // Sequences over all contexts: context c holds sequences c * seqs_per_context ...
  const int64_t n_seq = seqs_per_context * n_contexts;
  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_vocab - 1));
  // Sequence q's prompt and decoded tokens: prompt[q * n_prompt ..], gen[q * n_gen ..].
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt * n_seq)), gen(static_cast<size_t>(n_gen * n_seq));
  for (auto& t : prompt) t = pick(rng);
  for (auto& t : gen) t = pick(rng);
  // -f TEXT: prompt and decoded tokens come from a text instead (decode is teacher-forced), so
  // routing, prediction and caching see real text rather than random tokens.
  if (args.has("-f")) {
    std::vector<int32_t> text;
    if (int rc = tokenize_file(model, args.get("-f"), &text)) {
      moelite_model_free(model);
      return rc;
    }
    if (static_cast<int64_t>(text.size()) < n_prompt + n_gen) {
      moelite_model_free(model);
      return usage_error("-f: the text has " + std::to_string(text.size()) + " tokens, fewer than -p + -n");
    }
    // Sequence q reads the text from its own offset, spread over the text.
    const int64_t span = n_prompt + n_gen, room = static_cast<int64_t>(text.size()) - span;
    for (int64_t q = 0; q < n_seq; ++q) {
      const auto at = text.begin() + (n_seq > 1 ? room * q / (n_seq - 1) : 0);
      std::copy(at, at + n_prompt, prompt.begin() + q * n_prompt);
      std::copy(at + n_prompt, at + span, gen.begin() + q * n_gen);
    }
  }

  std::vector<moelite_context*> contexts(static_cast<size_t>(n_contexts), nullptr);
  auto free_contexts = [&] {
    for (moelite_context*& c : contexts) moelite_context_free(c);
    contexts.assign(contexts.size(), nullptr);
  };
  moelite_context_params* cp = moelite_context_params_create();
  moelite_status st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(n_prompt + n_gen));
  if (st == MOELITE_OK)
    st = moelite_context_params_set_n_batch(cp, static_cast<int32_t>(std::max(n_prompt, seqs_per_context)));
  if (st == MOELITE_OK) st = moelite_context_params_set_n_seq(cp, static_cast<int32_t>(seqs_per_context));
  for (moelite_context*& c : contexts)
    if (st == MOELITE_OK) st = moelite_context_create(model, cp, &c);
  moelite_context_params_free(cp);
  if (st != MOELITE_OK) {
    free_contexts();
    moelite_model_free(model);
    return report(st, "creating context");
  }

  double best_prefill = 1e30, best_decode = 1e30;
  moelite_expert_stats best_stats{};  // expert-store counters of the best decode run
  const int32_t n_layers = static_cast<int32_t>(moelite_model_get(model, MOELITE_MODEL_N_LAYERS));
  std::vector<moelite_expert_stats> best_layers(static_cast<size_t>(n_layers));
  const int64_t runs = reps + (args.has("--no-warmup") ? 0 : 1);
  // Context c's prefill (its sequences one after another) and decode (one token of each per step).
  auto prefill = [&](int64_t c) {
    moelite_context* ctx = contexts[static_cast<size_t>(c)];
    std::vector<int32_t> prompt_seqs(static_cast<size_t>(n_prompt));
    moelite_status s = MOELITE_OK;
    for (int32_t q = 0; q < seqs_per_context; ++q) (void)moelite_context_seq_truncate(ctx, q, 0);
    for (int64_t q = 0; q < seqs_per_context && s == MOELITE_OK; ++q) {
      std::fill(prompt_seqs.begin(), prompt_seqs.end(), static_cast<int32_t>(q));
      s = moelite_eval_batch(ctx, prompt.data() + (c * seqs_per_context + q) * n_prompt, prompt_seqs.data(), nullptr,
                             static_cast<int32_t>(n_prompt));
    }
    return s;
  };
  auto decode = [&](int64_t c) {
    moelite_context* ctx = contexts[static_cast<size_t>(c)];
    std::vector<int32_t> step_tokens(static_cast<size_t>(seqs_per_context)),
        step_seqs(static_cast<size_t>(seqs_per_context));
    for (int64_t q = 0; q < seqs_per_context; ++q) step_seqs[static_cast<size_t>(q)] = static_cast<int32_t>(q);
    moelite_status s = MOELITE_OK;
    for (int64_t i = 0; i < n_gen && s == MOELITE_OK; ++i) {
      for (int64_t q = 0; q < seqs_per_context; ++q)
        step_tokens[static_cast<size_t>(q)] = gen[static_cast<size_t>((c * seqs_per_context + q) * n_gen + i)];
      s = seqs_per_context == 1 ? moelite_eval(ctx, step_tokens.data(), 1, 0)
                                : moelite_eval_batch(ctx, step_tokens.data(), step_seqs.data(), nullptr,
                                                     static_cast<int32_t>(seqs_per_context));
    }
    return s;
  };
  // Runs `phase` for every context, each on a thread of its own when there are several; the first
  // error is the result (its message is printed at once: moelite_last_error is per thread).
  auto on_all = [&](auto& phase) {
    if (n_contexts == 1) return phase(0);
    std::vector<moelite_status> result(static_cast<size_t>(n_contexts), MOELITE_OK);
    std::vector<std::string> why(result.size());
    std::vector<std::thread> threads;
    for (int64_t c = 0; c < n_contexts; ++c)
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
  };
  for (int64_t r = 0; r < runs && st == MOELITE_OK; ++r) {
    double t0 = now();
    st = on_all(prefill);
    double t1 = now();
    moelite_model_reset_expert_stats(model);
    if (st == MOELITE_OK) st = on_all(decode);
    double t2 = now();
    if (r == 0 && runs > reps) continue;  // warm-up
    best_prefill = std::min(best_prefill, t1 - t0);
    if (t2 - t1 < best_decode) {
      best_decode = t2 - t1;
      best_stats.struct_size = sizeof best_stats;
      moelite_model_expert_stats(model, -1, &best_stats);
      for (int32_t l = 0; l < n_layers; ++l) {
        best_layers[static_cast<size_t>(l)].struct_size = sizeof(moelite_expert_stats);
        moelite_model_expert_stats(model, l, &best_layers[static_cast<size_t>(l)]);
      }
    }
  }
  if (st != MOELITE_OK) {
    free_contexts();
    moelite_model_free(model);
    return report(st, "benchmark");
  }
  // Tokens per second of all sequences together; per sequence, that over n_seq.
  const double prefill_tps = double(n_prompt * n_seq) / best_prefill;
  const double decode_tps = n_gen > 0 ? double(n_gen * n_seq) / best_decode : 0.0;
  const int64_t n_generated = n_gen * n_seq;
  const int64_t active = moelite_model_get(model, MOELITE_MODEL_ACTIVE_BYTES);
  const double decode_gbs = decode_tps * static_cast<double>(active) / 1e9;
  const std::string path = args.has("-m") ? args.get("-m") : args.get("--model");
  // The decode bound: active weight bytes per token over the measured DRAM read bandwidth with
  // the same number of threads.
  const uint64_t peak_rss = peak_rss_bytes();  // before the bandwidth probes allocate their buffers
  const int threads = static_cast<int>(moelite_model_get(model, MOELITE_MODEL_THREADS));
  const int64_t budget = moelite_model_get(model, MOELITE_MODEL_EXPERT_BUDGET);
  const int64_t budget_auto = moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO);
  const std::string budget_text = budget_summary(model);
  const std::string arch = moelite_model_arch(model), expert_type = moelite_model_expert_type(model),
                    backend_name = moelite_model_backend_name(model);
  const int64_t expert_bytes = moelite_model_get(model, MOELITE_MODEL_EXPERT_BYTES),
                dense_bytes = moelite_model_get(model, MOELITE_MODEL_DENSE_BYTES),
                pool_bytes = moelite_model_get(model, MOELITE_MODEL_EXPERT_POOL_BYTES),
                store_peak_bytes = moelite_model_get(model, MOELITE_MODEL_EXPERT_PEAK_BYTES),
                expert_slots = moelite_model_get(model, MOELITE_MODEL_EXPERT_SLOTS);
  // A GPU's decode is bound by its own memory: measured in the same run, through the model's backend
  // (NOT_IMPLEMENTED for the CPU backend, whose bound is the DRAM probe below).
  double device_gbs = 0.0;
  if (!args.has("--no-membw") && moelite_model_measure_device_bandwidth(model, &device_gbs) != MOELITE_OK)
    device_gbs = 0.0;
  // The probes below allocate buffers of their own (1 GiB for DRAM). The model goes first, so that
  // under a memory cap that fits the budget the peak is the larger of the two, not their sum.
  free_contexts();
  moelite_model_free(model);
  const double dram_gbs = args.has("--no-membw") ? 0.0 : measure_read_bandwidth(threads, size_t{1} << 30);
  const double bound_gbs = device_gbs > 0 ? device_gbs : dram_gbs;  // the memory the weights stream from
  // A step reads at least one token's active bytes, so n_seq sequences decode at most n_seq times
  // one sequence's bound (a loose bound for n_seq > 1: their experts overlap).
  const double bound_tps = bound_gbs > 0 ? double(n_seq) * bound_gbs * 1e9 / static_cast<double>(active) : 0.0;
  const double efficiency = bound_tps > 0 ? decode_tps / bound_tps : 0.0;
  // Expert store (decode only, best run): hit rate, share of decode time spent waiting for loads.
  const double hit_rate = best_stats.activations ? double(best_stats.hits) / double(best_stats.activations) : 1.0;
  // (Contexts wait at the same time: their waits are shared out over them.)
  const double stall =
      best_decode > 0 && n_gen > 0 ? best_stats.wait_seconds / (best_decode * double(n_contexts)) : 0.0;
  const double read_per_token = n_gen > 0 ? double(best_stats.bytes_read) / double(n_generated) : 0.0;
  const std::string policy = budget > 0 ? args.get("--policy", "lru") : "resident";
  // Prediction (decode, best run): share of the experts used that were predicted, that were fully
  // loaded when needed, and experts computed per token and layer (adaptive gating).
  const double act = best_stats.activations ? double(best_stats.activations) : 1.0;
  const double accuracy = double(best_stats.predicted) / act, timeliness = double(best_stats.ready_when_needed) / act;
  const double precision = best_stats.predictions ? double(best_stats.predicted) / double(best_stats.predictions) : 0.0;
  const double experts_per_token =
      best_stats.routed_tokens ? double(best_stats.routed_experts) / double(best_stats.routed_tokens) : 0.0;
  const std::string predictor = args.get("--predictor", "none");
  // Per layer: [hit rate, prediction accuracy, timeliness, on-demand loads per token].
  std::string layers_json = "[";
  for (int32_t l = 0; l < n_layers; ++l) {
    const moelite_expert_stats& ls = best_layers[static_cast<size_t>(l)];
    const double a = ls.activations ? double(ls.activations) : 1.0;
    char buf[256];
    snprintf(buf, sizeof buf,
             "%s{\"layer\": %d, \"hit_rate\": %.4f, \"accuracy\": %.4f, \"timeliness\": %.4f, "
             "\"on_demand_loads_per_token\": %.4f}",
             l ? ", " : "", l, double(ls.hits) / a, double(ls.predicted) / a, double(ls.ready_when_needed) / a,
             n_gen > 0 ? double(ls.misses) / double(n_generated) : 0.0);
    layers_json += buf;
  }
  layers_json += "]";
  // Under a budget the bound also counts the misses' reads from storage, assuming they overlap
  // perfectly with computation: a token cannot take less than either stream. The storage's speed
  // is the faster of a probe (2 threads of 4 MiB O_DIRECT reads, taken after the runs) and what the
  // store itself read at while it had reads in flight during the best decode run: a shared virtual
  // disk's speed drifts by 2x between minutes, and a probe alone then made the "bound" slower than
  // the decode it bounds. Both overstate a device that bursts after idle time (a token bucket: a
  // cloud disk, a cgroup's throttle): the store reads fast after each idle gap and the sustained
  // rate is lower. Where the sustained speed is known, --storage-gb-s gives it instead.
  const double probe_gbs =
      budget > 0 && !args.has("--no-membw") ? measure_storage_bandwidth(path, size_t{512} << 20, 2) : 0.0;
  const double store_gbs =
      best_stats.read_busy_seconds > 0 ? double(best_stats.bytes_read) / best_stats.read_busy_seconds / 1e9 : 0.0;
  const double storage_gbs = given_storage_gbs > 0 ? given_storage_gbs
                             : probe_gbs > 0       ? std::max(probe_gbs, store_gbs)
                                                   : 0.0;
  double budget_bound_tps = 0.0;
  if (budget > 0 && bound_gbs > 0 && storage_gbs > 0) {
    // Per step: at least one token's active bytes from memory, and what the step read from storage.
    const double t_mem = static_cast<double>(active) / (bound_gbs * 1e9);
    const double t_io = read_per_token * double(n_seq) / (storage_gbs * 1e9);
    budget_bound_tps = double(n_seq) / std::max(t_mem, t_io);
  }
  // Expert reads from storage per decoded token (budget only): demand loads plus speculative loads
  // started, each one expert read. And cache-aware gating's penalty as this machine measures it:
  // 1 + t_read / t_compute of one expert, a decode step being memory bound (include/moelite.h).
  char loads_json[64] = "null", penalty_json[64] = "null";
  if (budget > 0 && n_gen > 0)
    snprintf(loads_json, sizeof loads_json, "%.4f", double(best_stats.misses + best_stats.prefetches_issued) / double(n_generated));
  if (storage_gbs > 0 && bound_gbs > 0) snprintf(penalty_json, sizeof penalty_json, "%.2f", 1.0 + bound_gbs / storage_gbs);
  if (args.has("--json")) {
    printf("{\"model\": \"%s\", \"arch\": \"%s\", \"expert_type\": \"%s\", \"backend\": \"%s\", \"threads\": %" PRId64
           ", \"n_prompt\": %" PRId64 ", \"n_gen\": %" PRId64 ", \"n_seq\": %" PRId64 ", \"contexts\": %" PRId64
           ", \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"decode_tok_s_per_seq\": %.3f"
           ", \"decode_ms_per_token\": %.3f, \"active_bytes_per_token\": %" PRId64
           ", \"decode_weight_gb_s\": %.3f"
           ", \"dram_read_gb_s\": %.2f, \"device_memory_gb_s\": %.2f, \"bound_memory\": \"%s\""
           ", \"decode_bound_tok_s\": %.3f, \"decode_fraction_of_bound\": %.4g"
           ", \"expert_bytes\": %" PRId64 ", \"dense_bytes\": %" PRId64 ", \"peak_rss_bytes\": %" PRIu64
           ", \"expert_budget_bytes\": %" PRId64 ", \"expert_store_pool_bytes\": %" PRId64
           ", \"expert_store_peak_bytes\": %" PRId64 ", \"expert_slots\": %" PRId64
           ", \"policy\": \"%s\""
           ", \"hit_rate\": %.4f, \"stall_fraction\": %.4f, \"bytes_read_per_token\": %.0f"
           ", \"misses_per_token\": %.3f, \"storage_read_gb_s\": %.3f, \"storage_probe_gb_s\": %.3f"
           ", \"store_read_gb_s\": %.3f, \"storage_speed_given\": %s, \"budget_bound_tok_s\": %.3f"
           ", \"decode_fraction_of_budget_bound\": %.3f, \"predictor\": \"%s\", \"prefetch_accuracy\": %.4f"
           ", \"prefetch_precision\": %.4f, \"timeliness\": %.4f, \"on_demand_loads_per_token\": %.3f"
           ", \"loads_per_token\": %s, \"suggested_gating_penalty\": %s"
           ", \"experts_per_token\": %.4f, \"gating\": \"%s\", \"threshold\": %s, \"gating_penalty\": %s, \"gating_substitutes\": %s"
           ", \"profile\": \"%s\""
           ", \"allocation\": \"%s\", \"budget_auto\": %" PRId64 ", \"budget_summary\": \"%s\", \"text\": %s"
           ", \"layers\": %s}\n",
           json_escape(path).c_str(), arch.c_str(), expert_type.c_str(), json_escape(backend_name).c_str(),
           static_cast<int64_t>(threads), n_prompt, n_gen, n_seq, n_contexts, prefill_tps, decode_tps, decode_tps / double(n_seq),
           n_gen > 0 ? 1000.0 * best_decode / n_gen : 0.0, active, decode_gbs, dram_gbs, device_gbs,
           device_gbs > 0 ? "device" : "dram", bound_tps, efficiency, expert_bytes, dense_bytes, peak_rss, budget,
           pool_bytes, store_peak_bytes, expert_slots, policy.c_str(), hit_rate, stall, read_per_token,
           n_gen > 0 ? double(best_stats.misses) / double(n_generated) : 0.0, storage_gbs, probe_gbs, store_gbs,
           given_storage_gbs > 0 ? "true" : "false", budget_bound_tps,
           budget_bound_tps > 0 ? decode_tps / budget_bound_tps : 0.0, json_escape(predictor).c_str(), accuracy,
           precision, timeliness, n_gen > 0 ? double(best_stats.misses) / double(n_generated) : 0.0, loads_json, penalty_json,
           experts_per_token, json_escape(args.get("--gating", "exact")).c_str(), args.json_number("--threshold", 0).c_str(),
           args.json_number("--gating-penalty", 4).c_str(), args.json_number("--gating-substitutes", 0).c_str(),
           json_escape(args.get("--profile")).c_str(),
           json_escape(args.get("--allocation", args.has("--per-layer") ? "uniform" : "auto")).c_str(), budget_auto,
           json_escape(budget_text).c_str(), args.has("-f") ? ("\"" + json_escape(args.get("-f")) + "\"").c_str() : "null", layers_json.c_str());
  } else {
    printf("model     %s (%s, experts %s)\nbackend   %s, %" PRId64 " threads\n", path.c_str(), arch.c_str(),
           expert_type.c_str(), backend_name.c_str(), static_cast<int64_t>(threads));
    printf("budget    %s\n", budget_text.c_str());
    printf("prefill   %" PRId64 " tokens: %.2f tok/s\n", n_prompt, prefill_tps);
    if (n_contexts > 1)
      printf("decode    %" PRId64 " contexts x %" PRId64 " sequences x %" PRId64
             " tokens: %.2f tok/s in all, %.2f per sequence (%.2f ms/step)\n",
             n_contexts, seqs_per_context, n_gen, decode_tps, decode_tps / double(n_seq),
             n_gen > 0 ? 1000.0 * best_decode / n_gen : 0.0);
    else if (n_seq > 1)
      printf("decode    %" PRId64 " sequences x %" PRId64 " tokens: %.2f tok/s in all, %.2f per sequence (%.2f ms/step)\n",
             n_seq, n_gen, decode_tps, decode_tps / double(n_seq), n_gen > 0 ? 1000.0 * best_decode / n_gen : 0.0);
    else
      printf("decode    %" PRId64 " tokens: %.2f tok/s (%.2f ms/token, %.2f GB/s of weights)\n", n_gen, decode_tps,
             n_gen > 0 ? 1000.0 * best_decode / n_gen : 0.0, decode_gbs);
    if (bound_gbs > 0)
      printf("bound     %.2f tok/s at %.1f GB/s %s (%.1f MB/token): decode at %.0f%% of it\n", bound_tps, bound_gbs,
             device_gbs > 0 ? "device memory (copy)" : "DRAM read", active / 1e6, 100.0 * efficiency);
    if (budget > 0)
      printf("experts   budget %.1f MiB (%" PRId64
             " slots, %s): hit rate %.3f, %.2f MB read/token, stalled %.0f%% of decode\n",
             budget / 1048576.0, expert_slots, policy.c_str(), hit_rate, read_per_token / 1e6, 100.0 * stall);
    if (budget > 0 && predictor != "none")
      printf("predict   %s: accuracy %.3f, precision %.3f, timeliness %.3f, %.3f on-demand loads/token\n",
             predictor.c_str(), accuracy, precision, timeliness,
             n_gen > 0 ? double(best_stats.misses) / double(n_generated) : 0.0);
    if (experts_per_token > 0 && args.has("--gating"))
      printf("gating    %s, threshold %s: %.3f experts/token%s\n", args.get("--gating").c_str(),
             args.get("--threshold", "0").c_str(), experts_per_token,
             budget > 0 ? (", " + std::string(loads_json) + " expert loads/token").c_str() : "");
    if (strcmp(penalty_json, "null") != 0)
      printf("penalty   cache-aware gating penalty suggested by this machine: %s (1 + memory / storage bandwidth)\n",
             penalty_json);
    if (budget_bound_tps > 0)
      printf("bound     %.2f tok/s under the budget (storage %.2f GB/s%s: probe %.2f, store's reads %.2f): decode "
             "at %.0f%% of it\n",
             budget_bound_tps, storage_gbs, given_storage_gbs > 0 ? " as given" : "", probe_gbs, store_gbs,
             100.0 * decode_tps / budget_bound_tps);
    printf("peak RSS  %.1f MiB\n", peak_rss / 1048576.0);
  }
  return 0;
}

}  // namespace cli
