// system_info.h on Linux (and Android): /proc and /sys below a root directory.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "platforms/platform.h"
#include "platforms/system_info.h"

namespace moelite::platform {

namespace {

// Files here are small; a larger one is not what we expect and is cut, never read whole.
constexpr size_t kMaxFileBytes = 1 << 20;
// cgroup v1 writes "no limit" as LONG_MAX rounded down to a page; anything this large is no limit.
constexpr uint64_t kNoLimit = uint64_t{1} << 60;

std::string join(const std::string& root, const std::string& path) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (r == "/") r.clear();
  return r + path;
}

bool read_text(const std::string& path, std::string* out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  out->clear();
  char buf[4096];
  size_t got;
  while (out->size() < kMaxFileBytes && (got = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, got);
  fclose(f);
  return true;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string trim(std::string s) {
  // Device-tree strings end in NUL; sysfs values in a newline.
  const size_t nul = s.find('\0');
  if (nul != std::string::npos) s.resize(nul);
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The lines of a text file, without their '\n' (a last line without one included).
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    lines.push_back(text.substr(pos, eol - pos));
    pos = eol + 1;
  }
  return lines;
}

// A non-negative decimal integer filling the whole (trimmed) text; false for anything else
// ("max", "-1", "12abc", overflow).
bool parse_u64(const std::string& text, uint64_t* out) {
  const std::string t = trim(text);
  if (t.empty() || t.size() > 20) return false;
  uint64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool read_u64(const std::string& path, uint64_t* out) {
  std::string t;
  return read_text(path, &t) && parse_u64(t, out);
}

// "Key:   1234 kB" lines of /proc/meminfo, in bytes.
std::map<std::string, uint64_t> parse_meminfo(const std::string& text) {
  std::map<std::string, uint64_t> kv;
  for (const std::string& line : split_lines(text)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = trim(line.substr(colon + 1));
    uint64_t scale = 1;
    if (value.size() > 3 && value.compare(value.size() - 3, 3, " kB") == 0) {
      value.resize(value.size() - 3);
      scale = 1024;
    }
    uint64_t v = 0;
    if (parse_u64(value, &v) && v <= UINT64_MAX / scale) kv[line.substr(0, colon)] = v * scale;
  }
  return kv;
}

struct CgroupLevel {
  uint64_t limit = 0, usage = 0;
};

// Walks from the process's cgroup up to the hierarchy's root and keeps the level with the least
// room: a parent's limit caps its children too.
void tightest_cgroup(const std::string& mount, std::string path, const char* limit_file, const char* usage_file,
                     int version, MemoryInfo* mem) {
  // In a container /proc/self/cgroup may name the host's path while the container sees its own
  // cgroup as the mount's root: fall back to the root then.
  if (!exists(mount + path)) path = "/";
  for (;;) {
    const std::string dir = mount + (path == "/" ? "" : path);
    std::string limit_text;
    uint64_t limit = 0, usage = 0;
    if (read_text(dir + "/" + limit_file, &limit_text) && parse_u64(limit_text, &limit) && limit < kNoLimit &&
        read_u64(dir + "/" + usage_file, &usage)) {
      const uint64_t room = limit > usage ? limit - usage : 0;
      const uint64_t best = mem->cgroup_limit_bytes > mem->cgroup_usage_bytes
                                ? mem->cgroup_limit_bytes - mem->cgroup_usage_bytes
                                : 0;
      if (mem->cgroup_limit_bytes == 0 || room < best) {
        mem->cgroup_limit_bytes = limit;
        mem->cgroup_usage_bytes = usage;
        mem->cgroup_version = version;
      }
    }
    if (path == "/" || path.empty()) break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

void read_cgroups(const std::string& root, MemoryInfo* mem) {
  std::string text;
  if (!read_text(join(root, "/proc/self/cgroup"), &text)) return;
  for (const std::string& line : split_lines(text)) {
    // "hierarchy-id:controllers:path"; v2 is "0::path".
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string::npos ? std::string::npos : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path = line.substr(c2 + 1);
    if (path.empty() || path[0] != '/') continue;
    if (id == "0" && controllers.empty()) {
      tightest_cgroup(join(root, "/sys/fs/cgroup"), path, "memory.max", "memory.current", 2, mem);
    } else {
      const std::string padded = "," + controllers + ",";
      if (padded.find(",memory,") != std::string::npos)
        tightest_cgroup(join(root, "/sys/fs/cgroup/memory"), path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                        1, mem);
    }
  }
}

// Per-CPU blocks of /proc/cpuinfo as key -> value maps, in order.
std::vector<std::map<std::string, std::string>> parse_cpuinfo(const std::string& text) {
  std::vector<std::map<std::string, std::string>> blocks(1);
  for (const std::string& line : split_lines(text)) {
    if (trim(line).empty()) {
      if (!blocks.back().empty()) blocks.emplace_back();
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    blocks.back()[trim(line.substr(0, colon))] = trim(line.substr(colon + 1));
  }
  if (blocks.back().empty()) blocks.pop_back();
  return blocks;
}

// Arm's own cores by "CPU part" (implementer 0x41), plus NVIDIA's Carmel (Xavier): AArch64 Linux
// prints no model name, and these are the cores moelite's boards and phones have.
const char* arm_core_name(const std::string& implementer, const std::string& part) {
  const long impl = strtol(implementer.c_str(), nullptr, 16), p = strtol(part.c_str(), nullptr, 16);
  if (impl == 0x4e && p == 0x004) return "NVIDIA Carmel";
  if (impl != 0x41) return nullptr;
  static const struct {
    long part;
    const char* name;
  } kParts[] = {{0xd03, "Cortex-A53"}, {0xd04, "Cortex-A35"},  {0xd05, "Cortex-A55"}, {0xd07, "Cortex-A57"},
                {0xd08, "Cortex-A72"}, {0xd09, "Cortex-A73"},  {0xd0a, "Cortex-A75"}, {0xd0b, "Cortex-A76"},
                {0xd0c, "Neoverse-N1"}, {0xd0d, "Cortex-A77"}, {0xd40, "Neoverse-V1"}, {0xd41, "Cortex-A78"},
                {0xd42, "Cortex-A78AE"}, {0xd44, "Cortex-X1"}, {0xd46, "Cortex-A510"}, {0xd47, "Cortex-A710"},
                {0xd48, "Cortex-X2"},  {0xd49, "Neoverse-N2"}, {0xd4d, "Cortex-A715"}, {0xd4e, "Cortex-X3"},
                {0xd4f, "Neoverse-V2"}, {0xd80, "Cortex-A520"}, {0xd81, "Cortex-A720"}, {0xd82, "Cortex-X4"}};
  for (const auto& e : kParts)
    if (e.part == p) return e.name;
  return nullptr;
}

// "4x Cortex-A55 + 4x Cortex-A76" from the per-CPU blocks, in order of first appearance.
std::string arm_model_name(const std::vector<std::map<std::string, std::string>>& blocks) {
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& b : blocks) {
    const auto impl = b.find("CPU implementer"), part = b.find("CPU part");
    if (impl == b.end() || part == b.end()) continue;
    const char* name = arm_core_name(impl->second, part->second);
    const std::string n = name ? name : "ARM " + impl->second + "/" + part->second;
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == n; });
    if (it == counts.end()) counts.push_back({n, 1});
    else ++it->second;
  }
  std::string out;
  for (const auto& [n, c] : counts) out += (out.empty() ? "" : " + ") + std::to_string(c) + "x " + n;
  return out;
}

}  // namespace

MemoryInfo read_memory_info(const std::string& root) {
  MemoryInfo mem;
  std::string text;
  if (read_text(join(root, "/proc/meminfo"), &text)) {
    const auto kv = parse_meminfo(text);
    auto get = [&](const char* k) {
      const auto it = kv.find(k);
      return it == kv.end() ? uint64_t{0} : it->second;
    };
    mem.total_bytes = get("MemTotal");
    mem.available_bytes = kv.count("MemAvailable") ? get("MemAvailable") : get("MemFree") + get("Cached");
  }
  read_cgroups(root, &mem);
  return mem;
}

CpuInfo read_cpu_info(const std::string& root) {
  CpuInfo cpu;
  std::string text;
  if (read_text(join(root, "/proc/cpuinfo"), &text)) {
    const auto blocks = parse_cpuinfo(text);
    for (const auto& b : blocks) {
      if (b.count("CPU implementer")) cpu.arm = true;
      if (b.count("vendor_id") || b.count("flags")) cpu.x86 = true;
      if (cpu.model_name.empty() && b.count("model name")) cpu.model_name = b.at("model name");
    }
    if (cpu.arm && cpu.model_name.empty()) cpu.model_name = arm_model_name(blocks);
    if (cpu.model_name.empty() && !blocks.empty() && blocks[0].count("Hardware")) cpu.model_name = blocks[0].at("Hardware");
  }
  if (!cpu.arm && !cpu.x86) {  // no /proc/cpuinfo: the build's target is the best guess
#if defined(__aarch64__) || defined(__arm__)
    cpu.arm = true;
#elif defined(__x86_64__) || defined(__i386__)
    cpu.x86 = true;
#endif
  }

  const std::string sys = join(root, "/sys/devices/system/cpu");
  std::vector<int> present;
  if (read_text(sys + "/present", &text)) present = parse_cpu_list(text);
  if (present.empty())  // no list: count cpuN directories from 0
    for (int i = 0; i < 4096 && exists(sys + "/cpu" + std::to_string(i)); ++i) present.push_back(i);
  cpu.online = read_text(sys + "/online", &text) ? parse_cpu_list(text) : present;
  if (cpu.online.empty()) cpu.online = present;
  if (present.empty()) return cpu;

  // One scale for every CPU: cpu_capacity where all have it, else the maximum frequency.
  cpu.capacity.assign(static_cast<size_t>(present.back()) + 1, 0);
  for (const char* file : {"/cpu_capacity", "/cpufreq/cpuinfo_max_freq"}) {
    bool all = true;
    for (int id : cpu.online) {
      uint64_t v = 0;
      if (static_cast<size_t>(id) < cpu.capacity.size() &&
          read_u64(sys + "/cpu" + std::to_string(id) + file, &v) && v > 0)
        cpu.capacity[static_cast<size_t>(id)] = v;
      else
        all = false;
    }
    if (all) break;
    std::fill(cpu.capacity.begin(), cpu.capacity.end(), 0);
  }
  return cpu;
}

SystemInfo read_system_info(const std::string& root) {
  SystemInfo info;
  info.cpu = read_cpu_info(root);
  info.memory = read_memory_info(root);
  std::string text;
  if (read_text(join(root, "/proc/device-tree/model"), &text)) info.model = trim(text);
  if (info.model.empty() && read_text(join(root, "/sys/class/dmi/id/product_name"), &text)) info.model = trim(text);
  bool tegra = false;
  if (read_text(join(root, "/etc/nv_tegra_release"), &text)) {
    tegra = true;
    info.tegra_release = trim(text.substr(0, text.find('\n')));
  }
  // compatible is a list of NUL-separated strings, e.g. "nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0".
  if (read_text(join(root, "/proc/device-tree/compatible"), &text) && text.find("nvidia,tegra") != std::string::npos)
    tegra = true;
  if (tegra) info.kind = PlatformKind::Jetson;
  else if (info.cpu.arm) info.kind = PlatformKind::LinuxArm;
  else if (info.cpu.x86) info.kind = PlatformKind::X86Desktop;
  // Jetson's integrated GPU allocates from the same DRAM as the CPU: every byte the GPU backend
  // holds comes out of the budget's memory too.
  info.unified_memory = info.kind == PlatformKind::Jetson;
  return info;
}

std::vector<int> allowed_cpus() {
  std::vector<int> out;
#if defined(__linux__)
  for (int n = 1024; n <= (1 << 16) && out.empty(); n *= 4) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) break;
    const size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      for (int i = 0; i < n; ++i)
        if (CPU_ISSET_S(i, size, set)) out.push_back(i);
      CPU_FREE(set);
      break;
    }
    CPU_FREE(set);
    if (errno != EINVAL) break;  // EINVAL: the kernel's mask is larger than ours; retry bigger
  }
