// Calibration, profiles, predictors and adaptive gating through the public API on the shipped
// trained model: exactness under every predictor and the profile's DP allocation (offloading and
// prediction never change logits), gating reducing the experts used, and every bad input getting
// its own status.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "moelite.h"

namespace {

const std::string kModel = std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf";
const std::string kText = std::string(MOELITE_SOURCE_DIR) + "/tools/train/data/heldout.txt";

struct Params {
  uint64_t budget = 0;
  const char* predictor = "none";
  int32_t depth = 1;
  std::string profile;
  const char* gating = "exact";
  float threshold = 0.0f;
  float penalty = 0.0f;  // 0: the default
  int32_t substitutes = 0;
};

struct Loaded {
  moelite_model* model = nullptr;
  moelite_context* ctx = nullptr;
  ~Loaded() {
    moelite_context_free(ctx);
    moelite_model_free(model);
  }
};

moelite_status load(const Params& p, Loaded* out) {
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model_params_set_threads(mp, 2);
  moelite_model_params_set_expert_budget(mp, p.budget);
  moelite_model_params_set_predictor(mp, p.predictor);
  moelite_model_params_set_predictor_depth(mp, p.depth);
  moelite_model_params_set_profile(mp, p.profile.c_str());
  moelite_status st = moelite_model_params_set_gating(mp, p.gating, p.threshold);
  if (st == MOELITE_OK && p.penalty > 0) st = moelite_model_params_set_gating_penalty(mp, p.penalty);
  if (st == MOELITE_OK && p.substitutes > 0) st = moelite_model_params_set_gating_substitutes(mp, p.substitutes);
  if (st == MOELITE_OK) st = moelite_model_load(kModel.c_str(), mp, &out->model);
  moelite_model_params_free(mp);
  if (st == MOELITE_OK) st = moelite_context_create(out->model, nullptr, &out->ctx);
  return st;
}

std::vector<int32_t> corpus_tokens(moelite_model* model, size_t bytes) {
  std::ifstream in(kText, std::ios::binary);
  std::string text(bytes, '\0');
  in.read(&text[0], static_cast<std::streamsize>(bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<int32_t> tokens(text.size() + 8);
  int32_t n = 0;
  EXPECT_EQ(
      moelite_tokenize(model, text.data(), text.size(), 0, tokens.data(), static_cast<int32_t>(tokens.size()), &n),
      MOELITE_OK);
  tokens.resize(static_cast<size_t>(n));
  return tokens;
}

// Logits of a prompt (batched) and then of decode steps one token at a time (where predictors
// run), all concatenated.
std::vector<float> run(Loaded& l, const std::vector<int32_t>& tokens) {
  const int64_t n_vocab = moelite_model_get(l.model, MOELITE_MODEL_N_VOCAB);
  std::vector<float> out;
  const int32_t prompt = 8;
  EXPECT_EQ(moelite_eval(l.ctx, tokens.data(), prompt, 1), MOELITE_OK) << moelite_last_error();
  for (int32_t i = 0; i < prompt; ++i) {
    const float* row = moelite_get_logits(l.ctx, i);
    out.insert(out.end(), row, row + n_vocab);
  }
  for (size_t i = prompt; i < tokens.size(); ++i) {
    if (moelite_eval(l.ctx, &tokens[i], 1, 0) != MOELITE_OK) {
      ADD_FAILURE() << moelite_last_error();
      return out;
    }
    const float* row = moelite_get_logits(l.ctx, -1);
    out.insert(out.end(), row, row + n_vocab);
  }
  return out;
}

class AdaptiveApi : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    profile_ = testing::TempDir() + "moelite-profile-" + std::to_string(getpid()) + ".json";
    Loaded l;
    ASSERT_EQ(load(Params(), &l), MOELITE_OK) << moelite_last_error();
    tokens_ = corpus_tokens(l.model, 4000);
    ASSERT_GT(tokens_.size(), 600u);
    moelite_calibrate_params* cp = moelite_calibrate_params_create();
    ASSERT_EQ(moelite_calibrate_params_set_window(cp, 128), MOELITE_OK);
    ASSERT_EQ(moelite_calibrate(l.model, tokens_.data(), 512, cp, profile_.c_str()), MOELITE_OK)
        << moelite_last_error();
    moelite_calibrate_params_free(cp);
    total_ = static_cast<uint64_t>(moelite_model_get(l.model, MOELITE_MODEL_EXPERT_BYTES));
    // Longer held-out text for the quality governor: after the calibration text, 1024 tokens.
    const std::vector<int32_t> more = corpus_tokens(l.model, 16000);
    ASSERT_GE(more.size(), 600u + 1024u);
    heldout_.assign(more.begin() + 600, more.begin() + 600 + 1024);
    tokens_.assign(tokens_.begin() + 512, tokens_.begin() + 560);  // evaluation text: not calibration text
  }
  static void TearDownTestSuite() {
    std::remove(profile_.c_str());
    std::remove((profile_ + ".bin").c_str());
  }
  static std::string profile_;
  static std::vector<int32_t> tokens_, heldout_;
  static uint64_t total_;
};
std::string AdaptiveApi::profile_;
std::vector<int32_t> AdaptiveApi::tokens_;
std::vector<int32_t> AdaptiveApi::heldout_;
uint64_t AdaptiveApi::total_ = 0;

}  // namespace

TEST_F(AdaptiveApi, EveryPredictorAndTheDpAllocationLeaveLogitsBitwiseUnchanged) {
  Loaded resident;
  ASSERT_EQ(load(Params(), &resident), MOELITE_OK);
  const std::vector<float> want = run(resident, tokens_);
  struct Variant {
    const char* predictor;
    int32_t depth;
    bool profile;
  };
  const Variant variants[] = {{"next-gate", 1, false},  {"next-gate", 3, false}, {"correlation", 1, false},
                              {"none", 1, true},        {"next-gate", 2, true},  {"learned", 1, true},
                              {"first-layer", 1, true}, {"correlation", 1, true}};
  for (uint64_t budget : {total_ / 4, total_ / 2}) {
    for (const Variant& v : variants) {
      Params p;
      p.budget = budget;
      p.predictor = v.predictor;
      p.depth = v.depth;
      if (v.profile) p.profile = profile_;
      Loaded l;
      ASSERT_EQ(load(p, &l), MOELITE_OK) << v.predictor << ": " << moelite_last_error();
      moelite_model_reset_expert_stats(l.model);
      const std::vector<float> got = run(l, tokens_);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << v.predictor << " depth " << v.depth << (v.profile ? " with profile" : "") << " budget " << budget;
      EXPECT_LE(static_cast<uint64_t>(moelite_model_get(l.model, MOELITE_MODEL_EXPERT_POOL_BYTES)), budget);
      moelite_expert_stats s = {sizeof s};
      ASSERT_EQ(moelite_model_expert_stats(l.model, -1, &s), MOELITE_OK);
      EXPECT_EQ(s.activations, s.hits + s.misses);
      EXPECT_LE(s.predicted, s.activations);
      EXPECT_LE(s.ready_when_needed, s.hits);
      EXPECT_EQ(s.routed_experts, s.routed_tokens * 2);  // exact mode: top-2 everywhere
      if (strcmp(v.predictor, "none") != 0) {
        // A predictor that names nothing right would be useless: on this text every one of them
        // names some of the experts used (chance is 2 of 16 per layer).
        // first-layer only predicts layer 0 (of the next token).
        moelite_expert_stats covered = s;
        if (strcmp(v.predictor, "first-layer") == 0)
          ASSERT_EQ(moelite_model_expert_stats(l.model, 0, &covered), MOELITE_OK);
        EXPECT_GT(covered.predicted, covered.activations / 20) << v.predictor;
        EXPECT_GT(s.predictions, 0u);
        EXPECT_GT(s.prefetches_issued, 0u);
      } else {
        EXPECT_EQ(s.predicted, 0u);
      }
    }
  }
}

