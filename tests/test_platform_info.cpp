// Platform detection on fake /proc and /sys trees (tests/data/platform/): each fixture's known
// facts must come out of the readers, garbage must give defaults, and the big-core choice must
// follow capacities and the allowed CPU set.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "backends/cpu/threadpool.h"
#include "platforms/platform.h"
#include "platforms/system_info.h"

namespace mp = moelite::platform;

namespace {
std::string fixture(const char* name) { return std::string(MOELITE_SOURCE_DIR) + "/tests/data/platform/" + name; }
constexpr uint64_t kKiB = 1024;
}  // namespace

TEST(PlatformInfo, JetsonOrinNano) {
  const mp::SystemInfo s = mp::read_system_info(fixture("jetson-orin-nano"));
  EXPECT_EQ(s.kind, mp::PlatformKind::Jetson);
  EXPECT_STREQ(mp::platform_kind_name(s.kind), "jetson");
  EXPECT_EQ(s.model, "NVIDIA Jetson Orin Nano Developer Kit");
  EXPECT_EQ(s.tegra_release.rfind("# R36 (release), REVISION: 3.0", 0), 0u) << s.tegra_release;
  EXPECT_TRUE(s.unified_memory);
  EXPECT_TRUE(s.cpu.arm);
  EXPECT_FALSE(s.cpu.x86);
  EXPECT_EQ(s.cpu.model_name, "6x Cortex-A78AE");
  EXPECT_EQ(s.cpu.online, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(s.cpu.capacity, std::vector<uint64_t>(6, 1024));
  EXPECT_EQ(s.memory.total_bytes, 7802128 * kKiB);
  EXPECT_EQ(s.memory.available_bytes, 5933452 * kKiB);
  // The limit sits on user.slice, two levels above the process's own scope.
  EXPECT_EQ(s.memory.cgroup_version, 2);
  EXPECT_EQ(s.memory.cgroup_limit_bytes, uint64_t{4} << 30);
  EXPECT_EQ(s.memory.cgroup_usage_bytes, uint64_t{1} << 30);
  EXPECT_EQ(s.memory.room_bytes(), uint64_t{3} << 30);  // 3 GiB of cgroup room < 5.66 GiB MemAvailable
  // Homogeneous: no core is preferred.
  EXPECT_TRUE(mp::select_big_cores(s.cpu.capacity, s.cpu.online).empty());
}

TEST(PlatformInfo, BigLittleArm) {
  const mp::SystemInfo s = mp::read_system_info(fixture("arm-big-little"));
  EXPECT_EQ(s.kind, mp::PlatformKind::LinuxArm);
  EXPECT_STREQ(mp::platform_kind_name(s.kind), "linux-arm");
  EXPECT_EQ(s.model, "Radxa ROCK 5B");
  EXPECT_TRUE(s.tegra_release.empty());
  EXPECT_FALSE(s.unified_memory);
  EXPECT_EQ(s.cpu.model_name, "4x Cortex-A55 + 3x Cortex-A76");  // CPU 7 is offline
  EXPECT_EQ(s.cpu.online, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(s.cpu.capacity.size(), 8u);
  EXPECT_EQ(s.cpu.capacity[0], 530u);
  EXPECT_EQ(s.cpu.capacity[6], 1024u);
  EXPECT_EQ(s.cpu.capacity[7], 0u);  // offline: not read
  EXPECT_EQ(s.memory.total_bytes, 16139300 * kKiB);
  EXPECT_EQ(s.memory.available_bytes, 14680064 * kKiB);
  EXPECT_EQ(s.memory.cgroup_version, 1);
  EXPECT_EQ(s.memory.cgroup_limit_bytes, uint64_t{2} << 30);
  EXPECT_EQ(s.memory.cgroup_usage_bytes, uint64_t{512} << 20);
  EXPECT_EQ(s.memory.room_bytes(), uint64_t{1536} << 20);
  EXPECT_EQ(mp::select_big_cores(s.cpu.capacity, s.cpu.online), (std::vector<int>{4, 5, 6}));
}

TEST(PlatformInfo, X86Desktop) {
  const mp::SystemInfo s = mp::read_system_info(fixture("x86-desktop"));
  EXPECT_EQ(s.kind, mp::PlatformKind::X86Desktop);
  EXPECT_STREQ(mp::platform_kind_name(s.kind), "x86-desktop");
  EXPECT_EQ(s.model, "MS-7C91");
  EXPECT_FALSE(s.unified_memory);
  EXPECT_TRUE(s.cpu.x86);
  EXPECT_EQ(s.cpu.model_name, "AMD Ryzen 7 5800X 8-Core Processor");
  EXPECT_EQ(s.cpu.capacity, std::vector<uint64_t>(8, 4850000));  // cpufreq fallback
  EXPECT_EQ(s.memory.cgroup_version, 0);                          // memory.max is "max"
  EXPECT_EQ(s.memory.cgroup_limit_bytes, 0u);
  EXPECT_EQ(s.memory.room_bytes(), 28000000 * kKiB);
  EXPECT_TRUE(mp::select_big_cores(s.cpu.capacity, s.cpu.online).empty());
}

TEST(PlatformInfo, HostileFilesGiveDefaults) {
  const mp::SystemInfo s = mp::read_system_info(fixture("hostile"));
  EXPECT_EQ(s.memory.total_bytes, 0u);
  EXPECT_EQ(s.memory.available_bytes, 0u);
  EXPECT_EQ(s.memory.cgroup_limit_bytes, 0u);
  EXPECT_EQ(s.model, "");
  EXPECT_EQ(s.cpu.online, (std::vector<int>{0}));  // the lists are garbage; cpu0/ exists
  EXPECT_EQ(s.cpu.capacity, (std::vector<uint64_t>{0}));
  EXPECT_TRUE(mp::select_big_cores(s.cpu.capacity, s.cpu.online).empty());
  EXPECT_NE(s.kind, mp::PlatformKind::Jetson);
}

TEST(PlatformInfo, MissingRootGivesDefaults) {
  const mp::SystemInfo s = mp::read_system_info("/nonexistent/moelite-platform-root");
  EXPECT_EQ(s.memory.total_bytes, 0u);
  EXPECT_EQ(s.memory.room_bytes(), 0u);
  EXPECT_TRUE(s.cpu.online.empty());
  EXPECT_TRUE(s.cpu.capacity.empty());
  EXPECT_FALSE(s.unified_memory);
}

TEST(PlatformInfo, ThisMachineHasMemoryAndCpus) {
  const mp::SystemInfo s = mp::read_system_info();
  EXPECT_GT(s.memory.total_bytes, 0u);
  EXPECT_GT(s.memory.room_bytes(), 0u);
  EXPECT_LE(s.memory.room_bytes(), s.memory.total_bytes);
  EXPECT_FALSE(s.cpu.online.empty());
  EXPECT_FALSE(mp::allowed_cpus().empty());
  EXPECT_GE(mp::default_thread_count(), 1);
}

TEST(PlatformInfo, CpuLists) {
  EXPECT_EQ(mp::parse_cpu_list("0-3,6,8-9\n"), (std::vector<int>{0, 1, 2, 3, 6, 8, 9}));
  EXPECT_EQ(mp::parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(mp::parse_cpu_list("1,1,0"), (std::vector<int>{0, 1}));
  EXPECT_TRUE(mp::parse_cpu_list("").empty());
  EXPECT_TRUE(mp::parse_cpu_list("3-1").empty());
  EXPECT_TRUE(mp::parse_cpu_list("-1").empty());
  EXPECT_EQ(mp::parse_cpu_list("0-1,x,4"), (std::vector<int>{0, 1}));  // stops at the bad item
}

TEST(PlatformInfo, BigCoreSelection) {
  const std::vector<uint64_t> big_little = {530, 530, 530, 530, 1024, 1024, 1024, 1024};
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(mp::select_big_cores(big_little, all), (std::vector<int>{4, 5, 6, 7}));
  // taskset / cgroup cpuset: only the allowed ones count.
  EXPECT_EQ(mp::select_big_cores(big_little, {0, 1, 5}), (std::vector<int>{5}));
  EXPECT_TRUE(mp::select_big_cores(big_little, {0, 1, 2}).empty());  // only little ones allowed: all alike
  EXPECT_TRUE(mp::select_big_cores(big_little, {6, 7}).empty());     // only big ones: nothing to avoid
  // The expert loaders' cores: the allowed rest on a heterogeneous CPU, none on a homogeneous one.
  EXPECT_EQ(mp::select_little_cores(mp::select_big_cores(big_little, all), all), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(mp::select_little_cores({5}, {0, 1, 5}), (std::vector<int>{0, 1}));
  EXPECT_TRUE(mp::select_little_cores({}, all).empty());
  // Tri-cluster phone (1 prime + 3 big + 4 little): prime and big are kept.
  const std::vector<uint64_t> tri = {325, 325, 325, 325, 870, 870, 870, 1024};
  EXPECT_EQ(mp::select_big_cores(tri, all), (std::vector<int>{4, 5, 6, 7}));
  // Unknown capacity of an allowed CPU, or an id beyond the table: no choice.
  EXPECT_TRUE(mp::select_big_cores({530, 0, 1024}, {0, 1, 2}).empty());
  EXPECT_TRUE(mp::select_big_cores({530, 1024}, {0, 1, 9}).empty());
  EXPECT_TRUE(mp::select_big_cores({}, {}).empty());
  EXPECT_TRUE(mp::select_big_cores(std::vector<uint64_t>(4, 1024), {0, 1, 2, 3}).empty());
}

// The CPU backend's pool: workers confined to the given CPUs; unpinned (the process's whole
// allowed set) when the list is empty, as on homogeneous machines.
namespace {
std::vector<int> worker_affinities(int n_threads, std::vector<int> pin, std::vector<std::vector<int>>* seen) {
  std::unique_ptr<moelite::cpu::ThreadPool> pool;
  EXPECT_EQ(moelite::cpu::ThreadPool::create(n_threads, &pool, pin), MOELITE_OK);
  std::mutex mu;
  // Enough tasks, each long enough, that every worker takes some.
  pool->parallel_for(256, [&](int64_t, int thread) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (thread == 0) return;  // the caller: never re-pinned
    std::vector<int> cpus = mp::allowed_cpus();
    std::lock_guard<std::mutex> lock(mu);
    seen->push_back(cpus);
  });
  return pool->pinned_cpus();
}
}  // namespace

TEST(PlatformInfo, ThreadPoolPinsWorkersToTheGivenCpus) {
  const std::vector<int> allowed = mp::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  std::vector<std::vector<int>> seen;
  EXPECT_EQ(worker_affinities(3, {allowed.front()}, &seen), (std::vector<int>{allowed.front()}));
  ASSERT_FALSE(seen.empty());
  for (const auto& s : seen) EXPECT_EQ(s, (std::vector<int>{allowed.front()}));
  // The caller's own affinity is untouched.
  EXPECT_EQ(mp::allowed_cpus(), allowed);

  seen.clear();
  EXPECT_TRUE(worker_affinities(3, {}, &seen).empty());
  ASSERT_FALSE(seen.empty());
  for (const auto& s : seen) EXPECT_EQ(s, allowed);
}

TEST(PlatformInfo, ThisMachineDefaultThreads) {
  // Homogeneous machines keep the old default; heterogeneous ones use their big cores.
  if (mp::big_cores().empty())
    EXPECT_EQ(mp::default_thread_count(), mp::physical_core_count());
  else
    EXPECT_EQ(mp::default_thread_count(), static_cast<int>(mp::big_cores().size()));
}

TEST(PlatformInfo, BigCoresIgnoreFrequencyBinning) {
  // cpufreq fallback: equal cores whose maximum frequencies differ by binning are not big.LITTLE.
  EXPECT_TRUE(mp::select_big_cores({2400000, 2400000, 2304000, 2304000}, {0, 1, 2, 3}).empty());
  // A hybrid x86 (P-cores 4.9 GHz, E-cores 3.6 GHz): the P-cores.
  EXPECT_EQ(mp::select_big_cores({4900000, 4900000, 3600000, 3600000}, {0, 1, 2, 3}), (std::vector<int>{0, 1}));
}

// Participants (contexts evaluating at once share the cores): every task runs exactly once, only
// threads let in take part, and lowering and raising the count between calls, again and again and
// with calls of one task between them, never leaves a call waiting for a worker that sleeps.
namespace {
void change_participants_between_calls(moelite::cpu::ThreadPool* pool, int rounds) {
  const int counts[] = {4, 1, 2, 4, 3, 1, 1, 4, 2, 2, 3};
  for (int round = 0; round < rounds; ++round) {
    const int n = counts[round % (sizeof counts / sizeof counts[0])];
    pool->set_participants(n);
    EXPECT_EQ(pool->participants(), n);
    const int64_t tasks = round % 7 == 0 ? 1 : 64;
    std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
    std::atomic<int> max_thread{0};
    pool->parallel_for(tasks, [&](int64_t t, int thread) {
      runs[static_cast<size_t>(t)].fetch_add(1);
      int seen = max_thread.load();
      while (thread > seen && !max_thread.compare_exchange_weak(seen, thread)) {
      }
      if (round % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    });
    for (const auto& r : runs) ASSERT_EQ(r.load(), 1) << "round " << round;
    EXPECT_LT(max_thread.load(), n) << "a thread left out took part, round " << round;
  }
}
}  // namespace

TEST(PlatformInfo, ThreadPoolParticipantsShareTheCoresAndEveryCallJoins) {
  std::unique_ptr<moelite::cpu::ThreadPool> pool;
  ASSERT_EQ(moelite::cpu::ThreadPool::create(4, &pool), MOELITE_OK);
  change_participants_between_calls(pool.get(), 300);
  pool->set_participants(0);  // clamped
  EXPECT_EQ(pool->participants(), 1);
  pool->set_participants(99);
  EXPECT_EQ(pool->participants(), 4);
  // With every thread let in again, all of them take part once tasks are long enough.
  std::mutex mu;
  std::set<int> threads;
  pool->parallel_for(128, [&](int64_t, int thread) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(thread);
  });
  EXPECT_EQ(threads.size(), 4u);
}

// The same with every core busy elsewhere: workers are preempted while they spin, stop spinning
// (spin_backoff.h) and sleep, and a worker left out of a call can wake only after the caller has
// moved on to the next call. It must then judge by that call's participant count, not the one it
// slept through (a worker that ran the next call's tasks for the old one, and then again for the
// new one, left the caller waiting for ever: seen in CI with two test processes on two cores).
TEST(PlatformInfo, ThreadPoolParticipantsWorkWhenEveryCoreIsBusyElsewhere) {
  std::unique_ptr<moelite::cpu::ThreadPool> pool;
  ASSERT_EQ(moelite::cpu::ThreadPool::create(4, &pool), MOELITE_OK);
  std::atomic<bool> done{false};
  std::vector<std::thread> hogs;
  const unsigned n_hogs = 2 * std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < n_hogs; ++i)
    hogs.emplace_back([&] {
      while (!done.load(std::memory_order_relaxed)) {
      }
    });
  change_participants_between_calls(pool.get(), 2000);
  done = true;
  for (auto& t : hogs) t.join();
}

#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>

// A loader's short slice (prefer_short_slice): the kernel's own sched_getattr reads back the slice
// on a thread of its own, whose nice value stays as it was; other threads keep theirs.
TEST(PlatformInfo, AShortSliceIsTheCallingThreadsOnly) {
#if defined(SYS_sched_getattr)
  struct SchedAttr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
    uint32_t util_min, util_max;
  };
  auto read_attr = [] {
    SchedAttr a{};
    EXPECT_EQ(syscall(SYS_sched_getattr, 0, &a, sizeof a, 0), 0) << strerror(errno);
    return a;
  };
  const SchedAttr before = read_attr();
  std::thread t([&] {
    ASSERT_EQ(setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 3), 0);
    ASSERT_TRUE(moelite::platform::prefer_short_slice(100'000));
    const SchedAttr a = read_attr();
    EXPECT_EQ(a.policy, static_cast<uint32_t>(SCHED_OTHER));
    EXPECT_EQ(a.nice, 3);
    // Kernels before 6.12 have no custom slice: they ignore ours.
    utsname u{};
    int major = 0, minor = 0;
    ASSERT_EQ(uname(&u), 0);
    ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2) << u.release;
    if (major > 6 || (major == 6 && minor >= 12)) EXPECT_EQ(a.runtime, 100'000u) << u.release;
  });
  t.join();
  const SchedAttr after = read_attr();
  EXPECT_EQ(after.runtime, before.runtime);
  EXPECT_EQ(after.nice, before.nice);
#else
  GTEST_SKIP() << "no sched_getattr";
#endif
}
#endif

#if defined(__linux__)
#include <sys/mman.h>

#include <functional>
#include <memory>

#include "tests/proc_self_maps.h"

using moelite::test::advised_huge;
using moelite::test::vm_flags_at;

// advise_huge_pages marks the whole huge pages inside its range, and nothing outside them: the
// bytes of a partial huge page at either end keep small pages, so the advice never makes the
// process hold memory beyond the range.
TEST(PlatformMemory, HugePageAdviceCoversOnlyTheWholeHugePagesInsideTheRange) {
  if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0) GTEST_SKIP() << "no transparent huge pages";
  constexpr size_t kMiB = size_t{1} << 20, kHuge = 2 * kMiB;
  // A mapping of its own, never advised before (malloc may hand out memory an earlier test advised).
  const size_t map_bytes = 6 * kHuge;
  void* mapping = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  std::unique_ptr<void, std::function<void(void*)>> unmap(mapping, [&](void* m) { munmap(m, map_bytes); });
  uint8_t* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mapping) + kHuge - 1) / kHuge * kHuge);
  ASSERT_NE(vm_flags_at(p + 5 * kMiB), "?") << "this /proc/self/smaps does not list the buffer";
  EXPECT_FALSE(mp::advise_huge_pages(p + kMiB, kMiB)) << "no whole huge page in [1, 2) MiB";
  ASSERT_TRUE(mp::advise_huge_pages(p + kMiB, 7 * kMiB / 2));  // [1, 4.5) MiB: the page [2, 4) MiB
  EXPECT_TRUE(advised_huge(p + 2 * kMiB));
  EXPECT_TRUE(advised_huge(p + 4 * kMiB - 1));
  EXPECT_FALSE(advised_huge(p + 2 * kMiB - 1)) << vm_flags_at(p + 2 * kMiB - 1);
  EXPECT_FALSE(advised_huge(p + 4 * kMiB)) << vm_flags_at(p + 4 * kMiB);
  EXPECT_FALSE(advised_huge(p + 9 * kMiB));
}
#endif
