// The batch planner (core/serve/batch_plan.h) on numbers worked by hand: an OLMoE-like shape (8 MoE
// layers of 64 experts, top-8, 6 MiB an expert) in 2 GiB. The expected rows come from the
// formulas of the header evaluated separately (Python, double precision), not from the code.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/moe/tokens_by_expert.h"
#include "core/serve/batch_plan.h"

using moelite::BatchPlan;
using moelite::BatchPlanInputs;

namespace {
constexpr uint64_t MiB = uint64_t{1} << 20;

BatchPlanInputs olmoe_like(uint64_t kv_per_sequence) {
  BatchPlanInputs in;
  in.memory = 2048 * MiB;
  in.dense = 200 * MiB;
  in.context_base = 50 * MiB;
  in.kv_per_sequence = kv_per_sequence;
  in.headroom = 100 * MiB;
  in.slot_bytes = 6 * MiB;
  in.minimum_budget = 9 * 6 * MiB;        // top-8 + 1 reserve
  in.minimum_per_layer = 8 * 9 * 6 * MiB;  // the same in each layer's pool
  in.all_experts = (8 * 64 + 1) * 6 * MiB;  // every expert + 1 reserve
  in.n_moe_layers = 8;
  in.n_expert = 64;
  in.n_expert_used = 8;
  in.max_sequences = 16;
  in.storage_bytes_per_s = 2e9;
  return in;
}
}  // namespace

TEST(BatchPlan, DistinctExpertsOfIndependentTokens) {
  EXPECT_DOUBLE_EQ(moelite::expected_distinct_experts(64, 8, 1), 8.0);
  EXPECT_DOUBLE_EQ(moelite::expected_distinct_experts(64, 8, 2), 15.0);  // 64 (1 - (7/8)^2)
  EXPECT_NEAR(moelite::expected_distinct_experts(64, 8, 8), 42.0090, 1e-4);
  EXPECT_DOUBLE_EQ(moelite::expected_distinct_experts(16, 16, 3), 16.0);  // every expert every token
  EXPECT_DOUBLE_EQ(moelite::expected_distinct_experts(64, 8, 0), 0.0);
}

// Long contexts (256 MiB of KV a sequence): each added sequence takes a sixth of the expert
// cache, and the extra misses outweigh the shared reads, so one sequence is best.
TEST(BatchPlan, LargeKvCachesLeaveTheMemoryToExperts) {
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(olmoe_like(256 * MiB), &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 1);
  EXPECT_EQ(p.expert_budget, 1442 * MiB);  // 2048 - 200 - 50 - 256 - 100
  EXPECT_EQ(p.lookahead, 0);               // no compute rate given
  ASSERT_EQ(p.rows.size(), 16u);
  // n = 2: 1186 MiB -> 197 slots, 196 of 512 experts cached; 15 distinct experts a layer.
  EXPECT_NEAR(p.rows[1].cache_share, 196.0 / 512.0, 1e-12);
  EXPECT_NEAR(p.rows[1].read_bytes, 465960960.0, 1.0);
  EXPECT_NEAR(p.rows[0].tok_s, 9.3155, 1e-4);
  EXPECT_NEAR(p.rows[1].tok_s, 8.5844, 1e-4);
  EXPECT_FALSE(p.rows[1].per_layer);  // 8 x 15 experts a step fit in 197 slots: one global pool
  // n = 3: 8 x 21.1 experts a step outnumber 155 slots: a pool per layer (8 reserve slots).
  EXPECT_TRUE(p.rows[2].per_layer);
  EXPECT_NEAR(p.rows[2].cache_share, 147.0 / 512.0, 1e-12);
  EXPECT_NEAR(p.rows[2].tok_s, 7.9157, 1e-4);
  EXPECT_TRUE(p.rows[3].fits);    // 674 MiB of experts, above the per-layer minimum of 8 x 9 slots (432 MiB)
  EXPECT_FALSE(p.rows[4].fits);   // 418 MiB
  EXPECT_NE(p.reason.find("shrink the expert cache"), std::string::npos) << p.reason;
}

