// The OS-independent parts of system_info.h: names, the cgroup arithmetic, CPU lists and the
// choice of big cores (pure functions, tested on fixture values).
#include "platforms/system_info.h"

#include <algorithm>
#include <cstdlib>

namespace moelite::platform {

const char* platform_kind_name(PlatformKind kind) {
  switch (kind) {
    case PlatformKind::Jetson: return "jetson";
    case PlatformKind::LinuxArm: return "linux-arm";
    case PlatformKind::X86Desktop: return "x86-desktop";
    case PlatformKind::LinuxOther: return "linux-other";
  }
  return "linux-other";
}

uint64_t MemoryInfo::room_bytes() const {
  if (cgroup_limit_bytes == 0) return available_bytes;
  const uint64_t cg_room = cgroup_limit_bytes > cgroup_usage_bytes ? cgroup_limit_bytes - cgroup_usage_bytes : 0;
  return available_bytes == 0 ? cg_room : std::min(available_bytes, cg_room);
}

std::vector<int> parse_cpu_list(const std::string& text) {
  // Kernel CPU ids stay far below this; a larger number is a malformed file, not a machine.
  constexpr long kMaxCpuId = 1 << 16;
  std::vector<int> out;
  const char* s = text.c_str();
  while (*s && *s != '\n') {
    char* end = nullptr;
    const long a = strtol(s, &end, 10);
    if (end == s || a < 0 || a >= kMaxCpuId) break;
    long b = a;
    s = end;
    if (*s == '-') {
      const char* t = s + 1;
      b = strtol(t, &end, 10);
      if (end == t || b < a || b >= kMaxCpuId) break;
      s = end;
    }
    for (long i = a; i <= b; ++i) out.push_back(static_cast<int>(i));
    if (*s == ',') ++s;
    else if (*s && *s != '\n') break;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> select_big_cores(const std::vector<uint64_t>& capacity, const std::vector<int>& allowed) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int id : allowed) {
    if (id < 0 || static_cast<size_t>(id) >= capacity.size() || capacity[static_cast<size_t>(id)] == 0)
      return {};  // a CPU of unknown speed: no basis for choosing, leave placement to the scheduler
    lo = std::min(lo, capacity[static_cast<size_t>(id)]);
    hi = std::max(hi, capacity[static_cast<size_t>(id)]);
  }
  if (allowed.empty() || lo == hi) return {};
  // Everything faster than the slowest cluster: drops the in-order little cores, which would hold
  // every fork-join region back to their pace, and keeps the prime and middle cores of
  // tri-cluster phones (e.g. 1024 and ~870 against ~320). Little cores range from about 250 to
  // 530 (RK3588's A55) of the big ones' 1024, so no fixed share of the fastest separates them;
  // the 10 % margin keeps equal cores apart only by frequency binning (cpufreq fallback) together.
  std::vector<int> big;
  for (int id : allowed)
    if (capacity[static_cast<size_t>(id)] * 10 > lo * 11) big.push_back(id);
  if (big.size() == allowed.size()) return {};  // nothing slow to avoid
  std::sort(big.begin(), big.end());
  return big;
}

}  // namespace moelite::platform