// Prefill lookahead (core/forward/moe_block.cpp): a prompt evaluated at once under a budget names the
// next layer's experts to the store as soon as a layer has routed, so their reads start while the
// layer computes. Results are the resident model's bit for bit; the guesses are read (issued,
// then used), layer 0 is never guessed (nothing comes before it), and the layers after it miss
// less than with MOELITE_PREFILL_LOOKAHEAD=0, which issues nothing.
TEST_F(AdaptiveApi, PrefillLookaheadReadsTheNextLayerEarlyAndChangesNoResult) {
  const int64_t n_vocab = [] {
    Loaded l;
    EXPECT_EQ(load(Params(), &l), MOELITE_OK);
    return moelite_model_get(l.model, MOELITE_MODEL_N_VOCAB);
  }();
  const int32_t n = static_cast<int32_t>(tokens_.size());  // 48: every layer uses nearly all 16 experts
  auto prompt = [&](uint64_t budget, std::vector<float>* logits, moelite_expert_stats* all,
                    moelite_expert_stats* first) {
    Params p;
    p.budget = budget;
    Loaded l;
    ASSERT_EQ(load(p, &l), MOELITE_OK) << moelite_last_error();
    ASSERT_EQ(moelite_eval(l.ctx, tokens_.data(), n, 1), MOELITE_OK) << moelite_last_error();
    logits->clear();
    for (int32_t i = 0; i < n; ++i) {
      const float* row = moelite_get_logits(l.ctx, i);
      logits->insert(logits->end(), row, row + n_vocab);
    }
    all->struct_size = first->struct_size = sizeof *all;
    ASSERT_EQ(moelite_model_expert_stats(l.model, -1, all), MOELITE_OK);
    ASSERT_EQ(moelite_model_expert_stats(l.model, 0, first), MOELITE_OK);
  };
  std::vector<float> want, on, off;
  moelite_expert_stats s_on, first_on, s_off, first_off, unused, unused0;
  prompt(0, &want, &unused, &unused0);
  for (const uint64_t budget : {total_ / 2, total_ * 3 / 4}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    prompt(budget, &on, &s_on, &first_on);
    ASSERT_EQ(setenv("MOELITE_PREFILL_LOOKAHEAD", "0", 1), 0);
    prompt(budget, &off, &s_off, &first_off);
    ASSERT_EQ(unsetenv("MOELITE_PREFILL_LOOKAHEAD"), 0);
    ASSERT_EQ(on.size(), want.size());
    EXPECT_EQ(memcmp(on.data(), want.data(), want.size() * sizeof(float)), 0);
    EXPECT_EQ(memcmp(off.data(), want.data(), want.size() * sizeof(float)), 0);
    EXPECT_GT(s_on.prefetches_issued, 0u);
    EXPECT_GT(s_on.prefetches_used, 0u);
    EXPECT_EQ(first_on.prefetches_issued, 0u);
    EXPECT_EQ(s_off.prefetches_issued, 0u);
    EXPECT_EQ(first_on.misses, first_off.misses);
    EXPECT_LT(s_on.misses - first_on.misses, s_off.misses - first_off.misses);
    EXPECT_EQ(s_on.activations, s_off.activations);
    std::printf("budget %llu: misses after layer 0 %llu with lookahead, %llu without; %llu guesses read, %llu used\n",
                static_cast<unsigned long long>(budget),
                static_cast<unsigned long long>(s_on.misses - first_on.misses),
                static_cast<unsigned long long>(s_off.misses - first_off.misses),
                static_cast<unsigned long long>(s_on.prefetches_issued),
                static_cast<unsigned long long>(s_on.prefetches_used));
  }
}