// Short contexts (4 MiB a sequence): the cache barely shrinks, sharing wins; 15 sequences are
// within 5 % of 16's 23.25 tok/s (22.32), 14 are not (21.30).
TEST(BatchPlan, SmallKvCachesShareReadsAcrossSequences) {
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(olmoe_like(4 * MiB), &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 15);
  EXPECT_NEAR(p.tok_s, 22.3164, 1e-3);
  EXPECT_NEAR(p.rows[15].tok_s, 23.2547, 1e-3);
  EXPECT_TRUE(p.per_layer);
  EXPECT_EQ(p.expert_budget, 1638 * MiB);
  EXPECT_EQ(p.kv_bytes, 60 * MiB);
  EXPECT_NE(p.reason.find("within 5 %"), std::string::npos) << p.reason;
}

// Between the two (100 MiB a sequence) the throughput is nearly flat; the best that fits is 12
// (10.93 tok/s; 13 leave less than the per-layer minimum) and the fewest within 5 % is 8 (10.44;
// 7 give 10.35).
TEST(BatchPlan, TakesTheFewestSequencesNearTheBest) {
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(olmoe_like(100 * MiB), &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 8);
  EXPECT_TRUE(p.rows[11].fits);
  EXPECT_FALSE(p.rows[12].fits);
  EXPECT_NEAR(p.rows[11].tok_s, 10.9310, 1e-3);
}

// A loaded model's budget is fixed (600 MiB): only the sequences are planned, as many as fit.
TEST(BatchPlan, FixedBudgetPlansOnlyTheSequences) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.fixed_budget = 600 * MiB;
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 4);  // 200 + 50 + 4 x 256 + 100 + 600 = 1974 <= 2048; 5 would need 2230
  EXPECT_EQ(p.expert_budget, 600 * MiB);
  EXPECT_TRUE(p.rows[3].fits);
  EXPECT_FALSE(p.rows[4].fits);
  EXPECT_NEAR(p.rows[3].tok_s, 7.3161, 1e-3);
  EXPECT_NE(p.reason.find("no more sequences"), std::string::npos) << p.reason;
}

// One global LRU pool that a step's experts outnumber hits nothing: the layers, visited in turn,
// evict each other's experts before the next step reuses them (measured: hit rate 0 at 4 and 8
// sequences, docs/ARCHITECTURE.md "Several sequences"). With the pools fixed global, one sequence wins.
TEST(BatchPlan, AGlobalPoolSmallerThanAStepHitsNothing) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.fixed_budget = 600 * MiB;
  in.pools = moelite::CachePools::kGlobal;
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 1);
  EXPECT_FALSE(p.per_layer);
  EXPECT_NEAR(p.rows[0].hit_share, 99.0 / 512.0, 1e-12);  // 64 experts a step fit in 100 slots
  EXPECT_EQ(p.rows[1].hit_share, 0.0);                    // 120 do not
  EXPECT_NEAR(p.rows[1].tok_s, 5.2982, 1e-3);
}

// Lookahead 1 only where a step's reads fit behind its computation.
TEST(BatchPlan, LookaheadOnlyWhenReadsHideBehindComputation) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.max_sequences = 4;
  in.compute_bytes_per_s = 1e9;  // slow compute: n = 4 reads 0.52 s, computes 1.54 s
  BatchPlan slow;
  ASSERT_EQ(moelite::plan_batch(in, &slow), MOELITE_OK);
  EXPECT_EQ(slow.n_seq, 4);  // 1.9288 tok/s; 3 give 1.8160, below 95 %
  EXPECT_EQ(slow.lookahead, 1);
  in.compute_bytes_per_s = 20e9;  // fast compute: n = 1 reads 0.107 s, computes 0.031 s
  BatchPlan fast;
  ASSERT_EQ(moelite::plan_batch(in, &fast), MOELITE_OK);
  EXPECT_EQ(fast.n_seq, 1);
  EXPECT_NEAR(fast.tok_s, 7.2481, 1e-3);
  EXPECT_EQ(fast.lookahead, 0);
  EXPECT_NE(fast.reason.find("guesses would add reads"), std::string::npos) << fast.reason;
}

// Resident (a file mapping): only KV and scratch count; with nothing to time, the most that fit.
TEST(BatchPlan, ResidentTakesTheMostSequencesThatFit) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.resident = true;
  in.dense = 0;
  in.storage_bytes_per_s = 0;
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 7);  // 50 + 7 x 256 + 100 = 1942 <= 2048
  EXPECT_EQ(p.expert_budget, 0u);
  EXPECT_EQ(p.tok_s, 0.0);
}

