// DeepSeek-style routing on hand-made logits, against values worked out by hand from the
// definition in core/moe/scored_routing.h (sigmoid or softmax scores, a selection bias that picks
// but does not weigh, group-limited selection, renormalisation); the model-level behaviour is
// checked against the numpy reference in tests/reference.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/moe/scored_routing.h"

namespace moelite {
namespace {

HParams shape(int32_t n_expert, int32_t k, ExpertGatingFunc f, bool norm) {
  HParams hp;
  hp.n_expert = n_expert;
  hp.n_expert_used = k;
  hp.gating_func = f;
  hp.norm_topk = norm;
  return hp;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(ScoredRouting, TheBiasPicksAndTheUnbiasedScoresWeigh) {
  const HParams hp = shape(4, 2, ExpertGatingFunc::Sigmoid, false);
  const std::vector<float> logits = {1.0f, 0.0f, 0.5f, -1.0f}, bias = {0.0f, 1.0f, 0.0f, 2.0f};
  Routing r;
  route_scores(hp, logits.data(), 1, bias.data(), &r);
  // Selection: 0.731, 1.5, 0.622, 2.269 -> experts 3 then 1; weights sigmoid(-1), sigmoid(0).
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
  EXPECT_FLOAT_EQ(r.weights[0], sigmoid(-1.0f));
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
  EXPECT_TRUE(needs_scored_routing(hp, {}));
  EXPECT_FALSE(needs_scored_routing(shape(4, 2, ExpertGatingFunc::Softmax, false), {}));
  EXPECT_TRUE(needs_scored_routing(shape(4, 2, ExpertGatingFunc::Softmax, false), bias));
}

TEST(ScoredRouting, OnlyTheBestGroupsMayBePicked) {
  // 8 experts in 4 groups of 2, the best 2 groups kept. Group sums of the two best: g0 0.9+0.1,
  // g1 0.8+0.7 = 1.5, g2 0.95+0.0, g3 0.6+0.6 = 1.2 -> groups 1 and 3; the top 3 of their experts.
  HParams hp = shape(8, 3, ExpertGatingFunc::Softmax, true);
  hp.n_expert_groups = 4;
  hp.n_group_used = 2;
  const std::vector<float> sel = {0.9f, 0.1f, 0.8f, 0.7f, 0.95f, 0.0f, 0.6f, 0.6f};
  std::vector<float> logits(sel.size());
  for (size_t i = 0; i < sel.size(); ++i) logits[i] = std::log(sel[i] + 1e-3f);  // softmax order = sel's
  Routing r;
  route_scores(hp, logits.data(), 1, nullptr, &r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3, 6}));  // 0.95 (group 2) and 0.9 (group 0) are excluded
  float sum = 0.0f;
  for (float w : r.weights) sum += w;
  EXPECT_NEAR(sum, 1.0f, 1e-6f);  // renormalised
}

TEST(ScoredRouting, TiesGoToTheLowerIdAndNanNeverWins) {
  HParams hp = shape(4, 2, ExpertGatingFunc::Sigmoid, true);
  const std::vector<float> logits = {0.0f, NAN, 0.0f, 0.0f};
  Routing r;
  route_scores(hp, logits.data(), 1, nullptr, &r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  const std::vector<float> none = {NAN, NAN, NAN, NAN};
  route_scores(hp, none.data(), 1, nullptr, &r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{-1, -1}));  // dropped slots, weight 0
  EXPECT_EQ(r.weights, (std::vector<float>{0.0f, 0.0f}));
}

}  // namespace
}  // namespace moelite
