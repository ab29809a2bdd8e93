#include "base/options.h"
#include "platforms/fault_inject.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace moelite::platform::fault {

namespace {

const char* const kNames[kKindCount] = {"open",         "read",           "mmap",       "alloc",
                                        "uring_submit", "uring_complete", "uring_busy", "read_efault",
                                        "write"};

std::atomic<int> g_armed_kind{-1};
std::atomic<int64_t> g_armed_n{0};
std::atomic<bool> g_fired{false};
std::atomic<double> g_stall_seconds{0.0};  // > 0: the armed call stalls instead of failing
std::atomic<int64_t> g_calls[kKindCount];

// MOELITE_FAULT_INJECT=kind:n arms once, before the first counted call of the process.
void arm_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* e = option_text(Option::FaultInject);
    if (!e) return;
    const char* colon = strchr(e, ':');
    if (!colon) return;
    char name[32] = {};
    const size_t len = static_cast<size_t>(colon - e);
    if (len >= sizeof(name)) return;
    memcpy(name, e, len);
    Kind k;
    if (parse_kind(name, &k)) arm(k, strtoll(colon + 1, nullptr, 10));
  });
}

}  // namespace

const char* kind_name(Kind k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kKindCount ? kNames[i] : "?";
}

bool parse_kind(const char* name, Kind* out) {
  for (int i = 0; i < kKindCount; ++i)
    if (strcmp(name, kNames[i]) == 0) {
      *out = static_cast<Kind>(i);
      return true;
    }
  return false;
}

void reset_counts() {
  for (auto& c : g_calls) c.store(0);
  g_fired.store(false);
}

void arm(Kind k, int64_t n) {
  g_armed_kind.store(-1);
  g_stall_seconds.store(0.0);
  reset_counts();
  if (n <= 0) return;
  g_armed_n.store(n);
  g_armed_kind.store(static_cast<int>(k));
}

void arm_stall(Kind k, int64_t n, double seconds) {
  arm(k, 0);
  if (n <= 0) return;
  g_stall_seconds.store(seconds);
  g_armed_n.store(n);
  g_armed_kind.store(static_cast<int>(k));
}

void disarm() { arm(Kind::kOpen, 0); }

int64_t calls(Kind k) { return g_calls[static_cast<int>(k)].load(); }
bool fired() { return g_fired.load(); }

bool should_fail(Kind k) {
  arm_from_env();
  const int i = static_cast<int>(k);
  const int64_t n = g_calls[i].fetch_add(1) + 1;
  if (g_armed_kind.load(std::memory_order_relaxed) != i || n != g_armed_n.load()) return false;
  g_fired.store(true);
  const double stall = g_stall_seconds.load();
  if (stall > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(stall));
    return false;
  }
  return true;
}

}  // namespace moelite::platform::fault