TEST(BatchPlan, TooLittleMemoryNamesEveryTerm) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.memory = 600 * MiB;  // 600 - 200 - 50 - 256 - 100 = -6: nothing for experts
  BatchPlan p;
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_BUDGET_TOO_SMALL);
  const std::string msg = moelite::last_error_message();
  EXPECT_NE(msg.find("629145600 bytes of memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("they need 56623104"), std::string::npos) << msg;
}

TEST(BatchPlan, InputsThatMakeNoModelAreRefused) {
  BatchPlan p;
  BatchPlanInputs in = olmoe_like(4 * MiB);
  in.max_sequences = 0;
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
  in = olmoe_like(4 * MiB);
  in.storage_bytes_per_s = 0;  // streaming, but no bandwidth
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
  in = olmoe_like(4 * MiB);
  in.n_expert = 0;
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(BatchPlan, JsonNamesTheChoiceAndEveryRow) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.max_sequences = 3;
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  const std::string j = moelite::batch_plan_json(in, p);
  EXPECT_EQ(j.rfind("{\"n_seq\": 1, \"expert_budget_bytes\": 1512046592", 0), 0u) << j;
  EXPECT_NE(j.find("\"rows\": [{\"n_seq\": 1"), std::string::npos);
  EXPECT_NE(j.find("{\"n_seq\": 3, \"fits\": true"), std::string::npos);
}

// Skewed routing (a profile's shares): one layer of 4 experts, top-1, shares 0.7/0.1/0.1/0.1, a
// pool of 2 slots (1 after the reserve). Che's approximation for one sequence: the cache holds
// what was used in the last T steps with T such that 1 - 0.3^T + 3 (1 - 0.9^T) = 1, i.e. T = 1,
// so the hit share is 0.7 x 0.7 + 3 x 0.1 x 0.1 = 0.52 (uniform routing would give 1/4). Two
// sequences: 0.468919 (the same equation for the step's use chances 0.91 and 0.19, solved apart).
TEST(BatchPlan, SkewedRoutingHitsMoreThanTheCacheShare) {
  BatchPlanInputs in;
  in.memory = 64 * MiB;
  in.fixed_budget = 2 * MiB;
  in.slot_bytes = MiB;
  in.minimum_budget = 2 * MiB;
  in.minimum_per_layer = 2 * MiB;
  in.all_experts = 5 * MiB;
  in.n_moe_layers = 1;
  in.n_expert = 4;
  in.n_expert_used = 1;
  in.max_sequences = 2;
  in.pools = moelite::CachePools::kPerLayer;
  in.storage_bytes_per_s = 1e6;
  in.routing = {0.7, 0.1, 0.1, 0.1};
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  EXPECT_NEAR(p.rows[0].hit_share, 0.52, 1e-9);
  EXPECT_NEAR(p.rows[0].read_bytes, 0.48 * MiB, 1e-3);
  EXPECT_NEAR(p.rows[1].distinct_experts, 1.48, 1e-12);  // 0.91 + 3 x 0.19
  EXPECT_NEAR(p.rows[1].hit_share, 0.468919, 1e-6);
  EXPECT_DOUBLE_EQ(p.rows[0].cache_share, 0.25);

  // Shares of k / E each are uniform routing: the same plan as none given.
  in.routing = {0.25, 0.25, 0.25, 0.25};
  BatchPlan even, none;
  ASSERT_EQ(moelite::plan_batch(in, &even), MOELITE_OK);
  in.routing.clear();
  ASSERT_EQ(moelite::plan_batch(in, &none), MOELITE_OK);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(even.rows[i].hit_share, none.rows[i].hit_share, 1e-9);
    EXPECT_NEAR(none.rows[i].hit_share, none.rows[i].cache_share, 1e-9);
  }
  in.routing = {0.5, 0.5};  // not one share per expert
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
}

// The work is bounded: routing shares beyond kMaxRoutingCells experts are refused, and uniform
// routing costs the same for the largest model the library loads (1024 layers x 4096 experts, 256
// sequences asked for) as for a small one: no per-expert work.
TEST(BatchPlan, WorkIsBoundedForHugeModels) {
  BatchPlanInputs in = olmoe_like(4 * MiB);
  in.routing.assign(moelite::kMaxRoutingCells + 1, 0.01);
  BatchPlan p;
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
  in.routing.clear();
  in.n_moe_layers = 1024;
  in.n_expert = 4096;
  in.max_sequences = 256;
  in.memory = uint64_t{1} << 50;
  in.all_experts = in.slot_bytes * (uint64_t{1024} * 4096 + 1);
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  EXPECT_EQ(p.rows.size(), 256u);
  EXPECT_DOUBLE_EQ(p.rows[0].hit_share, 1.0);  // every expert fits: everything ever used stays
}

