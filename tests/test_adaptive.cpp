// Adaptive machinery against hand-worked cases and independent references: the gating rules on
// hand-made router outputs, the DP cache allocation against known optima and brute force, the
// JSON reader, profiles (round trip, every malformation refused), ridge regression against a known
// linear map, and the correlation table against hand-computed probabilities.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/calibrate/ridge.h"
#include "core/experts/cache_allocation.h"
#include "core/experts/guess_gate.h"
#include "core/experts/predictor.h"
#include "core/model/model.h"
#include "core/model/profile.h"
#include "core/moe/gating.h"
#include "core/support/json.h"

using namespace moelite;

namespace {

Routing routing_of(int32_t k, const std::vector<float>& weights) {
  Routing r;
  r.k = k;
  r.n_tokens = static_cast<int32_t>(weights.size()) / k;
  r.weights = weights;
  for (size_t i = 0; i < weights.size(); ++i) r.ids.push_back(static_cast<int32_t>(10 + i));
  return r;
}

// Cache-aware gating at threshold t and penalty p, one layer of sensitivity s.
GatingConfig cache_aware(float t, float p, double s) {
  GatingConfig cfg;
  cfg.mode = GatingMode::CacheAware;
  cfg.threshold = t;
  cfg.penalty = p;
  cfg.sensitivity = {s};
  return cfg;
}

// Routing of tokens with `k` experts each: ids and weights token after token.
Routing routing_with(int32_t k, std::vector<int32_t> ids, std::vector<float> weights) {
  Routing r;
  r.k = k;
  r.n_tokens = static_cast<int32_t>(ids.size()) / k;
  r.ids = std::move(ids);
  r.weights = std::move(weights);
  return r;
}

std::string temp_path(const char* name) {
  return testing::TempDir() + "moelite-adaptive-" + std::to_string(getpid()) + "-" + name;
}

}  // namespace

// ---- gating

// Bands are half-octaves of confidence: (2^-(b+1)/2, 2^-b/2], the last also everything below.
TEST(GuessGate, BandsAreHalfOctavesOfConfidence) {
  using moelite::GuessGate;
  EXPECT_EQ(GuessGate::band(0.99f), 0);
  EXPECT_EQ(GuessGate::band(0.71f), 0);  // 1/sqrt2 = 0.7071
  EXPECT_EQ(GuessGate::band(0.70f), 1);
  EXPECT_EQ(GuessGate::band(0.5f), 2);  // exactly 2^-1: the top of band 2
  EXPECT_EQ(GuessGate::band(0.26f), 3);
  EXPECT_EQ(GuessGate::band(0.05f), 8);  // -2 log2(0.05) = 8.64
  EXPECT_EQ(GuessGate::band(1e-6f), GuessGate::kBands - 1);
  EXPECT_EQ(GuessGate::band(0.0f), GuessGate::kBands - 1);
  EXPECT_EQ(GuessGate::band(std::nanf("")), GuessGate::kBands - 1);
  // Scores become confidences below certainty; NaN and negatives become 0.
  EXPECT_LT(moelite::guess_confidence(1.0f), moelite::kCertain);
  EXPECT_LT(moelite::guess_confidence(7.0f), moelite::kCertain);
  EXPECT_EQ(moelite::guess_confidence(0.25f), 0.25f);
  EXPECT_EQ(moelite::guess_confidence(-1.0f), 0.0f);
  EXPECT_EQ(moelite::guess_confidence(std::nanf("")), 0.0f);
}

// A band reads while it has seen too few guesses to know, then only while used / seen reaches the
// minimum; the other bands and certainty are not touched by its record.
TEST(GuessGate, ReadsABandOnlyWhileItsGuessesWereUsedOftenEnough) {
  moelite::GuessGate gate(0.6);
  for (int i = 0; i < 7; ++i) gate.score(0.05f, false);
  EXPECT_TRUE(gate.worth_reading(0.05f)) << "7 guesses are too few to know";
  EXPECT_DOUBLE_EQ(gate.precision(0.05f), 1.0);
  gate.score(0.05f, false);  // the 8th
  EXPECT_DOUBLE_EQ(gate.precision(0.05f), 0.0);
  EXPECT_FALSE(gate.worth_reading(0.05f));
  EXPECT_FALSE(gate.worth_reading(0.048f)) << "the same band";
  EXPECT_TRUE(gate.worth_reading(0.3f)) << "another band";
  EXPECT_TRUE(gate.worth_reading(moelite::kCertain));
  gate.score(moelite::kCertain, false);  // certainty is never scored
  EXPECT_DOUBLE_EQ(gate.precision(moelite::kCertain), 1.0);
  // Guesses of the closed band go on being scored: 12 used of 20 = 0.6 opens it again.
  for (int i = 0; i < 12; ++i) gate.score(0.05f, true);
  EXPECT_DOUBLE_EQ(gate.precision(0.05f), 12.0 / 20.0);
  EXPECT_TRUE(gate.worth_reading(0.05f));
  // No gate at 0.
  moelite::GuessGate none(0.0);
  for (int i = 0; i < 50; ++i) none.score(0.05f, false);
  EXPECT_TRUE(none.worth_reading(0.05f));
}

// Counts halve when a band has seen kWindow guesses: old evidence weighs half.
TEST(GuessGate, OldEvidenceWeighsLess) {
  moelite::GuessGate gate(0.5);
  const int window = static_cast<int>(moelite::GuessGate::kWindow);
  for (int i = 0; i < window; ++i) gate.score(0.2f, false);  // 256 unused: halved to 0 of 128
  EXPECT_DOUBLE_EQ(gate.precision(0.2f), 0.0);
  for (int i = 0; i < 128; ++i) gate.score(0.2f, true);  // 128 of 256: halved to 64 of 128
  EXPECT_DOUBLE_EQ(gate.precision(0.2f), 0.5);
  EXPECT_TRUE(gate.worth_reading(0.2f));  // without the halving: 128 / 384 = 0.33
}

