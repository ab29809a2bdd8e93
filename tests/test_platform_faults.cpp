// Faults at the OS boundary never crash, hang or leak, and never corrupt a later result: the
// platform layer's fault injector (platforms/fault_inject.h) fails each open, read, mmap, large
// allocation, io_uring submission (refused, or busy once) and io_uring completion that loading,
// evaluation, generation, a request queue and calibration make, one at a time, through the public C API. Each case must end in a status
// whose message names the fault (an allocation's is MOELITE_ERR_OUT_OF_MEMORY), or in success with
// exact logits; and once the fault is cleared the same context's next evaluation must give
// bitwise the logits of a resident run that never saw a fault (the independent reference).
//
// The matrix (fault kind x phase -> statuses) is printed, and copied into docs/robustness.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "moelite.h"
#include "platforms/fault_inject.h"

namespace fault = moelite::platform::fault;

namespace {

std::string model_path() { return std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf"; }
std::string tmp_dir() { return std::string(MOELITE_BINARY_DIR) + "/test-tmp"; }

// At most this many values of n per (kind, phase): the first calls, the last, and evenly between.
constexpr int64_t kMaxCases = 12;

std::vector<int32_t> prompt_tokens(const moelite_model* m) {
  const char* text = "The quick brown fox jumps over the lazy dog";
  int32_t toks[64];
  int32_t n = 0;
  EXPECT_EQ(moelite_tokenize(m, text, strlen(text), 0, toks, 64, &n), MOELITE_OK) << moelite_last_error();
  return std::vector<int32_t>(toks, toks + n);
}

// What a budgeted load looks like in these tests: a quarter of the experts' bytes, so the store
// reads experts for every token.
struct LoadSetup {
  uint64_t budget = 0;
  int32_t use_mmap = 1;
};

moelite_status load(const LoadSetup& s, moelite_model** out) {
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_threads(p, 2);
  moelite_model_params_set_backend(p, MOELITE_BACKEND_CPU);
  if (s.budget) moelite_model_params_set_expert_budget(p, s.budget);
  moelite_model_params_set_use_mmap(p, s.use_mmap);
  const moelite_status st = moelite_model_load(model_path().c_str(), p, out);
  moelite_model_params_free(p);
  return st;
}

moelite_status make_context(moelite_model* m, moelite_context** out) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_ctx(cp, 256);
  const moelite_status st = moelite_context_create(m, cp, out);
  moelite_context_params_free(cp);
  return st;
}

// The reference: every expert resident in the file mapping, no fault armed.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  uint64_t expert_bytes = 0;
};

const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    fault::disarm();
    moelite_model* m = nullptr;
    moelite_context* c = nullptr;
    EXPECT_EQ(load(LoadSetup{}, &m), MOELITE_OK) << moelite_last_error();
    r.expert_bytes = static_cast<uint64_t>(moelite_model_get(m, MOELITE_MODEL_EXPERT_BYTES));
    r.tokens = prompt_tokens(m);
    EXPECT_EQ(make_context(m, &c), MOELITE_OK);
    EXPECT_EQ(moelite_eval(c, r.tokens.data(), static_cast<int32_t>(r.tokens.size()), 0), MOELITE_OK);
    const float* l = moelite_get_logits(c, -1);
    r.logits.assign(l, l + moelite_model_get(m, MOELITE_MODEL_N_VOCAB));
    moelite_context_free(c);
    moelite_model_free(m);
    return r;
  }();
  return ref;
}

LoadSetup budgeted() { return LoadSetup{reference().expert_bytes / 4, 1}; }

