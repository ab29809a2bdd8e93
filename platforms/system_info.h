// What machine moelite runs on: the kind of board (Jetson, other ARM Linux, x86 desktop), its CPU
// cores and their relative speed (big.LITTLE), and how much memory the process may still take
// (MemAvailable and the cgroup's room). Used for `moelite info --platform`, the expert budget
// "auto" and the CPU backend's thread placement.
//
// Every reader takes a filesystem root ("/" on a live system), so tests point them at fake trees
// (tests/data/platform/). Missing, unreadable or malformed files give defaults (0, "", false):
// nothing here fails or throws on what a file contains.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moelite::platform {

enum class PlatformKind { Jetson, LinuxArm, X86Desktop, LinuxOther };
const char* platform_kind_name(PlatformKind kind);  // "jetson", "linux-arm", "x86-desktop", "linux-other"

struct MemoryInfo {
  uint64_t total_bytes = 0;      // MemTotal
  uint64_t available_bytes = 0;  // MemAvailable (MemFree + Cached on kernels before 3.14)
  // The tightest memory limit of the process's cgroup and its ancestors (v2 memory.max, v1
  // memory.limit_in_bytes), and that cgroup's usage. 0 = no limit found.
  uint64_t cgroup_limit_bytes = 0;
  uint64_t cgroup_usage_bytes = 0;
  int cgroup_version = 0;  // 1 or 2 where a limit was found, else 0
  // What the process may still allocate: min(MemAvailable, cgroup limit - usage); MemAvailable
  // alone without a limit. The cgroup's usage counts page cache, which the kernel would reclaim
  // before an OOM kill, so this errs on the safe side.
  uint64_t room_bytes() const;
};

struct CpuInfo {
  std::string model_name;  // "AMD EPYC 7763", "Cortex-A78AE"; "" when unknown
  bool arm = false;        // from /proc/cpuinfo's fields ("CPU implementer"); the build's target if absent
  bool x86 = false;
  // Per logical CPU id (index = id), for the CPUs present: relative capacity from
  // cpuN/cpu_capacity (the scheduler's 0..1024 scale), else cpufreq/cpuinfo_max_freq (kHz),
  // else 0 (unknown). Offline or absent ids hold 0 too.
  std::vector<uint64_t> capacity;
  std::vector<int> online;  // ids listed in /sys/devices/system/cpu/online (all present ones if absent)
};

struct SystemInfo {
  PlatformKind kind = PlatformKind::LinuxOther;
  std::string model;           // board/module: device-tree model or DMI product name; "" if unknown
  std::string tegra_release;   // first line of /etc/nv_tegra_release ("# R36 (release), REVISION: 3.0, ...")
  bool unified_memory = false; // the GPU shares the CPU's DRAM (Jetson)
  CpuInfo cpu;
  MemoryInfo memory;
};

// Reads everything below `root` ("/" for this machine).
SystemInfo read_system_info(const std::string& root = "/");
MemoryInfo read_memory_info(const std::string& root = "/");
CpuInfo read_cpu_info(const std::string& root = "/");

// The cores worth computing on: on a heterogeneous CPU (big.LITTLE, or prime + big + little),
// the allowed CPUs more than 10 % faster than the slowest allowed CPU (so only the little cluster
// is left out); empty when the allowed CPUs are all alike or any capacity is unknown (then nothing is pinned and the
// scheduler places threads as before). `capacity` is indexed by CPU id; `allowed` lists CPU ids
// (the process's affinity mask). Pure: tests feed it fixture values.
std::vector<int> select_big_cores(const std::vector<uint64_t>& capacity, const std::vector<int>& allowed);

// The CPU ids this process may run on (sched_getaffinity); every online CPU when unknown.
std::vector<int> allowed_cpus();
// select_big_cores() for this process, computed once (the machine does not change under it).
const std::vector<int>& big_cores();
// The allowed CPUs that are not big cores: where background threads that mostly wait (the expert
// store's loaders, which issue reads and sleep until they complete) run on a heterogeneous CPU,
// so they never preempt compute workers pinned to the big cores. Empty when the CPU is
// homogeneous. Pure, like select_big_cores.
std::vector<int> select_little_cores(const std::vector<int>& big, const std::vector<int>& allowed);
// select_little_cores() for this process, computed once.
const std::vector<int>& little_cores();
// Default compute threads: the number of big cores on a heterogeneous CPU, else
// physical_core_count() (as before this existed).
int default_thread_count();

// Restricts the calling thread to `cpus` (pthread_setaffinity_np); false when the OS refuses (a CPU
// outside the process's cgroup cpuset) or cannot (no affinity API). An empty list does nothing.
bool pin_current_thread(const std::vector<int>& cpus);

// Asks the scheduler for a short time slice for the calling thread (Linux 6.12+, EEVDF: a task
// with a shorter slice has an earlier deadline, so when it wakes it preempts a running task with a
// longer one sooner). For threads that sleep on I/O and must act at once when it completes. False
// when the kernel does not take it (older kernels ignore the slice: true but no effect).
bool prefer_short_slice(uint64_t slice_ns);

// Parses a kernel CPU list ("0-3,6,8-9"); stops at the first malformed item.
std::vector<int> parse_cpu_list(const std::string& text);

}  // namespace moelite::platform
