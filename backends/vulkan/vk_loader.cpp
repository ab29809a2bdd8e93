#include "backends/vulkan/vk_loader.h"
#include "base/options.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace moelite::vk {

namespace {

struct Loader {
  PFN_vkGetInstanceProcAddr get_instance_proc_addr = nullptr;
  std::string error;  // why there is none
};

void* open_library(const char* name, std::string* error) {
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();  // names the file, as a rule
    std::string reason = why ? why : "unknown error";
    if (reason.find(name) == std::string::npos) reason = std::string(name) + ": " + reason;
    *error += (error->empty() ? "" : "; ") + reason;
  }
  return lib;
}

// Opened once per process and never closed: drivers and layers it loaded may keep state (and
// threads) until exit, and every Device resolves its functions through it.
const Loader& loader() {
  static const Loader l = [] {
    Loader out;
    std::string error;
    void* lib = nullptr;
    const char* override_path = option_text(Option::VulkanLoader);
    if (override_path) {
      lib = open_library(override_path, &error);
    } else {
      lib = open_library("libvulkan.so.1", &error);
      if (!lib) lib = open_library("libvulkan.so", &error);
    }
    if (!lib) {
      out.error =
          "cannot open the Vulkan loader (" + error + "); install it (Debian: libvulkan1) or use the CPU backend";
      return out;
    }
    out.get_instance_proc_addr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
    if (!out.get_instance_proc_addr) out.error = "the Vulkan loader has no vkGetInstanceProcAddr";
    return out;
  }();
  return l;
}

Status missing(const char* name) {
  return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: the Vulkan implementation lacks %s", name);
}

}  // namespace

Status Functions::load_global() {
  const Loader& l = loader();
  if (!l.get_instance_proc_addr) return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: %s", l.error.c_str());
  vkGetInstanceProcAddr = l.get_instance_proc_addr;
#define MOELITE_VK_LOAD(name)                                                        \
  name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(VK_NULL_HANDLE, #name)); \
  if (!name) return missing(#name);
  MOELITE_VK_GLOBAL_FUNCTIONS(MOELITE_VK_LOAD)
#undef MOELITE_VK_LOAD
  return MOELITE_OK;
}

Status Functions::load_instance(VkInstance instance) {
#define MOELITE_VK_LOAD(name)                                                  \
  name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(instance, #name)); \
  if (!name) return missing(#name);
#define MOELITE_VK_LOAD_OPTIONAL(name) name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(instance, #name));
  MOELITE_VK_INSTANCE_FUNCTIONS(MOELITE_VK_LOAD)
  MOELITE_VK_INSTANCE_OPTIONAL_FUNCTIONS(MOELITE_VK_LOAD_OPTIONAL)
#undef MOELITE_VK_LOAD
#undef MOELITE_VK_LOAD_OPTIONAL
  return MOELITE_OK;
}

Status Functions::load_device(VkDevice device) {
#define MOELITE_VK_LOAD(name)                                              \
  name = reinterpret_cast<PFN_##name>(vkGetDeviceProcAddr(device, #name)); \
  if (!name) return missing(#name);
#define MOELITE_VK_LOAD_OPTIONAL(name) name = reinterpret_cast<PFN_##name>(vkGetDeviceProcAddr(device, #name));
  MOELITE_VK_DEVICE_FUNCTIONS(MOELITE_VK_LOAD)
  MOELITE_VK_DEVICE_OPTIONAL_FUNCTIONS(MOELITE_VK_LOAD_OPTIONAL)
#undef MOELITE_VK_LOAD
#undef MOELITE_VK_LOAD_OPTIONAL
  return MOELITE_OK;
}

}  // namespace moelite::vk
