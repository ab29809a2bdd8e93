// Several contexts of one model evaluating at once, through the public C API only: the job that
// tools/test.sh --tsan runs under ThreadSanitizer (and the plain build runs too). The model has an
// expert budget (the store's loader threads, io_uring where available), predictors that hint
// the store and learn online (each context a clone of its own), and the counters are read while
// contexts evaluate; one context is aborted from another thread again and again. Then contexts of
// a resident model, and of budgeted ones with and without predictors, evaluate at the same time
// (shown by one waiting inside an evaluation for another's to finish). Every result is checked
// bitwise against a resident, single-threaded run. (A context aborted while it waits for another's
// turn, where contexts take turns: tests/test_io_robustness.cpp.)
//
// With `vulkan` all of it runs on the Vulkan backend (each context a command stream of its own),
// under the Khronos validation layer when MOELITE_VK_VALIDATION is set (any message fails), and
// then on a device treated as discrete (MOELITE_VK_AS_DISCRETE): contexts still evaluate at the
// same time, resident (cached copies go through staging uploads) and under a budget (the streams
// share the device tier of expert slots), exact, with aborts; and contexts that take turns on the
// runtime's one stream (cache-aware gating) are exact and can be aborted while they wait.
//
// With `cuda` (on the SIMT emulator: MOELITE_CUDA_EMULATOR=1, a unified-memory device) all of it
// runs on CUDA (each context streams of its own, budgeted experts read in place), then the same
// as Vulkan's on an emulated discrete device (the instances share its device tier).
//
// Usage: moelite_concurrency MODEL.gguf [cpu|vulkan|cuda]   (exit 0 on success, 77 where the
// backend is missing; prints what failed otherwise)
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "moelite.h"

namespace {

std::mutex g_report_mu;
std::atomic<int> g_failures{0};

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::lock_guard<std::mutex> lock(g_report_mu);
  fprintf(stderr, "FAIL: %s\n", what.c_str());
  g_failures++;
}

moelite_backend g_backend = MOELITE_BACKEND_CPU;
bool g_backend_missing = false;

// The GPU device tier's use (Vulkan or CUDA), as each backend instance reports it when it is
// destroyed: matrices found there, copied in, and copied for one pass because peers held the slots.
std::atomic<uint64_t> g_tier_hits{0}, g_tier_loads{0}, g_tier_own_copies{0};

// Errors the library logs (the Vulkan validation layer's messages among them) fail the test.
void on_log(moelite_log_level level, const char* text, void*) {
  if (level >= MOELITE_LOG_ERROR) check(false, std::string("logged: ") + text);
  unsigned long long hits = 0, loads = 0, copies = 0;
  if (sscanf(text, "vulkan: device expert tier: %llu hits, %llu loads over the transfer queue, %llu copies", &hits,
             &loads, &copies) == 3 ||
      sscanf(text, "cuda: device expert tier of %*u slots: %llu hits, %llu loads over the copy stream, %llu copies",
             &hits, &loads, &copies) == 3) {
    g_tier_hits += hits;
    g_tier_loads += loads;
    g_tier_own_copies += copies;
  }
}

// With a budget: predictors (each context guesses with its own) unless `no_predictor`; per-layer
// quotas when asked.
// With `gating_profile` (a calibration profile), cache-aware gating at threshold 0: it never swaps
// an expert, so results stay exact, but contexts take turns all the same.
moelite_model* load(const char* path, uint64_t budget, bool no_predictor = false, bool per_layer = false,
                    const char* gating_profile = nullptr) {
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_threads(p, 2);
  moelite_model_params_set_backend(p, g_backend);
  if (gating_profile) {
    moelite_model_params_set_profile(p, gating_profile);
    check(moelite_model_params_set_gating(p, "cache-aware", 0.0f) == MOELITE_OK, "cache-aware gating");
  }
  if (budget) {
    moelite_model_params_set_expert_budget(p, budget);
    moelite_model_params_set_cache_allocation(p, per_layer ? "uniform" : "global");
    if (!no_predictor) {
      moelite_model_params_set_predictor(p, "next-gate,correlation");
      moelite_model_params_set_predictor_depth(p, 2);
    }
  }
  moelite_model* m = nullptr;
  const moelite_status st = moelite_model_load(path, p, &m);
  moelite_model_params_free(p);
  if (st == MOELITE_ERR_BACKEND_UNAVAILABLE && g_backend != MOELITE_BACKEND_CPU) {
    g_backend_missing = true;
    return nullptr;
  }
  check(st == MOELITE_OK, std::string("load: ") + moelite_last_error());
  return m;
}

