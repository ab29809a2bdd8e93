#include "backends/vulkan/vk_device.h"
#include "base/options.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backends/vulkan/vk_shaders.h"

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <link.h>
#endif

namespace moelite::vk {

namespace {

// Sanitizer builds only: keep every loaded Vulkan driver loaded for the life of the process.
// Mesa's lavapipe keeps an allocation in its globals; once the loader dlclose()s the driver at
// vkDestroyInstance, LeakSanitizer can no longer see that pointer and reports 128 bytes leaked
// from "<unknown module>" (measured: the pre-refactor build does the same with the same Mesa
// 22.3.6-1+deb12u2). Pinning the driver keeps the pointer visible, so real leaks still fail.
void pin_drivers_for_leak_checking() {
#if defined(__SANITIZE_ADDRESS__)
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) {
        if (info->dlpi_name && strstr(info->dlpi_name, "libvulkan_"))
          dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
        return 0;
      },
      nullptr);
#endif
}

}  // namespace

namespace {

constexpr uint32_t kMaxBindings = 6;
constexpr uint32_t kSetsPerPool = 4096;  // descriptor sets between two flushes
std::atomic<uint64_t> g_validation_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                             VkDebugUtilsMessageTypeFlagsEXT,
                                             const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    g_validation_messages++;
    log_msg(MOELITE_LOG_ERROR, "vulkan validation: %s", data->pMessage ? data->pMessage : "");
  }
  return VK_FALSE;
}

Status vk_fail(VkResult r, const char* what) {
  return fail(r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? MOELITE_ERR_OUT_OF_MEMORY
                                                                                     : MOELITE_ERR_BACKEND_UNAVAILABLE,
              "vulkan: %s failed (VkResult %d)", what, static_cast<int>(r));
}

#define VK_TRY(call, what)                          \
  do {                                              \
    VkResult _r = (call);                           \
    if (_r != VK_SUCCESS) return vk_fail(_r, what); \
  } while (0)

int rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

}  // namespace

uint64_t Device::validation_messages() { return g_validation_messages.load(); }

struct Device::Shared {
  Functions fn;
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  VkQueue transfer_queue = VK_NULL_HANDLE;
  uint32_t transfer_family = 0;
  VkPipelineCache pipeline_cache = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties mem_props{};
  std::map<std::pair<std::string, uint32_t>, Pipeline> pipelines;
  bool as_discrete = false;
  DeviceFacts facts;
  std::mutex pipelines_mu;  // a pipeline is created at its first use, by whichever stream needs it
  std::mutex queue_mu;      // vkQueueSubmit needs its queue externally synchronised

  ~Shared() {
    if (device) {
      fn.vkDeviceWaitIdle(device);
      for (auto& kv : pipelines) {
        fn.vkDestroyPipeline(device, kv.second.pipeline, nullptr);
        fn.vkDestroyPipelineLayout(device, kv.second.layout, nullptr);
        fn.vkDestroyDescriptorSetLayout(device, kv.second.set_layout, nullptr);
      }
      fn.vkDestroyPipelineCache(device, pipeline_cache, nullptr);
      fn.vkDestroyDevice(device, nullptr);
    }
    if (messenger && fn.vkDestroyDebugUtilsMessengerEXT)
      fn.vkDestroyDebugUtilsMessengerEXT(instance, messenger, nullptr);
    if (instance && fn.vkDestroyInstance) fn.vkDestroyInstance(instance, nullptr);
  }
};

Device::Device(std::shared_ptr<Shared> shared)
    : shared_(std::move(shared)),
      fn_(shared_->fn),
      instance_(shared_->instance),
      messenger_(shared_->messenger),
      physical_(shared_->physical),
      device_(shared_->device),
      queue_(shared_->queue),
      queue_family_(shared_->queue_family),
      transfer_queue_(shared_->transfer_queue),
      transfer_family_(shared_->transfer_family),
      pipeline_cache_(shared_->pipeline_cache),
      mem_props_(shared_->mem_props),
      pipelines_(shared_->pipelines),
      as_discrete_(shared_->as_discrete),
      facts_(shared_->facts) {}

Status Device::create(bool allow_cpu, std::unique_ptr<Device>* out) {
  std::unique_ptr<Device> d(new Device(std::make_shared<Shared>()));
  MOELITE_TRY(d->init(allow_cpu));
  MOELITE_TRY(d->init_stream());
  *out = std::move(d);
  return MOELITE_OK;
}

Status Device::create_stream(std::unique_ptr<Device>* out) {
  std::unique_ptr<Device> d(new Device(shared_));
  MOELITE_TRY(d->init_stream());
  *out = std::move(d);
  return MOELITE_OK;
}

