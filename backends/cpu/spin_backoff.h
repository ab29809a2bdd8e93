// Whether an idle pool worker may spin (poll) for the next parallel region, or should sleep at once.
//
// Spinning pays only while the worker has a core to itself: then it joins the next region within
// nanoseconds instead of the tens to hundreds of microseconds a wake-up costs. When the machine has
// more runnable threads than cores (other processes, a test runner running two jobs on two cores,
// a phone's background work), a spinning worker holds a core that a thread with real work is
// waiting for -- its own process's or another's -- and every fork-join region waits for the
// preempted thread's next time slice. Measured on a 2-core Zen 3 VM, two test processes at once,
// each with a 2-thread pool: 136 s with 5 ms spins, 47 s with this backoff, 37 s without spinning
// (alone, one at a time: 62 s with spins or backoff, 57 s without).
//
// The signal is cheap and direct: a spinning worker reads the clock every few microseconds, and a
// gap far longer than that between two reads means the OS took the core away from it -- someone
// else wanted it. The worker then stops spinning for a while (sleeping at once between regions),
// the pause doubling each time it is preempted again, and forgotten once spins have gone
// undisturbed for a while.
// Pure logic on nanosecond timestamps, so tests drive it with made-up times.
#pragma once
#include <algorithm>
#include <cstdint>

namespace moelite::cpu {

class SpinBackoff {
 public:
  // A gap between two clock reads of a spin longer than this: the worker was descheduled. Reads
  // are 64 pauses apart (at most ~10 us on current cores); a time slice is milliseconds.
  static constexpr int64_t kPreemptedGapNs = 200'000;
  // The first pause from spinning after a preemption, and the longest one. Under lasting
  // contention the pause grows to the longest, so a worker risks one preempted spin (a time
  // slice of a core) every 1.3 s instead of one per parallel region.
  static constexpr int64_t kFirstPauseNs = 40'000'000;
  static constexpr int64_t kMaxPauseNs = 1'280'000'000;
  // Spins that went undisturbed this long after the last preemption: the contention is over, and
  // the next preemption starts from the first pause again.
  static constexpr int64_t kCalmNs = 2'000'000'000;

  static_assert(kFirstPauseNs < kMaxPauseNs && kCalmNs >= kMaxPauseNs, "pauses grow, and calm outlasts them");

  // May the worker spin for the next region at `now_ns`?
  bool may_spin(int64_t now_ns) const { return now_ns >= quiet_until_ns_; }

  // The worker was descheduled while spinning: no spinning for a pause twice the last one.
  void preempted(int64_t now_ns) {
    pause_ns_ = pause_ns_ == 0 ? kFirstPauseNs : std::min(pause_ns_ * 2, kMaxPauseNs);
    quiet_until_ns_ = now_ns + pause_ns_;
    last_preempted_ns_ = now_ns;
  }

  // A spin ended with work to do and was never preempted.
  void spun_undisturbed(int64_t now_ns) {
    if (pause_ns_ != 0 && now_ns - last_preempted_ns_ >= kCalmNs) pause_ns_ = 0;
  }

  int64_t pause_ns() const { return pause_ns_; }

 private:
  int64_t pause_ns_ = 0;        // the current pause length; 0: not backing off
  int64_t quiet_until_ns_ = 0;  // no spinning before this time
  int64_t last_preempted_ns_ = 0;
};

}  // namespace moelite::cpu
