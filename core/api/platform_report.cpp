#include "core/api/platform_report.h"

#include <cinttypes>
#include <cstdio>
#include <vector>

#include "backends/backend.h"
#include "core/support/json.h"
#include "platforms/system_info.h"

namespace moelite {

namespace {

std::string u64(uint64_t v) { return std::to_string(v); }

std::string int_list(const std::vector<int>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
  return o + "]";
}

const char* backend_name(BackendKind k) {
  switch (k) {
    case BackendKind::Cpu: return "cpu";
    case BackendKind::Vulkan: return "vulkan";
    case BackendKind::Cuda: return "cuda";
    case BackendKind::Auto: break;
  }
  return "auto";
}

}  // namespace

std::string platform_json() {
  using json::quote;
  const platform::SystemInfo s = platform::read_system_info();
  const std::vector<int> allowed = platform::allowed_cpus();
  const std::vector<int>& big = platform::big_cores();
  const AutoBackendChoice choice = explain_auto_backend();
  std::string capacity = "[";
  for (size_t i = 0; i < s.cpu.capacity.size(); ++i) capacity += (i ? ", " : "") + u64(s.cpu.capacity[i]);
  capacity += "]";
  const platform::MemoryInfo& m = s.memory;
  std::string o = "{";
  o += "\"kind\": " + quote(platform::platform_kind_name(s.kind));
  o += ", \"model\": " + quote(s.model);
  o += ", \"tegra_release\": " + quote(s.tegra_release);
  o += ", \"unified_memory\": " + std::string(s.unified_memory ? "true" : "false");
  o += ", \"cpu\": {\"model\": " + quote(s.cpu.model_name);
  o += ", \"arch\": " + quote(s.cpu.arm ? "arm" : s.cpu.x86 ? "x86" : "other");
  o += ", \"online\": " + int_list(s.cpu.online) + ", \"allowed\": " + int_list(allowed);
  o += ", \"capacity\": " + capacity + ", \"big_cores\": " + int_list(big);
  o += ", \"heterogeneous\": " + std::string(big.empty() ? "false" : "true");
  o += ", \"default_threads\": " + std::to_string(platform::default_thread_count()) + "}";
  o += ", \"memory\": {\"total\": " + u64(m.total_bytes) + ", \"available\": " + u64(m.available_bytes);
  o += ", \"cgroup_version\": " + std::to_string(m.cgroup_version) + ", \"cgroup_limit\": " + u64(m.cgroup_limit_bytes);
  o += ", \"cgroup_usage\": " + u64(m.cgroup_usage_bytes) + ", \"room\": " + u64(m.room_bytes()) + "}";
  o += ", \"backends\": {\"cpu\": true, \"cuda\": " + std::string(MOELITE_HAVE_CUDA ? "true" : "false");
  o += ", \"cuda_emulator\": " + std::string(MOELITE_HAVE_CUDA_EMULATOR ? "true" : "false");
  o += ", \"vulkan\": " + std::string(MOELITE_HAVE_VULKAN ? "true" : "false") + "}";
  o += ", \"auto_backend\": {\"name\": " + quote(backend_name(choice.kind)) + ", \"reason\": " + quote(choice.reason);
  o += "}}";
  return o;
}

}  // namespace moelite
