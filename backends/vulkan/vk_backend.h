// The Vulkan backend: every operation of backends/backend.h as a GLSL compute shader (fused
// dequantize + matrix-vector products for every weight type the CPU backend supports, attention
// over a KV cache in device memory, routing on the device with only the chosen experts read back).
//
// Memory: dense weights are uploaded at load (tensors beyond maxStorageBufferRange are split by
// rows); resident experts are uploaded on first use and kept; experts from the memory-budgeted
// store are copied per use from its host slots (on unified-memory devices a plain copy into mapped
// memory). Activations and KV caches live in device memory; only routing decisions and logits
// come back. Work is recorded into one command buffer and submitted when the host needs a result.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/vulkan/vk_device.h"

namespace moelite::vk {

class VulkanBackend final : public Backend {
 public:
  // `allow_cpu`: accept CPU implementations of Vulkan (lavapipe) -- when asked for explicitly.
  static Status create(bool allow_cpu, std::unique_ptr<Backend>* out);
  ~VulkanBackend() override;

  const char* name() const override { return name_.c_str(); }
  int32_t n_threads() const override { return 1; }

  void* alloc_shared(uint64_t bytes) override;
  void free_shared(void* p) override;
  Status place_weight(WeightView* w) override;
  Status check_weight(const WeightView& w) override;
  Status alloc_act(int64_t rows, int64_t cols, Act* out) override;
  void free_act(Act* a) override;
  Act view_rows(const Act& a, int64_t row0, int64_t n) override;
  void read_rows(const Act& a, int64_t row0, int64_t n, float* dst) override;
  Status alloc_kv(int32_t n_layers, int32_t n_ctx, int64_t kv_dim, KvCache* out) override;
  void free_kv(KvCache* kv) override;

  void get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) override;
  void rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) override;
  void matmul(const WeightView& w, const Act& x, const float* bias, Act* out) override;
  void add(Act* x, const Act& y) override;
  void rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) override;
  void attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                 int32_t n_head, int32_t n_head_kv, int64_t head_dim, Act* out) override;
  void route(const Act& logits, int32_t k, bool renormalize, Routing* r) override;
  Status moe_ffn(int32_t layer, const Act& x, const Routing& r, ExpertSource* experts, Act* out) override;
  void dense_ffn(const ExpertWeights& w, const float* gate_inp, const Act& x, Act* out) override;

 private:
  // An activation: a device buffer and an offset in floats (views share the base's buffer).
  struct ActRef {
    Buffer buf;
    uint64_t off = 0;
    ActRef* base = nullptr;
  };
  // A weight in device memory: row chunks, each within the storage-buffer range.
  struct DevWeight {
    struct Chunk {
      Buffer buf;
      uint64_t offset = 0;  // byte offset of the chunk's first row in buf
      int64_t row0 = 0, rows = 0;
    };
    TensorType type = TensorType::F32;
    uint64_t row_bytes = 0;
    int64_t cols = 0;
    std::vector<Chunk> chunks;
  };
  struct KvRef {
    std::vector<Buffer> layers;  // per layer: n_ctx rows of keys, then n_ctx rows of values
  };

  explicit VulkanBackend(std::unique_ptr<Device> dev);
  static ActRef* ref(const Act& a) { return static_cast<ActRef*>(a.handle); }
  // Device copy of host weight bytes: placed (owned for the backend's life), cached (keyed by the
  // host address, for weights whose host bytes never change: resident experts, gate vectors), or
  // temporary (this submission only: experts from the budgeted store's reused slots).
  enum class Keep { Placed, Cached, Temporary };
  Status upload_weight(const WeightView& w, Keep keep, DevWeight** out);
  const DevWeight* device_weight(const WeightView& w, bool keep);
  const Buffer& host_floats(const float* p, size_t n);  // norm weights, biases: uploaded once
  // The weight as a view of shared memory (zero copy), or null if its bytes are not there.
  const DevWeight* shared_weight(const WeightView& w);
  // out rows (or mapped rows) = W x rows; maps: device int buffer [in rows..., out rows...].
  void matmul_dev(const DevWeight& w, const Buffer& x, uint64_t x_off, uint64_t x_stride, const Buffer& y,
                  uint64_t y_off, uint64_t y_stride, int64_t n, const Buffer* bias, const Buffer* maps, uint32_t map_n);
  void remember(Status st);

  std::unique_ptr<Device> dev_;
  std::string name_;
  Buffer dummy_;
  std::vector<std::unique_ptr<DevWeight>> placed_;
  std::unordered_map<const void*, std::unique_ptr<DevWeight>> weight_cache_;
  std::vector<std::unique_ptr<DevWeight>> temp_weights_;  // freed after the next flush
  std::unordered_map<const void*, Buffer> float_cache_;
  std::map<std::pair<ActRef*, uint64_t>, std::unique_ptr<ActRef>> views_;
  Buffer scores_;   // attention scratch
  Buffer ffn_out_;  // moe_ffn's per-(token, slot) outputs
  struct Shared {
    Buffer buf;
    uint8_t* host = nullptr;  // 4096-aligned start handed out
    uint64_t bytes = 0;
  };
  std::vector<Shared> shared_;
  // Discrete devices: a tier of expert slots in device memory, as many as the store's host slots,
  // filled on the transfer queue; an expert stays there across tokens until evicted (LRU).
  struct TierSlot {
    int32_t layer = -1, expert = -1;
    Buffer chunk[3];           // gate, up, down
    uint64_t last_use = 0;
    bool in_use = false;       // read by work recorded since the last submission
  };
  std::vector<TierSlot> tier_;
  uint64_t tier_clock_ = 0, tier_hits_ = 0, tier_loads_ = 0;
  // The expert's matrices in the device tier (loading them on a miss), or false on failure.
  bool tier_expert(int32_t layer, int32_t expert, const ExpertWeights& w, int64_t pool_slots, const DevWeight* out[3]);
  Status error_ = MOELITE_OK;  // first failure of an operation that cannot return one
};

}  // namespace moelite::vk
