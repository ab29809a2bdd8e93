// The Vulkan plumbing under the Vulkan backend: instance and device choice, memory, buffers,
// compute pipelines from the embedded SPIR-V, and a command stream that records dispatches and
// is submitted only when the host needs a result (a read-back) or a staging buffer must be reused.
// One device may have several streams (create_stream), one per backend instance, each used by one
// thread at a time: they share the device, its queues and pipelines, and record and wait apart.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/vulkan/vk_loader.h"
#include "base/status.h"

namespace moelite::vk {

struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t size = 0;
  void* mapped = nullptr;  // host pointer when the memory is host-visible (unified memory)
};

// A storage-buffer binding: a whole buffer (shaders index it with offsets from push constants,
// so no descriptor offset alignment applies).
struct Binding {
  const Buffer* buffer;
};

struct DeviceFacts {
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint64_t max_storage_range = 0;  // maxStorageBufferRange
  bool unified_memory = false;     // a device-local memory type is host-visible, on a device that is not discrete
  bool fp16 = false, int8 = false, subgroups = false, storage8 = false;
  bool use_subgroups = false;  // subgroup arithmetic in compute shaders, and not disabled by MOELITE_VK_PORTABLE
  uint32_t subgroup_size = 0;
  bool dedicated_transfer_queue = false;  // a queue family for transfers only
  bool timeline_semaphores = false;
};

class Device {
 public:
  ~Device();
  // Picks a device: MOELITE_VK_DEVICE=index forces one; else discrete > integrated > virtual >
  // CPU implementations. `allow_cpu` false refuses CPU implementations (the "auto" choice).
  // MOELITE_VK_VALIDATION=1 enables the Khronos validation layer; its messages are counted and
  // logged as errors.
  static Status create(bool allow_cpu, std::unique_ptr<Device>* out);
  // Another command stream on this device, for a backend instance that evaluates on another
  // thread: its own command and descriptor pools, frames, temporaries and transfers; the instance,
  // device, queues (each submission under a lock, as Vulkan requires) and pipelines (created under
  // a lock) are shared and live until the last stream is destroyed. Buffers may be freed by any
  // stream. Destroy streams before the device they came from.
  Status create_stream(std::unique_ptr<Device>* out);

  const DeviceFacts& facts() const { return facts_; }
  static uint64_t validation_messages();
  // Test hook (tests/test_backend_faults.cpp): the n-th fallible device operation from now on
  // (an allocation, a recorded dispatch, a submission or a read-back) fails as a real failure
  // would; 0 turns it off. Process-wide.
  static void fail_nth_operation_for_testing(int64_t n);
  // Test hook (tests/test_vulkan_ops.cpp): a stream submits what it recorded whenever `n`
  // descriptor sets were used since its last submission, as it does when the pool runs out; 0
  // restores the pool's size. Process-wide.
  static void submit_every_n_sets_for_testing(uint32_t n);

  // Device-local memory, host-visible when the device has such memory (then `mapped` is set).
  Status alloc(uint64_t bytes, Buffer* out);
  void free(Buffer* b);
  // Host -> buffer. Directly when mapped; otherwise through a staging buffer, copied in the
  // command stream (so ordered with the dispatches recorded around it).
  Status upload(const Buffer& dst, uint64_t offset, const void* src, uint64_t bytes);
  // Fills a buffer that no recorded work uses yet (just allocated): a plain copy when mapped.
  Status write_new(const Buffer& dst, const void* src, uint64_t bytes);
  // Fills a buffer that no recorded work uses yet, complete when this returns (a plain copy when
  // mapped, else a copy submitted on its own and waited for): for copies other streams may read
  // at once, such as the backend's shared caches of weights.
  Status write_now(const Buffer& dst, const void* src, uint64_t bytes);
  // A buffer holding `bytes` of `data` (or uninitialised when data is null) that lives until the
  // next flush: per-call inputs such as token ids, row maps and rotation angles.
  Status temp(const void* data, uint64_t bytes, Buffer* out);
  // Buffer -> host: flushes the command stream first.
  Status download(const Buffer& src, uint64_t offset, void* dst, uint64_t bytes);