TEST(Gating, ExactModeLeavesRoutingAlone) {
  Routing r = routing_of(3, {0.5f, 0.3f, 0.2f});
  const Routing before = r;
  GatingConfig c;
  EXPECT_EQ(apply_gating(c, 0, &r), 3);
  EXPECT_EQ(r.ids, before.ids);
  EXPECT_EQ(r.weights, before.weights);
}

TEST(Gating, SensitivityDropsTheTailWhileItsSquaredWeightTimesSIsBelowT) {
  // Top-4 weights 0.4 0.3 0.2 0.1 (slots in another order), S = 2.
  const std::vector<float> w = {0.2f, 0.4f, 0.1f, 0.3f};
  // Dropping {0.1}: 0.01 * 2 = 0.02; {0.1, 0.2}: 0.09 * 2 = 0.18; {0.1, 0.2, 0.3}: 0.36 * 2 = 0.72.
  struct Case {
    float t;
    int32_t kept;
  };
  for (Case c : {Case{0.0f, 4}, Case{0.019f, 4}, Case{0.021f, 3}, Case{0.17f, 3}, Case{0.19f, 2}, Case{0.71f, 2},
                 Case{0.73f, 1}, Case{100.0f, 1}})
    EXPECT_EQ(gating_keep_count(GatingMode::Sensitivity, c.t, 2.0, w.data(), 4), c.kept) << "T = " << c.t;
  // Applied: T = 0.19 keeps 0.4 and 0.3 (slots 1 and 3), rescaled to the old sum 1.0.
  GatingConfig cfg;
  cfg.mode = GatingMode::Sensitivity;
  cfg.threshold = 0.19f;
  cfg.sensitivity = {5.0, 2.0};
  Routing r = routing_of(4, w);
  EXPECT_EQ(apply_gating(cfg, 1, &r), 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{-1, 11, -1, 13}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.0f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.4f / 0.7f);
  EXPECT_FLOAT_EQ(r.weights[3], 0.3f / 0.7f);
  // Layer 0's sensitivity 5: {0.1} costs 0.05 > 0.019, so nothing is dropped there.
  cfg.threshold = 0.019f;
  Routing r0 = routing_of(4, w);
  EXPECT_EQ(apply_gating(cfg, 0, &r0), 4);
}

TEST(Gating, MassIsPreservedForUnnormalisedWeights) {
  // qwen2moe/olmoe keep raw softmax weights (sum < 1): the kept ones take the dropped mass.
  GatingConfig cfg;
  cfg.mode = GatingMode::Score;
  cfg.threshold = 0.1f;
  Routing r = routing_of(2, {0.05f, 0.45f, 0.3f, 0.2f});  // two tokens
  EXPECT_EQ(apply_gating(cfg, 0, &r), 3);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{-1, 11, 12, 13}));
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[2], 0.3f);
  EXPECT_FLOAT_EQ(r.weights[3], 0.2f);
}

TEST(Gating, ScoreKeepsAtLeastTheTopExpertAndBreaksTiesByLowerSlot) {
  const std::vector<float> w = {0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_EQ(gating_keep_count(GatingMode::Score, 0.3f, 0.0, w.data(), 4), 1);
  EXPECT_EQ(gating_keep_count(GatingMode::Score, 0.25f, 0.0, w.data(), 4), 4);  // not below
  GatingConfig cfg;
  cfg.mode = GatingMode::Score;
  cfg.threshold = 0.3f;
  Routing r = routing_of(4, w);
  EXPECT_EQ(apply_gating(cfg, 0, &r), 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{10, -1, -1, -1}));  // equal weights: slot 0 is kept
  EXPECT_FLOAT_EQ(r.weights[0], 1.0f);
  // Ties inside the sensitivity tail: the later slot goes first.
  const std::vector<float> tie = {0.5f, 0.25f, 0.25f};
  int32_t order[3];
  gating_rank(tie.data(), 3, order);
  EXPECT_EQ(order[0], 0);
  EXPECT_EQ(order[1], 1);
  EXPECT_EQ(order[2], 2);
  GatingConfig s;
  s.mode = GatingMode::Sensitivity;
  s.threshold = 0.1f;  // drops one 0.25 (0.0625 * 1) but not both (0.25)
  s.sensitivity = {1.0};
  Routing rt = routing_of(3, tie);
  EXPECT_EQ(apply_gating(s, 0, &rt), 2);
  EXPECT_EQ(rt.ids, (std::vector<int32_t>{10, 11, -1}));
}

