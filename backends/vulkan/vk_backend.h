// The Vulkan backend: every operation of backends/backend.h as a GLSL compute shader (fused
// dequantize + matrix-vector products for every weight type the CPU backend supports, attention
// over a KV cache in device memory, routing on the device with only the chosen experts read back).
//
// Memory: dense weights are uploaded at load (tensors beyond maxStorageBufferRange are split by
// rows) and found again by host address; resident experts are uploaded on first use and kept;
// experts from the memory-budgeted store are read in place from its slots on unified-memory
// devices (zero copy) and go through a device tier of expert slots on discrete ones. Activations
// and KV caches live in device memory; only routing decisions and logits come back. Work is
// recorded into command buffers and submitted when the host needs a result, at the end of a
// budgeted expert, or at sync().
//
// Peers (create_peer): each a command stream of its own on the same device, sharing the cached
// device copies of weights (found and filled under a lock, each copy complete before it can be
// found), the zero-copy slot pool and the device tier, so contexts evaluate on them at the same
// time. A tier slot is one stream's from its first use in an expert pass until that stream has run
// the pass (no stream waits for another's work): another stream that needs the same expert
// meanwhile, or finds every slot held by others, reads a copy of its own for that submission.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/device_tier.h"
#include "backends/vulkan/vk_device.h"

namespace moelite::vk {

class VulkanBackend final : public Backend {
 public:
  // `allow_cpu`: accept CPU implementations of Vulkan (lavapipe) -- when asked for explicitly.
  static Status create(bool allow_cpu, std::unique_ptr<Backend>* out);
  ~VulkanBackend() override;

  BackendKind kind() const override { return BackendKind::Vulkan; }
  const char* name() const override { return name_.c_str(); }
  int32_t n_threads() const override { return 1; }
  Status create_peer(std::unique_ptr<Backend>* out) override;

  void* alloc_shared(uint64_t bytes) override;
  void free_shared(void* p) override;
  void set_device_tier_slots(int64_t slots) override { tier_slots_ = slots; }
  Status place_weight(const WeightView& w) override;
  Status check_weight(const WeightView& w) override;
  Status alloc_act(int64_t rows, int64_t cols, Act* out) override;
  void free_act(Act* a) override;
  Act view_rows(const Act& a, int64_t row0, int64_t n) override;
  Status read_rows(const Act& a, int64_t row0, int64_t n, float* dst) override;
  Status alloc_kv(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim, bool values,
                  KvCache* out) override;
  void free_kv(KvCache* kv) override;
  Status read_kv(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n, float* keys, float* values) override;
  Status write_kv(KvCache* kv, int32_t layer, int32_t slot0, int32_t n, const float* keys, const float* values) override;
  Status sync() override;