moelite_context* context(moelite_model* m, moelite_abort_fn abort, void* user, moelite_routing_fn route = nullptr,
                         void* route_user = nullptr) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_ctx(cp, 256);
  moelite_context_params_set_n_batch(cp, 16);
  moelite_context_params_set_abort_callback(cp, abort, user);
  moelite_context_params_set_routing_callback(cp, route, route_user);
  moelite_context* c = nullptr;
  const moelite_status st = moelite_context_create(m, cp, &c);
  moelite_context_params_free(cp);
  check(st == MOELITE_OK, std::string("context: ") + moelite_last_error());
  return c;
}

std::vector<int32_t> prompt(int seed, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(1 + (seed * 131 + i * 37) % 250);
  return t;
}

// Evaluates `toks` from an empty cache (prompt in one call, then one token at a time) and
// returns the last logits.
bool run(moelite_context* c, const std::vector<int32_t>& toks, int32_t n_vocab, std::vector<float>* out) {
  moelite_context_kv_reset(c);
  const int32_t half = static_cast<int32_t>(toks.size()) / 2;
  if (moelite_eval(c, toks.data(), half, 0) != MOELITE_OK) return false;
  for (size_t i = static_cast<size_t>(half); i < toks.size(); ++i)
    if (moelite_eval(c, &toks[i], 1, 0) != MOELITE_OK) return false;
  const float* l = moelite_get_logits(c, -1);
  out->assign(l, l + n_vocab);
  return true;
}

int abort_when_set(void* user) { return static_cast<std::atomic<bool>*>(user)->load() ? 1 : 0; }

// One context aborted from another thread at varying moments: every call ends in OK or
// MOELITE_ERR_ABORTED, an aborted call leaves the sequence as it was, and a clean run after
// the aborts is exact.
void abort_again_and_again(moelite_model* m, const std::vector<int32_t>& toks, int32_t n_vocab,
                           const std::vector<float>& ref) {
  std::atomic<bool> stop{false};
  moelite_context* c = context(m, abort_when_set, &stop);
  int n_aborted = 0;
  for (int i = 0; i < 12; ++i) {
    stop = false;
    std::thread aborter([&stop, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(300 * i));
      stop = true;
    });
    moelite_context_kv_reset(c);
    const moelite_status st = moelite_eval(c, toks.data(), static_cast<int32_t>(toks.size()), 0);
    aborter.join();
    check(st == MOELITE_OK || st == MOELITE_ERR_ABORTED,
          std::string("aborted context: ") + moelite_status_name(st) + ": " + moelite_last_error());
    if (st == MOELITE_ERR_ABORTED) {
      ++n_aborted;
      check(moelite_context_kv_length(c) == 0, "an aborted eval changed the sequence");
    }
  }
  check(n_aborted > 0, "no evaluation was ever aborted");
  stop = false;
  std::vector<float> got;
  check(run(c, toks, n_vocab, &got), std::string("clean run after aborts: ") + moelite_last_error());
  check(got == ref, "logits after aborts differ");
  moelite_context_free(c);
}

moelite_expert_stats context_stats(moelite_context* c) {
  moelite_expert_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  check(moelite_context_expert_stats(c, -1, &s) == MOELITE_OK, "context expert stats");
  return s;
}

// Holds one context inside its first MoE layer until another context has finished an evaluation
// (or `patience` seconds have passed).
struct OverlapGate {
  std::atomic<bool> inside{false}, other_done{false}, overlapped{false};
  bool waited = false;  // touched by the held context's thread only
  int patience = 60;
};