TEST_F(AdaptiveApi, GatingUsesFewerExpertsAndChangesResultsOnlyWhenAsked) {
  Loaded exact;
  ASSERT_EQ(load(Params(), &exact), MOELITE_OK);
  const std::vector<float> want = run(exact, tokens_);
  moelite_expert_stats s = {sizeof s};
  ASSERT_EQ(moelite_model_expert_stats(exact.model, -1, &s), MOELITE_OK);
  EXPECT_EQ(s.routed_experts, s.routed_tokens * 2);
  EXPECT_EQ(s.routed_tokens, tokens_.size() * 4);  // 4 layers

  for (const char* mode : {"score", "sensitivity"}) {
    Params p;
    p.gating = mode;
    p.threshold = strcmp(mode, "score") == 0 ? 0.2f : 0.01f;
    p.profile = profile_;
    Loaded l;
    ASSERT_EQ(load(p, &l), MOELITE_OK) << moelite_last_error();
    const std::vector<float> got = run(l, tokens_);
    ASSERT_EQ(moelite_model_expert_stats(l.model, -1, &s), MOELITE_OK);
    EXPECT_LT(s.routed_experts, s.routed_tokens * 2) << mode;
    EXPECT_GE(s.routed_experts, s.routed_tokens) << mode;  // at least one expert each
    EXPECT_NE(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << mode;
    // Gated and budgeted: still bitwise the gated resident result (offloading never changes it).
    p.budget = total_ / 4;
    p.predictor = "learned";
    Loaded b;
    ASSERT_EQ(load(p, &b), MOELITE_OK) << moelite_last_error();
    const std::vector<float> budgeted = run(b, tokens_);
    EXPECT_EQ(memcmp(budgeted.data(), got.data(), got.size() * sizeof(float)), 0) << mode;
  }
  // Threshold 0 is exact whatever the mode.
  Params zero;
  zero.gating = "score";
  Loaded z;
  ASSERT_EQ(load(zero, &z), MOELITE_OK);
  const std::vector<float> same = run(z, tokens_);
  EXPECT_EQ(memcmp(same.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST_F(AdaptiveApi, CacheAwareGatingIsSensitivityWithoutABudgetAndLoadsLessWithOne) {
  // No budget: every expert is resident, so cache-aware is sensitivity gating bit for bit
  // (batched prompt and decode), whatever the penalty.
  for (float t : {0.003f, 0.01f, 0.05f}) {
    Params sp;
    sp.gating = "sensitivity";
    sp.threshold = t;
    sp.profile = profile_;
    Loaded s;
    ASSERT_EQ(load(sp, &s), MOELITE_OK) << moelite_last_error();
    const std::vector<float> want = run(s, tokens_);
    Params cp = sp;
    cp.gating = "cache-aware";
    cp.penalty = 50.0f;
    Loaded c;
    ASSERT_EQ(load(cp, &c), MOELITE_OK) << moelite_last_error();
    const std::vector<float> got = run(c, tokens_);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "T = " << t;
    moelite_expert_stats a = {sizeof a}, b = {sizeof b};
    ASSERT_EQ(moelite_model_expert_stats(s.model, -1, &a), MOELITE_OK);
    ASSERT_EQ(moelite_model_expert_stats(c.model, -1, &b), MOELITE_OK);
    EXPECT_EQ(a.routed_experts, b.routed_experts);
  }
  // A budget: at the same threshold cache-aware reads no more experts from storage than
  // sensitivity gating (here: strictly fewer), and the same sequence of evaluations gives the
  // same result again (no predictor: the store's state is a function of the evaluations).
  const uint64_t budget = total_ / 4;
  auto measure = [&](const char* mode, float penalty, std::vector<float>* logits, moelite_expert_stats* st) {
    Params p;
    p.budget = budget;
    p.gating = mode;
    p.threshold = 0.01f;
    p.penalty = penalty;
    p.profile = profile_;
    Loaded l;
    ASSERT_EQ(load(p, &l), MOELITE_OK) << moelite_last_error();
    *logits = run(l, tokens_);
    st->struct_size = sizeof *st;
    ASSERT_EQ(moelite_model_expert_stats(l.model, -1, st), MOELITE_OK);
  };
  std::vector<float> sens, aware, again, unit;
  moelite_expert_stats ss, as, as2, us;
  measure("sensitivity", 0.0f, &sens, &ss);
  measure("cache-aware", 0.0f, &aware, &as);
  measure("cache-aware", 0.0f, &again, &as2);
  measure("cache-aware", 1.0f, &unit, &us);
  EXPECT_LT(as.misses, ss.misses);
  EXPECT_LT(as.routed_experts, ss.routed_experts);
  EXPECT_GE(as.routed_experts, as.routed_tokens);
  EXPECT_EQ(as.prefetches_issued, 0u);
  ASSERT_EQ(aware.size(), again.size());
  EXPECT_EQ(memcmp(aware.data(), again.data(), aware.size() * sizeof(float)), 0);
  EXPECT_EQ(as.misses, as2.misses);
  // Penalty 1 is sensitivity gating, budget or not.
  ASSERT_EQ(unit.size(), sens.size());
  EXPECT_EQ(memcmp(unit.data(), sens.data(), sens.size() * sizeof(float)), 0);
  EXPECT_EQ(us.misses, ss.misses);
}

TEST_F(AdaptiveApi, CacheAwareSubstitutionKeepsExpertsAndLoadsLessUnderABudgetOnly) {
  // No budget: nothing is resident-or-not, so substitution changes nothing (bitwise).
  Params plain;
  plain.gating = "cache-aware";
  plain.threshold = 0.003f;
  plain.profile = profile_;
  Params swap = plain;
  swap.substitutes = 14;
  {
    Loaded a, b;
    ASSERT_EQ(load(plain, &a), MOELITE_OK) << moelite_last_error();
    ASSERT_EQ(load(swap, &b), MOELITE_OK) << moelite_last_error();
    const std::vector<float> x = run(a, tokens_), y = run(b, tokens_);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
  }
  // A quarter budget: substitution answers some absent experts with resident ones, so the
  // results change, fewer experts are read, and the same evaluations give the same result again.
  plain.budget = swap.budget = total_ / 4;
  auto measure = [&](const Params& p, std::vector<float>* logits, moelite_expert_stats* st) {
    Loaded l;
    ASSERT_EQ(load(p, &l), MOELITE_OK) << moelite_last_error();
    *logits = run(l, tokens_);
    st->struct_size = sizeof *st;
    ASSERT_EQ(moelite_model_expert_stats(l.model, -1, st), MOELITE_OK);
  };
  std::vector<float> without, with, again;
  moelite_expert_stats ws, ss, ss2;
  measure(plain, &without, &ws);
  measure(swap, &with, &ss);
  measure(swap, &again, &ss2);
  ASSERT_EQ(without.size(), with.size());
  EXPECT_NE(memcmp(without.data(), with.data(), with.size() * sizeof(float)), 0);
  EXPECT_LT(ss.misses, ws.misses);
  // Every token keeps at least its first expert and at most k.
  EXPECT_GE(ss.routed_experts, ss.routed_tokens);
  EXPECT_LE(ss.routed_experts, ss.routed_tokens * 2);
  ASSERT_EQ(with.size(), again.size());
  EXPECT_EQ(memcmp(with.data(), again.data(), with.size() * sizeof(float)), 0);
  EXPECT_EQ(ss.misses, ss2.misses);
  for (float v : with) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(AdaptiveApi, BadInputsGetTheirOwnStatus) {
  moelite_model_params* mp = moelite_model_params_create();
  EXPECT_EQ(moelite_model_params_set_gating(mp, "topk", 0.1f), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating(mp, "score", -1.0f), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating(mp, "score", NAN), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_predictor_depth(mp, 0), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating(mp, "cache-aware", 0.01f), MOELITE_OK);
  EXPECT_EQ(moelite_model_params_set_gating(mp, "cache-aware", -0.5f), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating(mp, "cache-aware", INFINITY), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating(mp, "Cache-Aware", 0.01f), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_penalty(mp, 0.5f), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_penalty(mp, NAN), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_penalty(mp, INFINITY), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_penalty(nullptr, 2.0f), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_penalty(mp, 1.0f), MOELITE_OK);
  EXPECT_EQ(moelite_model_params_set_gating_substitutes(mp, -1), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_substitutes(mp, 65537), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_substitutes(nullptr, 4), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_params_set_gating_substitutes(mp, 65536), MOELITE_OK);  // capped at n_expert - k at load
  EXPECT_EQ(moelite_model_params_set_gating_substitutes(mp, 0), MOELITE_OK);
  moelite_model_params_free(mp);
  Params aware;
  aware.gating = "cache-aware";
  aware.threshold = 0.01f;
  aware.budget = total_ / 4;
  Loaded aware_no_profile;
  EXPECT_EQ(load(aware, &aware_no_profile), MOELITE_ERR_BAD_PROFILE);
  EXPECT_NE(strstr(moelite_last_error(), "cache-aware"), nullptr) << moelite_last_error();

  Params p;
  p.gating = "sensitivity";
  p.threshold = 0.01f;
  Loaded no_profile;
  EXPECT_EQ(load(p, &no_profile), MOELITE_ERR_BAD_PROFILE);
  Params learned;
  learned.budget = total_ / 4;
  learned.predictor = "learned";
  Loaded no_weights;
  EXPECT_EQ(load(learned, &no_weights), MOELITE_ERR_BAD_PROFILE);
  Params pregate = learned;
  pregate.predictor = "pregate";
  Loaded no_pregate;
  EXPECT_EQ(load(pregate, &no_pregate), MOELITE_ERR_INVALID_ARGUMENT);
  Params missing;
  missing.profile = profile_ + ".nope";
  Loaded m;
  EXPECT_EQ(load(missing, &m), MOELITE_ERR_FILE_NOT_FOUND);
  // A profile of another model (its dimensions edited consistently: still well-formed).
  std::string text;
  {
    std::ifstream in(profile_, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("\"arch\": \"qwen3moe\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 18, "\"arch\": \"olmoe\"");
  const std::string other = profile_ + ".other.json";
  std::ofstream(other, std::ios::binary) << text;
  Params wrong;
  wrong.profile = other;
  Loaded w;
  EXPECT_EQ(load(wrong, &w), MOELITE_ERR_BAD_PROFILE);
  EXPECT_NE(strstr(moelite_last_error(), "olmoe"), nullptr) << moelite_last_error();
  std::remove(other.c_str());

  // Calibration's own errors.
  Loaded l;
  ASSERT_EQ(load(Params(), &l), MOELITE_OK);
  const int32_t one[] = {5}, bad[] = {5, 1 << 30};
  EXPECT_EQ(moelite_calibrate(l.model, one, 1, nullptr, "/tmp/x.json"), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_calibrate(l.model, bad, 2, nullptr, "/tmp/x.json"), MOELITE_ERR_BAD_TOKEN);
  EXPECT_EQ(moelite_calibrate(l.model, tokens_.data(), 16, nullptr, "/nonexistent-dir-moelite/p.json"), MOELITE_ERR_IO);
  EXPECT_EQ(moelite_calibrate(l.model, tokens_.data(), 16, nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  Params gated;
  gated.gating = "score";
  gated.threshold = 0.2f;
  Loaded g;
  ASSERT_EQ(load(gated, &g), MOELITE_OK);
  EXPECT_EQ(moelite_calibrate(g.model, tokens_.data(), 16, nullptr, "/tmp/x.json"), MOELITE_ERR_INVALID_ARGUMENT);
  moelite_calibrate_params* cp = moelite_calibrate_params_create();
  EXPECT_EQ(moelite_calibrate_params_set_window(cp, 1), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_calibrate_params_set_holdout(cp, 1.0), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_calibrate_params_set_stride(cp, 0), MOELITE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(moelite_calibrate_params_set_stride(cp, 9), MOELITE_OK);  // checked against the model
  EXPECT_EQ(moelite_calibrate(l.model, tokens_.data(), 16, cp, "/tmp/x.json"), MOELITE_ERR_INVALID_ARGUMENT);
  moelite_calibrate_params_free(cp);
}

// The store's handling of multi-layer predictions, through its C++ interface: the nearest layer's
// guesses load first, a deeper layer's only once every nearer guess is resident, and a newer hint
// replaces what is still waiting.
#include <atomic>
#include <chrono>
#include <thread>

#include "core/exec/runtime.h"
#include "core/experts/expert_store.h"
#include "core/model/model.h"
#include "platforms/fault_inject.h"
#include "tests/proc_self_maps.h"

// The sensitivity sample: whole windows, recorded in the profile; the progress callback rises
// steadily to 1.
TEST_F(AdaptiveApi, SensitivitySampleIsRecordedAndProgressRisesToOne) {
  Loaded l;
  ASSERT_EQ(load(Params(), &l), MOELITE_OK);
  std::vector<int32_t> corpus = corpus_tokens(l.model, 2000);
  ASSERT_GE(corpus.size(), 256u);
  const std::string path = testing::TempDir() + "moelite-sample-" + std::to_string(getpid()) + ".json";
  auto read = [&] {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  moelite_calibrate_params* cp = moelite_calibrate_params_create();
  EXPECT_EQ(moelite_calibrate_params_set_sensitivity_tokens(cp, -2), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_calibrate_params_set_sensitivity_tokens(nullptr, 0), MOELITE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(moelite_calibrate_params_set_window(cp, 64), MOELITE_OK);
  ASSERT_EQ(moelite_calibrate_params_set_sensitivity_tokens(cp, 65), MOELITE_OK);  // two windows
  std::vector<float> seen;
  auto record = [](float p, void* user) {
    static_cast<std::vector<float>*>(user)->push_back(p);
    return 1;
  };
  ASSERT_EQ(moelite_calibrate_params_set_progress_callback(cp, record, &seen), MOELITE_OK);
  ASSERT_EQ(moelite_calibrate(l.model, corpus.data(), 256, cp, path.c_str()), MOELITE_OK) << moelite_last_error();
  EXPECT_NE(read().find("\"sensitivity_tokens\": 128"), std::string::npos) << read();
  ASSERT_GT(seen.size(), 4u);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);
  EXPECT_EQ(seen.back(), 1.0f);
  EXPECT_LT(seen[seen.size() - 2], 1.0f);
  ASSERT_EQ(moelite_calibrate_params_set_sensitivity_tokens(cp, 0), MOELITE_OK);  // every window
  ASSERT_EQ(moelite_calibrate(l.model, corpus.data(), 256, cp, path.c_str()), MOELITE_OK);
  EXPECT_NE(read().find("\"sensitivity_tokens\": 256"), std::string::npos);
  moelite_calibrate_params_free(cp);
  std::remove(path.c_str());
  std::remove((path + ".bin").c_str());
}

// The shipped model with a budget of half its experts, and its runtime (the store), one thread.
void half_budget_runtime(std::unique_ptr<moelite::Model>* m, std::unique_ptr<moelite::Runtime>* rt) {
  moelite::LoadOptions o;
  moelite::RuntimeOptions ro;
  ro.n_threads = 1;
  ASSERT_EQ(moelite::Model::load(kModel, o, m), MOELITE_OK);
  ro.expert_budget = moelite::ExpertBudget::of_bytes(static_cast<uint64_t>((*m)->expert_bytes) / 2);
  o.stream_experts = true;
  ASSERT_EQ(moelite::Model::load(kModel, o, m), MOELITE_OK) << moelite_last_error();
  ASSERT_EQ(moelite::Runtime::create(**m, ro, rt), MOELITE_OK) << moelite_last_error();
}

TEST(ExpertStorePredictions, DeeperGuessesWaitForNearerOnesToBeResident) {
  std::unique_ptr<moelite::Model> m;
  std::unique_ptr<moelite::Runtime> rt;
  half_budget_runtime(&m, &rt);
  ASSERT_TRUE(rt && rt->store);
  moelite::ExpertStore& store = *rt->store;
  auto issued = [&](int layer) { return store.stats()[static_cast<size_t>(layer)].prefetches_issued; };
  auto wait_for = [&](int layer, uint64_t n) {
    for (int i = 0; i < 2000 && issued(layer) < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return issued(layer);
  };
  using moelite::Prediction;
  // Layer 1: experts 3 and 5; layer 2: expert 7, issued at once (-1: no layer is being prepared).
  store.hint({{{2, 7}, 0.9f}, {{1, 3}, 0.8f}, {{1, 5}, 0.7f}}, -1);
  EXPECT_EQ(issued(1), 2u);  // the nearest layer goes out immediately
  // Layer 2's guess follows once 3 and 5 have landed.
  EXPECT_EQ(wait_for(2, 1), 1u);
  // A newer hint replaces the waiting guesses: layer 3's expert 1 goes out, layer 2's 7 is not
  // issued again (it is resident already).
  store.hint({{{2, 7}, 1.0f}, {{3, 1}, 1.0f}}, -1);
  EXPECT_EQ(wait_for(3, 1), 1u);
  EXPECT_EQ(issued(2), 1u);
  // Guesses made while layer 0 is being computed wait for its prepare().
  store.hint({{{1, 9}, 1.0f}}, 0);
  EXPECT_EQ(issued(1), 2u);
  ASSERT_EQ(store.prepare(0, {0, 1}), MOELITE_OK);
  EXPECT_EQ(issued(1), 3u);
  for (int32_t e : {0, 1}) {
    std::vector<int32_t> pending = {e};
    int32_t got;
    moelite::ExpertWeights w;
    ASSERT_EQ(store.acquire_next(0, &pending, &got, &w), MOELITE_OK);
    store.release(0, got);
  }
}

// The store reads a guess of an absent expert only where guesses of its confidence have been used
// often enough (core/experts/guess_gate.h): eight guesses at 0.05 that the routing did not use
// close that band; a ninth is not read, while a guess at 0.3 and a certain one are. The closed
// band's guesses are scored all the same, unread: twelve used ones open it again.
TEST(ExpertStorePredictions, GuessesOfAConfidenceTheRoutingRefusesAreNotRead) {
  setenv("MOELITE_PREDICT_MIN_PRECISION", "0.6", 1);
  std::unique_ptr<moelite::Model> m;
  std::unique_ptr<moelite::Runtime> rt;
  half_budget_runtime(&m, &rt);
  unsetenv("MOELITE_PREDICT_MIN_PRECISION");
  ASSERT_TRUE(rt && rt->store);
  moelite::ExpertStore& store = *rt->store;
  auto issued = [&] {
    uint64_t n = 0;
    for (const moelite::ExpertLayerStats& s : store.stats()) n += s.prefetches_issued;
    return n;
  };
  for (int32_t e = 0; e < 8; ++e) {  // layer 1's experts 0..7, each refuted by a routing of 14 and 15
    store.hint({{{1, e}, 0.05f}}, -1);
    store.on_routing(1, moelite::Routing{1, 2, {14, 15}, {0.5f, 0.5f}});
  }
  EXPECT_EQ(issued(), 8u) << "guesses of a band not yet known are read";
  store.hint({{{1, 8}, 0.05f}}, -1);
  EXPECT_EQ(issued(), 8u) << "a guess of the closed band was read";
  EXPECT_FALSE(store.resident_or_loading(1, 8));
  store.hint({{{1, 9}, 0.3f}, {{1, 10}, moelite::kCertain}}, -1);
  EXPECT_EQ(issued(), 10u);
  for (int32_t e = 0; e < 12; ++e) {  // layer 2's experts 0..11 guessed at 0.05, unread, each used
    store.hint({{{2, e}, 0.05f}}, -1);
    EXPECT_FALSE(store.resident_or_loading(2, e));
    store.on_routing(2, moelite::Routing{1, 2, {e, 15}, {0.5f, 0.5f}});
  }
  EXPECT_EQ(issued(), 10u);
  store.hint({{{2, 12}, 0.05f}}, -1);  // 12 used of 20: 0.6, open again
  EXPECT_EQ(issued(), 11u);
}

// Guesses never hold the last free loader, and the most confident goes first: with the default
// two loaders one guess is read at a time, in order of confidence, so while the first guess's read
// stalls (a slow device) the others wait in the queue, where the routing of their layer can still
// drop them unread, instead of taking the loader and the bandwidth demand reads need; with three
// loaders two are read at once. Before, every loader read a guess of its own at once.
TEST(ExpertStorePredictions, GuessesLeaveALoaderFreeMostConfidentFirst) {
  namespace fault = moelite::platform::fault;
  for (const char* loaders : {"2", "3"}) {
    SCOPED_TRACE(std::string(loaders) + " loaders");
    setenv("MOELITE_IO", "pread", 1);  // the stall below is injected into pread
    setenv("MOELITE_IO_THREADS", loaders, 1);
    std::unique_ptr<moelite::Model> m;
    std::unique_ptr<moelite::Runtime> rt;
    half_budget_runtime(&m, &rt);
    unsetenv("MOELITE_IO");
    unsetenv("MOELITE_IO_THREADS");
    ASSERT_TRUE(rt && rt->store);
    moelite::ExpertStore& store = *rt->store;
    constexpr double kStall = 1.0;
    fault::arm_stall(fault::Kind::kRead, 1, kStall);  // the first read from now on
    const auto start = std::chrono::steady_clock::now();
    store.hint({{{1, 5}, 0.5f}, {{1, 3}, 0.9f}, {{1, 4}, 0.7f}}, -1);
    EXPECT_EQ(store.stats()[1].prefetches_issued, 3u);
    const bool two = std::string(loaders) == "3";
    if (two) {
      // Two guesses at once (3 and 4, the most confident): one stalls, whichever read first; the
      // other lands and its loader reads the third guess, 5, which lands too, all within the stall.
      for (int i = 0; i < 500 && !store.ready(1, 5); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const bool in_stall = std::chrono::steady_clock::now() - start < std::chrono::duration<double>(kStall * 0.9);
      if (in_stall) {  // a machine too slow to look within the stall proves nothing either way
        EXPECT_TRUE(store.ready(1, 5)) << "a second guess was not read beside the stalled one";
        EXPECT_EQ(int(store.ready(1, 3)) + int(store.ready(1, 4)), 1) << "the stalled guess landed early";
      }
    } else {
      // One at a time, in order of confidence: 3 (stalled), then 4, then 5; nothing lands during
      // the stall, and a later guess is never whole before an earlier one.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const bool in_stall = std::chrono::steady_clock::now() - start < std::chrono::duration<double>(kStall * 0.9);
      if (in_stall)
        for (int32_t e : {3, 4, 5})
          EXPECT_FALSE(store.ready(1, e)) << "guess " << e << " was read beside the stalled one";
      for (int i = 0; i < 10000 && !store.ready(1, 5); ++i) {
        // The latest first: a guess seen whole means every earlier one was whole before.
        const bool r5 = store.ready(1, 5), r4 = store.ready(1, 4), r3 = store.ready(1, 3);
        if (r5) EXPECT_TRUE(r4) << "guess 5 landed before guess 4";
        if (r4) EXPECT_TRUE(r3) << "guess 4 landed before guess 3";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    for (int32_t e : {3, 4, 5})
      for (int i = 0; i < 10000 && !store.ready(1, e); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fault::disarm();
    for (int32_t e : {3, 4, 5}) EXPECT_TRUE(store.ready(1, e)) << e;
  }
}

// The store of half_budget_runtime with `loaders` loaders reading with pread (where faults are
// injected), each guess one matrix at a time (4096 bytes in flight: every read a step of its own).
class StepwiseStore {
 public:
  explicit StepwiseStore(const char* loaders) {
    setenv("MOELITE_IO", "pread", 1);
    setenv("MOELITE_IO_THREADS", loaders, 1);
    setenv("MOELITE_IO_BYTES_IN_FLIGHT", "4096", 1);
    half_budget_runtime(&model_, &runtime_);
    unsetenv("MOELITE_IO");
    unsetenv("MOELITE_IO_THREADS");
    unsetenv("MOELITE_IO_BYTES_IN_FLIGHT");
  }
  // Null when the runtime could not be made (half_budget_runtime has failed the test).
  moelite::ExpertStore* store() const { return runtime_ ? runtime_->store : nullptr; }

 private:
  std::unique_ptr<moelite::Model> model_;
  std::unique_ptr<moelite::Runtime> runtime_;
};

// Waits (up to 10 s) until `done`; false if it never came.
template <class Done>
bool wait_until(Done&& done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done();
}

// Hands a prepared expert out and back, as a layer's computation does.
void compute_one(moelite::ExpertStore& store, int32_t layer, int32_t expert) {
  std::vector<int32_t> pending = {expert};
  int32_t got = -1;
  moelite::ExpertWeights w;
  ASSERT_EQ(store.acquire_next(layer, &pending, &got, &w), MOELITE_OK) << moelite_last_error();
  store.release(layer, got);
}

// take_ready hands out, without waiting, the experts of a round whose reads have all landed, in
// the round's order, and leaves the one still being read pending (acquire_next then waits for it).
TEST(ExpertStore, TakeReadyHandsOutOnlyExpertsWhollyInMemory) {
  namespace fault = moelite::platform::fault;
  StepwiseStore stepwise("2");
  ASSERT_NE(stepwise.store(), nullptr);
  moelite::ExpertStore& store = *stepwise.store();
  ASSERT_EQ(store.prepare(0, {1, 5}), MOELITE_OK);
  compute_one(store, 0, 1);
  compute_one(store, 0, 5);
  // Handed out once gate and up were in: wait for the down projections too.
  ASSERT_TRUE(wait_until([&] { return store.ready(0, 1) && store.ready(0, 5); }));
  fault::arm_stall(fault::Kind::kRead, 1, 1.0);  // expert 2's first read
  ASSERT_EQ(store.prepare(0, {5, 2, 1}), MOELITE_OK);
  ASSERT_TRUE(wait_until([] { return fault::calls(fault::Kind::kRead) >= 1; }));
  std::vector<int32_t> pending = {5, 2, 1};
  std::vector<moelite::ReadyExpert> ready;
  ready.reserve(pending.size());
  store.take_ready(0, &pending, &ready);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].expert, 5);
  EXPECT_EQ(ready[1].expert, 1);
  EXPECT_NE(ready[0].w.gate.data, ready[1].w.gate.data) << "two slots";
  EXPECT_EQ(pending, std::vector<int32_t>{2});
  EXPECT_FALSE(store.ready(0, 2)) << "the stall ended before the take";
  for (const moelite::ReadyExpert& r : ready) store.release(0, r.expert);
  compute_one(store, 0, 2);  // waits for the stalled read
  fault::disarm();
}

#if defined(__linux__)
// The slot pool asks for transparent huge pages (MOELITE_HUGE_PAGES, on unless 0): the slots that
// lie in the pool's whole huge pages are in memory advised for them.
TEST(ExpertStore, TheSlotPoolIsAdvisedForHugePages) {
  if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0) GTEST_SKIP() << "no transparent huge pages";
  std::unique_ptr<moelite::Model> m;
  std::unique_ptr<moelite::Runtime> rt;
  half_budget_runtime(&m, &rt);
  ASSERT_TRUE(rt && rt->store);
  moelite::ExpertStore& store = *rt->store;
  ASSERT_GE(store.pool_bytes(), uint64_t{4} << 20) << "a pool with a whole huge page in it";
  // Every slot, through one expert of each layer after another (each load takes a free slot first).
  int advised = 0, slots = 0;
  for (int32_t l = 0; l < m->hp.n_layer && slots < store.pool_slots(); ++l)
    for (int32_t e = 0; e < store.capacity(l) && slots < store.pool_slots(); ++e, ++slots) {
      ASSERT_EQ(store.prepare(l, {e}), MOELITE_OK);
      std::vector<int32_t> pending = {e};
      int32_t got = -1;
      moelite::ExpertWeights w;
      ASSERT_EQ(store.acquire_next(l, &pending, &got, &w), MOELITE_OK) << moelite_last_error();
      advised += moelite::test::advised_huge(w.gate.data) ? 1 : 0;
      store.release(l, got);
    }
  const uint64_t huge_pages_inside = store.pool_bytes() / (uint64_t{2} << 20) - 1;  // at least
  EXPECT_GE(static_cast<uint64_t>(advised) * store.slot_bytes(),
            huge_pages_inside * (uint64_t{2} << 20) - store.slot_bytes())
      << advised << " of " << slots << " slots";
}
#endif

// A guess its layer's routing confirms while it still waits in the queue behind another guess is
// read at once as a demand read, on the loader guesses leave free (before, it waited for the guess
// ahead of it: a 50 % decode's trace showed such experts starting 1-2 ms after their routing while
// that loader idled); a guess the routing refutes while being read stops after the read in flight
// and frees its slot (its other reads are never made).
TEST(ExpertStorePredictions, ConfirmedGuessesJumpTheQueueRefutedOnesStop) {
  namespace fault = moelite::platform::fault;
  StepwiseStore stepwise("2");
  ASSERT_NE(stepwise.store(), nullptr);
  moelite::ExpertStore& store = *stepwise.store();
  constexpr double kStall = 2.0;
  fault::arm_stall(fault::Kind::kRead, 1, kStall);  // guess 3's first read
  const auto start = std::chrono::steady_clock::now();
  store.hint({{{1, 3}, 0.9f}, {{1, 4}, 0.7f}}, -1);
  ASSERT_TRUE(wait_until([] { return fault::calls(fault::Kind::kRead) >= 1; }));
  store.on_routing(1, moelite::Routing{1, 1, {4}, {1.0f}});
  ASSERT_EQ(store.prepare(1, {4}), MOELITE_OK);
  ASSERT_TRUE(wait_until([&] { return store.ready(1, 4); }));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), kStall)
      << "the confirmed guess waited for the stalled one";
  compute_one(store, 1, 4);
  // Guess 3: once its stalled read lands, nothing more of it is read and its slot is free.
  EXPECT_TRUE(wait_until([&] { return !store.resident_or_loading(1, 3); })) << "the refuted guess was read whole";
  const moelite::ExpertLayerStats st = store.stats()[1];
  EXPECT_EQ(st.reads, 3u + 1u) << "expert 4's three reads and guess 3's first";
  EXPECT_EQ(st.prefetches_wasted, 1u);
  EXPECT_EQ(st.prefetches_used, 1u);
  fault::disarm();
}

// A guess refuted while it is read, then named again by a newer hint (a later token's guesses),
// is read whole: the newer guess is not lost with the refuted one.
TEST(ExpertStorePredictions, ARefutedGuessNamedAgainIsReadWhole) {
  namespace fault = moelite::platform::fault;
  StepwiseStore stepwise("2");
  ASSERT_NE(stepwise.store(), nullptr);
  moelite::ExpertStore& store = *stepwise.store();
  fault::arm_stall(fault::Kind::kRead, 1, 1.0);  // guess 3's first read
  store.hint({{{1, 3}, 0.9f}}, -1);
  ASSERT_TRUE(wait_until([] { return fault::calls(fault::Kind::kRead) >= 1; }));
  store.on_routing(1, moelite::Routing{1, 1, {4}, {1.0f}});  // refutes 3 while its read stalls
  store.hint({{{1, 3}, 0.8f}}, -1);                          // and 3 is guessed again
  EXPECT_TRUE(wait_until([&] { return store.ready(1, 3); })) << "the guess named again was dropped";
  EXPECT_EQ(store.stats()[1].prefetches_wasted, 0u);
  fault::disarm();
}

// Demand reads go before the rest of a guess being read: with two loaders a guess waits while a
// demand read is in flight on the other (a stalled one here: the guess reads nothing meanwhile);
// with one loader, the loader reads a demand queued while its guess is read before the guess's
// next read (before, both read beside each other and a 50 % decode's demand reads took 2-3x as
// long; with one loader the demand waited for the whole guess).
TEST(ExpertStorePredictions, GuessesGiveWayToDemandReads) {
  namespace fault = moelite::platform::fault;
  for (const char* loaders : {"2", "1"}) {
    SCOPED_TRACE(std::string(loaders) + " loader(s)");
    StepwiseStore stepwise(loaders);
    ASSERT_NE(stepwise.store(), nullptr);
    moelite::ExpertStore& store = *stepwise.store();
    constexpr double kStall = 1.0;
    fault::arm_stall(fault::Kind::kRead, 1, kStall);
    const auto start = std::chrono::steady_clock::now();
    auto in_stall = [&] {
      return std::chrono::steady_clock::now() - start < std::chrono::duration<double>(kStall * 0.9);
    };
    if (std::string(loaders) == "2") {
      ASSERT_EQ(store.prepare(0, {0}), MOELITE_OK);  // a miss: its first read stalls
      ASSERT_TRUE(wait_until([] { return fault::calls(fault::Kind::kRead) >= 1; }));
      store.hint({{{1, 3}, 0.9f}}, -1);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const int64_t reads = fault::calls(fault::Kind::kRead);
      if (in_stall()) EXPECT_EQ(reads, 1) << "the guess was read beside the demand read";
    } else {
      store.hint({{{1, 3}, 0.9f}}, -1);  // its first read stalls
      ASSERT_TRUE(wait_until([] { return fault::calls(fault::Kind::kRead) >= 1; }));
      ASSERT_EQ(store.prepare(0, {0}), MOELITE_OK);  // queued while the only loader reads the guess
      // The second read after the stalled one stalls too: the demand's second if the loader turned
      // to it, the guess's third if it did not. Each read is counted as it lands, before the next.
      fault::arm_stall(fault::Kind::kRead, 2, kStall);
      ASSERT_TRUE(wait_until([] { return fault::calls(fault::Kind::kRead) >= 2; }));
      EXPECT_EQ(store.stats()[1].reads, 1u) << "the guess went on before the demand read";
      EXPECT_EQ(store.stats()[0].reads, 1u);
    }
    // Whichever came first, the demand read is whole before the guess is.
    bool guess_first = false;
    EXPECT_TRUE(wait_until([&] {
      const bool guess = store.ready(1, 3), demand = store.ready(0, 0);
      guess_first = guess_first || (guess && !demand);
      return guess && demand;
    }));
    EXPECT_FALSE(guess_first) << "the guess landed before the demand read";
    compute_one(store, 0, 0);
    fault::disarm();
  }
}

// More guesses than the pool holds (a step of several sequences guesses the union of their
// experts): the guesses that fit are loaded and kept; the rest are not loaded at the cost of
// evicting an earlier, more confident guess (whose read would then be wasted). A demand load
// still takes a slot from them.
TEST(ExpertStorePredictions, GuessesBeyondThePoolDoNotEvictEachOther) {
  moelite::LoadOptions o;
  moelite::RuntimeOptions ro;
  ro.n_threads = 1;
  std::unique_ptr<moelite::Model> m;
  ASSERT_EQ(moelite::Model::load(kModel, o, &m), MOELITE_OK);
  const int32_t n_expert = m->hp.n_expert;
  ro.expert_budget = moelite::ExpertBudget::of_bytes(static_cast<uint64_t>(m->expert_bytes) / 8);
  o.stream_experts = true;
  ASSERT_EQ(moelite::Model::load(kModel, o, &m), MOELITE_OK) << moelite_last_error();
  std::unique_ptr<moelite::Runtime> rt;
  ASSERT_EQ(moelite::Runtime::create(*m, ro, &rt), MOELITE_OK) << moelite_last_error();
  moelite::ExpertStore& store = *rt->store;
  const int32_t n = static_cast<int32_t>(store.n_slots());
  ASSERT_GE(n, 3);
  ASSERT_LE(2 * n, n_expert);  // room for as many guesses again beyond the pool
  auto layer_stats = [&](int layer) { return store.stats()[static_cast<size_t>(layer)]; };
  std::vector<moelite::Prediction> guesses;
  for (int32_t e = 0; e < n; ++e) guesses.push_back({{1, e}, 1.0f - 0.01f * static_cast<float>(e)});
  store.hint(guesses, -1);
  ASSERT_EQ(layer_stats(1).prefetches_issued, static_cast<uint64_t>(n));  // one per slot
  for (int32_t e = 0; e < n; ++e)
    for (int i = 0; i < 5000 && !store.ready(1, e); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int32_t e = 0; e < n; ++e) ASSERT_TRUE(store.ready(1, e)) << e;
  // The same guesses and as many again, less confident: every slot holds a guess, so none of the
  // new ones is loaded (issued synchronously: hint returns after trying them).
  for (int32_t e = n; e < 2 * n; ++e) guesses.push_back({{1, e}, 0.5f - 0.01f * static_cast<float>(e)});
  store.hint(guesses, -1);
  EXPECT_EQ(layer_stats(1).prefetches_issued, static_cast<uint64_t>(n));
  EXPECT_EQ(layer_stats(1).prefetches_wasted, 0u);
  for (int32_t e = 0; e < n; ++e) EXPECT_TRUE(store.ready(1, e)) << e;
  for (int32_t e = n; e < 2 * n; ++e) EXPECT_FALSE(store.resident_or_loading(1, e)) << e;
  // A demand load is not a guess: it evicts one (the least confident is not promised; some guess).
  ASSERT_EQ(store.prepare(2, {0}), MOELITE_OK);
  std::vector<int32_t> pending = {0};
  int32_t got;
  moelite::ExpertWeights w;
  ASSERT_EQ(store.acquire_next(2, &pending, &got, &w), MOELITE_OK);
  store.release(2, got);
  EXPECT_EQ(layer_stats(1).prefetches_wasted, 1u);
}

// Two clients of one store (two contexts evaluating at the same time) hint, are scored and lose
// their guesses on their own: B's hint does not replace A's waiting or issued guesses, and A's
// routing neither scores B's guesses nor drops them.
TEST(ExpertStorePredictions, EachClientsGuessesAreItsOwn) {
  std::unique_ptr<moelite::Model> m;
  std::unique_ptr<moelite::Runtime> rt;
  half_budget_runtime(&m, &rt);
  ASSERT_TRUE(rt && rt->store);
  moelite::ExpertStore& store = *rt->store;
  int32_t id_a = -1, id_b = -1;
  std::unique_ptr<moelite::ExpertSource> a = store.open_client(&id_a), b = store.open_client(&id_b);
  auto stats = [&](int32_t id, int layer) { return store.client_stats(id)[static_cast<size_t>(layer)]; };
  // One token routed to two experts of a layer, and the round prepared (pinned, loads started).
  auto routed = [](moelite::ExpertSource& src, int32_t layer, std::vector<int32_t> experts) {
    src.on_routing(layer, moelite::Routing{1, 2, experts, {0.5f, 0.5f}});
    return src.prepare(layer, experts);
  };
  // A prepared round handed out and given back, as a layer's computation does.
  auto computed = [](moelite::ExpertSource& src, int32_t layer, std::vector<int32_t> experts) {
    for (int32_t e : experts) {
      std::vector<int32_t> pending = {e};
      int32_t got = -1;
      moelite::ExpertWeights w;
      EXPECT_EQ(src.acquire_next(layer, &pending, &got, &w), MOELITE_OK);
      if (got >= 0) src.release(layer, got);
    }
  };
  // A guesses layer 2's experts 4 and 6 while its layer 1 is computed (they wait for that
  // prepare); B guesses layer 2's expert 9, issued at once.
  a->hint({{{2, 4}, 0.9f}, {{2, 6}, 0.8f}}, 1);
  b->hint({{{2, 9}, 0.9f}}, -1);
  EXPECT_EQ(stats(id_b, 2).prefetches_issued, 1u);
  EXPECT_EQ(stats(id_a, 2).prefetches_issued, 0u);  // still waiting for A's layer 1
  ASSERT_EQ(routed(*a, 1, {0, 1}), MOELITE_OK);
  EXPECT_EQ(stats(id_a, 2).prefetches_issued, 2u);  // B's later hint did not replace A's guesses
  computed(*a, 1, {0, 1});
  // A's layer 2 routes to 4 and 5: one of its two guesses used, scored for A alone; B's guess of
  // 9 is neither scored for A nor dropped by A's routing.
  ASSERT_EQ(routed(*a, 2, {4, 5}), MOELITE_OK);
  EXPECT_EQ(stats(id_a, 2).predictions, 2u);
  EXPECT_EQ(stats(id_a, 2).predicted, 1u);
  EXPECT_EQ(stats(id_b, 2).predictions, 0u);
  EXPECT_TRUE(store.resident_or_loading(2, 9));
  computed(*a, 2, {4, 5});
  // B's layer 2 routes to 9: B's own guess, scored for B.
  ASSERT_EQ(routed(*b, 2, {9, 4}), MOELITE_OK);
  EXPECT_EQ(stats(id_b, 2).predictions, 1u);
  EXPECT_EQ(stats(id_b, 2).predicted, 1u);
  computed(*b, 2, {9, 4});
  a.reset();
  b.reset();
}

// A window's extend_round (expert_executor.cpp, run_window) adds a pin only while the pool has
// room and no other client waits for it: a client that waited for admission while holding pins
// could deadlock with one waiting for those, and one that passed a waiting client could keep it
// out for a whole layer.
TEST(ExpertStoreAdmission, ExtendRoundAddsOnlyWhileThePoolHasRoomAndNobodyWaits) {
  moelite::LoadOptions o;
  moelite::RuntimeOptions ro;
  ro.n_threads = 1;
  std::unique_ptr<moelite::Model> m;
  ASSERT_EQ(moelite::Model::load(kModel, o, &m), MOELITE_OK);
  ro.expert_budget = moelite::ExpertBudget::of_bytes(static_cast<uint64_t>(m->expert_bytes) / 16);
  o.stream_experts = true;
  ASSERT_EQ(moelite::Model::load(kModel, o, &m), MOELITE_OK) << moelite_last_error();
  std::unique_ptr<moelite::Runtime> rt;
  ASSERT_EQ(moelite::Runtime::create(*m, ro, &rt), MOELITE_OK) << moelite_last_error();
  ASSERT_TRUE(rt->store);
  moelite::ExpertStore& store = *rt->store;
  const int32_t cap = store.capacity(0);
  ASSERT_GE(cap, 2);
  ASSERT_LE(cap + 4, m->hp.n_expert);
  int32_t id_a = -1, id_b = -1;
  std::unique_ptr<moelite::ExpertSource> a = store.open_client(&id_a), b = store.open_client(&id_b);
  // Hands out one expert of *pending and gives it back, as a layer's computation does.
  auto compute_one = [](moelite::ExpertSource& src, std::vector<int32_t>* pending) {
    int32_t got = -1;
    moelite::ExpertWeights w;
    ASSERT_EQ(src.acquire_next(0, pending, &got, &w), MOELITE_OK) << moelite_last_error();
    src.release(0, got);
  };
  std::vector<int32_t> pending;
  for (int32_t e = 0; e < cap; ++e) pending.push_back(e);
  ASSERT_EQ(a->prepare(0, pending), MOELITE_OK);
  bool added = true;
  ASSERT_EQ(a->extend_round(0, cap, &added), MOELITE_OK);
  EXPECT_FALSE(added) << "the pool's pins are all out";
  compute_one(*a, &pending);
  ASSERT_EQ(a->extend_round(0, cap, &added), MOELITE_OK);
  EXPECT_TRUE(added) << "room for one and nobody waits";
  pending.push_back(cap);
  compute_one(*a, &pending);
  // B asks for two, which do not fit beside A's cap - 1: it waits in the queue.
  std::atomic<bool> b_admitted{false};
  std::thread tb([&] {
    EXPECT_EQ(b->prepare(0, {cap + 1, cap + 2}), MOELITE_OK) << moelite_last_error();
    b_admitted = true;
  });
  for (int i = 0; i < 5000 && store.waiting_clients(0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(store.waiting_clients(0), 1u);
  ASSERT_EQ(a->extend_round(0, cap + 3, &added), MOELITE_OK);
  EXPECT_FALSE(added) << "a pin is free, but B waits for the pool and goes first";
  EXPECT_FALSE(b_admitted);
  while (!pending.empty()) compute_one(*a, &pending);
  tb.join();
  EXPECT_TRUE(b_admitted);
  std::vector<int32_t> b_pending = {cap + 1, cap + 2};
  while (!b_pending.empty()) compute_one(*b, &b_pending);
  EXPECT_EQ(store.pinned_slots(), 0u);
  a.reset();
  b.reset();
}

// KL(p || q) of two logit rows, as the definition reads: softmax in long double, then
// sum p (log p - log q). The meter's own computation is not used.
double reference_kl(const float* p_logits, const float* q_logits, int64_t n, bool* same_top1) {
  long double mp = p_logits[0], mq = q_logits[0];
  int64_t ap = 0, aq = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (p_logits[i] > mp) mp = p_logits[ap = i];
    if (q_logits[i] > mq) mq = q_logits[aq = i];
  }
  long double zp = 0, zq = 0;
  for (int64_t i = 0; i < n; ++i) {
    zp += std::exp(static_cast<long double>(p_logits[i]) - mp);
    zq += std::exp(static_cast<long double>(q_logits[i]) - mq);
  }
  long double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const long double p = std::exp(static_cast<long double>(p_logits[i]) - mp) / zp;
    const long double q = std::exp(static_cast<long double>(q_logits[i]) - mq) / zq;
    if (p > 0) kl += p * std::log(p / q);
  }
  *same_top1 = ap == aq;
  return static_cast<double>(kl);
}

TEST_F(AdaptiveApi, TheQualityMeterMeasuresWhatExactRoutingOfEachTokenGives) {
  // Sensitivity gating, metered at every decode step, against an independent measurement: before
  // each step the gated context is saved, loaded into a context of an exactly routed model, and
  // that one evaluates the step's token (same history, exact routing). The meter's mean KL and
  // top-1 agreement must be those of the two logit rows; the gated results must be those of an
  // unmetered context, bit for bit.
  Params p;
  p.gating = "sensitivity";
  p.threshold = 0.01f;
  p.profile = profile_;
  Loaded gated, plain, exact;
  ASSERT_EQ(load(p, &gated), MOELITE_OK) << moelite_last_error();
  ASSERT_EQ(load(p, &plain), MOELITE_OK);
  ASSERT_EQ(load(Params(), &exact), MOELITE_OK);
  moelite_context_free(gated.ctx);
  moelite_context_params* cp = moelite_context_params_create();
  EXPECT_EQ(moelite_context_params_set_quality_meter(cp, 1.5), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_context_params_set_quality_meter(cp, std::nan("")), MOELITE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(moelite_context_params_set_quality_meter(cp, 1.0), MOELITE_OK);
  ASSERT_EQ(moelite_context_create(gated.model, cp, &gated.ctx), MOELITE_OK);
  moelite_context_params_free(cp);

  const int64_t n_vocab = moelite_model_get(gated.model, MOELITE_MODEL_N_VOCAB);
  const std::string session = testing::TempDir() + "moelite-meter-" + std::to_string(getpid()) + ".session";
  const int32_t steps = 24;
  double kl_sum = 0;
  int32_t agree = 0, loaded_steps = 0;
  for (int32_t t = 0; t < steps; ++t) {
    if (t > 0) {  // the history before step t, evaluated by the exact model's context
      ASSERT_EQ(moelite_context_save(gated.ctx, session.c_str()), MOELITE_OK) << moelite_last_error();
      ASSERT_EQ(moelite_context_load(exact.ctx, session.c_str()), MOELITE_OK) << moelite_last_error();
      ++loaded_steps;
    }
    ASSERT_EQ(moelite_eval(gated.ctx, &tokens_[static_cast<size_t>(t)], 1, 0), MOELITE_OK) << moelite_last_error();
    ASSERT_EQ(moelite_eval(plain.ctx, &tokens_[static_cast<size_t>(t)], 1, 0), MOELITE_OK);
    ASSERT_EQ(moelite_eval(exact.ctx, &tokens_[static_cast<size_t>(t)], 1, 0), MOELITE_OK);
    const float* g = moelite_get_logits(gated.ctx, -1);
    ASSERT_EQ(memcmp(g, moelite_get_logits(plain.ctx, -1), static_cast<size_t>(n_vocab) * sizeof(float)), 0)
        << "the meter changed the gated logits at step " << t;
    bool same = false;
    kl_sum += reference_kl(moelite_get_logits(exact.ctx, -1), g, n_vocab, &same);
    agree += same ? 1 : 0;
  }
  std::remove(session.c_str());
  ASSERT_EQ(loaded_steps, steps - 1);
  moelite_quality_stats q = {sizeof q};
  ASSERT_EQ(moelite_context_quality_stats(gated.ctx, &q), MOELITE_OK);
  EXPECT_EQ(q.gated_tokens, static_cast<uint64_t>(steps));
  EXPECT_EQ(q.metered_tokens, static_cast<uint64_t>(steps));
  EXPECT_EQ(q.meter_evaluations, static_cast<uint64_t>(steps));
  EXPECT_GT(kl_sum, 0.0) << "gating at this threshold should change some distribution";
  EXPECT_NEAR(q.kl_mean, kl_sum / steps, 1e-9 * (kl_sum / steps) + 1e-12);
  EXPECT_DOUBLE_EQ(q.top1_agreement, static_cast<double>(agree) / steps);
  EXPECT_GT(q.predicted_loss, 0.0);
  EXPECT_GT(q.meter_seconds, 0.0);
  // An unmetered context measures nothing; an exact model's meter has nothing to measure.
  moelite_quality_stats none = {sizeof none};
  ASSERT_EQ(moelite_context_quality_stats(plain.ctx, &none), MOELITE_OK);
  EXPECT_EQ(none.metered_tokens, 0u);
  EXPECT_EQ(none.gated_tokens, static_cast<uint64_t>(steps));
  EXPECT_GT(none.predicted_loss, 0.0);
  ASSERT_EQ(moelite_context_quality_stats(exact.ctx, &none), MOELITE_OK);
  EXPECT_EQ(none.gated_tokens, 0u);
}

namespace {

struct Governed {
  std::vector<float> logits;       // every step's, concatenated
  std::vector<double> thresholds;  // after every step
  moelite_quality_stats stats{};
  moelite_expert_stats experts{};
};

// Decodes `tokens` one at a time (windows of 256, the cache emptied between them, as perplexity
// --batch 1 does) in a context governed towards `target`.
Governed run_governed(const Params& p, const char* target, double sample_rate, const std::vector<int32_t>& tokens) {
  Governed g;
  Loaded l;
  EXPECT_EQ(load(p, &l), p.profile.empty() ? MOELITE_ERR_BAD_PROFILE : MOELITE_OK);  // no target: needs a profile
  moelite_context_free(l.ctx);
  l.ctx = nullptr;
  moelite_context_params* cp = moelite_context_params_create();
  EXPECT_EQ(moelite_context_params_set_quality_target(cp, target), MOELITE_OK);
  if (sample_rate > 0) EXPECT_EQ(moelite_context_params_set_quality_meter(cp, sample_rate), MOELITE_OK);
  EXPECT_EQ(moelite_context_create(l.model, cp, &l.ctx), MOELITE_OK) << moelite_last_error();
  moelite_context_params_free(cp);
  if (!l.ctx) return g;
  const int64_t n_vocab = moelite_model_get(l.model, MOELITE_MODEL_N_VOCAB);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i % 256 == 0) moelite_context_kv_reset(l.ctx);
    if (moelite_eval(l.ctx, &tokens[i], 1, 0) != MOELITE_OK) {
      ADD_FAILURE() << moelite_last_error();
      return g;
    }
    const float* row = moelite_get_logits(l.ctx, -1);
    g.logits.insert(g.logits.end(), row, row + n_vocab);
    moelite_quality_stats q = {sizeof q};
    EXPECT_EQ(moelite_context_quality_stats(l.ctx, &q), MOELITE_OK);
    g.thresholds.push_back(q.threshold);
  }
  g.stats.struct_size = sizeof g.stats;
  EXPECT_EQ(moelite_context_quality_stats(l.ctx, &g.stats), MOELITE_OK);
  g.experts.struct_size = sizeof g.experts;
  EXPECT_EQ(moelite_context_expert_stats(l.ctx, -1, &g.experts), MOELITE_OK);
  return g;
}

}  // namespace

TEST_F(AdaptiveApi, TheGovernorsTrajectoryDependsOnTheInputsNeverOnTiming) {
  // Sensitivity gating without a profile, governed to a 1 % perplexity rise, with a learned-free
  // predictor and a quarter of the experts in memory: twice the same tokens and thresholds, bit for
  // bit, and the same as with every expert resident (the budget, the cache and the predictor never
  // change results, the governor's included).
  Params p;
  p.gating = "sensitivity";
  p.budget = total_ / 4;
  p.predictor = "next-gate";
  p.depth = 2;
  const std::vector<int32_t> tokens(heldout_.begin(), heldout_.begin() + 160);
  const Governed a = run_governed(p, "1%", 0.25, tokens);
  const Governed b = run_governed(p, "1%", 0.25, tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  ASSERT_FALSE(a.logits.empty());
  EXPECT_EQ(memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0);
  EXPECT_EQ(a.thresholds, b.thresholds);
  EXPECT_GT(a.thresholds.back(), a.thresholds.front()) << "the governor never left (almost) exact routing";
  Params resident = p;
  resident.budget = 0;
  resident.predictor = "none";
  const Governed r = run_governed(resident, "1%", 0.25, tokens);
  EXPECT_EQ(memcmp(a.logits.data(), r.logits.data(), a.logits.size() * sizeof(float)), 0);
  EXPECT_EQ(a.thresholds, r.thresholds);
}

TEST_F(AdaptiveApi, TheGovernorHoldsTheMeasuredDivergenceAtItsTargetWithAndWithoutAProfile) {
  // 1024 held-out tokens decoded one by one: the meter's KL (itself checked against exact routing
  // above) within 35 % of the target, and fewer experts than exact routing's two per token.
  Params p;
  p.gating = "sensitivity";
  for (const bool with_profile : {false, true}) {
    p.profile = with_profile ? profile_ : "";
    const Governed g = run_governed(p, "kl:0.01", 0.25, heldout_);
    ASSERT_GT(g.stats.metered_tokens, 100u);
    EXPECT_GT(g.stats.kl_mean, 0.0065) << "profile " << with_profile;
    EXPECT_LT(g.stats.kl_mean, 0.0135) << "profile " << with_profile;
    EXPECT_NEAR(g.stats.target_kl, 0.01, 1e-12);
    const double experts_per_token = double(g.experts.routed_experts) / double(g.experts.routed_tokens);
    EXPECT_LT(experts_per_token, 1.8) << "profile " << with_profile;
  }
}

TEST_F(AdaptiveApi, QualityTargetsAreCheckedAndNeedSensitivityGating) {
  moelite_context_params* cp = moelite_context_params_create();
  for (const char* bad : {"0%", "101%", "-1%", "kl:0", "kl:11", "kl:nan", "1", "1 %", "%", "kl:", "x%"})
    EXPECT_EQ(moelite_context_params_set_quality_target(cp, bad), MOELITE_ERR_INVALID_ARGUMENT) << bad;
  EXPECT_EQ(moelite_context_params_set_quality_target(nullptr, "1%"), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_context_params_set_quality_bounds(cp, -1, 1), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_context_params_set_quality_bounds(cp, 2, 1), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_context_params_set_quality_bounds(cp, 0, NAN), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_context_params_set_quality_bounds(cp, 0, INFINITY), MOELITE_OK);
  EXPECT_EQ(moelite_context_params_set_quality_target(cp, "0.5%"), MOELITE_OK);
  Params score;
  score.gating = "score";
  score.threshold = 0.1f;
  Loaded l;
  ASSERT_EQ(load(score, &l), MOELITE_OK);
  moelite_context* ctx = nullptr;
  EXPECT_EQ(moelite_context_create(l.model, cp, &ctx), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(moelite_last_error(), "sensitivity or cache-aware"), nullptr) << moelite_last_error();
  EXPECT_EQ(moelite_context_params_set_quality_target(cp, ""), MOELITE_OK);  // none again
  ASSERT_EQ(moelite_context_create(l.model, cp, &ctx), MOELITE_OK);
  moelite_context_free(ctx);
  moelite_context_params_free(cp);
}