// Evaluates the reference prompt from an empty cache; true when the logits are bitwise the
// reference's.
::testing::AssertionResult exact_after_reset(moelite_context* c) {
  const Reference& ref = reference();
  moelite_context_kv_reset(c);
  const moelite_status st = moelite_eval(c, ref.tokens.data(), static_cast<int32_t>(ref.tokens.size()), 0);
  if (st != MOELITE_OK)
    return ::testing::AssertionFailure() << "clean eval failed: " << moelite_status_name(st) << ": "
                                         << moelite_last_error();
  const float* l = moelite_get_logits(c, -1);
  if (memcmp(l, ref.logits.data(), ref.logits.size() * sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "logits differ from the reference";
  return ::testing::AssertionSuccess();
}

bool names_fault(fault::Kind k, moelite_status st, const char* msg) {
  if (k == fault::Kind::kAlloc) return st == MOELITE_ERR_OUT_OF_MEMORY;
  return strstr(msg, "injected fault") != nullptr && strstr(msg, fault::kind_name(k)) != nullptr;
}

std::vector<int64_t> cases(int64_t count) {
  std::vector<int64_t> ns;
  if (count <= kMaxCases) {
    for (int64_t n = 1; n <= count; ++n) ns.push_back(n);
    return ns;
  }
  for (int64_t i = 0; i < kMaxCases; ++i) ns.push_back(1 + i * (count - 1) / (kMaxCases - 1));
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  return ns;
}

// One phase run under a fault: returns its status. `c` is a context of `m` the phase may use;
// phases that load create their own model.
struct PhaseEnv {
  moelite_model* m = nullptr;
  moelite_context* c = nullptr;
};
using Phase = std::function<moelite_status(PhaseEnv&)>;

// Sweeps every kind over the calls `phase` makes, prints this phase's row of the matrix.
void sweep(const char* phase_name, const LoadSetup& setup, const Phase& phase) {
  const Reference& ref = reference();
  ASSERT_FALSE(ref.logits.empty());
  for (int ki = 0; ki < fault::kKindCount; ++ki) {
    const fault::Kind kind = static_cast<fault::Kind>(ki);
    SCOPED_TRACE(std::string(phase_name) + " / " + fault::kind_name(kind));
    // Count the phase's calls of this kind in a clean run.
    PhaseEnv env;
    if (std::string(phase_name) != "load") {
      ASSERT_EQ(load(setup, &env.m), MOELITE_OK) << moelite_last_error();
      ASSERT_EQ(make_context(env.m, &env.c), MOELITE_OK);
    }
    fault::disarm();
    ASSERT_EQ(phase(env), MOELITE_OK) << moelite_last_error();
    const int64_t count = fault::calls(kind);
    moelite_context_free(env.c);
    moelite_model_free(env.m);

    std::map<std::string, int> outcomes;
    for (int64_t n : cases(count)) {
      SCOPED_TRACE("call " + std::to_string(n) + " of " + std::to_string(count));
      PhaseEnv e;
      if (std::string(phase_name) != "load") {
        ASSERT_EQ(load(setup, &e.m), MOELITE_OK) << moelite_last_error();
        ASSERT_EQ(make_context(e.m, &e.c), MOELITE_OK);
      }
      fault::arm(kind, n);
      const moelite_status st = phase(e);
      const std::string msg = moelite_last_error();
      const bool fired = fault::fired();
      fault::disarm();
      // A transient refusal is retried: never an error.
      if (kind == fault::Kind::kUringBusy || kind == fault::Kind::kReadEfault) EXPECT_EQ(st, MOELITE_OK) << msg;
      if (st != MOELITE_OK) {
        EXPECT_TRUE(fired) << "failed without the fault: " << moelite_status_name(st) << ": " << msg;
        EXPECT_TRUE(names_fault(kind, st, msg.c_str())) << moelite_status_name(st) << ": " << msg;
      }
      outcomes[st == MOELITE_OK ? (fired ? "OK (recovered)" : "OK (not reached)") : moelite_status_name(st)]++;
      // After the fault: the same context (or a fresh load, where loading failed) is exact.
      if (!e.m) ASSERT_EQ(load(setup, &e.m), MOELITE_OK) << moelite_last_error();
      if (!e.c) ASSERT_EQ(make_context(e.m, &e.c), MOELITE_OK) << moelite_last_error();
      EXPECT_TRUE(exact_after_reset(e.c));
      moelite_context_free(e.c);
      moelite_model_free(e.m);
    }
    std::string row;
    for (const auto& [name, k] : outcomes) row += (row.empty() ? "" : ", ") + name + " x" + std::to_string(k);
    printf("[fault matrix] %-10s %-15s calls %4lld: %s\n", phase_name, fault::kind_name(kind),
           static_cast<long long>(count), count == 0 ? "(no calls)" : row.c_str());
  }
}

moelite_status phase_eval(PhaseEnv& e) {
  const Reference& ref = reference();
  return moelite_eval(e.c, ref.tokens.data(), static_cast<int32_t>(ref.tokens.size()), 0);
}

}  // namespace

TEST(PlatformFaults, Load) {
  // Loading with a budget (the store opens the file again, allocates its pool) and mapped.
  for (const LoadSetup& s : {budgeted(), LoadSetup{}, LoadSetup{0, 0}}) {
    const std::string name = s.budget ? "load+budget" : s.use_mmap ? "load" : "load+nommap";
    sweep("load", s, [&](PhaseEnv& e) -> moelite_status {
      const moelite_status st = load(s, &e.m);
      if (st != MOELITE_OK) e.m = nullptr;
      return st;
    });
    printf("[fault matrix] (row above: %s)\n", name.c_str());
  }
}

TEST(PlatformFaults, EvalWithBudget) { sweep("eval", budgeted(), phase_eval); }

TEST(PlatformFaults, EvalWithBudgetPread) {
  setenv("MOELITE_IO", "pread", 1);  // read by each loader thread when the store starts
  sweep("eval-pread", budgeted(), phase_eval);
  unsetenv("MOELITE_IO");
}

TEST(PlatformFaults, Generate) {
  sweep("generate", budgeted(), [](PhaseEnv& e) -> moelite_status {
    moelite_generate_params* g = moelite_generate_params_create();
    moelite_generate_params_set_max_tokens(g, 4);
    moelite_generate_params_set_temperature(g, 0.0f);
    const char* prompt = "Once upon a time";
    const moelite_status st = moelite_generate(e.c, prompt, strlen(prompt), g, nullptr);
    moelite_generate_params_free(g);
    return st;
  });
}

TEST(PlatformFaults, Calibrate) {
  const std::string profile = tmp_dir() + "/platform-faults-profile.json";
  sweep("calibrate", budgeted(), [&](PhaseEnv& e) -> moelite_status {
    const Reference& ref = reference();
    moelite_calibrate_params* cp = moelite_calibrate_params_create();
    moelite_calibrate_params_set_window(cp, static_cast<int32_t>(ref.tokens.size()));
    const moelite_status st =
        moelite_calibrate(e.m, ref.tokens.data(), static_cast<int32_t>(ref.tokens.size()), cp, profile.c_str());
    moelite_calibrate_params_free(cp);
    return st;
  });
}

TEST(PlatformFaults, Queue) {
  // A request queue over a budgeted model: a step that fails (a read, an allocation) changed
  // nothing and the next one tries again, so stepping on to the end gives every request exactly the
  // clean run's tokens, and the queue always ends.
  std::vector<std::vector<int32_t>> clean;  // filled by the sweep's first (clean) run
  sweep("queue", budgeted(), [&](PhaseEnv& e) -> moelite_status {
    const Reference& ref = reference();
    moelite_queue* q = nullptr;
    moelite_status first = moelite_queue_create(e.c, &q);
    if (first != MOELITE_OK) return first;
    moelite_generate_params* g = moelite_generate_params_create();
    moelite_generate_params_set_max_tokens(g, 4);
    moelite_generate_params_set_temperature(g, 0.0f);
    const int32_t lengths[2] = {static_cast<int32_t>(ref.tokens.size()), 5};
    for (int32_t n : lengths) {
      int64_t id = -1;
      EXPECT_EQ(moelite_queue_add(q, ref.tokens.data(), n, g, &id), MOELITE_OK) << moelite_last_error();
    }
    moelite_generate_params_free(g);
    int steps = 0;
    for (; moelite_queue_waiting(q) + moelite_queue_running(q) > 0 && steps < 200; ++steps) {
      const moelite_status st = moelite_queue_step(q, nullptr);
      if (st != MOELITE_OK && first == MOELITE_OK) first = st;  // its message stays the last error
    }
    EXPECT_LT(steps, 200) << "the queue did not finish";
    std::vector<std::vector<int32_t>> got;
    for (int64_t id = 0; id < 2; ++id) {
      int32_t state = 0, toks[16], n = 0;
      EXPECT_EQ(moelite_queue_request_state(q, id, &state), MOELITE_OK);
      EXPECT_EQ(state, MOELITE_STOP_MAX_TOKENS) << "request " << id;
      EXPECT_EQ(moelite_queue_request_tokens(q, id, toks, 16, &n), MOELITE_OK);
      got.emplace_back(toks, toks + n);
    }
    if (clean.empty()) clean = got;
    EXPECT_EQ(got, clean) << "a request's tokens differ from the clean run's";
    moelite_queue_free(q);
    return first;
  });
}