void hold_until_other_done(int32_t, int32_t, int32_t, int32_t, const int32_t*, const float*, void* user) {
  auto* g = static_cast<OverlapGate*>(user);
  if (g->waited) return;
  g->waited = true;
  g->inside = true;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(g->patience);
  while (!g->other_done && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g->overlapped = g->other_done.load();
}

constexpr int kWorkers = 3, kRounds = 3, kTokens = 12;

// Whether two contexts of `m` evaluate at the same time: context A waits inside its first MoE
// layer until context B, started once A is there, has run a whole evaluation, which B could not if
// they took turns (A gives up after `patience` seconds). Both results bitwise against the reference.
bool evaluate_at_once(moelite_model* m, const std::vector<std::vector<float>>& ref, int32_t n_vocab,
                      const std::string& where, int patience = 60) {
  OverlapGate gate;
  gate.patience = patience;
  moelite_context* a = context(m, nullptr, nullptr, hold_until_other_done, &gate);
  moelite_context* b = context(m, nullptr, nullptr);
  std::thread ta([&] {
    std::vector<float> got;
    check(run(a, prompt(0, kTokens), n_vocab, &got) && got == ref[0], "held context: logits differ" + where);
  });
  std::thread tb([&] {
    // Only once A is held inside its evaluation: where contexts take turns, B would otherwise
    // sometimes run its whole evaluation before A took the turn, and look like an overlap.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!gate.inside && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<float> got;
    check(run(b, prompt(1, kTokens), n_vocab, &got) && got == ref[1], "free context: logits differ" + where);
    gate.other_done = true;
  });
  ta.join();
  tb.join();
  moelite_context_free(a);
  moelite_context_free(b);
  return gate.overlapped.load();
}

// Starts kWorkers threads, each with a context of `m` of its own evaluating its prompt kRounds
// times, bitwise against ref[w]; with `own`, each thread's context counters go to (*own)[w].
std::vector<std::thread> start_workers(moelite_model* m, const std::vector<std::vector<float>>& ref, int32_t n_vocab,
                                       const std::string& label, std::vector<moelite_expert_stats>* own = nullptr) {
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w)
    threads.emplace_back([=, &ref] {
      moelite_context* c = context(m, nullptr, nullptr);
      for (int r = 0; r < kRounds; ++r) {
        std::vector<float> got;
        const bool ok = run(c, prompt(w, kTokens), n_vocab, &got);
        const std::string who = label + " " + std::to_string(w) + " round " + std::to_string(r);
        check(ok, who + ": " + moelite_last_error());
        check(!ok || got == ref[static_cast<size_t>(w)], who + ": logits differ");
      }
      if (own) (*own)[static_cast<size_t>(w)] = context_stats(c);
      moelite_context_free(c);
    });
  return threads;
}

void join_all(std::vector<std::thread>* threads) {
  for (std::thread& t : *threads) t.join();
}

// One context evaluating again and again (bitwise) while another is aborted again and again: the
// aborts land while the aborted one waits for the busy one (its turn, or room in the expert pool).
void aborts_beside_a_busy_context(moelite_model* m, const std::vector<std::vector<float>>& ref, int32_t n_vocab,
                                  const std::string& where) {
  std::thread busy([&] {
    moelite_context* c = context(m, nullptr, nullptr);
    for (int r = 0; r < kRounds; ++r) {
      std::vector<float> got;
      check(run(c, prompt(0, kTokens), n_vocab, &got) && got == ref[0], "busy context: logits differ" + where);
    }
    moelite_context_free(c);
  });
  abort_again_and_again(m, prompt(kWorkers, kTokens), n_vocab, ref[kWorkers]);
  busy.join();
}