#endif
  if (out.empty()) out = read_cpu_info("/").online;
  return out;
}

bool prefer_short_slice(uint64_t slice_ns) {
#if defined(__linux__) && defined(SYS_sched_setattr)
  struct SchedAttr {  // the kernel's struct sched_attr, version 1 (glibc 2.36 has no wrapper)
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
    uint32_t util_min, util_max;
  } attr{};
  attr.size = sizeof attr;
  attr.policy = SCHED_OTHER;
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (nice == -1 && errno != 0) return false;
  attr.nice = nice;  // kept: only the slice changes
  attr.runtime = slice_ns;
  return syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
#else
  (void)slice_ns;
  return false;
#endif
}

bool pin_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
#if defined(__linux__)
  const int n = *std::max_element(cpus.begin(), cpus.end()) + 1;
  cpu_set_t* set = CPU_ALLOC(n);
  if (!set) return false;
  const size_t size = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(size, set);
  for (int id : cpus)
    if (id >= 0) CPU_SET_S(id, size, set);
  const bool ok = pthread_setaffinity_np(pthread_self(), size, set) == 0;
  CPU_FREE(set);
  return ok;
#else
  return false;
#endif
}

const std::vector<int>& big_cores() {
  static const std::vector<int> cores = select_big_cores(read_cpu_info("/").capacity, allowed_cpus());
  return cores;
}

std::vector<int> select_little_cores(const std::vector<int>& big, const std::vector<int>& allowed) {
  if (big.empty()) return {};
  std::vector<int> little;
  for (int cpu : allowed)
    if (std::find(big.begin(), big.end(), cpu) == big.end()) little.push_back(cpu);
  return little;
}

const std::vector<int>& little_cores() {
  static const std::vector<int> cores = select_little_cores(big_cores(), allowed_cpus());
  return cores;
}

int default_thread_count() {
  const std::vector<int>& big = big_cores();
  return big.empty() ? physical_core_count() : static_cast<int>(big.size());
}

}  // namespace moelite::platform
