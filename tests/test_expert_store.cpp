// The memory-budgeted expert store through the public API: exactness across budgets, the budget
// as a hard limit, the too-small error, read failures surfacing as errors without harming the
// context, and counter consistency. The model is the repository's shipped default (qwen3moe).
#include <gtest/gtest.h>

#include <chrono>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "moelite.h"

namespace {

const std::string kModel = std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf";
const std::vector<int32_t> kTokens = {3, 300, 17, 99, 5, 260, 42, 7, 400, 11, 12, 13};

struct Loaded {
  moelite_model* model = nullptr;
  moelite_context* ctx = nullptr;
  ~Loaded() {
    moelite_context_free(ctx);
    moelite_model_free(model);
  }
};

moelite_status load(const std::string& path, uint64_t budget, Loaded* out, const char* policy = "lru",
                    bool per_layer = false, const char* predictor = "none") {
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_threads(p, 2);
  moelite_model_params_set_expert_budget(p, budget);
  moelite_model_params_set_cache_allocation(p, per_layer ? "uniform" : "auto");
  // Unknown names are refused by their setters, before any load.
  moelite_status st = moelite_model_params_set_cache_policy(p, policy);
  if (st == MOELITE_OK) st = moelite_model_params_set_predictor(p, predictor);
  if (st == MOELITE_OK) st = moelite_model_load(path.c_str(), p, &out->model);
  moelite_model_params_free(p);
  if (st == MOELITE_OK) st = moelite_context_create(out->model, nullptr, &out->ctx);
  return st;
}

std::vector<float> logits_of(Loaded& l) {
  const moelite_status st = moelite_eval(l.ctx, kTokens.data(), static_cast<int32_t>(kTokens.size()), 1);
  EXPECT_EQ(st, MOELITE_OK) << moelite_last_error();
  if (st != MOELITE_OK) return {};
  const int64_t n_vocab = moelite_model_get(l.model, MOELITE_MODEL_N_VOCAB);
  std::vector<float> out;
  for (size_t i = 0; i < kTokens.size(); ++i) {
    const float* row = moelite_get_logits(l.ctx, static_cast<int32_t>(i));
    out.insert(out.end(), row, row + n_vocab);
  }
  return out;
}

uint64_t expert_bytes() {
  Loaded l;
  EXPECT_EQ(load(kModel, 0, &l), MOELITE_OK);
  return static_cast<uint64_t>(moelite_model_get(l.model, MOELITE_MODEL_EXPERT_BYTES));
}

uint64_t minimum_budget() {
  Loaded l;
  EXPECT_EQ(load(kModel, 1, &l), MOELITE_ERR_BUDGET_TOO_SMALL);
  // The message states the minimum: "... below the minimum working set of N bytes ...".
  const char* m = strstr(moelite_last_error(), "minimum working set of ");
  EXPECT_NE(m, nullptr);
  return m ? strtoull(m + strlen("minimum working set of "), nullptr, 10) : 0;
}

}  // namespace

TEST(ExpertStore, LogitsAreBitwiseIdenticalForEveryBudget) {
  Loaded resident;
  ASSERT_EQ(load(kModel, 0, &resident), MOELITE_OK);
  const std::vector<float> want = logits_of(resident);
  const uint64_t total = expert_bytes(), minimum = minimum_budget();
  ASSERT_GT(minimum, 0u);
  // Per-layer quotas need the minimum in each layer.
  const uint64_t layers = static_cast<uint64_t>(moelite_model_get(resident.model, MOELITE_MODEL_N_LAYERS));
  for (uint64_t budget : {total, total / 2, total / 4, minimum, minimum * layers}) {
    if (budget < minimum) budget = minimum;
    for (int variant = 0; variant < 7; ++variant) {
      const char* policy = variant == 1   ? "lfu"
                           : variant == 4 ? "decay"
                           : variant == 5 ? "static"
                           : variant == 6 ? "belady"
                                          : "lru";
      const bool per_layer = variant == 2;
      const char* predictor = variant == 3 || variant == 6 ? "next-gate" : "none";
      if (per_layer && budget < minimum * layers) continue;
      Loaded l;
      ASSERT_EQ(load(kModel, budget, &l, policy, per_layer, predictor), MOELITE_OK) << moelite_last_error();
      const std::vector<float> got = logits_of(l);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "budget " << budget << " " << policy << (per_layer ? " per-layer " : " ") << predictor;
      // And again from a warm store, token by token.
      moelite_context_kv_reset(l.ctx);
      for (size_t i = 0; i < kTokens.size(); ++i) {
        ASSERT_EQ(moelite_eval(l.ctx, &kTokens[i], 1, 0), MOELITE_OK);
        EXPECT_EQ(memcmp(moelite_get_logits(l.ctx, -1), want.data() + i * (want.size() / kTokens.size()),
                         want.size() / kTokens.size() * sizeof(float)),
                  0);
      }
    }
  }
}