// min_sequences = max_sequences plans exactly that many: its budget and pools, whatever is best.
TEST(BatchPlan, ExactlyNSequences) {
  BatchPlanInputs in = olmoe_like(256 * MiB);
  in.min_sequences = in.max_sequences = 3;  // the best would be 1
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  EXPECT_EQ(p.n_seq, 3);
  EXPECT_EQ(p.expert_budget, 930 * MiB);  // 2048 - 200 - 50 - 3 x 256 - 100
  EXPECT_TRUE(p.per_layer);
  EXPECT_NE(p.reason.find("3 sequences asked for"), std::string::npos) << p.reason;
  in.min_sequences = in.max_sequences = 5;  // 418 MiB: below the per-layer minimum
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_BUDGET_TOO_SMALL);
  EXPECT_NE(std::string(moelite::last_error_message()).find("KV cache of 5 sequences"), std::string::npos);
  in.min_sequences = 6;
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
}

namespace {
// Layers of 4 experts, top-1, 1 MiB an expert, a budget of `slots` experts in the given pools, up
// to 2 sequences, storage at 1 GB/s; memory to spare.
BatchPlanInputs four_experts_top1(int32_t layers, uint64_t slots, moelite::CachePools pools) {
  BatchPlanInputs in;
  in.memory = 64 * MiB;
  in.fixed_budget = slots * MiB;
  in.slot_bytes = MiB;
  in.minimum_budget = 2 * MiB;
  in.minimum_per_layer = 2 * static_cast<uint64_t>(layers) * MiB;
  in.all_experts = (4 * static_cast<uint64_t>(layers) + 1) * MiB;
  in.pools = pools;
  in.n_moe_layers = layers;
  in.n_expert = 4;
  in.n_expert_used = 1;
  in.max_sequences = 2;
  in.storage_bytes_per_s = 1e9;
  return in;
}

// One sequence's recorded routing, token-major: routing[token][layer] is that layer's experts.
std::shared_ptr<const moelite::RoutingTrace> recorded(const std::vector<std::vector<std::vector<int32_t>>>& routing) {
  auto t = std::make_shared<moelite::RoutingTrace>();
  t->tokens = static_cast<int32_t>(routing.size());
  for (const auto& token : routing)
    for (const auto& layer : token) t->experts.push_back(layer);
  return t;
}
}  // namespace

// A trace replaces the independent-steps model with a replay. One layer of 4 experts, top-1, one
// global pool of 2 slots (1 after the reserve), a sequence that stays on expert 0 for four tokens,
// then on expert 1 for four. Worked by hand, LRU over the trace's second pass (the first warms
// the cache: it ends holding expert 1):
// - 1 sequence: 0 misses, three hits, 1 misses, three hits: hit share 6/8 (uniform routing: 1/4);
//   0.25 MiB read a step.
// - 2 sequences start 4 tokens apart, so every step reads {0, 1}: two experts a step outnumber the
//   one slot, which hits nothing; 2 MiB read a step, so one sequence is 4x faster a token.
TEST(BatchPlan, ATraceMeasuresASequencesReuseOfItsExperts) {
  BatchPlanInputs in = four_experts_top1(1, 2, moelite::CachePools::kGlobal);
  BatchPlan uniform;
  ASSERT_EQ(moelite::plan_batch(in, &uniform), MOELITE_OK);
  EXPECT_DOUBLE_EQ(uniform.rows[0].hit_share, 0.25);

  in.trace = recorded({{{0}}, {{0}}, {{0}}, {{0}}, {{1}}, {{1}}, {{1}}, {{1}}});
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(p.rows[0].hit_share, 0.75);
  EXPECT_DOUBLE_EQ(p.rows[0].distinct_experts, 1.0);
  EXPECT_DOUBLE_EQ(p.rows[0].read_bytes, 0.25 * MiB);
  EXPECT_DOUBLE_EQ(p.rows[1].hit_share, 0.0);
  EXPECT_DOUBLE_EQ(p.rows[1].distinct_experts, 2.0);
  EXPECT_DOUBLE_EQ(p.rows[1].read_bytes, 2.0 * MiB);
  EXPECT_NEAR(p.rows[0].tok_s, 1e9 / (0.25 * MiB), 1e-6);
  EXPECT_EQ(p.n_seq, 1);
  EXPECT_NE(moelite::batch_plan_json(in, p).find("\"routing\": \"trace\""), std::string::npos);
}

