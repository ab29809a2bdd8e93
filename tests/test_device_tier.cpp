// The rule by which a GPU's backend instances share its device tier of expert slots
// (backends/device_tier.h), step by step for two instances A and B. The backends' tests
// (VulkanOps.Peers*, CudaOps.Peers*) check what the rule protects: results under concurrency.
#include <gtest/gtest.h>

#include <vector>

#include "backends/device_tier.h"

using namespace moelite;

namespace {

struct Slot : TierEntry {};

TierPick pick(std::vector<Slot>& slots, uint64_t* clock, int32_t expert, const void* who) {
  return pick_tier_slot(slots, clock, /*layer=*/0, expert, who);
}

void release(std::vector<Slot>& slots, const void* who) {
  for (Slot& s : slots)
    if (s.holder == who) s.holder = nullptr;
}

}  // namespace

TEST(DeviceTier, AHeldSlotIsNeverTakenAndAFreeOneIsHitOrEvictedLeastRecentlyUsedFirst) {
  const int a = 0, b = 0;  // two instances: only their addresses matter
  std::vector<Slot> slots(2);
  uint64_t clock = 0;

  TierPick p = pick(slots, &clock, 7, &a);  // A takes an empty slot for expert 7
  ASSERT_EQ(p.kind, TierPick::Use);
  EXPECT_TRUE(p.taken && p.reassigned);
  const size_t seven = p.index;
  EXPECT_EQ(slots[seven].holder, &a);

  p = pick(slots, &clock, 7, &a);  // A again, same pass: its own slot, nothing to wait for
  ASSERT_EQ(p.kind, TierPick::Use);
  EXPECT_EQ(p.index, seven);
  EXPECT_FALSE(p.taken || p.reassigned);

  p = pick(slots, &clock, 7, &b);  // B wants expert 7 while A holds it: a copy of its own
  EXPECT_EQ(p.kind, TierPick::OwnCopy);

  p = pick(slots, &clock, 8, &b);  // B takes the other slot
  ASSERT_EQ(p.kind, TierPick::Use);
  const size_t eight = p.index;
  EXPECT_NE(eight, seven);

  p = pick(slots, &clock, 9, &b);  // every slot held, one by B: B must release its own first
  EXPECT_EQ(p.kind, TierPick::ReleaseOwnFirst);
  release(slots, &b);
  p = pick(slots, &clock, 9, &b);  // then expert 8's slot, the only free one, is evicted for 9
  ASSERT_EQ(p.kind, TierPick::Use);
  EXPECT_EQ(p.index, eight);
  EXPECT_TRUE(p.taken && p.reassigned);
  EXPECT_EQ(slots[eight].expert, 9);

  p = pick(slots, &clock, 10, &a);  // A: the other slot is B's, its own is the only one left
  EXPECT_EQ(p.kind, TierPick::ReleaseOwnFirst);
  release(slots, &a);
  release(slots, &b);

  p = pick(slots, &clock, 7, &b);  // released and complete: a hit for B, taken from no holder
  ASSERT_EQ(p.kind, TierPick::Use);
  EXPECT_EQ(p.index, seven);
  EXPECT_TRUE(p.taken);
  EXPECT_FALSE(p.reassigned);

  p = pick(slots, &clock, 11, &a);  // A: the least recently used free slot is expert 9's
  ASSERT_EQ(p.kind, TierPick::Use);
  EXPECT_EQ(p.index, eight);
  EXPECT_TRUE(p.reassigned);

  p = pick(slots, &clock, 12, &a);  // B holds one slot, A the other: A releases its own first
  EXPECT_EQ(p.kind, TierPick::ReleaseOwnFirst);
  release(slots, &a);
  EXPECT_EQ(pick(slots, &clock, 12, &a).kind, TierPick::Use);
}

TEST(DeviceTier, WhenPeersHoldEverySlotAnInstanceCopiesForItself) {
  const int a = 0, b = 0;
  std::vector<Slot> slots(1);
  uint64_t clock = 0;
  ASSERT_EQ(pick(slots, &clock, 1, &a).kind, TierPick::Use);
  EXPECT_EQ(pick(slots, &clock, 2, &b).kind, TierPick::OwnCopy);  // holds nothing to release
  EXPECT_EQ(pick(slots, &clock, 1, &b).kind, TierPick::OwnCopy);  // its expert is A's
  release(slots, &a);
  EXPECT_EQ(pick(slots, &clock, 2, &b).kind, TierPick::Use);
}
