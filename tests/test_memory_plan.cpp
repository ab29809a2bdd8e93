// The expert memory plan (core/experts/memory_plan.h) against what the runtime really accepts and
// allocates, on the shipped model, with the slot arithmetic worked out here from the model's shape
// (an independent count, not the plan's own numbers):
//   - the minimum of each layout is the smallest budget Runtime::create takes (one byte less is
//     MOELITE_ERR_BUDGET_TOO_SMALL), and no budget allocates more than holding every expert;
//   - a share P of the experts is the reserve + ceil(P x experts) slots per pool, 100 % keeps
//     every expert, and the bytes a share reports load the same slots when given as bytes;
//   - budget auto sizes within the same limits.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "core/exec/runtime.h"
#include "core/experts/expert_store.h"
#include "core/experts/memory_plan.h"
#include "core/model/model.h"

using namespace moelite;

namespace {

std::string model_path() { return std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf"; }

struct Case {
  bool per_layer;
  const char* allocation;
};

RuntimeOptions options(const Case& c, const ExpertBudget& budget) {
  RuntimeOptions o;
  o.n_threads = 1;
  o.expert_budget = budget;
  o.expert_per_layer = c.per_layer;
  o.cache_allocation = c.allocation;
  return o;
}

// Runtime::create with `budget` under the case's options; the store's pool bytes through *pool.
Status create_with(const Model& m, const Case& c, uint64_t budget, uint64_t* pool) {
  std::unique_ptr<Runtime> rt;
  const Status st = Runtime::create(m, options(c, ExpertBudget::of_bytes(budget)), &rt);
  if (st == MOELITE_OK && pool) *pool = rt->store->pool_bytes();
  return st;
}

std::unique_ptr<Model> load_streaming() {
  LoadOptions lo;
  lo.stream_experts = true;  // a budgeted load: experts are read by the store, not mapped
  std::unique_ptr<Model> m;
  EXPECT_EQ(Model::load(model_path(), lo, &m), MOELITE_OK) << last_error_message();
  return m;
}

// The bytes one slot takes, counted here: each of gate, up and down rounded up to 4 KiB, plus
// 4 KiB for the aligned read's start.
uint64_t slot_bytes_of(const Model& m) {
  const ExpertWeights w = m.layers[static_cast<size_t>(m.hp.n_dense_lead)].experts.expert(0);
  uint64_t sum = 0;
  for (const WeightView* v : {&w.gate, &w.up, &w.down}) sum += (v->bytes() + 4095) / 4096 * 4096 + 4096;
  return sum;
}

const Case kCases[] = {{false, "auto"}, {false, "global"}, {false, "uniform"},
                       {true, "auto"},  {true, "global"},  {true, "uniform"}};

}  // namespace

TEST(MemoryPlan, LimitsAreWhatTheRuntimeAccepts) {
  std::unique_ptr<Model> m = load_streaming();
  ASSERT_TRUE(m);
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.per_layer ? "per-layer " : "") + c.allocation);
    const std::string alloc = options(c, {}).allocation();
    const ExpertPoolLimits l = expert_pool_limits(*m, alloc == "uniform" || alloc == "dp");
    ASSERT_EQ(l.slot_bytes, slot_bytes_of(*m));
    const uint64_t pools = alloc == "uniform" ? static_cast<uint64_t>(m->hp.n_moe_layers()) : 1;
    EXPECT_EQ(l.minimum, l.slot_bytes * (m->hp.n_expert_used + kReserveSlots) * pools);
    uint64_t pool = 0;
    EXPECT_EQ(create_with(*m, c, l.minimum, &pool), MOELITE_OK) << last_error_message();
    EXPECT_GE(pool, l.minimum);
    EXPECT_EQ(create_with(*m, c, l.minimum - 1, nullptr), MOELITE_ERR_BUDGET_TOO_SMALL);
    // A budget of every expert's bytes and more: the pool stops at every expert plus the reserve.
    EXPECT_EQ(create_with(*m, c, m->expert_bytes * 4, &pool), MOELITE_OK) << last_error_message();
    const uint64_t experts = static_cast<uint64_t>(m->hp.n_moe_layers()) * static_cast<uint64_t>(m->hp.n_expert);
    EXPECT_EQ(pool, l.slot_bytes * (experts + kReserveSlots * pools));
  }
}