  Status get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) override;
  Status rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) override;
  Status matmul(const WeightView& w, const Act& x, const float* bias, Act* out) override;
  Status add(Act* x, const Act& y) override;
  Status scale(Act* x, float s) override;
  Status add_bias(Act* x, const float* bias) override;
  Status copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups, int64_t width, Act* out,
                        int64_t out_stride, int64_t out_offset) override;
  Status rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) override;
  Status attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0, int32_t n_head,
                   int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec, Act* out) override;
  Status route(const Act& logits, int32_t k, bool renormalize, Routing* r) override;
  Status dense_ffn(const ExpertWeights& w, const FfnKind& kind, const float* gate_inp, const Act& x, Act* out) override;

  Status moe_begin(const Act& x, const FfnKind& kind, int64_t n_out_rows) override;
  Status expert_gate_up(const ExpertTask* tasks, int32_t n_tasks) override;
  Status expert_down(const ExpertTask* tasks, int32_t n_tasks) override;
  Status expert_round_end() override;
  Status moe_combine(const Routing& r, Act* out) override;
  // Zero-copy slots are read in place by work that runs after expert_down returns.
  bool reads_experts_until_round_end() const override { return true; }

  // This instance's use of the device tier so far (discrete devices under a budget).
  struct TierStats {
    uint64_t hits = 0, loads = 0;  // matrices found in a slot; copied into one
    uint64_t own_copies = 0;       // copied for one submission: other streams held the slots
  };
  TierStats tier_stats() const { return {tier_hits_, tier_loads_, tier_own_copies_}; }

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

  struct Shared;
  VulkanBackend(std::unique_ptr<Device> dev, std::shared_ptr<Shared> shared);
  static ActRef* ref(const Act& a) { return static_cast<ActRef*>(a.handle); }
  // Device copy of host weight bytes: cached (keyed by the host address, for weights whose host
  // bytes never change: placed dense weights, resident experts, gate vectors; the caller holds
  // shared_->mu, and the copy is complete on return) or temporary (this submission only: experts
  // from the budgeted store's reused slots).
  enum class Keep { Cached, Temporary };
  Status upload_weight(const WeightView& w, Keep keep, DevWeight** out);
  Status device_weight(const WeightView& w, bool keep, const DevWeight** out);
  // Norm weights, biases: uploaded once, found again by host address (null p: a dummy buffer).
  Status host_floats(const float* p, size_t n, const Buffer** out);
  // One matrix (0 gate, 1 up, 2 down) of a routed expert, wherever the device reads it from.
  Status expert_matrix(const ExpertTask& task, int chunk, const DevWeight** out);
  // `w`'s rows as they lie in `buf` from `offset` on, valid until the next moe_begin.
  const DevWeight* buffer_view(const WeightView& w, const Buffer& buf, uint64_t offset);
  // The weight as a view of shared memory (zero copy), or null if its bytes are not there. The
  // caller holds shared_->mu.
  const DevWeight* shared_weight(const WeightView& w);
  // out rows (or mapped rows) = W x rows; maps: device int buffer [in rows..., out rows...].
  void matmul_dev(const DevWeight& w, const Buffer& x, uint64_t x_off, uint64_t x_stride, const Buffer& y,
                  uint64_t y_off, uint64_t y_stride, int64_t n, const Buffer* bias, const Buffer* maps, uint32_t map_n);

  struct SharedRegion {
    Buffer buf;
    uint8_t* host = nullptr;  // 4096-aligned start handed out
    uint64_t bytes = 0;
  };
  // What an instance and its peers share, under `mu`: device copies kept across calls, keyed by
  // host address (elements of these maps stay where they are, so a pointer found under the lock
  // stays valid after it), and the zero-copy regions handed to the expert store. The first
  // instance frees them; its peers are destroyed before it.
  // Discrete devices: a tier of expert slots in device memory, as many as the store's host slots,
  // filled on the transfer queue; an expert stays there across tokens until evicted (LRU). Shared
  // by the streams by backends/device_tier.h's rule: a stream releases its slots once it has run
  // what it recorded.
  struct TierSlot : TierEntry {
    Buffer chunk[3];                      // gate, up, down
    bool has[3] = {false, false, false};  // chunks copied in for (layer, expert)
  };
  struct Shared {
    std::mutex mu;
    std::unordered_map<const void*, std::unique_ptr<DevWeight>> weights;
    std::unordered_map<const void*, Buffer> floats;
    std::vector<SharedRegion> regions;
    std::mutex tier_mu;  // guards the tier; never held together with `mu`
    std::vector<TierSlot> tier;
    uint64_t tier_clock = 0;
  };

  std::unique_ptr<Device> dev_;
  std::shared_ptr<Shared> shared_;
  bool is_peer_ = false;
  std::string name_;
  Buffer dummy_;
  std::vector<std::unique_ptr<DevWeight>> temp_weights_;  // freed after the next flush
  std::map<std::pair<ActRef*, uint64_t>, std::unique_ptr<ActRef>> views_;
  Buffer scores_;   // attention scratch
  Buffer ffn_out_;  // the routed-expert pass's per-(token, slot) outputs
  // The device tier's use by this instance (logged when it is destroyed): chunks found there,
  // chunks copied in, chunks copied for one submission because other streams held the slots.
  uint64_t tier_hits_ = 0, tier_loads_ = 0, tier_own_copies_ = 0;
  int64_t tier_slots_ = 0;  // the expert store's slot count (set_expert_pool)
  // One matrix of the expert in the device tier, copied in on a miss; gate and up are copied at
  // expert_gate_up and down at expert_down, so the down copy overlaps the gate/up compute.
  Status tier_chunk(const ExpertTask& task, int chunk, const DevWeight** out);
  // The tier slots this stream holds are free again: the recorded work reading them has run.
  void release_tier_slots();
  // The routed-expert pass in progress.
  Act pass_x_;
  FfnKind pass_kind_;
  bool pass_reads_host_ = false;  // a budgeted expert's bytes were used since the last round end
  struct PendingExpert {
    Buffer h, up, in_map, out_map;  // h = act(gate, up) rows, kept for expert_down
  };
  std::vector<PendingExpert> pending_;
};

}  // namespace moelite::vk