// A resident model: two contexts shown to evaluate at the same time, then workers, bitwise.
bool resident_contexts_at_once(const char* path, const std::vector<std::vector<float>>& ref, int32_t n_vocab,
                               const std::string& where) {
  moelite_model* res = load(path, 0);
  if (!res) return false;
  check(evaluate_at_once(res, ref, n_vocab, where),
        "contexts of a resident model did not evaluate at the same time" + where);
  std::vector<std::thread> parallel = start_workers(res, ref, n_vocab, "parallel worker" + where);
  join_all(&parallel);
  moelite_model_free(res);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 2 ? argv[2] : "cpu";
  if (argc < 2 || (strcmp(mode, "cpu") != 0 && strcmp(mode, "vulkan") != 0 && strcmp(mode, "cuda") != 0)) {
    fprintf(stderr, "usage: %s MODEL.gguf [cpu|vulkan|cuda]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  const bool vulkan = strcmp(mode, "vulkan") == 0, cuda = strcmp(mode, "cuda") == 0;
  if (vulkan) g_backend = MOELITE_BACKEND_VULKAN;
  if (cuda) g_backend = MOELITE_BACKEND_CUDA;
  moelite_set_log_callback(on_log, nullptr, MOELITE_LOG_INFO);

  // References: resident, one context, one thread.
  moelite_model* ref_model = load(path, 0);
  if (g_backend_missing) {
    printf("concurrency: skipped, no %s device (%s)\n", mode, moelite_last_error());
    return 77;
  }
  if (!ref_model) return 1;
  const int32_t n_vocab = static_cast<int32_t>(moelite_model_get(ref_model, MOELITE_MODEL_N_VOCAB));
  const uint64_t budget = static_cast<uint64_t>(moelite_model_get(ref_model, MOELITE_MODEL_EXPERT_BYTES)) / 4;
  const uint64_t min_budget = static_cast<uint64_t>(moelite_model_get(ref_model, MOELITE_MODEL_EXPERT_MIN_BUDGET));
  const uint64_t moe_layers = static_cast<uint64_t>(moelite_model_get(ref_model, MOELITE_MODEL_N_LAYERS) -
                                                    moelite_model_get(ref_model, MOELITE_MODEL_N_DENSE_LAYERS));
  std::vector<std::vector<float>> ref(kWorkers + 1);
  {
    moelite_context* c = context(ref_model, nullptr, nullptr);
    for (int w = 0; w <= kWorkers; ++w) check(run(c, prompt(w, kTokens), n_vocab, &ref[w]), "reference run");
    moelite_context_free(c);
  }
  moelite_model_free(ref_model);

  moelite_model* m = load(path, budget);
  if (!m) return 1;
  std::atomic<bool> done{false};

  // Workers: each its own context and prompt, several rounds, bitwise against the reference.
  std::vector<std::thread> threads = start_workers(m, ref, n_vocab, "worker");

  // Text functions (documented thread-safe) on the same model while the workers evaluate: the
  // same answers as on the quiet model.
  const moelite_chat_message msgs[] = {{"user", "How are <|im_end|> dictionaries ordered?"}};
  std::vector<int32_t> quiet_chat(256);
  {
    int32_t n_quiet = 0;
    check(moelite_chat_tokenize(m, msgs, 1, 1, quiet_chat.data(), 256, &n_quiet) == MOELITE_OK, "chat_tokenize");
    quiet_chat.resize(static_cast<size_t>(n_quiet));
  }
  std::thread text([&] {
    for (int i = 0; i < 40; ++i) {
      int32_t ids[256], n = 0, n_chat = 0, chat[256];
      const char* s = "Generators yield values lazily.";
      check(moelite_tokenize(m, s, strlen(s), MOELITE_TOKENIZE_ADD_SPECIAL, ids, 256, &n) == MOELITE_OK, "tokenize");
      check(moelite_chat_tokenize(m, msgs, 1, 1, chat, 256, &n_chat) == MOELITE_OK, "chat_tokenize");
      char back[1024];
      size_t len = 0;
      check(moelite_detokenize(m, ids, n, 0, back, sizeof back, &len) == MOELITE_OK && std::string(back, len) == s,
            "detokenize round trip");
      check(std::vector<int32_t>(chat, chat + n_chat) == quiet_chat, "chat tokens differ from the quiet model's");
    }
  });

  // Statistics read while contexts evaluate.
  std::thread stats([&] {
    while (!done) {
      moelite_expert_stats s;
      memset(&s, 0, sizeof(s));
      s.struct_size = sizeof(s);
      check(moelite_model_expert_stats(m, -1, &s) == MOELITE_OK, "expert stats");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  std::thread aborted([&] { abort_again_and_again(m, prompt(kWorkers, kTokens), n_vocab, ref[kWorkers]); });

  join_all(&threads);
  aborted.join();
  text.join();
  done = true;
  stats.join();
  moelite_model_free(m);

  // Every expert resident on the CPU: contexts evaluate at the same time, each on a backend
  // instance of its own. That they overlap is shown, not assumed: context A waits inside its first
  // MoE layer until context B has run a whole evaluation, which B could not if they took turns (A
  // would give up after 60 s and the check fails). Then workers as above, bitwise.
  if (!resident_contexts_at_once(path, ref, n_vocab, " (resident)")) return 1;

  // A budget: contexts share the store and evaluate at the same time (shown as above), at a
  // quarter of the experts with and without predictors, and without them at the smallest budget
  // the model loads with, in one pool and in per-layer quotas. At the minimum a layer of one token
  // pins every slot but the reserve, so contexts wait for one another's groups (the store's
  // admission) on almost every layer: no deadlock, no "no slot free", bitwise results, aborts
  // honoured while waiting. Each context's counters are its own: they add up to the model's (a
  // guess still loading when its context is freed reads bytes for the model alone).
  struct SharedStore {
    const char* what;
    uint64_t budget;
    bool per_layer;
    bool predictors;
  };
  for (const SharedStore& shared :
       {SharedStore{"a quarter of the experts", budget, false, false},
        SharedStore{"a quarter of the experts, predictors", budget, false, true},
        SharedStore{"the minimum budget", min_budget, false, false},
        SharedStore{"the minimum per-layer quotas", min_budget * moe_layers, true, false}}) {
    // The emulated CUDA device is slow (and runs one kernel at a time): there, the variants that
    // only exercise the store and the predictors, which the CPU and Vulkan runs cover, are left out.
    if (cuda && (shared.predictors || shared.per_layer)) continue;
    const std::string where = std::string(" (") + shared.what + ")";
    moelite_model* b = load(path, shared.budget, /*no_predictor=*/!shared.predictors, shared.per_layer);
    if (!b) return 1;
    if (shared.budget == budget)
      check(evaluate_at_once(b, ref, n_vocab, where),
            "contexts sharing an expert budget did not evaluate at the same time" + where);
    moelite_model_reset_expert_stats(b);
    std::vector<moelite_expert_stats> own(kWorkers);
    std::vector<std::thread> parallel = start_workers(b, ref, n_vocab, "shared-store worker" + where, &own);
    join_all(&parallel);
    moelite_expert_stats all;
    memset(&all, 0, sizeof(all));
    all.struct_size = sizeof(all);
    check(moelite_model_expert_stats(b, -1, &all) == MOELITE_OK, "model expert stats");
    uint64_t activations = 0, misses = 0, bytes = 0, prefetches = 0, predicted = 0;
    for (const moelite_expert_stats& o : own) {
      activations += o.activations;
      misses += o.misses;
      bytes += o.bytes_read;
      prefetches += o.prefetches_issued;
      predicted += o.predicted;
      check(o.activations > 0, "a context counted no expert use" + where);
      check(!shared.predictors || o.predictions > 0, "a context with a predictor predicted nothing" + where);
    }
    check(prefetches == all.prefetches_issued && predicted == all.predicted,
          "the contexts' prediction counters do not add up to the model's" + where);
    check(shared.predictors == (prefetches > 0), "prefetches issued: " + std::to_string(prefetches) + where);
    check(activations == all.activations && misses == all.misses &&
              (shared.predictors ? bytes <= all.bytes_read : bytes == all.bytes_read),
          "the contexts' expert counters do not add up to the model's" + where + ": activations " +
              std::to_string(activations) + " of " + std::to_string(all.activations) + ", misses " +
              std::to_string(misses) + " of " + std::to_string(all.misses) + ", bytes " + std::to_string(bytes) +
              " of " + std::to_string(all.bytes_read));
    check(misses > 0 && bytes > 0, "nothing was read under a budget" + where);
    if (shared.budget == min_budget) {
      // Aborts while other contexts hold the pool (waits for admission and for loads).
      aborts_beside_a_busy_context(b, ref, n_vocab, where);
    }
    moelite_model_free(b);
  }

  // A device treated as discrete (MOELITE_VK_AS_DISCRETE, or the emulated CUDA device as
  // MOELITE_CUDA_EMULATOR=discrete; read at each load): resident, contexts evaluate at the same time
  // with weights copied in, each copy complete before another context's stream can find it. Under
  // a budget the experts go through the device tier of expert slots that all instances share:
  // contexts still evaluate at the same time, results exact at a quarter of the experts and at the
  // minimum budget (a tier of a few slots, which the workers hold in turn, so each often reads a
  // copy of its own), aborts honoured.
  if (vulkan || cuda) {
    const char* discrete_variable = vulkan ? "MOELITE_VK_AS_DISCRETE" : "MOELITE_CUDA_EMULATOR";
    const char* was = getenv(discrete_variable);
    const std::string before = was ? was : "";
    setenv(discrete_variable, vulkan ? "1" : "discrete", 1);
    if (!resident_contexts_at_once(path, ref, n_vocab, " (discrete, resident)")) return 1;
    for (const uint64_t tier_budget : {budget, min_budget}) {
      const std::string where =
          tier_budget == budget ? " (discrete, a quarter of the experts)" : " (discrete, the minimum budget)";
      moelite_model* b = load(path, tier_budget, /*no_predictor=*/true);
      if (!b) return 1;
      g_tier_hits = g_tier_loads = g_tier_own_copies = 0;
      if (tier_budget == budget)
        check(evaluate_at_once(b, ref, n_vocab, where), "contexts sharing a device tier took turns" + where);
      std::vector<std::thread> workers = start_workers(b, ref, n_vocab, "discrete budgeted worker" + where);
      join_all(&workers);
      aborts_beside_a_busy_context(b, ref, n_vocab, where);
      moelite_model_free(b);
      printf("device tier%s: %llu hits, %llu loads, %llu copies of slots other streams held\n", where.c_str(),
             static_cast<unsigned long long>(g_tier_hits.load()), static_cast<unsigned long long>(g_tier_loads.load()),
             static_cast<unsigned long long>(g_tier_own_copies.load()));
      check(g_tier_loads > 0, "nothing went through the device tier" + where);
    }

    // Contexts that take turns on the runtime's one stream (cache-aware gating, whose choices read
    // what is resident): A holds its turn for 3 s while B waits, workers exact while others are
    // created and freed beside them, a context waiting for its turn aborted again and again.
    const std::string profile = "/tmp/moelite-concurrency-" + std::to_string(getpid()) + ".profile";
    {
      const moelite_backend backend = g_backend;
      g_backend = MOELITE_BACKEND_CPU;  // the profile is the model's, whichever backend computes it
      moelite_model* plain = load(path, 0);
      g_backend = backend;
      if (!plain) return 1;
      const std::vector<int32_t> corpus = prompt(7, 256);
      moelite_calibrate_params* cal = moelite_calibrate_params_create();
      moelite_calibrate_params_set_window(cal, 64);
      check(moelite_calibrate(plain, corpus.data(), 256, cal, profile.c_str()) == MOELITE_OK,
            std::string("calibrate: ") + moelite_last_error());
      moelite_calibrate_params_free(cal);
      moelite_model_free(plain);
    }
    moelite_model* t = load(path, budget, /*no_predictor=*/true, /*per_layer=*/false, profile.c_str());
    std::remove(profile.c_str());
    std::remove((profile + ".bin").c_str());
    if (!t) return 1;
    check(!evaluate_at_once(t, ref, n_vocab, " (discrete, cache-aware gating)", /*patience=*/3),
          "contexts with cache-aware gating evaluated at the same time");
    std::vector<std::thread> turns = start_workers(t, ref, n_vocab, "worker taking turns");
    join_all(&turns);
    aborts_beside_a_busy_context(t, ref, n_vocab, " (discrete, cache-aware gating)");
    moelite_model_free(t);
    if (was)
      setenv(discrete_variable, before.c_str(), 1);
    else
      unsetenv(discrete_variable);
  }

  // Freeing a model races the freeing of its contexts on other threads: the reference count
  // decides who releases it, exactly once (ThreadSanitizer and ASan watch this).
  for (int round = 0; round < 4; ++round) {
    moelite_model* shared = load(path, 0);
    if (!shared) return 1;
    moelite_context* a = context(shared, nullptr, nullptr);
    moelite_context* b = context(shared, nullptr, nullptr);
    std::thread fa([a] { moelite_context_free(a); });
    std::thread fb([b] { moelite_context_free(b); });
    moelite_model_free(shared);
    fa.join();
    fb.join();
  }
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures.load());
    return 1;
  }
  printf("concurrency (%s): %d contexts x %d rounds exact, aborts honoured\n", mode, kWorkers, kRounds);
  return 0;
}