// Cache-aware gating against a fake residency oracle (the per-expert mask the store would give).
TEST(Gating, CacheAwareRaisesTheThresholdOfNonResidentExpertsOnly) {
  // Top-4 weights 0.4 0.3 0.2 0.1 in slots 1 3 0 2 (ids 11 13 10 12), S = 2: dropping {0.1}
  // costs 0.02, {0.1, 0.2} 0.18, {0.1, 0.2, 0.3} 0.72. T = 0.05, penalty 4: bound 0.05 for a
  // resident expert, 0.2 for one that would be read from storage.
  const std::vector<float> w = {0.2f, 0.4f, 0.1f, 0.3f};
  const uint8_t all[4] = {1, 1, 1, 1}, none[4] = {0, 0, 0, 0};
  const uint8_t only_02_out[4] = {0, 1, 1, 1};  // slot 0 (weight 0.2) not resident
  const uint8_t only_01_out[4] = {1, 1, 0, 1};  // slot 2 (weight 0.1) not resident
  EXPECT_EQ(gating_keep_count_cache_aware(0.05f, 4.0f, 2.0, w.data(), 4, all), 3);   // = sensitivity
  EXPECT_EQ(gating_keep_count_cache_aware(0.05f, 4.0f, 2.0, w.data(), 4, nullptr), 3);
  EXPECT_EQ(gating_keep_count(GatingMode::Sensitivity, 0.05f, 2.0, w.data(), 4), 3);
  EXPECT_EQ(gating_keep_count_cache_aware(0.05f, 4.0f, 2.0, w.data(), 4, none), 2);  // 0.18 < 0.2
  EXPECT_EQ(gating_keep_count_cache_aware(0.05f, 4.0f, 2.0, w.data(), 4, only_02_out), 2);
  // 0.2 resident: 0.18 >= 0.05 keeps it; its non-resident neighbour 0.1 had gone anyway.
  EXPECT_EQ(gating_keep_count_cache_aware(0.05f, 4.0f, 2.0, w.data(), 4, only_01_out), 3);
  // The first expert is always kept, however absent and whatever the threshold.
  EXPECT_EQ(gating_keep_count_cache_aware(1e30f, 1e30f, 2.0, w.data(), 4, none), 1);
  // Threshold 0 keeps all, resident or not (no loss is below 0).
  EXPECT_EQ(gating_keep_count_cache_aware(0.0f, 4.0f, 2.0, w.data(), 4, none), 4);
  // Penalty 1 is sensitivity gating whatever the residency.
  for (float t : {0.0f, 0.019f, 0.021f, 0.19f, 0.73f})
    EXPECT_EQ(gating_keep_count_cache_aware(t, 1.0f, 2.0, w.data(), 4, none),
              gating_keep_count(GatingMode::Sensitivity, t, 2.0, w.data(), 4));

  // Applied through the layer's residency mask (indexed by expert id).
  GatingConfig cfg = cache_aware(0.05f, 4.0f, 2.0);
  std::vector<uint8_t> mask(16, 1);
  Routing resident = routing_of(4, w), sens = routing_of(4, w);
  EXPECT_EQ(apply_gating(cfg, 0, &resident, &mask), 3);
  GatingConfig sc = cfg;
  sc.mode = GatingMode::Sensitivity;
  EXPECT_EQ(apply_gating(sc, 0, &sens), 3);
  EXPECT_EQ(resident.ids, sens.ids);
  EXPECT_EQ(resident.weights, sens.weights);
  // No mask (no budget): sensitivity, bit for bit.
  Routing unbudgeted = routing_of(4, w);
  EXPECT_EQ(apply_gating(cfg, 0, &unbudgeted), 3);
  EXPECT_EQ(unbudgeted.weights, sens.weights);
  mask.assign(16, 0);
  Routing absent = routing_of(4, w);
  EXPECT_EQ(apply_gating(cfg, 0, &absent, &mask), 2);
  EXPECT_EQ(absent.ids, (std::vector<int32_t>{-1, 11, -1, 13}));
  EXPECT_FLOAT_EQ(absent.weights[1], 0.4f / 0.7f);
  // What a token keeps is marked resident for the rest of the batch.
  EXPECT_EQ(mask[11], 1);
  EXPECT_EQ(mask[13], 1);
  EXPECT_EQ(mask[10], 0);
}

TEST(Gating, CacheAwareCountsAnExpertKeptEarlierInTheBatchAsResident) {
  // Two tokens, top-2, S = 1, T = 0.01, penalty 100: a non-resident tail weight below 1 goes, a
  // resident one of 0.2 stays (0.04 >= 0.01). Token 0 routes experts 3, 5; token 1 experts 7, 5.
  GatingConfig cfg = cache_aware(0.01f, 100.0f, 1.0);
  Routing r = routing_with(2, {3, 5, 7, 5}, {0.8f, 0.2f, 0.8f, 0.2f});
  std::vector<uint8_t> mask(8, 0);
  mask[5] = 0;
  EXPECT_EQ(apply_gating(cfg, 0, &r, &mask), 2);  // both drop 5: nobody loads it
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, -1, 7, -1}));
  // Expert 5 resident for token 1 only because token 0 kept it: the second token keeps it too.
  r.ids = {5, 3, 7, 5};
  r.weights = {0.8f, 0.2f, 0.8f, 0.2f};
  mask.assign(8, 0);
  EXPECT_EQ(apply_gating(cfg, 0, &r, &mask), 3);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, -1, 7, 5}));
}

TEST(Gating, CandidatesAreTheRoutersNextExpertsOnTheRoutingsScale) {
  // Two tokens over 6 experts. Softmax probabilities worked out here with exp() directly; the
  // routing (top-2) is given as a renormalising router would give it for token 0 and as a plain
  // (unnormalised) one for token 1, so the candidates' scale follows each token's own factor.
  const std::vector<float> logits = {2.0f, 0.5f, 1.0f, -1.0f, 1.5f, 0.0f,   // token 0: 0 > 4 > 2 > 1 > 5 > 3
                                     -2.0f, 3.0f, 0.0f, 1.0f, 0.0f, 2.5f};  // token 1: 1 > 5 > 3 > 2 = 4 > 0
  auto probs = [&](int t) {
    std::vector<double> p(6);
    double sum = 0.0;
    for (int e = 0; e < 6; ++e) sum += p[e] = std::exp(static_cast<double>(logits[t * 6 + e]));
    for (double& v : p) v /= sum;
    return p;
  };
  const std::vector<double> p0 = probs(0), p1 = probs(1);
  const Routing r = routing_with(2, {0, 4, 1, 5},
                                 {static_cast<float>(p0[0] / (p0[0] + p0[4])),
                                  static_cast<float>(p0[4] / (p0[0] + p0[4])), static_cast<float>(p1[1]),
                                  static_cast<float>(p1[5])});
  GatingCandidates c;
  gating_candidates(logits.data(), 6, r, 3, &c);
  ASSERT_EQ(c.n, 3);
  // Ties rank the lower id first (2 before 4 for token 1).
  EXPECT_EQ(c.ids, (std::vector<int32_t>{2, 1, 5, 3, 2, 4}));
  const double scale0 = 1.0 / (p0[0] + p0[4]);
  EXPECT_NEAR(c.weights[0], p0[2] * scale0, 1e-6);
  EXPECT_NEAR(c.weights[1], p0[1] * scale0, 1e-6);
  EXPECT_NEAR(c.weights[2], p0[5] * scale0, 1e-6);
  EXPECT_NEAR(c.weights[3], p1[3], 1e-6);
  EXPECT_NEAR(c.weights[4], p1[2], 1e-6);
  EXPECT_NEAR(c.weights[5], p1[4], 1e-6);
  // More candidates asked for than there are experts outside top-k: the rest are -1.
  gating_candidates(logits.data(), 6, r, 5, &c);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{2, 1, 5, 3, -1, 3, 2, 4, 0, -1}));
  EXPECT_EQ(c.weights[4], 0.0f);
  EXPECT_EQ(c.weights[9], 0.0f);
}