Status Device::init(bool allow_cpu) {
  MOELITE_TRY(create_instance());
  MOELITE_TRY(pick_physical_device(allow_cpu));
  read_facts();
  return create_logical_device();
}

// The instance, with the validation layer and its messenger when MOELITE_VK_VALIDATION asks.
Status Device::create_instance() {
  bool validate = false;
  option_flag(Option::VkValidation, &validate);
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "moelite";
  app.apiVersion = VK_API_VERSION_1_2;  // timeline semaphores where the device has 1.2
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  const char* layers[] = {"VK_LAYER_KHRONOS_validation"};
  const char* exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  if (validate) {
    ici.enabledLayerCount = 1;
    ici.ppEnabledLayerNames = layers;
    ici.enabledExtensionCount = 1;
    ici.ppEnabledExtensionNames = exts;
  }
  MOELITE_TRY(fn_.load_global());
  VkResult r = fn_.vkCreateInstance(&ici, nullptr, &instance_);
  if (r != VK_SUCCESS)
    return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: no usable Vulkan driver (vkCreateInstance: %d%s)",
                static_cast<int>(r), validate ? "; is vulkan-validationlayers installed?" : "");
  MOELITE_TRY(fn_.load_instance(instance_));
  if (validate) {
    VkDebugUtilsMessengerCreateInfoEXT mci{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mci.messageSeverity =
        VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                      VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mci.pfnUserCallback = on_validation;
    if (fn_.vkCreateDebugUtilsMessengerEXT) fn_.vkCreateDebugUtilsMessengerEXT(instance_, &mci, nullptr, &messenger_);
  }

  return MOELITE_OK;
}

// MOELITE_VK_DEVICE's device, or the best by type (discrete > integrated > virtual > CPU; a CPU
// implementation only when allowed).
Status Device::pick_physical_device(bool allow_cpu) {
  uint32_t n = 0;
  fn_.vkEnumeratePhysicalDevices(instance_, &n, nullptr);
  std::vector<VkPhysicalDevice> devices(n);
  if (n) fn_.vkEnumeratePhysicalDevices(instance_, &n, devices.data());
  pin_drivers_for_leak_checking();
  if (devices.empty()) return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: no Vulkan device found");
  int best = -1;
  if (int64_t forced; option_int(Option::VkDevice, &forced)) {
    if (forced >= static_cast<int64_t>(devices.size()))
      return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: MOELITE_VK_DEVICE=%lld but there are %u devices",
                  static_cast<long long>(forced), n);
    best = static_cast<int>(forced);
  } else {
    for (int i = 0; i < static_cast<int>(devices.size()); ++i) {
      VkPhysicalDeviceProperties p;
      fn_.vkGetPhysicalDeviceProperties(devices[static_cast<size_t>(i)], &p);
      if (!allow_cpu && p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) continue;
      VkPhysicalDeviceProperties bp;
      if (best >= 0) fn_.vkGetPhysicalDeviceProperties(devices[static_cast<size_t>(best)], &bp);
      if (best < 0 || rank(p.deviceType) < rank(bp.deviceType)) best = i;
    }
    if (best < 0)
      return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: only CPU implementations of Vulkan are present");
  }
  physical_ = devices[static_cast<size_t>(best)];
  return MOELITE_OK;
}