TEST(ExpertStore, PreadFallbackGivesTheSameLogits) {
  // The default reader is io_uring where available; the pread fallback must agree bit for bit.
  Loaded resident;
  ASSERT_EQ(load(kModel, 0, &resident), MOELITE_OK);
  const std::vector<float> want = logits_of(resident);
  setenv("MOELITE_IO", "pread", 1);
  Loaded l;
  const moelite_status st = load(kModel, minimum_budget(), &l);
  unsetenv("MOELITE_IO");
  ASSERT_EQ(st, MOELITE_OK);
  const std::vector<float> got = logits_of(l);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(ExpertStore, BudgetIsAHardLimitAndCountersAddUp) {
  const uint64_t total = expert_bytes(), minimum = minimum_budget();
  for (uint64_t budget : {minimum, minimum + 1, total / 3}) {
    Loaded l;
    ASSERT_EQ(load(kModel, budget, &l), MOELITE_OK);
    moelite_model_reset_expert_stats(l.model);
    const auto t0 = std::chrono::steady_clock::now();
    logits_of(l);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t pool = moelite_model_get(l.model, MOELITE_MODEL_EXPERT_POOL_BYTES);
    const int64_t peak = moelite_model_get(l.model, MOELITE_MODEL_EXPERT_PEAK_BYTES);
    EXPECT_GT(peak, 0);
    EXPECT_LE(static_cast<uint64_t>(pool), budget);
    EXPECT_LE(peak, pool);
    moelite_expert_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(moelite_model_expert_stats(l.model, -1, &s), MOELITE_OK);
    EXPECT_EQ(s.activations, s.hits + s.misses);
    EXPECT_GT(s.misses, 0u);
    // Every miss read at least the expert's bytes (aligned reads may read a little more).
    EXPECT_GE(s.bytes_read,
              s.misses * (total / static_cast<uint64_t>(moelite_model_get(l.model, MOELITE_MODEL_N_LAYERS) *
                                                        moelite_model_get(l.model, MOELITE_MODEL_N_EXPERTS))));
    // Per-layer counters sum to the total.
    uint64_t act = 0;
    for (int32_t layer = 0; layer < moelite_model_get(l.model, MOELITE_MODEL_N_LAYERS); ++layer) {
      moelite_expert_stats ls;
      ls.struct_size = sizeof ls;
      ASSERT_EQ(moelite_model_expert_stats(l.model, layer, &ls), MOELITE_OK);
      act += ls.activations;
    }
    EXPECT_EQ(act, s.activations);
    // Reads were in flight for some of the evaluation's time, never more than all of it.
    EXPECT_GT(s.read_busy_seconds, 0.0);
    EXPECT_LE(s.read_busy_seconds, wall);
    moelite_model_reset_expert_stats(l.model);
    ASSERT_EQ(moelite_model_expert_stats(l.model, -1, &s), MOELITE_OK);
    EXPECT_EQ(s.activations, 0u);
    EXPECT_EQ(s.read_busy_seconds, 0.0);
  }
}

TEST(ExpertStore, TooSmallBudgetIsRefusedWithTheMinimum) {
  const uint64_t minimum = minimum_budget();
  Loaded l;
  EXPECT_EQ(load(kModel, minimum - 1, &l), MOELITE_ERR_BUDGET_TOO_SMALL);
  EXPECT_NE(strstr(moelite_last_error(), std::to_string(minimum).c_str()), nullptr);
  EXPECT_EQ(l.model, nullptr);
  Loaded bad_policy;
  EXPECT_EQ(load(kModel, minimum, &bad_policy, "random"), MOELITE_ERR_INVALID_ARGUMENT);
  Loaded bad_predictor;
  EXPECT_EQ(load(kModel, minimum, &bad_predictor, "lru", false, "oracle"), MOELITE_ERR_INVALID_ARGUMENT);
  Loaded per_layer;  // the same budget is too small once every layer needs its own working set
  EXPECT_EQ(load(kModel, minimum, &per_layer, "lru", true), MOELITE_ERR_BUDGET_TOO_SMALL);
}

TEST(ExpertStore, ReadFailuresSurfaceAsErrorsAndTheContextSurvives) {
  // A private copy of the model whose expert data disappears after loading (the file is cut),
  // then comes back.
  const std::string copy = testing::TempDir() + "moelite-store-io-" + std::to_string(getpid()) + ".gguf";
  std::string bytes;
  {
    std::ifstream in(kModel, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
    std::ofstream(copy, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  Loaded resident;
  ASSERT_EQ(load(kModel, 0, &resident), MOELITE_OK);
  const std::vector<float> want = logits_of(resident);

  Loaded l;
  ASSERT_EQ(load(copy, minimum_budget(), &l), MOELITE_OK);
  ASSERT_EQ(truncate(copy.c_str(), static_cast<off_t>(bytes.size() / 3)), 0);
  EXPECT_EQ(moelite_eval(l.ctx, kTokens.data(), static_cast<int32_t>(kTokens.size()), 1), MOELITE_ERR_IO);
  EXPECT_NE(strstr(moelite_last_error(), "expert"), nullptr) << moelite_last_error();
  EXPECT_EQ(moelite_context_kv_length(l.ctx), 0);
  // Restore the file: the same context now evaluates correctly.
  std::ofstream(copy, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const std::vector<float> got = logits_of(l);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  std::remove(copy.c_str());
}