TEST(Gating, SubstitutionSwapsOrRevivesNonResidentExpertsWithResidentCandidatesWithinTheBounds) {
  // One token, top-3: ids 4 1 2 with weights 0.5 0.3 0.2; S = 1, T = 0.01, P = 4 (bound 0.04 for a
  // non-resident expert). The walk keeps all three: the lowest, 0.2, is resident and costs
  // 0.04 >= 0.01. Expert 1 (0.3) is not resident. Candidates: 5 (0.15, not resident), 3 (0.12,
  // resident), 0 (0.05, resident). The best resident one is 3: it loses 0.18, 0.0324 < 0.04.
  GatingConfig cfg = cache_aware(0.01f, 4.0f, 1.0);
  cfg.substitutes = 3;
  GatingCandidates cands;
  cands.n = 3;
  cands.ids = {5, 3, 0};
  cands.weights = {0.15f, 0.12f, 0.05f};
  auto token = [] { return routing_with(3, {4, 1, 2}, {0.5f, 0.3f, 0.2f}); };
  std::vector<uint8_t> mask = {1, 0, 1, 1, 1, 0};
  Routing r = token();
  int64_t swapped = 0;
  EXPECT_EQ(apply_gating(cfg, 0, &r, &mask, &cands, &swapped), 3);
  EXPECT_EQ(swapped, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 3, 2}));
  // Rescaled to the sum of the router's three weights: 1.0 / (0.5 + 0.12 + 0.2).
  const double scale = 1.0 / (0.5 + 0.12 + 0.2);
  EXPECT_NEAR(r.weights[0], 0.5 * scale, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.12 * scale, 1e-6);
  EXPECT_NEAR(r.weights[2], 0.2 * scale, 1e-6);
  EXPECT_EQ(mask[5], 0);  // the candidate passed over is not loaded

  // The token as the router gave it, all three kept, nothing substituted.
  auto expect_untouched = [&](const char* why) {
    Routing u = token();
    int64_t n = 0;
    EXPECT_EQ(apply_gating(cfg, 0, &u, &mask, &cands, &n), 3) << why;
    EXPECT_EQ(n, 0) << why;
    EXPECT_EQ(u.ids, (std::vector<int32_t>{4, 1, 2})) << why;
    EXPECT_EQ(u.weights, (std::vector<float>{0.5f, 0.3f, 0.2f})) << why;
  };
  cfg.penalty = 3.0f;
  expect_untouched("P = 3: bound 0.03 < 0.0324");
  cfg.penalty = 4.0f;
  mask = {1, 0, 1, 0, 1, 0};
  expect_untouched("only the best resident candidate is tried: with 3 gone, 0 would cost (0.3 - 0.05)^2 = 0.0625");
  mask = {1, 1, 1, 1, 0, 0};
  cands.weights = {0.45f, 0.45f, 0.44f};
  expect_untouched("the first expert (4, 0.5, absent) is never replaced, however close a resident candidate");

  // Two absent experts never take the same stand-in: the second takes the next resident one.
  Routing two = routing_with(3, {4, 1, 2}, {0.4f, 0.31f, 0.29f});
  mask = {1, 0, 0, 1, 1, 1};
  cands.ids = {3, 5, 0};
  cands.weights = {0.2f, 0.19f, 0.18f};
  swapped = 0;
  EXPECT_EQ(apply_gating(cfg, 0, &two, &mask, &cands, &swapped), 3);
  EXPECT_EQ(swapped, 2);
  EXPECT_EQ(two.ids, (std::vector<int32_t>{4, 5, 3}));  // the lowest-weight absent one chose first

  // A slot the walk dropped is revived as a resident stand-in when the loss it takes back is worth
  // one resident computation: (w_e^2 - (w_e - w_f)^2) * S >= T. T = 0.005, P = 8 (bound 0.04):
  // weights 0.6 0.25 0.15 (ids 4 1 2), expert 2 absent and dropped (0.0225 < 0.04), 1 resident
  // and kept (0.16 >= 0.005). Candidate 3 (resident) at 0.1 takes back 0.0225 - 0.0025 = 0.02.
  cfg.threshold = 0.005f;
  cfg.penalty = 8.0f;
  mask = {1, 1, 0, 1, 1, 0};
  cands.ids = {5, 3, 0};
  cands.weights = {0.2f, 0.1f, 0.05f};
  Routing dropped = routing_with(3, {4, 1, 2}, {0.6f, 0.25f, 0.15f});
  Routing tiny = dropped;
  swapped = 0;
  EXPECT_EQ(apply_gating(cfg, 0, &dropped, &mask, &cands, &swapped), 3);
  EXPECT_EQ(swapped, 1);
  EXPECT_EQ(dropped.ids, (std::vector<int32_t>{4, 1, 3}));
  EXPECT_NEAR(dropped.weights[2], 0.1 / 0.95, 1e-6);
  EXPECT_NEAR(dropped.weights[0], 0.6 / 0.95, 1e-6);
  // At 0.01 it would take back only 0.0225 - 0.0196 = 0.0029 < 0.005: the slot stays dropped.
  cands.weights = {0.2f, 0.01f, 0.005f};
  swapped = 0;
  EXPECT_EQ(apply_gating(cfg, 0, &tiny, &mask, &cands, &swapped), 2);
  EXPECT_EQ(swapped, 0);
  EXPECT_EQ(tiny.ids, (std::vector<int32_t>{4, 1, -1}));
  EXPECT_NEAR(tiny.weights[0], 0.6 / 0.85, 1e-6);
  cfg.threshold = 0.01f;
  cfg.penalty = 4.0f;
  cands.ids = {5, 3, 0};
  cands.weights = {0.15f, 0.12f, 0.05f};

  // No residency mask (no budget): nothing is substituted.
  r = token();
  swapped = 0;
  apply_gating(cfg, 0, &r, nullptr, &cands, &swapped);
  EXPECT_EQ(swapped, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 1, 2}));
}