// Per-layer pools: two layers of 4 experts, top-1, 5 slots (2 reserve, 1.5 a layer), a trace of 4
// tokens: layer 0 reads 0, 0, 1, 1 and layer 1 reads 2, 3, 2, 3. Stack distances of the second
// pass, worked by hand (layer 0 starts it with [1, 0], layer 1 with [3, 2], most recent first):
// - 1 sequence: layer 0 hits 2 of 4 with 1 slot and 4 with 2; layer 1 hits 0 with 1 slot and 4
//   with 2. Halfway between (1.5 slots): (3 + 2) / 8.
// - 2 sequences (tokens 2 apart): layer 0 reads {0, 1} every step, each step one access at depth 0
//   and one at depth 1 (4 hits of 8 with 1 slot, 8 with 2); layer 1 reads 2, 3, 2, 3 as before.
//   (6 + 2) / 12, and 3 experts a step: 1.5 a layer.
TEST(BatchPlan, ATraceReplaysPerLayerPoolsBetweenWholeSlots) {
  BatchPlanInputs in = four_experts_top1(2, 5, moelite::CachePools::kPerLayer);
  in.trace = recorded({{{0}, {2}}, {{0}, {3}}, {{1}, {2}}, {{1}, {3}}});
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_TRUE(p.rows[0].per_layer);
  EXPECT_DOUBLE_EQ(p.rows[0].hit_share, 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(p.rows[0].distinct_experts, 1.0);
  EXPECT_DOUBLE_EQ(p.rows[1].hit_share, 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(p.rows[1].distinct_experts, 1.5);
}

TEST(BatchPlan, ATraceOfAnotherShapeIsRefused) {
  BatchPlanInputs in = olmoe_like(4 * MiB);
  BatchPlan p;
  in.trace = recorded({{{0}}, {{1}}});  // one layer a token; the model has 8
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
  std::vector<std::vector<std::vector<int32_t>>> tokens(2, std::vector<std::vector<int32_t>>(8, {1, 2}));
  tokens[1][7] = {64};  // an expert the model does not have
  in.trace = recorded(tokens);
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(moelite::last_error_message()).find("expert 64 of 64"), std::string::npos);
  tokens[1][7] = {63};
  in.trace = recorded(tokens);
  EXPECT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
}

// The replays' work is bounded: 256 candidates of a model of 64 layers x 256 experts, top-8, with
// a trace of 1 024 tokens, replay one step each (2^30 / 256 / (n 8 x 64 x 256) < 1 from n = 1),
// so the plan returns at once instead of after minutes.
TEST(BatchPlan, ReplayingATraceIsBoundedForManyCandidatesOfABigModel) {
  BatchPlanInputs in;
  in.memory = uint64_t{1} << 40;
  in.fixed_budget = uint64_t{1} << 30;
  in.slot_bytes = MiB;
  in.minimum_budget = 9 * MiB;
  in.minimum_per_layer = 64 * 9 * MiB;
  in.all_experts = (64 * 256 + 1) * MiB;
  in.n_moe_layers = 64;
  in.n_expert = 256;
  in.n_expert_used = 8;
  in.max_sequences = 256;
  in.storage_bytes_per_s = 1e9;
  std::vector<std::vector<std::vector<int32_t>>> tokens(1024, std::vector<std::vector<int32_t>>(64));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (auto& layer : tokens[t])
      for (int32_t j = 0; j < 8; ++j) layer.push_back(static_cast<int32_t>((t * 37 + static_cast<size_t>(j) * 29) % 256));
  in.trace = recorded(tokens);
  BatchPlan p;
  ASSERT_EQ(moelite::plan_batch(in, &p), MOELITE_OK);
  ASSERT_EQ(p.rows.size(), 256u);
  // One step of n sequences: n copies of 8 experts a layer, starting 1024 / n tokens apart, whose
  // union is at most 256.
  EXPECT_DOUBLE_EQ(p.rows[0].distinct_experts, 8.0);
  EXPECT_LE(p.rows[255].distinct_experts, 256.0);
}