// What the shaders and the memory paths depend on: limits, memory kind, features, subgroups.
void Device::read_facts() {
  VkPhysicalDeviceProperties props;
  fn_.vkGetPhysicalDeviceProperties(physical_, &props);
  facts_.name = props.deviceName;
  facts_.type = props.deviceType;
  facts_.max_storage_range = props.limits.maxStorageBufferRange;
  // Tests shrink the range to exercise the split of large tensors on small models.
  if (int64_t range; option_int(Option::VkMaxBuffer, &range))
    facts_.max_storage_range = std::min<uint64_t>(facts_.max_storage_range, static_cast<uint64_t>(range));
  fn_.vkGetPhysicalDeviceMemoryProperties(physical_, &mem_props_);
  // Unified memory: the device's own memory is the host's (an integrated GPU, a CPU device). A
  // discrete GPU may also offer a device-local, host-visible type (its PCIe BAR, all of its memory
  // with resizable BAR, as NVIDIA's H100/H200 do) but that is device memory seen through the bus:
  // host reads of it crawl, and the kernel cannot pin it for I/O, so O_DIRECT reads into it fail
  // with EFAULT (seen on an H200). A discrete GPU keeps the staging paths and the device tier.
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mem_props_.memoryTypes[i].propertyFlags;
    if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
        (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) && props.deviceType != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU)
      facts_.unified_memory = true;
  }
  // Tests treat a unified-memory device as a discrete one, so the staging paths run here too.
  bool discrete = false;
  option_flag(Option::VkAsDiscrete, &discrete);
  as_discrete_ = discrete;
  if (as_discrete_) facts_.unified_memory = false;
  // Features the shaders could use; the portable path needs none of them.
  VkPhysicalDeviceShaderFloat16Int8Features f16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDevice8BitStorageFeatures s8{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES};
  s8.pNext = &f16;
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &s8;
  fn_.vkGetPhysicalDeviceFeatures2(physical_, &feats);
  facts_.fp16 = f16.shaderFloat16;
  facts_.int8 = f16.shaderInt8;
  facts_.storage8 = s8.storageBuffer8BitAccess;
  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &sub;
  fn_.vkGetPhysicalDeviceProperties2(physical_, &props2);
  facts_.subgroups = (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0 &&
                     (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
  bool portable = false;  // tests run both shader paths
  option_flag(Option::VkPortable, &portable);
  facts_.use_subgroups = facts_.subgroups && !portable;
  facts_.subgroup_size = sub.subgroupSize;
}

// The logical device: a compute queue, a transfer queue where the device has a family for it (else
// a second compute queue, else the compute queue), timeline semaphores where available, and the
// pipeline cache.
Status Device::create_logical_device() {
  VkPhysicalDeviceProperties props;
  fn_.vkGetPhysicalDeviceProperties(physical_, &props);
  uint32_t nq = 0;
  fn_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  fn_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, qf.data());
  int compute = -1, transfer = -1;
  for (uint32_t i = 0; i < nq; ++i) {
    if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && compute < 0) compute = static_cast<int>(i);
    if ((qf[i].queueFlags & VK_QUEUE_TRANSFER_BIT) &&
        !(qf[i].queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_GRAPHICS_BIT)) && transfer < 0)
      transfer = static_cast<int>(i);
  }
  if (compute < 0)
    return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: device '%s' has no compute queue", props.deviceName);
  facts_.dedicated_transfer_queue = transfer >= 0;
  queue_family_ = static_cast<uint32_t>(compute);
  transfer_family_ = transfer >= 0 ? static_cast<uint32_t>(transfer) : queue_family_;
  // A second queue of the compute family serves transfers when there is no transfer family.
  const uint32_t compute_queues = transfer < 0 && qf[queue_family_].queueCount > 1 ? 2 : 1;
  const float priorities[2] = {1.0f, 1.0f};
  VkDeviceQueueCreateInfo qci[2] = {{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO},
                                    {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO}};
  qci[0].queueFamilyIndex = queue_family_;
  qci[0].queueCount = compute_queues;
  qci[0].pQueuePriorities = priorities;
  qci[1].queueFamilyIndex = transfer_family_;
  qci[1].queueCount = 1;
  qci[1].pQueuePriorities = priorities;
  VkPhysicalDeviceTimelineSemaphoreFeatures tl{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &tl;
  if (props.apiVersion >= VK_API_VERSION_1_2) fn_.vkGetPhysicalDeviceFeatures2(physical_, &f2);
  facts_.timeline_semaphores = tl.timelineSemaphore;
  VkPhysicalDeviceTimelineSemaphoreFeatures enable_tl{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
  enable_tl.timelineSemaphore = VK_TRUE;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = transfer >= 0 ? 2 : 1;
  dci.pQueueCreateInfos = qci;
  if (facts_.timeline_semaphores) dci.pNext = &enable_tl;
  VK_TRY(fn_.vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
  if (Status st = fn_.load_device(device_); st != MOELITE_OK) {
    if (fn_.vkDestroyDevice) fn_.vkDestroyDevice(device_, nullptr);
    device_ = VK_NULL_HANDLE;  // the destructor skips the device's objects (there are none yet)
    return st;
  }
  if (!fn_.vkWaitSemaphores || !fn_.vkGetSemaphoreCounterValue) facts_.timeline_semaphores = false;
  fn_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  fn_.vkGetDeviceQueue(device_, transfer_family_, transfer >= 0 ? 0 : compute_queues - 1, &transfer_queue_);
  VkPipelineCacheCreateInfo pci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  VK_TRY(fn_.vkCreatePipelineCache(device_, &pci, nullptr, &pipeline_cache_), "vkCreatePipelineCache");
  log_msg(MOELITE_LOG_INFO,
          "vulkan: %s (%s memory, max storage range %" PRIu64
          " MiB, fp16 %d, int8 %d, subgroups %d x %u; "
          "transfers on %s, %s)",
          facts_.name.c_str(), facts_.unified_memory ? "unified" : "discrete", facts_.max_storage_range >> 20,
          facts_.fp16, facts_.int8, facts_.subgroups, facts_.subgroup_size,
          facts_.dedicated_transfer_queue ? "a dedicated transfer queue"
          : transfer_queue_ == queue_     ? "the compute queue"
                                          : "a second compute-family queue",
          facts_.timeline_semaphores ? "timeline semaphores" : "fences");
  return MOELITE_OK;
}

Status Device::init_stream() {
  VkCommandPoolCreateInfo tpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  tpi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  tpi.queueFamilyIndex = transfer_family_;
  VK_TRY(fn_.vkCreateCommandPool(device_, &tpi, nullptr, &transfer_pool_), "vkCreateCommandPool");
  if (facts_.timeline_semaphores) {
    VkSemaphoreTypeCreateInfo sti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    sti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo sci{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    sci.pNext = &sti;
    VK_TRY(fn_.vkCreateSemaphore(device_, &sci, nullptr, &timeline_), "vkCreateSemaphore");
  }

  VkCommandPoolCreateInfo cpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  cpi.queueFamilyIndex = queue_family_;
  VK_TRY(fn_.vkCreateCommandPool(device_, &cpi, nullptr, &cmd_pool_), "vkCreateCommandPool");
  MOELITE_TRY(new_frame());
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBindings};
  VkDescriptorPoolCreateInfo dpi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dpi.maxSets = kSetsPerPool;
  dpi.poolSizeCount = 1;
  dpi.pPoolSizes = &ps;
  VK_TRY(fn_.vkCreateDescriptorPool(device_, &dpi, nullptr, &desc_pool_), "vkCreateDescriptorPool");
  return MOELITE_OK;
}

Device::~Device() {
  if (device_) {
    // This stream's work only: other streams of the device may still be running theirs. (Not a
    // flush when nothing is recorded or running: it would report a pending recording error as
    // the thread's last error from inside a free.)
    bool busy = recording_;
    for (const Frame& f : frames_) busy = busy || f.in_flight;
    if (busy && desc_pool_) (void)flush();
    release_temporaries();
    reclaim_transfers(true);
    if (timeline_) fn_.vkDestroySemaphore(device_, timeline_, nullptr);
    fn_.vkDestroyCommandPool(device_, transfer_pool_, nullptr);
    fn_.vkDestroyDescriptorPool(device_, desc_pool_, nullptr);
    for (Frame& f : frames_) fn_.vkDestroyFence(device_, f.fence, nullptr);
    fn_.vkDestroyCommandPool(device_, cmd_pool_, nullptr);
  }
  // The device itself goes with the last stream's shared_.
}

int32_t Device::memory_type(uint32_t bits, VkMemoryPropertyFlags want) const {
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i)
    if ((bits & (1u << i)) && (mem_props_.memoryTypes[i].propertyFlags & want) == want) return static_cast<int32_t>(i);
  return -1;
}

namespace {
std::atomic<int64_t> g_fail_countdown{0};
}  // namespace

void Device::fail_nth_operation_for_testing(int64_t n) { g_fail_countdown.store(n); }

namespace {
std::atomic<uint32_t> g_sets_per_submission{0};  // 0: kSetsPerPool
}  // namespace

void Device::submit_every_n_sets_for_testing(uint32_t n) { g_sets_per_submission.store(n); }

Status Device::injected_failure(const char* what) {
  int64_t left = g_fail_countdown.load();
  while (left > 0 && !g_fail_countdown.compare_exchange_weak(left, left - 1)) {
  }
  if (left != 1) return MOELITE_OK;
  return fail(MOELITE_ERR_OUT_OF_MEMORY, "vulkan: %s failed (injected by a test)", what);
}

Status Device::alloc_with(uint64_t bytes, VkMemoryPropertyFlags props, Buffer* out) {
  MOELITE_TRY(injected_failure("a buffer allocation"));
  Buffer b;
  b.size = std::max<uint64_t>(bytes, 16);
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = b.size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VK_TRY(fn_.vkCreateBuffer(device_, &bci, nullptr, &b.buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  fn_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  const int32_t type = memory_type(req.memoryTypeBits, props);
  if (type < 0) {
    fn_.vkDestroyBuffer(device_, b.buffer, nullptr);
    return fail(MOELITE_ERR_BACKEND_UNAVAILABLE, "vulkan: no memory type with properties 0x%x", props);
  }
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = static_cast<uint32_t>(type);
  VkResult r = fn_.vkAllocateMemory(device_, &mai, nullptr, &b.memory);
  if (r != VK_SUCCESS) {
    fn_.vkDestroyBuffer(device_, b.buffer, nullptr);
    return vk_fail(r, "vkAllocateMemory");
  }
  fn_.vkBindBufferMemory(device_, b.buffer, b.memory, 0);
  const bool staging = (props & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
  if ((mem_props_.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
      (staging || !as_discrete_)) {
    r = fn_.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped);
    if (r != VK_SUCCESS) {
      free(&b);
      return vk_fail(r, "vkMapMemory");
    }
  }
  *out = b;
  return MOELITE_OK;
}

Status Device::alloc(uint64_t bytes, Buffer* out) {
  if (bytes > facts_.max_storage_range)
    return fail(MOELITE_ERR_NOT_IMPLEMENTED,
                "vulkan: a buffer of %" PRIu64 " bytes exceeds the device's storage range of %" PRIu64, bytes,
                facts_.max_storage_range);
  const VkMemoryPropertyFlags unified =
      VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  if (facts_.unified_memory) return alloc_with(bytes, unified, out);
  return alloc_with(bytes, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, out);
}

void Device::free(Buffer* b) {
  if (b->mapped) fn_.vkUnmapMemory(device_, b->memory);
  if (b->buffer) fn_.vkDestroyBuffer(device_, b->buffer, nullptr);
  if (b->memory) fn_.vkFreeMemory(device_, b->memory, nullptr);
  *b = Buffer();
}

void Device::begin_if_needed() {
  if (recording_) return;
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  fn_.vkBeginCommandBuffer(frames_[current_].cmd, &bi);
  recording_ = true;
}

namespace {
void full_barrier(const Functions& fn, VkCommandBuffer cmd) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  fn.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                          VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr,
                          0, nullptr);
}
}  // namespace

Status Device::upload(const Buffer& dst, uint64_t offset, const void* src, uint64_t bytes) {
  if (bytes == 0) return MOELITE_OK;
  if (dst.mapped && !recording_) {
    memcpy(static_cast<uint8_t*>(dst.mapped) + offset, src, bytes);
    return MOELITE_OK;
  }
  // Recorded work may still read the old contents: the copy goes into the command stream.
  Buffer staging;
  MOELITE_TRY(alloc_with(bytes, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, &staging));
  memcpy(staging.mapped, src, bytes);
  begin_if_needed();
  VkCommandBuffer cmd = frames_[current_].cmd;
  full_barrier(fn_, cmd);
  VkBufferCopy region{0, offset, bytes};
  fn_.vkCmdCopyBuffer(cmd, staging.buffer, dst.buffer, 1, &region);
  staging_.push_back(staging);
  return MOELITE_OK;
}

Status Device::alloc_device(uint64_t bytes, Buffer* out) {
  if (transfer_family_ == queue_family_) return alloc(bytes, out);
  // Used by two queue families without ownership transfers: concurrent sharing.
  Buffer b;
  b.size = std::max<uint64_t>(bytes, 16);
  const uint32_t families[2] = {queue_family_, transfer_family_};
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = b.size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_CONCURRENT;
  bci.queueFamilyIndexCount = 2;
  bci.pQueueFamilyIndices = families;
  VK_TRY(fn_.vkCreateBuffer(device_, &bci, nullptr, &b.buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  fn_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  const int32_t type = memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = static_cast<uint32_t>(std::max(type, 0));
  VkResult r = type < 0 ? VK_ERROR_OUT_OF_DEVICE_MEMORY : fn_.vkAllocateMemory(device_, &mai, nullptr, &b.memory);
  if (r != VK_SUCCESS) {
    fn_.vkDestroyBuffer(device_, b.buffer, nullptr);
    return vk_fail(r, "vkAllocateMemory");
  }
  fn_.vkBindBufferMemory(device_, b.buffer, b.memory, 0);
  *out = b;
  return MOELITE_OK;
}

Status Device::record_staged_copy(VkCommandPool pool, const Buffer& dst, const void* src, uint64_t bytes,
                                  Buffer* staging, VkCommandBuffer* cmd) {
  MOELITE_TRY(alloc_with(bytes, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, staging));
  memcpy(staging->mapped, src, bytes);
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = pool;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  if (const VkResult r = fn_.vkAllocateCommandBuffers(device_, &cai, cmd); r != VK_SUCCESS) {
    free(staging);
    *cmd = VK_NULL_HANDLE;
    return vk_fail(r, "vkAllocateCommandBuffers");
  }
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  fn_.vkBeginCommandBuffer(*cmd, &bi);
  VkBufferCopy region{0, 0, bytes};
  fn_.vkCmdCopyBuffer(*cmd, staging->buffer, dst.buffer, 1, &region);
  fn_.vkEndCommandBuffer(*cmd);
  return MOELITE_OK;
}

Status Device::transfer(const Buffer& dst, const void* src, uint64_t bytes) {
  PendingTransfer t{};
  MOELITE_TRY(record_staged_copy(transfer_pool_, dst, src, bytes, &t.staging, &t.cmd));
  t.value = ++transfer_value_;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &t.cmd;
  VkTimelineSemaphoreSubmitInfo ts{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  if (timeline_) {
    ts.signalSemaphoreValueCount = 1;
    ts.pSignalSemaphoreValues = &t.value;
    si.pNext = &ts;
    si.signalSemaphoreCount = 1;
    si.pSignalSemaphores = &timeline_;
  } else {
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    fn_.vkCreateFence(device_, &fci, nullptr, &t.fence);
  }
  VkResult r;
  {
    std::lock_guard<std::mutex> queue_lock(shared_->queue_mu);
    r = fn_.vkQueueSubmit(transfer_queue_, 1, &si, t.fence);
  }
  if (r != VK_SUCCESS) {
    fn_.vkFreeCommandBuffers(device_, transfer_pool_, 1, &t.cmd);
    if (t.fence) fn_.vkDestroyFence(device_, t.fence, nullptr);
    free(&t.staging);
    return vk_fail(r, "vkQueueSubmit (transfer)");
  }
  wait_value_ = t.value;
  transfers_.push_back(t);
  return MOELITE_OK;
}

void Device::reclaim_transfers(bool all) {
  uint64_t done = 0;
  if (timeline_ && !all) fn_.vkGetSemaphoreCounterValue(device_, timeline_, &done);
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    bool finished = all || (timeline_ ? it->value <= done : fn_.vkGetFenceStatus(device_, it->fence) == VK_SUCCESS);
    if (all && !timeline_ && it->fence) fn_.vkWaitForFences(device_, 1, &it->fence, VK_TRUE, UINT64_MAX);
    if (all && timeline_) {
      VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
      wi.semaphoreCount = 1;
      wi.pSemaphores = &timeline_;
      wi.pValues = &it->value;
      fn_.vkWaitSemaphores(device_, &wi, UINT64_MAX);
    }
    if (!finished) {
      ++it;
      continue;
    }
    fn_.vkFreeCommandBuffers(device_, transfer_pool_, 1, &it->cmd);
    if (it->fence) fn_.vkDestroyFence(device_, it->fence, nullptr);
    free(&it->staging);
    it = transfers_.erase(it);
  }
}

Status Device::write_new(const Buffer& dst, const void* src, uint64_t bytes) {
  if (dst.mapped) {
    memcpy(dst.mapped, src, bytes);
    return MOELITE_OK;
  }
  return upload(dst, 0, src, bytes);
}

Status Device::write_now(const Buffer& dst, const void* src, uint64_t bytes) {
  if (dst.mapped) {
    memcpy(dst.mapped, src, bytes);
    return MOELITE_OK;
  }
  if (bytes == 0) return MOELITE_OK;
  // A command buffer of its own, submitted and waited for now: the stream's recording (which may
  // be part way through a pass) is not flushed, and its temporaries stay.
  Buffer staging;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  MOELITE_TRY(record_staged_copy(cmd_pool_, dst, src, bytes, &staging, &cmd));
  VkFence fence = VK_NULL_HANDLE;
  auto cleanup = [&](Status st) {
    if (fence) fn_.vkDestroyFence(device_, fence, nullptr);
    fn_.vkFreeCommandBuffers(device_, cmd_pool_, 1, &cmd);
    free(&staging);
    return st;
  };
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if (VkResult r = fn_.vkCreateFence(device_, &fci, nullptr, &fence); r != VK_SUCCESS)
    return cleanup(vk_fail(r, "vkCreateFence"));
  if (const Status st = injected_failure("a submission"); st != MOELITE_OK) return cleanup(st);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  VkResult r;
  {
    std::lock_guard<std::mutex> queue_lock(shared_->queue_mu);
    r = fn_.vkQueueSubmit(queue_, 1, &si, fence);
  }
  if (r != VK_SUCCESS) return cleanup(vk_fail(r, "vkQueueSubmit (an upload)"));
  r = fn_.vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX);
  return cleanup(r == VK_SUCCESS ? MOELITE_OK : vk_fail(r, "vkWaitForFences (an upload)"));
}

Status Device::temp(const void* data, uint64_t bytes, Buffer* out) {
  Buffer b;
  MOELITE_TRY(alloc((bytes + 3) / 4 * 4, &b));  // shaders read whole 32-bit words
  staging_.push_back(b);                        // freed with the staging buffers, after the work that reads it
  if (data) MOELITE_TRY(write_new(b, data, bytes));
  *out = b;
  return MOELITE_OK;
}

Status Device::download(const Buffer& src, uint64_t offset, void* dst, uint64_t bytes) {
  if (bytes == 0) return MOELITE_OK;
  if (const Status st = injected_failure("a read-back"); st != MOELITE_OK) {
    (void)flush();  // what was recorded still runs, so the device is idle as after a real failure
    return fail(st, "vulkan: a read-back failed (injected by a test)");
  }
  if (src.mapped) {
    // Copied out before the submission's temporaries (src may be one) are released.
    const Status st = finish();
    if (st == MOELITE_OK) memcpy(dst, static_cast<const uint8_t*>(src.mapped) + offset, bytes);
    release_temporaries();
    return st;
  }
  Buffer staging;
  MOELITE_TRY(alloc_with(bytes, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, &staging));
  begin_if_needed();
  VkCommandBuffer cmd = frames_[current_].cmd;
  full_barrier(fn_, cmd);
  VkBufferCopy region{offset, 0, bytes};
  fn_.vkCmdCopyBuffer(cmd, src.buffer, staging.buffer, 1, &region);
  const Status st = finish();
  if (st == MOELITE_OK) memcpy(dst, staging.mapped, bytes);
  free(&staging);
  release_temporaries();
  return st;
}

Device::Pipeline* Device::pipeline(const char* name, uint32_t spec, uint32_t n_bindings) {
  const auto key = std::make_pair(std::string(name), spec);
  // Held while a missing pipeline is built, so two streams never build the same one; a map's
  // elements stay where they are, so the pointer returned outlives the lock.
  std::lock_guard<std::mutex> lock(shared_->pipelines_mu);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return &it->second;
  const ShaderBlob* blob = find_shader(name);
  if (!blob) return nullptr;
  Pipeline p;
  p.n_bindings = n_bindings;
  std::vector<VkDescriptorSetLayoutBinding> binds(n_bindings);
  for (uint32_t i = 0; i < n_bindings; ++i)
    binds[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo dl{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dl.bindingCount = n_bindings;
  dl.pBindings = binds.data();
  fn_.vkCreateDescriptorSetLayout(device_, &dl, nullptr, &p.set_layout);
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
  VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &p.set_layout;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &pcr;
  fn_.vkCreatePipelineLayout(device_, &pl, nullptr, &p.layout);
  VkShaderModuleCreateInfo smi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smi.codeSize = blob->words * 4;
  smi.pCode = blob->code;
  VkShaderModule module;
  fn_.vkCreateShaderModule(device_, &smi, nullptr, &module);
  VkSpecializationMapEntry entry{0, 0, 4};
  VkSpecializationInfo si{1, &entry, 4, &spec};
  VkComputePipelineCreateInfo cpi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cpi.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
               nullptr,
               0,
               VK_SHADER_STAGE_COMPUTE_BIT,
               module,
               "main",
               &si};
  cpi.layout = p.layout;
  fn_.vkCreateComputePipelines(device_, pipeline_cache_, 1, &cpi, nullptr, &p.pipeline);
  fn_.vkDestroyShaderModule(device_, module, nullptr);
  return &(pipelines_[key] = p);
}

void Device::dispatch(const char* name, uint32_t spec, const std::vector<Binding>& bindings, const void* push,
                      uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (gx == 0 || gy == 0 || gz == 0) return;
  const uint32_t sets_per_submission = g_sets_per_submission.load();
  if (sets_used_ >= (sets_per_submission > 0 ? std::min(sets_per_submission, kSetsPerPool) : kSetsPerPool)) {
    // The pool's sets can be reused once what was recorded has run. Temporaries stay: dispatches
    // recorded after this one may read them (a flush here freed an expert pass's gate/up outputs
    // before its down projections ran).
    if (const Status st = finish(); st != MOELITE_OK && error_ == MOELITE_OK) {
      error_ = st;  // reported at the next submission, like a dispatch that could not be recorded
      error_msg_ = last_error_message();
    }
  }
  Pipeline* p = pipeline(name, spec, static_cast<uint32_t>(bindings.size()));
  Status st = p ? injected_failure("recording a dispatch")
                : fail(MOELITE_ERR_INTERNAL, "vulkan: shader '%s' is not in this build", name);
  if (st != MOELITE_OK) {
    // Surfaces at the next submission (a read-back, a group end or the backend's sync()).
    if (error_ == MOELITE_OK) {
      error_ = st;
      error_msg_ = last_error_message();
    }
    return;
  }
  begin_if_needed();
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = desc_pool_;
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &p->set_layout;
  VkDescriptorSet set;
  fn_.vkAllocateDescriptorSets(device_, &ai, &set);
  ++sets_used_;
  std::vector<VkDescriptorBufferInfo> infos(bindings.size());
  std::vector<VkWriteDescriptorSet> writes(bindings.size());
  for (size_t i = 0; i < bindings.size(); ++i) {
    infos[i] = {bindings[i].buffer->buffer, 0, VK_WHOLE_SIZE};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  fn_.vkUpdateDescriptorSets(device_, static_cast<uint32_t>(writes.size()), writes.data(), 0, nullptr);
  VkCommandBuffer cmd = frames_[current_].cmd;
  full_barrier(fn_, cmd);
  fn_.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipeline);
  fn_.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, nullptr);
  if (push_bytes) fn_.vkCmdPushConstants(cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  fn_.vkCmdDispatch(cmd, gx, gy, gz);
}

Status Device::flush() {
  const Status st = finish();
  release_temporaries();
  return st;
}

void Device::release_temporaries() {
  for (Buffer& b : staging_) free(&b);
  staging_.clear();
}

Status Device::submit() {
  if (!recording_) return MOELITE_OK;
  recording_ = false;
  Frame& f = frames_[current_];
  // Work that cannot be submitted is discarded, never run later: the temporaries it reads are
  // released with the failed call's cleanup.
  auto discard = [&](Status st) {
    fn_.vkResetCommandBuffer(f.cmd, 0);
    return st;
  };
  VkResult end = fn_.vkEndCommandBuffer(f.cmd);
  if (end != VK_SUCCESS) return discard(vk_fail(end, "vkEndCommandBuffer"));
  if (const Status st = injected_failure("a submission"); st != MOELITE_OK) return discard(st);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &f.cmd;
  // The expert tier's transfers this work reads must have landed.
  VkTimelineSemaphoreSubmitInfo ts{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  const VkPipelineStageFlags wait_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  if (wait_value_ > 0 && timeline_) {
    ts.waitSemaphoreValueCount = 1;
    ts.pWaitSemaphoreValues = &wait_value_;
    si.pNext = &ts;
    si.waitSemaphoreCount = 1;
    si.pWaitSemaphores = &timeline_;
    si.pWaitDstStageMask = &wait_stage;
  } else if (wait_value_ > 0) {
    for (const PendingTransfer& t : transfers_)
      if (t.value <= wait_value_) fn_.vkWaitForFences(device_, 1, &t.fence, VK_TRUE, UINT64_MAX);
  }
  VkResult submitted;
  {
    std::lock_guard<std::mutex> queue_lock(shared_->queue_mu);
    submitted = fn_.vkQueueSubmit(queue_, 1, &si, f.fence);
  }
  if (submitted != VK_SUCCESS) return discard(vk_fail(submitted, "vkQueueSubmit"));
  f.in_flight = true;
  wait_value_ = 0;
  // The next recording goes into a frame that is not in flight.
  current_ = frames_.size();
  for (size_t i = 0; i < frames_.size(); ++i)
    if (!frames_[i].in_flight) current_ = i;
  if (current_ == frames_.size()) MOELITE_TRY(new_frame());
  return MOELITE_OK;
}

Status Device::new_frame() {
  Frame f;
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = cmd_pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  VK_TRY(fn_.vkAllocateCommandBuffers(device_, &cai, &f.cmd), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VK_TRY(fn_.vkCreateFence(device_, &fci, nullptr, &f.fence), "vkCreateFence");
  frames_.push_back(f);
  current_ = frames_.size() - 1;
  return MOELITE_OK;
}

Status Device::finish() {
  Status st = MOELITE_OK;
  if (error_ != MOELITE_OK) {
    st = fail(error_, "%s (the work recorded since the last submission was discarded)", error_msg_.c_str());
    error_ = MOELITE_OK;
    if (recording_) {
      fn_.vkEndCommandBuffer(frames_[current_].cmd);
      fn_.vkResetCommandBuffer(frames_[current_].cmd, 0);
      recording_ = false;
    }
  } else {
    st = submit();
  }
  for (Frame& f : frames_) {
    if (!f.in_flight) continue;
    const VkResult r = fn_.vkWaitForFences(device_, 1, &f.fence, VK_TRUE, UINT64_MAX);
    if (r != VK_SUCCESS && st == MOELITE_OK) st = vk_fail(r, "vkWaitForFences");
    fn_.vkResetFences(device_, 1, &f.fence);
    fn_.vkResetCommandBuffer(f.cmd, 0);
    f.in_flight = false;
  }
  fn_.vkResetDescriptorPool(device_, desc_pool_, 0);
  sets_used_ = 0;
  // Transfers that no submitted work waited for (nothing was recorded after them, or it was
  // discarded) may still be landing: wait for them too, since what a finish leaves is trusted (a
  // device-tier slot released now may be read by any stream next).
  reclaim_transfers(/*all=*/wait_value_ > 0);
  wait_value_ = 0;
  return st;
}

}  // namespace moelite::vk