TEST(Gating, ModeNames) {
  GatingMode m;
  EXPECT_TRUE(parse_gating_mode("sensitivity", &m));
  EXPECT_EQ(m, GatingMode::Sensitivity);
  EXPECT_TRUE(parse_gating_mode("score", &m));
  EXPECT_TRUE(parse_gating_mode("exact", &m));
  EXPECT_FALSE(parse_gating_mode("topk", &m));
  EXPECT_TRUE(parse_gating_mode("cache-aware", &m));
  EXPECT_EQ(m, GatingMode::CacheAware);
  EXPECT_STREQ(gating_mode_name(GatingMode::CacheAware), "cache-aware");
  EXPECT_FALSE(parse_gating_mode("cache_aware", &m));
  EXPECT_STREQ(gating_mode_name(GatingMode::Score), "score");
}

// ---- DP allocation

namespace {

double brute_force(const std::vector<AllocationLayer>& layers, int64_t budget, std::vector<int32_t>* best_sizes) {
  double best = INFINITY;
  std::vector<int32_t> sizes(layers.size());
  std::function<void(size_t, int64_t, double)> rec = [&](size_t l, int64_t used, double loss) {
    if (l == layers.size()) {
      if (loss < best) {
        best = loss;
        *best_sizes = sizes;
      }
      return;
    }
    for (int32_t c = layers[l].min_size; c <= layers[l].max_size; ++c) {
      const int64_t u = used + c * layers[l].unit_cost;
      if (u > budget) break;
      sizes[l] = c;
      rec(l + 1, u, loss + layers[l].loss[static_cast<size_t>(c - layers[l].min_size)]);
    }
  };
  rec(0, 0, 0.0);
  return best;
}

AllocationLayer layer_from(int32_t lo, const std::vector<double>& loss, int64_t cost = 1) {
  AllocationLayer a;
  a.min_size = lo;
  a.max_size = lo + static_cast<int32_t>(loss.size()) - 1;
  a.unit_cost = cost;
  a.loss = loss;
  return a;
}

}  // namespace

TEST(Allocation, HandWorkedOptima) {
  // Two layers, sizes 1..3, 4 slots. Layer 0 gains a lot from its second slot, layer 1 from its
  // third: (1 + 3) costs 0.9 + 0.1 = 1.0; (2 + 2): 0.2 + 0.8 = 1.0... so make layer 1's third
  // slot worth more: the optimum (1, 3) = 0.9 + 0.05 beats (2, 2) = 0.2 + 0.8 and (3, 1).
  std::vector<AllocationLayer> layers = {layer_from(1, {0.9, 0.2, 0.15}), layer_from(1, {1.0, 0.8, 0.05})};
  std::vector<int32_t> sizes;
  double loss;
  ASSERT_EQ(allocate_cache(layers, 4, &sizes, &loss), MOELITE_OK);
  EXPECT_EQ(sizes, (std::vector<int32_t>{1, 3}));
  EXPECT_DOUBLE_EQ(loss, 0.95);
  // With 5 slots both get what they want most.
  ASSERT_EQ(allocate_cache(layers, 5, &sizes, &loss), MOELITE_OK);
  EXPECT_EQ(sizes, (std::vector<int32_t>{2, 3}));
  EXPECT_DOUBLE_EQ(loss, 0.25);
  // Spare budget is not forced on a layer that does not benefit: sizes stay within max.
  ASSERT_EQ(allocate_cache(layers, 100, &sizes, &loss), MOELITE_OK);
  EXPECT_EQ(sizes, (std::vector<int32_t>{3, 3}));
  // Uniform curves: the budget is shared evenly (AdapMoE's uniform-hit special case).
  std::vector<AllocationLayer> uniform(4, layer_from(2, {0.5, 0.25, 0.125, 0.0625}));
  ASSERT_EQ(allocate_cache(uniform, 12, &sizes), MOELITE_OK);
  EXPECT_EQ(sizes, (std::vector<int32_t>{3, 3, 3, 3}));
}

TEST(Allocation, UnitCostsMakeLargeExpertsCompeteFairly) {
  // Layer 0's experts cost 3 units, layer 1's 1 unit: with 7 units, one more layer-0 expert (3
  // units, gain 0.3) loses to three more layer-1 experts (3 units, gain 0.1 + 0.1 + 0.15 = 0.35).
  std::vector<AllocationLayer> layers = {layer_from(1, {0.5, 0.2}, 3), layer_from(1, {0.5, 0.4, 0.3, 0.15})};
  std::vector<int32_t> sizes;
  ASSERT_EQ(allocate_cache(layers, 7, &sizes), MOELITE_OK);
  EXPECT_EQ(sizes, (std::vector<int32_t>{1, 4}));
}

TEST(Allocation, MatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<AllocationLayer> layers;
    int64_t minimum = 0;
    for (int l = 0; l < n; ++l) {
      const int32_t lo = 1 + static_cast<int32_t>(rng() % 3), span = 1 + static_cast<int32_t>(rng() % 5);
      std::vector<double> loss;
      double v = 4.0 * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
      for (int32_t i = 0; i < span; ++i) {
        loss.push_back(v);
        v *= std::uniform_real_distribution<double>(0.2, 1.0)(rng);  // non-increasing, not convex
      }
      layers.push_back(layer_from(lo, loss, 1 + static_cast<int64_t>(rng() % 3)));
      minimum += lo * layers.back().unit_cost;
    }
    const int64_t budget = minimum + static_cast<int64_t>(rng() % 12);
    std::vector<int32_t> sizes, want;
    double loss;
    ASSERT_EQ(allocate_cache(layers, budget, &sizes, &loss), MOELITE_OK);
    const double best = brute_force(layers, budget, &want);
    EXPECT_NEAR(loss, best, 1e-12) << "trial " << trial;
    int64_t used = 0;
    double check = 0.0;
    for (size_t l = 0; l < layers.size(); ++l) {
      ASSERT_GE(sizes[l], layers[l].min_size);
      ASSERT_LE(sizes[l], layers[l].max_size);
      used += sizes[l] * layers[l].unit_cost;
      check += layers[l].loss[static_cast<size_t>(sizes[l] - layers[l].min_size)];
    }
    EXPECT_LE(used, budget);
    EXPECT_NEAR(check, loss, 1e-12);
  }
}

