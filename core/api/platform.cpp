// The C API's platform queries: argument checks and translation (core/api/platform_report.h,
// platforms/system_info.h), nothing else.
#include <cstring>
#include <new>
#include <string>

#include "backends/backend.h"
#include "base/status.h"
#include "core/api/platform_report.h"
#include "moelite.h"
#include "platforms/system_info.h"

namespace mp = moelite::platform;

extern "C" {

MOELITE_API int64_t moelite_platform_get(moelite_platform_field field) {
  try {
    switch (field) {
      case MOELITE_PLATFORM_MEM_TOTAL_BYTES: return static_cast<int64_t>(mp::read_memory_info().total_bytes);
      case MOELITE_PLATFORM_MEM_AVAILABLE_BYTES: return static_cast<int64_t>(mp::read_memory_info().room_bytes());
      case MOELITE_PLATFORM_CGROUP_LIMIT_BYTES: return static_cast<int64_t>(mp::read_memory_info().cgroup_limit_bytes);
      case MOELITE_PLATFORM_CGROUP_USAGE_BYTES: return static_cast<int64_t>(mp::read_memory_info().cgroup_usage_bytes);
      case MOELITE_PLATFORM_IS_JETSON: return mp::read_system_info().kind == mp::PlatformKind::Jetson ? 1 : 0;
      case MOELITE_PLATFORM_UNIFIED_MEMORY: return mp::read_system_info().unified_memory ? 1 : 0;
      case MOELITE_PLATFORM_CPUS_ONLINE: return static_cast<int64_t>(mp::read_cpu_info().online.size());
      case MOELITE_PLATFORM_CPUS_ALLOWED: return static_cast<int64_t>(mp::allowed_cpus().size());
      case MOELITE_PLATFORM_BIG_CORES: return static_cast<int64_t>(mp::big_cores().size());
      case MOELITE_PLATFORM_DEFAULT_THREADS: return mp::default_thread_count();
      case MOELITE_PLATFORM_AUTO_BACKEND: return static_cast<int64_t>(moelite::explain_auto_backend().kind);
      case MOELITE_PLATFORM_HAS_CUDA: return MOELITE_HAVE_CUDA ? 1 : 0;
      case MOELITE_PLATFORM_HAS_VULKAN: return MOELITE_HAVE_VULKAN ? 1 : 0;
    }
  } catch (...) {  // out of memory while reading a file: no exception crosses the C ABI
    return 0;
  }
  return -1;
}

MOELITE_API moelite_status moelite_platform_describe_json(char* buf, size_t buf_size, size_t* needed) {
  try {
    if (!buf && buf_size > 0)
      return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: buf is NULL with buf_size %zu", __func__, buf_size);
    const std::string text = moelite::platform_json();
    if (needed) *needed = text.size() + 1;
    if (buf_size < text.size() + 1)
      return moelite::fail(MOELITE_ERR_BUFFER_TOO_SMALL, "%s: the description needs %zu bytes, the buffer has %zu",
                           __func__, text.size() + 1, buf_size);
    memcpy(buf, text.c_str(), text.size() + 1);
    return MOELITE_OK;
  } catch (const std::bad_alloc&) {
    return moelite::fail(MOELITE_ERR_OUT_OF_MEMORY, "%s: out of memory", __func__);
  } catch (...) {
    return moelite::fail(MOELITE_ERR_INTERNAL, "%s: unexpected exception", __func__);
  }
}

}  // extern "C"