  // A device-local buffer that both the compute and the transfer queue use (the expert tier).
  Status alloc_device(uint64_t bytes, Buffer* out);
  // Copies host bytes into `dst` on the transfer queue, at once (its own queue family where the
  // device has one): a staging copy submitted immediately, signalling a timeline semaphore (a
  // fence where timelines are missing). Work recorded afterwards waits for it at its submission,
  // so transfers overlap the recording and the host's waits for storage.
  Status transfer(const Buffer& dst, const void* src, uint64_t bytes);

  // Records a dispatch of shader `name` (with specialization constant 0 = spec) over `groups`
  // workgroups, after a barrier on every earlier dispatch's writes.
  void dispatch(const char* name, uint32_t spec, const std::vector<Binding>& bindings, const void* push,
                uint32_t push_bytes, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1);
  // Submits what was recorded, waits for it, and releases the temporaries it used.
  Status flush();
  // Submits what was recorded and waits for it, keeping the temporaries: for a wait part way
  // through work whose later dispatches read them (an expert pass's gate/up outputs and row maps).
  Status finish();
  // Submits what was recorded without waiting (it runs while the host records more, and while
  // transfers proceed); a later flush waits for everything.
  Status submit();

 private:
  struct Pipeline {
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
    uint32_t n_bindings = 0;
  };
  // What the streams of one device share; destroyed with the last of them.
  struct Shared;
  explicit Device(std::shared_ptr<Shared> shared);
  Status init(bool allow_cpu);  // the four steps below, in order
  Status create_instance();
  Status pick_physical_device(bool allow_cpu);
  void read_facts();
  Status create_logical_device();
  Status init_stream();  // this stream's pools, first frame and transfer state
  Pipeline* pipeline(const char* name, uint32_t spec, uint32_t n_bindings);
  void begin_if_needed();
  void release_temporaries();
  void reclaim_transfers(bool all);
  int32_t memory_type(uint32_t type_bits, VkMemoryPropertyFlags want) const;
  Status alloc_with(uint64_t bytes, VkMemoryPropertyFlags props, Buffer* out);
  // A staging buffer holding `bytes` of `src`, and a one-time command buffer from `pool` that
  // copies it to the start of `dst`, ended and ready to submit (transfer, write_now). Nothing is
  // left allocated on failure.
  Status record_staged_copy(VkCommandPool pool, const Buffer& dst, const void* src, uint64_t bytes, Buffer* staging,
                            VkCommandBuffer* cmd);

  std::shared_ptr<Shared> shared_;
  // The device's, in shared_ (the names every stream's code uses):
  Functions& fn_;  // the Vulkan functions, loaded at run time (vk_loader.h)
  VkInstance& instance_;
  VkDebugUtilsMessengerEXT& messenger_;
  VkPhysicalDevice& physical_;
  VkDevice& device_;
  VkQueue& queue_;
  uint32_t& queue_family_;
  // Transfers: their own queue (family) where the device has one, else the compute queue.
  VkQueue& transfer_queue_;
  uint32_t& transfer_family_;
  VkPipelineCache& pipeline_cache_;
  VkPhysicalDeviceMemoryProperties& mem_props_;
  std::map<std::pair<std::string, uint32_t>, Pipeline>& pipelines_;
  bool& as_discrete_;  // MOELITE_VK_AS_DISCRETE: device buffers are never mapped
  DeviceFacts& facts_;
  // This stream's:
  VkCommandPool transfer_pool_ = VK_NULL_HANDLE;
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  uint64_t transfer_value_ = 0;  // last value signalled
  uint64_t wait_value_ = 0;      // what the next compute submission must wait for
  struct PendingTransfer {
    uint64_t value;
    VkCommandBuffer cmd;
    VkFence fence;  // when there are no timeline semaphores
    Buffer staging;
  };
  std::vector<PendingTransfer> transfers_;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  // Command buffers: the one being recorded (current_) and those submitted and not yet waited for.
  struct Frame {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    bool in_flight = false;
  };
  std::vector<Frame> frames_;
  size_t current_ = 0;
  Status new_frame();
  Status injected_failure(const char* what);  // MOELITE_OK unless fail_nth_operation_for_testing chose this one
  VkDescriptorPool desc_pool_ = VK_NULL_HANDLE;
  bool recording_ = false;
  Status error_ = MOELITE_OK;  // a dispatch that could not be recorded, reported at submission
  std::string error_msg_;
  uint32_t sets_used_ = 0;
  std::vector<Buffer> staging_;  // freed at the next flush
};

}  // namespace moelite::vk