TEST(Allocation, RefusesImpossibleBudgetsAndBadInput) {
  std::vector<AllocationLayer> layers = {layer_from(3, {1.0, 0.5}), layer_from(3, {1.0, 0.5})};
  std::vector<int32_t> sizes;
  EXPECT_EQ(allocate_cache(layers, 5, &sizes), MOELITE_ERR_BUDGET_TOO_SMALL);
  layers[1].loss.pop_back();
  EXPECT_EQ(allocate_cache(layers, 10, &sizes), MOELITE_ERR_INVALID_ARGUMENT);
}

// A model and profile of hostile sizes (64 layers, 4096 experts, a budget of a million slots) used
// to start a programme of hours and a 1 GiB choice table at load; it is refused at once now.
TEST(Allocation, RefusesProgrammesTooLargeToSolveAtLoad) {
  std::vector<AllocationLayer> layers(64);
  for (AllocationLayer& a : layers) {
    a.min_size = 9;
    a.max_size = 4096;
    a.loss.assign(static_cast<size_t>(a.max_size - a.min_size + 1), 1.0);
  }
  EXPECT_TRUE(allocation_too_large(layers, 1 << 20));
  std::vector<int32_t> sizes;
  EXPECT_EQ(allocate_cache(layers, 1 << 20, &sizes), MOELITE_ERR_INVALID_ARGUMENT);
  // Few states but many sizes per state: bounded by the steps.
  layers.resize(2);
  EXPECT_FALSE(allocation_too_large(layers, 64 * 9));
  EXPECT_TRUE(allocation_too_large(layers, int64_t{1} << 19));
  // Real shapes still solve (48 layers, 128 experts, half the slots).
  std::vector<AllocationLayer> real(48);
  for (AllocationLayer& a : real) {
    a.min_size = 9;
    a.max_size = 128;
    for (int32_t c = a.min_size; c <= a.max_size; ++c) a.loss.push_back(1.0 / c);
  }
  EXPECT_FALSE(allocation_too_large(real, 48 * 64));
  EXPECT_EQ(allocate_cache(real, 48 * 64, &sizes), MOELITE_OK);
}

TEST(Allocation, ExpectedDemandLoads) {
  EXPECT_DOUBLE_EQ(expected_demand_loads(8, 0.5, 0.0), 4.0);
  EXPECT_DOUBLE_EQ(expected_demand_loads(8, 0.5, 0.75), 1.0);
  EXPECT_DOUBLE_EQ(expected_demand_loads(2, 1.0, 0.0), 0.0);
}

// ---- JSON

