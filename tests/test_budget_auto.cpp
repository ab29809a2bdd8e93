// The budget "auto" arithmetic (core/experts/budget_auto.h) on known numbers: subtraction of every term,
// the default headroom, the cap at a pool holding every expert, and the error below the minimum.
#include <gtest/gtest.h>

#include <string>

#include "base/status.h"
#include "core/experts/budget_auto.h"

using moelite::AutoBudget;
using moelite::AutoBudgetInputs;

namespace {
constexpr uint64_t MiB = uint64_t{1} << 20;

AutoBudgetInputs inputs() {
  AutoBudgetInputs in;
  in.room = 4096 * MiB;
  in.dense = 1000 * MiB;
  in.context = 96 * MiB;
  in.headroom = 0;  // default: max(64 MiB, 10 %) = 409.6 MiB
  in.minimum = 50 * MiB;
  in.all_experts = 100000 * MiB;
  return in;
}
}  // namespace

TEST(BudgetAuto, SubtractsEveryTerm) {
  AutoBudget b;
  ASSERT_EQ(moelite::size_auto_budget(inputs(), &b), MOELITE_OK);
  EXPECT_EQ(b.headroom, 4096 * MiB / 10);
  EXPECT_EQ(b.budget, 4096 * MiB - 1000 * MiB - 96 * MiB - 4096 * MiB / 10);
  EXPECT_FALSE(b.all_resident);
  EXPECT_EQ(b.room, 4096 * MiB);
  EXPECT_EQ(b.context, 96 * MiB);
}

TEST(BudgetAuto, DefaultHeadroomHasAFloor) {
  AutoBudgetInputs in = inputs();
  in.room = 300 * MiB;
  in.dense = 10 * MiB;
  in.context = 10 * MiB;
  AutoBudget b;
  ASSERT_EQ(moelite::size_auto_budget(in, &b), MOELITE_OK);
  EXPECT_EQ(b.headroom, moelite::kMinAutoHeadroom);  // 10 % would be 30 MiB
  EXPECT_EQ(b.budget, 300 * MiB - 20 * MiB - moelite::kMinAutoHeadroom);
}

TEST(BudgetAuto, ExplicitHeadroomIsUsedAsGiven) {
  AutoBudgetInputs in = inputs();
  in.headroom = 1;
  AutoBudget b;
  ASSERT_EQ(moelite::size_auto_budget(in, &b), MOELITE_OK);
  EXPECT_EQ(b.headroom, 1u);
  EXPECT_EQ(b.budget, 4096 * MiB - 1096 * MiB - 1);
}

TEST(BudgetAuto, CappedWhenEveryExpertFits) {
  AutoBudgetInputs in = inputs();
  in.all_experts = 700 * MiB;
  AutoBudget b;
  ASSERT_EQ(moelite::size_auto_budget(in, &b), MOELITE_OK);
  EXPECT_TRUE(b.all_resident);
  EXPECT_EQ(b.budget, 700 * MiB);
}

TEST(BudgetAuto, BelowTheMinimumSaysWhy) {
  AutoBudgetInputs in = inputs();
  in.room = 1200 * MiB;  // - 1000 dense - 96 context - 120 headroom < 0
  AutoBudget b;
  b.budget = 12345;
  EXPECT_EQ(moelite::size_auto_budget(in, &b), MOELITE_ERR_BUDGET_TOO_SMALL);
  EXPECT_EQ(b.budget, 12345u);  // untouched
  const std::string msg = moelite::last_error_message();
  EXPECT_NE(msg.find(std::to_string(1200 * MiB)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(1000 * MiB)), std::string::npos) << msg;
  EXPECT_NE(msg.find("= 0 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(50 * MiB)), std::string::npos) << msg;

  // Just enough: exactly the minimum is accepted, one byte less is not.
  AutoBudgetInputs exact = in;
  exact.headroom = 64 * MiB;
  exact.room = 50 * MiB + 1000 * MiB + 96 * MiB + 64 * MiB;
  ASSERT_EQ(moelite::size_auto_budget(exact, &b), MOELITE_OK);
  EXPECT_EQ(b.budget, 50 * MiB);
  exact.room -= 1;
  EXPECT_EQ(moelite::size_auto_budget(exact, &b), MOELITE_ERR_BUDGET_TOO_SMALL);
}

TEST(BudgetAuto, NoMemoryAtAll) {
  AutoBudgetInputs in = inputs();
  in.room = 0;  // an unreadable /proc/meminfo and no cgroup
  AutoBudget b;
  EXPECT_EQ(moelite::size_auto_budget(in, &b), MOELITE_ERR_BUDGET_TOO_SMALL);
}
