// The Vulkan functions the backend calls, loaded at run time: the Vulkan loader (libvulkan.so.1)
// is dlopen()ed, so libmoelite has no link-time dependency on it and loads (and runs on the CPU)
// on machines without it. The headers are still needed to build (types, PFN_* declarations);
// VK_NO_PROTOTYPES keeps any direct call to a Vulkan function from compiling.
//
// Every function is listed once, in one of the lists below, by the level it is resolved at:
//   global    vkGetInstanceProcAddr(NULL, ...), before an instance exists
//   instance  vkGetInstanceProcAddr(instance, ...), after vkCreateInstance
//   device    vkGetDeviceProcAddr(device, ...), after vkCreateDevice (no loader trampoline)
// The "optional" lists may stay null: extensions, and Vulkan 1.2 functions on older devices.
#pragma once
#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include "base/status.h"

namespace moelite::vk {

#define MOELITE_VK_GLOBAL_FUNCTIONS(X) X(vkCreateInstance)

#define MOELITE_VK_INSTANCE_FUNCTIONS(X)      \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define MOELITE_VK_INSTANCE_OPTIONAL_FUNCTIONS(X) \
  X(vkCreateDebugUtilsMessengerEXT)               \
  X(vkDestroyDebugUtilsMessengerEXT)

#define MOELITE_VK_DEVICE_FUNCTIONS(X) \
  X(vkDestroyDevice)                   \
  X(vkDeviceWaitIdle)                  \
  X(vkGetDeviceQueue)                  \
  X(vkQueueSubmit)                     \
  X(vkCreateBuffer)                    \
  X(vkDestroyBuffer)                   \
  X(vkGetBufferMemoryRequirements)     \
  X(vkAllocateMemory)                  \
  X(vkFreeMemory)                      \
  X(vkBindBufferMemory)                \
  X(vkMapMemory)                       \
  X(vkUnmapMemory)                     \
  X(vkCreateFence)                     \
  X(vkDestroyFence)                    \
  X(vkResetFences)                     \
  X(vkGetFenceStatus)                  \
  X(vkWaitForFences)                   \
  X(vkCreateSemaphore)                 \
  X(vkDestroySemaphore)                \
  X(vkCreateCommandPool)               \
  X(vkDestroyCommandPool)              \
  X(vkAllocateCommandBuffers)          \
  X(vkFreeCommandBuffers)              \
  X(vkBeginCommandBuffer)              \
  X(vkEndCommandBuffer)                \
  X(vkResetCommandBuffer)              \
  X(vkCmdBindPipeline)                 \
  X(vkCmdBindDescriptorSets)           \
  X(vkCmdPushConstants)                \
  X(vkCmdDispatch)                     \
  X(vkCmdPipelineBarrier)              \
  X(vkCmdCopyBuffer)                   \
  X(vkCreateShaderModule)              \
  X(vkDestroyShaderModule)             \
  X(vkCreatePipelineCache)             \
  X(vkDestroyPipelineCache)            \
  X(vkCreatePipelineLayout)            \
  X(vkDestroyPipelineLayout)           \
  X(vkCreateComputePipelines)          \
  X(vkDestroyPipeline)                 \
  X(vkCreateDescriptorSetLayout)       \
  X(vkDestroyDescriptorSetLayout)      \
  X(vkCreateDescriptorPool)            \
  X(vkDestroyDescriptorPool)           \
  X(vkResetDescriptorPool)             \
  X(vkAllocateDescriptorSets)          \
  X(vkUpdateDescriptorSets)

// Timeline semaphores (core in Vulkan 1.2): used only where the device offers them.
#define MOELITE_VK_DEVICE_OPTIONAL_FUNCTIONS(X) \
  X(vkWaitSemaphores)                           \
  X(vkGetSemaphoreCounterValue)

// One table per Device: instance and device functions belong to that instance and device.
struct Functions {
#define MOELITE_VK_MEMBER(name) PFN_##name name = nullptr;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  MOELITE_VK_GLOBAL_FUNCTIONS(MOELITE_VK_MEMBER)
  MOELITE_VK_INSTANCE_FUNCTIONS(MOELITE_VK_MEMBER)
  MOELITE_VK_INSTANCE_OPTIONAL_FUNCTIONS(MOELITE_VK_MEMBER)
  MOELITE_VK_DEVICE_FUNCTIONS(MOELITE_VK_MEMBER)
  MOELITE_VK_DEVICE_OPTIONAL_FUNCTIONS(MOELITE_VK_MEMBER)
#undef MOELITE_VK_MEMBER

  // Opens the Vulkan loader (once per process; it stays loaded) and resolves the global
  // functions. The loader is libvulkan.so.1, else libvulkan.so; MOELITE_VULKAN_LOADER names
  // another file instead (tests simulate a machine without the loader with a nonexistent path).
  // Fails with MOELITE_ERR_BACKEND_UNAVAILABLE naming the library and dlerror()'s reason.
  Status load_global();
  // After vkCreateInstance / vkCreateDevice: that instance's / device's functions.
  Status load_instance(VkInstance instance);
  Status load_device(VkDevice device);
};

}  // namespace moelite::vk