TEST(Json, ParsesDocuments) {
  json::Value v;
  std::string err;
  ASSERT_TRUE(json::parse(R"( {"a": [1, -2.5e3, true, null, "x\"\u00e9\ud83d\ude00"], "b": {}} )", &v, &err)) << err;
  ASSERT_TRUE(v.is_object());
  const json::Value* a = v.find("a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->array.size(), 5u);
  EXPECT_EQ(a->array[0].number, 1.0);
  EXPECT_EQ(a->array[1].number, -2500.0);
  EXPECT_TRUE(a->array[2].boolean);
  EXPECT_EQ(a->array[3].kind, json::Value::Kind::Null);
  EXPECT_EQ(a->array[4].string, "x\"\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.find("b")->is_object());
  EXPECT_EQ(v.find("c"), nullptr);
}

TEST(Json, RejectsMalformedTextWithTheLine) {
  const char* bad[] = {"",   "{",   "[1,]",    "{\"a\" 1}",   "{\"a\":1,}", "01",          "1.",       "-",
                       "+1", "nan", "\"\\x\"", "\"\\ud800\"", "[1] 2",      "{\"a\":tru}", "\"a\nb\"", "[1e]"};
  for (const char* text : bad) {
    json::Value v;
    std::string err;
    EXPECT_FALSE(json::parse(text, &v, &err)) << text;
    EXPECT_EQ(err.rfind("line ", 0), 0u) << text;
  }
  json::Value v;
  std::string err;
  EXPECT_FALSE(json::parse("{\n\"a\": [\n1,\n}", &v, &err));
  EXPECT_EQ(err.rfind("line 4", 0), 0u) << err;
  EXPECT_FALSE(json::parse(std::string(100, '[') + std::string(100, ']'), &v, &err));  // depth limit
  EXPECT_NE(err.find("64"), std::string::npos);
}

TEST(Json, NumbersRoundTrip) {
  for (double x : {0.0, 1.0, -0.1, 1e-300, 123456789.123456789, 0.769141274287891}) {
    json::Value v;
    std::string err;
    ASSERT_TRUE(json::parse(json::number(x), &v, &err)) << json::number(x);
    EXPECT_EQ(v.number, x);
  }
  EXPECT_EQ(json::number(NAN), "null");
  EXPECT_EQ(json::quote("a\"b\n"), "\"a\\\"b\\u000a\"");
}

// ---- profiles

namespace {

Profile sample_profile() {
  Profile p;
  p.arch = "qwen3moe";
  p.n_layer = 2;
  p.n_expert = 4;
  p.n_expert_used = 2;
  p.n_embd = 3;
  p.n_tokens = 100;
  p.window = 50;
  p.layers.resize(2);
  for (int l = 0; l < 2; ++l) {
    p.layers[l].sensitivity = 0.5 + l;
    p.layers[l].sensitivity_fd = 0.6 + l;
    p.layers[l].expert_counts = {10, 20, 30, uint64_t(40 + l)};
    p.layers[l].hit_curve = {0, 0, 0.5, 0.75, 1.0};
  }
  p.gating = {{0.01, 1.5, 0.5}};
  p.accuracy["learned"] = {NAN, 0.75};
  p.first_layer = {4, 3, std::vector<float>(16, 0.25f)};
  p.learned.resize(2);
  p.learned[0] = {4, 3, std::vector<float>(16, -1.0f)};
  p.correlation = {std::vector<float>(16, 2.0f)};
  return p;
}

}  // namespace

TEST(Profile, RoundTrips) {
  const std::string path = temp_path("roundtrip.json");
  const Profile p = sample_profile();
  ASSERT_EQ(p.save(path), MOELITE_OK) << last_error_message();
  Profile q;
  ASSERT_EQ(Profile::load(path, &q), MOELITE_OK) << last_error_message();
  EXPECT_EQ(q.arch, "qwen3moe");
  EXPECT_EQ(q.n_tokens, 100);
  ASSERT_EQ(q.layers.size(), 2u);
  EXPECT_EQ(q.layers[1].sensitivity, 1.5);
  EXPECT_EQ(q.layers[1].sensitivity_fd, 1.6);
  EXPECT_EQ(q.layers[1].expert_counts, p.layers[1].expert_counts);
  EXPECT_EQ(q.layers[0].hit_curve, p.layers[0].hit_curve);
  ASSERT_EQ(q.gating.size(), 1u);
  EXPECT_EQ(q.gating[0].experts_per_token, 1.5);
  EXPECT_TRUE(std::isnan(q.accuracy["learned"][0]));
  EXPECT_EQ(q.accuracy["learned"][1], 0.75);
  EXPECT_EQ(q.first_layer.w, p.first_layer.w);
  EXPECT_EQ(q.learned[0].w, p.learned[0].w);
  EXPECT_TRUE(q.learned[1].empty());
  EXPECT_EQ(q.correlation[0], p.correlation[0]);
  std::remove(path.c_str());
  std::remove((path + ".bin").c_str());
}

// Found by fuzz_profile: expert_counts and hit_curve are optional when reading, but a profile
// without them was saved with empty arrays, which the reader (rightly) refuses.
TEST(Profile, OptionalArraysStayOptionalThroughSave) {
  const std::string path = temp_path("optional.json");
  Profile p = sample_profile();
  p.layers[0].expert_counts.clear();
  p.layers[1].hit_curve.clear();
  ASSERT_EQ(p.save(path), MOELITE_OK) << last_error_message();
  Profile q;
  ASSERT_EQ(Profile::load(path, &q), MOELITE_OK) << last_error_message();
  EXPECT_TRUE(q.layers[0].expert_counts.empty());
  EXPECT_EQ(q.layers[0].hit_curve, (std::vector<double>{0, 0, 0.5, 0.75, 1.0}));
  EXPECT_EQ(q.layers[1].expert_counts, (std::vector<uint64_t>{10, 20, 30, 41}));
  EXPECT_TRUE(q.layers[1].hit_curve.empty());
  std::remove(path.c_str());
  std::remove((path + ".bin").c_str());
}

// A tensor list naming the same bytes again and again would copy the weights file once per entry;
// the listed sizes may not add up to more than the file holds.
TEST(Profile, TensorsListingMoreBytesThanTheFileAreRefused) {
  const std::string path = temp_path("dup.json");
  ASSERT_EQ(sample_profile().save(path), MOELITE_OK);
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("{\"name\": \"first_layer\"");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string entry = text.substr(at, text.find('}', at) + 1 - at);
  text.insert(at, entry + ", ");  // first_layer listed twice: its bytes counted twice
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  Profile q;
  EXPECT_EQ(Profile::load(path, &q), MOELITE_ERR_BAD_PROFILE);
  EXPECT_NE(std::string(last_error_message()).find("listed twice"), std::string::npos) << last_error_message();
  std::remove(path.c_str());
  std::remove((path + ".bin").c_str());
}

TEST(Profile, EveryMalformationIsRefusedWithItsOwnStatus) {
  const std::string path = temp_path("bad.json");
  ASSERT_EQ(sample_profile().save(path), MOELITE_OK);
  std::string good;
  {
    std::ifstream in(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto load_text = [&](const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    Profile q;
    return Profile::load(path, &q);
  };
  // Truncated at every byte: refused as a bad profile (or, at the very end, fine), never a crash.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    const Status st = load_text(good.substr(0, cut));
    EXPECT_TRUE(st == MOELITE_ERR_BAD_PROFILE || (st == MOELITE_OK && cut + 2 >= good.size())) << "cut at " << cut;
  }
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_EQ(load_text(replaced("moelite-profile", "something-else")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("\"version\": 1", "\"version\": 2")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("\"sensitivity\": 0.5", "\"sensitivity\": -1")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("\"n_layer\": 2", "\"n_layer\": 3")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("[0, 0, 0.5, 0.75, 1]", "[0, 0, 0.5, 1.75, 1]")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("[10, 20, 30, 40]", "[10, 20, 30]")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("\"first_layer\"", "\"last_layer\"")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("\"rows\": 4, \"cols\": 4", "\"rows\": 4, \"cols\": 5")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("\"learned.0\"", "\"learned.9\"")), MOELITE_ERR_BAD_PROFILE);
  EXPECT_EQ(load_text(replaced("bad.json.bin", "../x.bin")), MOELITE_ERR_BAD_PROFILE);
  // A truncated weights file.
  ASSERT_EQ(load_text(good), MOELITE_OK);
  ASSERT_EQ(truncate((path + ".bin").c_str(), 100), 0);
  Profile q;
  EXPECT_EQ(Profile::load(path, &q), MOELITE_ERR_BAD_PROFILE);
  EXPECT_NE(std::string(last_error_message()).find("outside"), std::string::npos) << last_error_message();
  EXPECT_EQ(Profile::load(path + ".missing", &q), MOELITE_ERR_FILE_NOT_FOUND);
  // Another model's profile.
  HParams hp;
  hp.arch = "qwen3moe";
  hp.n_layer = 2;
  hp.n_expert = 4;
  hp.n_expert_used = 2;
  hp.n_embd = 3;
  Profile p = sample_profile();
  EXPECT_EQ(p.check_model(hp), MOELITE_OK);
  hp.n_expert = 8;
  EXPECT_EQ(p.check_model(hp), MOELITE_ERR_BAD_PROFILE);
  std::remove(path.c_str());
  std::remove((path + ".bin").c_str());
}

TEST(Profile, SaveNeverLeavesAHalfWrittenFile) {
  // A directory that does not exist: the save fails with MOELITE_ERR_IO and no file appears.
  const Profile p = sample_profile();
  EXPECT_EQ(p.save("/nonexistent-dir-moelite/x.json"), MOELITE_ERR_IO);
}

// ---- predictors' building blocks

TEST(Ridge, RecoversAKnownLinearMap) {
  // y = A x + b exactly; with a negligible penalty the fit returns A and b.
  const int32_t n_in = 5, n_out = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  std::vector<float> a(static_cast<size_t>(n_out * n_in)), b(static_cast<size_t>(n_out));
  for (float& v : a) v = g(rng);
  for (float& v : b) v = g(rng);
  RidgeAccumulator ridge(n_in, n_out);
  for (int s = 0; s < 200; ++s) {
    std::vector<float> x(n_in), y(n_out);
    for (float& v : x) v = g(rng);
    for (int32_t o = 0; o < n_out; ++o) {
      double acc = b[static_cast<size_t>(o)];
      for (int32_t i = 0; i < n_in; ++i)
        acc += double(a[static_cast<size_t>(o * n_in + i)]) * x[static_cast<size_t>(i)];
      y[static_cast<size_t>(o)] = static_cast<float>(acc);
    }
    ridge.add(x.data(), y.data());
  }
  LinearMap m;
  ASSERT_EQ(ridge.solve(1e-12, &m), MOELITE_OK);
  for (int32_t o = 0; o < n_out; ++o) {
    for (int32_t i = 0; i < n_in; ++i)
      EXPECT_NEAR(m.w[static_cast<size_t>(o * (n_in + 1) + i)], a[static_cast<size_t>(o * n_in + i)], 1e-4);
    EXPECT_NEAR(m.w[static_cast<size_t>(o * (n_in + 1) + n_in)], b[static_cast<size_t>(o)], 1e-4);
  }
  // apply() computes W [x, 1].
  std::vector<float> x = {1, 0, 0, 0, 0}, out(3);
  m.apply(x.data(), out.data());
  for (int32_t o = 0; o < n_out; ++o)
    EXPECT_NEAR(out[static_cast<size_t>(o)], a[static_cast<size_t>(o * n_in)] + b[static_cast<size_t>(o)], 1e-4);
  RidgeAccumulator empty(2, 2);
  EXPECT_EQ(empty.solve(1e-3, &m), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(Predictors, CorrelationTableGivesSmoothedConditionalProbabilities) {
  CorrelationTable t(3, {});
  const int32_t a0[] = {0}, b1[] = {1}, b2[] = {2}, both[] = {0, 1}, dropped[] = {0, -1};
  t.add(a0, 1, b1, 1);
  t.add(a0, 1, b1, 1);
  t.add(a0, 1, b2, 1);
  std::vector<float> s(3);
  // Row 0: counts (0, 2, 1), sum 3, add-one: (1, 3, 2) / 6.
  t.scores(a0, 1, s.data());
  EXPECT_FLOAT_EQ(s[0], 1.0f / 6);
  EXPECT_FLOAT_EQ(s[1], 3.0f / 6);
  EXPECT_FLOAT_EQ(s[2], 2.0f / 6);
  // Two source experts: the mean of their rows (row 1 is uniform 1/3).
  t.scores(both, 2, s.data());
  EXPECT_FLOAT_EQ(s[1], (3.0f / 6 + 1.0f / 3) / 2);
  // Dropped slots (-1) are ignored.
  t.scores(dropped, 2, s.data());
  EXPECT_FLOAT_EQ(s[1], 3.0f / 6);
  EXPECT_EQ(top_indices(s.data(), 3, 2), (std::vector<int32_t>{1, 2}));
  const float ties[] = {0.5f, 0.7f, 0.7f, 0.1f};
  EXPECT_EQ(top_indices(ties, 4, 3), (std::vector<int32_t>{1, 2, 0}));
}

// The correlation predictor's tables grow with experts squared: a 157 KB file declaring 4096
// experts used to allocate hundreds of MB for them, even without a budget. Refused beyond the
// limit (with or without building), sized in 64 bits (4096^2 x 63 layers overflows 32 bits).
TEST(CorrelationPredictor, RefusesTablesBeyondTheLimit) {
  EXPECT_EQ(correlation_table_bytes(64, 4096), uint64_t{63} * 4096 * 4096 * 4);
  EXPECT_EQ(correlation_table_bytes(1, 4096), 0u);
  Model m;
  m.hp.n_layer = 64;
  m.hp.n_expert = 4096;
  m.hp.n_expert_used = 8;
  std::unique_ptr<ExpertPredictor> p;
  EXPECT_EQ(make_predictor("correlation", 1, m, nullptr, &p), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(make_predictor("correlation", 1, m, nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(last_error_message()).find("MiB"), std::string::npos);
  m.hp.n_expert = 128;
  m.hp.n_layer = 48;
  EXPECT_EQ(make_predictor("correlation", 1, m, nullptr, nullptr), MOELITE_OK);
  EXPECT_EQ(make_predictor("correlation", 1, m, nullptr, &p), MOELITE_OK);
  EXPECT_NE(p, nullptr);
}
