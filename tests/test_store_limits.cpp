// The expert store's size limits as the auto budget sees them (planned_store_limits) against what
// the runtime really accepts and allocates, for every cache allocation with and without per-layer
// quotas: the minimum is the smallest budget Runtime::create takes (one byte less is
// MOELITE_ERR_BUDGET_TOO_SMALL), and no budget makes the store allocate more than the cap. The auto
// budget once derived both on its own and disagreed with `--per-layer --allocation global`.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/adaptive/setup.h"
#include "core/expert_store/expert_store.h"
#include "core/model.h"
#include "core/runtime.h"

using namespace moelite;

namespace {

std::string model_path() { return std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf"; }

struct Case {
  bool per_layer;
  const char* allocation;
};

// Runtime::create with `budget` under the case's options; the store's pool bytes through *pool.
Status create_with(const Model& m, const Case& c, uint64_t budget, uint64_t* pool) {
  LoadOptions o;
  o.n_threads = 1;
  o.expert_budget_bytes = budget;
  o.expert_per_layer = c.per_layer;
  o.cache_allocation = c.allocation;
  std::unique_ptr<Runtime> rt;
  const Status st = Runtime::create(m, o, &rt);
  if (st == MOELITE_OK && pool) *pool = rt->store->pool_bytes();
  return st;
}

}  // namespace

TEST(StoreLimits, AutoBudgetLimitsAreTheStores) {
  LoadOptions lo;
  lo.expert_budget_bytes = 1;  // a budgeted load: experts are read by the store, not mapped
  std::unique_ptr<Model> m;
  ASSERT_EQ(Model::load(model_path(), lo, &m), MOELITE_OK) << last_error_message();
  const Case cases[] = {{false, "auto"},   {false, "global"}, {false, "uniform"},
                        {true, "auto"},    {true, "global"},  {true, "uniform"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.per_layer ? "per-layer " : "") + c.allocation);
    LoadOptions o;
    o.expert_per_layer = c.per_layer;
    o.cache_allocation = c.allocation;
    const ExpertStore::Limits l = planned_store_limits(*m, o);
    ASSERT_GT(l.minimum, 0u);
    uint64_t pool = 0;
    EXPECT_EQ(create_with(*m, c, l.minimum, &pool), MOELITE_OK) << last_error_message();
    EXPECT_GE(pool, l.minimum);
    EXPECT_EQ(create_with(*m, c, l.minimum - 1, nullptr), MOELITE_ERR_BUDGET_TOO_SMALL);
    // A budget of every expert's bytes and more: the pool stops at the cap.
    EXPECT_EQ(create_with(*m, c, m->expert_bytes * 4, &pool), MOELITE_OK) << last_error_message();
    EXPECT_LE(pool, l.cap);
    EXPECT_GE(l.cap, m->expert_bytes);
  }
}
