// The pool workers' spin backoff (backends/cpu/spin_backoff.h), driven with made-up timestamps.
#include "backends/cpu/spin_backoff.h"

#include <gtest/gtest.h>

#include <algorithm>

using moelite::cpu::SpinBackoff;

namespace {
constexpr int64_t kMs = 1'000'000;
}

TEST(SpinBackoff, SpinsFreelyUntilPreempted) {
  SpinBackoff b;
  for (int64_t t = 0; t < 10'000 * kMs; t += 7 * kMs) {
    EXPECT_TRUE(b.may_spin(t));
    b.spun_undisturbed(t);
  }
  EXPECT_EQ(b.pause_ns(), 0);
}

TEST(SpinBackoff, APreemptionStopsSpinningForThePauseThenAllowsItAgain) {
  SpinBackoff b;
  const int64_t at = 1000 * kMs;
  b.preempted(at);
  EXPECT_EQ(b.pause_ns(), SpinBackoff::kFirstPauseNs);
  EXPECT_FALSE(b.may_spin(at));
  EXPECT_FALSE(b.may_spin(at + SpinBackoff::kFirstPauseNs - 1));
  EXPECT_TRUE(b.may_spin(at + SpinBackoff::kFirstPauseNs));
}

TEST(SpinBackoff, LastingContentionDoublesThePauseUpToTheLongest) {
  SpinBackoff b;
  int64_t t = 0;
  int64_t want = SpinBackoff::kFirstPauseNs;
  for (int i = 0; i < 20; ++i) {
    b.preempted(t);
    EXPECT_EQ(b.pause_ns(), want) << "preemption " << i;
    t += b.pause_ns();  // spins again as soon as allowed, and is preempted again
    EXPECT_TRUE(b.may_spin(t));
    want = std::min(want * 2, SpinBackoff::kMaxPauseNs);
  }
  EXPECT_EQ(b.pause_ns(), SpinBackoff::kMaxPauseNs);
}

TEST(SpinBackoff, UndisturbedSpinsForgetThePauseOnlyAfterACalmPeriod) {
  SpinBackoff b;
  b.preempted(0);
  b.preempted(SpinBackoff::kFirstPauseNs);
  const int64_t last = SpinBackoff::kFirstPauseNs;
  const int64_t pause = b.pause_ns();
  ASSERT_EQ(pause, 2 * SpinBackoff::kFirstPauseNs);
  // Undisturbed spins soon after the preemption keep the pause: contention comes and goes.
  b.spun_undisturbed(last + pause);
  EXPECT_EQ(b.pause_ns(), pause);
  b.spun_undisturbed(last + SpinBackoff::kCalmNs - 1);
  EXPECT_EQ(b.pause_ns(), pause);
  // Calm for long enough: the next preemption starts from the first pause.
  b.spun_undisturbed(last + SpinBackoff::kCalmNs);
  EXPECT_EQ(b.pause_ns(), 0);
  b.preempted(last + SpinBackoff::kCalmNs + kMs);
  EXPECT_EQ(b.pause_ns(), SpinBackoff::kFirstPauseNs);
}