TEST(MemoryPlan, ASharePaysForThatShareOfTheExperts) {
  std::unique_ptr<Model> m = load_streaming();
  ASSERT_TRUE(m);
  const int64_t layers = m->hp.n_moe_layers(), per_layer = m->hp.n_expert, experts = layers * per_layer;
  for (const Case& c : {Case{false, "global"}, Case{false, "uniform"}}) {
    const bool uniform = std::string(c.allocation) == "uniform";
    for (const double share : {0.25, 0.3, 0.5, 0.9, 1.0}) {
      SCOPED_TRACE(std::string(c.allocation) + " " + std::to_string(share));
      std::unique_ptr<Runtime> rt;
      ASSERT_EQ(Runtime::create(*m, options(c, ExpertBudget::of_share(share)), &rt), MOELITE_OK)
          << last_error_message();
      const ExpertMemoryPlan& plan = rt->memory_plan;
      const int64_t want = uniform ? layers * (1 + static_cast<int64_t>(std::ceil(share * per_layer - 1e-9)))
                                   : 1 + static_cast<int64_t>(std::ceil(share * experts - 1e-9));
      EXPECT_EQ(plan.n_slots, want);
      EXPECT_EQ(static_cast<int64_t>(rt->store->n_slots()), want);
      EXPECT_EQ(plan.budget_bytes, static_cast<uint64_t>(want) * slot_bytes_of(*m));
      // Every expert has a slot once the pools hold as many slots as they serve experts (the reserve
      // slot may make that true just below 100 %).
      EXPECT_EQ(plan.all_resident, uniform ? want / layers >= per_layer : want >= experts);
      // The same bytes, given as bytes, pay for the same slots.
      std::unique_ptr<Runtime> again;
      ASSERT_EQ(Runtime::create(*m, options(c, ExpertBudget::of_bytes(plan.budget_bytes)), &again), MOELITE_OK);
      EXPECT_EQ(again->memory_plan.n_slots, want);
    }
  }
}

TEST(MemoryPlan, BudgetTextIsParsedOnce) {
  ExpertBudget b;
  ASSERT_EQ(parse_expert_budget("25%", &b), MOELITE_OK);
  EXPECT_EQ(b.kind, ExpertBudget::Kind::Share);
  EXPECT_DOUBLE_EQ(b.share, 0.25);
  ASSERT_EQ(parse_expert_budget("2GiB", &b), MOELITE_OK);
  EXPECT_EQ(b.kind, ExpertBudget::Kind::Bytes);
  EXPECT_EQ(b.bytes, uint64_t{2} << 30);
  ASSERT_EQ(parse_expert_budget("1.5G", &b), MOELITE_OK);
  EXPECT_EQ(b.bytes, 1500000000u);
  ASSERT_EQ(parse_expert_budget("auto", &b), MOELITE_OK);
  EXPECT_EQ(b.kind, ExpertBudget::Kind::Auto);
  ASSERT_EQ(parse_expert_budget("none", &b), MOELITE_OK);
  EXPECT_EQ(b.kind, ExpertBudget::Kind::None);
  for (const char* bad : {"", "0", "0.4", "0%", "101%", "-1", "1e30", "inf", "nan", "18446744073709551615", "0x100000",
                          "25 %", "2 GiB", "5Q", "%"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(parse_expert_budget(bad, &b), MOELITE_ERR_INVALID_ARGUMENT);
  }
}

TEST(MemoryPlan, AutoSizesWithinTheLayoutsLimits) {
  std::unique_ptr<Model> m = load_streaming();
  ASSERT_TRUE(m);
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.per_layer ? "per-layer " : "") + c.allocation);
    std::unique_ptr<Runtime> rt;
    ASSERT_EQ(Runtime::create(*m, options(c, ExpertBudget::automatic(0)), &rt), MOELITE_OK) << last_error_message();
    const ExpertMemoryPlan& plan = rt->memory_plan;
    // This machine has far more memory than the tiny model's experts: every expert fits.
    EXPECT_TRUE(plan.all_resident);
    EXPECT_EQ(plan.budget_bytes, plan.auto_budget.budget);
    EXPECT_LE(rt->store->pool_bytes(), plan.budget_bytes);
  }
}

// Model::load refuses routed experts without rows (test_model_metadata); a model that has some
// anyway -- here the last layer's, emptied after loading -- gets no plan rather than an expert
// store sized by bytes that layer does not have.
TEST(MemoryPlan, ALayerOfExpertsWithoutBytesGetsNoPlan) {
  std::unique_ptr<Model> m = load_streaming();
  ASSERT_TRUE(m);
  LayerExperts& ex = m->layers.back().experts;
  for (WeightView* v : {&ex.gate, &ex.up, &ex.down}) v->rows = 0;
  for (ExpertWeights& w : ex.split) w.gate.rows = w.up.rows = w.down.rows = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.per_layer ? "per-layer " : "") + c.allocation);
    EXPECT_EQ(create_with(*m, c, m->expert_bytes, nullptr), MOELITE_ERR_BAD_SHAPE) << last_error_message();
  }
}
