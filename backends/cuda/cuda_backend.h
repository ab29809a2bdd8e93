// The CUDA backend: every operation of backends/backend.h as CUDA kernels (kernels/), run on a
// GPU through the CUDA driver (opened at run time) or on the CPU through the SIMT emulator
// (MOELITE_CUDA_EMULATOR, in builds configured with it),
// behind the same GpuRuntime interface (gpu_runtime.h).
//
// Memory: dense weights, norm vectors and biases are uploaded at first use and found again by host
// address; activations, the KV cache (one buffer per layer for keys and one for values) and
// scratch live in device memory; per-call inputs (token ids, row maps, RoPE angles, routing) go
// through a pinned, device-mapped upload arena; only routing decisions and read-back rows come
// back. Routed experts: resident ones are uploaded on first use and kept; the budgeted store's
// slots are pinned, mapped host memory (alloc_shared) that an integrated GPU reads in place (zero
// copy) and a discrete GPU copies into a device tier of as many expert slots as the store has, on
// a copy stream, with events so a kernel waits only for the matrix it reads.
//
// Peers (create_peer): each with streams, scratch and arenas of its own on the same device,
// sharing the device copies of weights (found and made under a lock, each copy complete before it
// can be found), the zero-copy slot blocks and the device tier, so contexts evaluate on them at the
// same time. A tier slot is one instance's from its first use in an expert pass until it releases
// it (recording an event on its compute stream that the next copy into the slot waits for); an
// instance that needs an expert whose slot another holds, or finds every slot held by others,
// copies the matrix into its own scratch for that pass instead of waiting.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/gpu_runtime.h"
#include "backends/device_tier.h"

namespace moelite::cuda {

class CudaBackend final : public Backend {
 public:
  // A GPU through the CUDA driver, or the emulated device when MOELITE_CUDA_EMULATOR is set
  // ("1"/"integrated" or "discrete"). MOELITE_ERR_BACKEND_UNAVAILABLE with the reason otherwise.
  static Status create(std::unique_ptr<Backend>* out);
  static Status create_with(std::unique_ptr<GpuRuntime> rt, std::unique_ptr<Backend>* out);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::Cuda; }
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
  Status measure_memory_bandwidth(double* gb_per_s) override;

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
  // Zero-copy slots are read in place, and tier copies read the slots, after expert_down returns.
  bool reads_experts_until_round_end() const override { return true; }

  // This instance's use of the device tier so far (discrete devices under a budget).
  struct TierStats {
    uint64_t hits = 0, loads = 0;  // matrices found in a slot; copied into one
    uint64_t own_copies = 0;       // copied into this pass's scratch: peers held the slots
  };
  TierStats tier_stats() const { return {tier_hits_, tier_loads_, tier_own_copies_}; }

 private:
  struct Shared;
  CudaBackend(std::shared_ptr<GpuRuntime> rt, std::shared_ptr<Shared> shared);
  Status init();

  // Device memory the backend owns, grown on demand and reused (bump allocation, reset at points
  // where every queued use of it is in stream order behind the new one).
  struct Arena {
    struct Chunk {
      uint8_t* host = nullptr;  // pinned arenas only
      uint8_t* dev = nullptr;
      size_t size = 0, used = 0;
    };
    std::vector<Chunk> chunks;
    bool pinned = false;
  };
  Status arena_take(Arena* a, size_t bytes, void** host, void** dev);
  void arena_reset(Arena* a) {
    for (auto& c : a->chunks) c.used = 0;
  }
  void arena_free(Arena* a);
  // Host data for one call (ids, maps, angles), readable by kernels queued until the next full sync.
  Status upload(const void* src, size_t bytes, const void** dev);
  // Room for a table a kernel reads many times (grouped products, their row maps, routing): the
  // host fills `*host`, then commit_table() makes it the device's. On a discrete GPU the table is
  // copied into device memory in stream order (a kernel reading mapped host memory pays a PCIe
  // round trip per read, once per warp); on an integrated one it is read in place.
  Status take_table(size_t bytes, void** host, void** dev);
  Status commit_table(void* host, void* dev, size_t bytes);
  // Launches products grouped by weight type (one launch per type): y = W x, or with gate_up
  // y = act(gate x, up x). Sets first_block.
  Status launch_grouped(const std::vector<GroupedProduct>& products, const std::vector<TensorType>& types, bool gate_up);

  int act_mode() const { return pass_kind_.activation == FfnActivation::SwiGLU ? 0 : 1; }
  Status scratch(size_t floats, float** dev) {
    void* h;
    void* d;
    MOELITE_TRY(arena_take(&scratch_, floats * sizeof(float), &h, &d));
    *dev = static_cast<float*>(d);
    return MOELITE_OK;
  }

  // A host weight's device copy, uploaded on first use (placed dense weights, resident experts)
  // and waited for, so a peer that finds it reads it complete.
  Status device_weight(const WeightView& w, WeightArg* out);
  Status device_floats(const float* p, size_t n, const float** out);  // norm vectors, biases (null: null)
  // A routed expert's matrix (0 gate, 1 up, 2 down) wherever the device reads it from.
  Status expert_matrix(const ExpertTask& t, int which, WeightArg* out);
  const uint8_t* shared_device_address(const uint8_t* host) const;  // zero-copy alias, or null
  Status tier_matrix(const ExpertTask& t, int which, WeightArg* out);
  Status wait_for_copy(EventHandle e);
  // A budgeted expert's matrix copied into this pass's scratch on the copy stream (the tier slots
  // it would use are held by peers).
  Status own_copy(const WeightView& w, WeightArg* out);
  // The tier slots this instance holds are free again; copies into them wait for the kernels
  // queued so far on this compute stream. The caller holds shared_->tier_mu.
  Status release_tier_slots_locked();
  // Waits for a stream. On a device error nothing copied into the device tier since the last
  // successful full sync can be trusted: the tier is emptied (but for slots peers hold), so the
  // next evaluation copies again and is exact. (Weights are in the shared map only once their copy
  // has completed.)
  Status wait(StreamHandle s);
  void forget_tier();
  Status matmul_rows(const WeightArg& w, const float* x, int64_t x_stride, const int32_t* x_map, float* y,
                     int64_t y_stride, const int32_t* y_map, int64_t n, const float* bias);
  // The activation format of an integer product with weights of type t, or -1 when the product
  // stays in floats (a float type, or MOELITE_CUDA_PRODUCTS=float).
  int int8_format(TensorType t) const;
  // Rows r < n of x (x_stride floats apart, row x_map[r] when a map is given), cols values each,
  // quantized in `format` into this pass's scratch (act_layout.h's rows).
  Status quantize_rows(int format, const float* x, int64_t x_stride, const int32_t* x_map, int64_t n, int64_t cols,
                       const uint8_t** out);
  // The routed-expert pass's input quantized in `format`, once per pass and format.
  Status pass_quantized(int format, const uint8_t** out);
  // The product that computes h = act(gate x + bias, up x + bias) for a task's rows (x_map: device
  // rows of x, or null).
  static bool fusable(const WeightArg& gate, const WeightArg& up);  // same type and shape: one fused product
  // The gate/up products of expert_gate_up not yet queued: fused ones by weight type, the rest
  // (gate and up of different types) as separate products.
  struct GateUpLaunch {
    struct Separate {
      GroupedProduct p;
      WeightArg gate, up;
    };
    std::vector<GroupedProduct> products;
    std::vector<TensorType> types;
    std::vector<Separate> separate;
    void add(const GroupedProduct& p, const WeightArg& gate, const WeightArg& up) {
      if (fusable(gate, up)) {
        products.push_back(p);
        types.push_back(gate.type);
      } else {
        separate.push_back({p, gate, up});
      }
    }
  };
  Status flush_gate_up(GateUpLaunch* l);
  Status separate_gate_up(const GroupedProduct& p, const WeightArg& gate, const WeightArg& up);
  Status gate_up_product(const ExpertWeights& w, const WeightArg& gate, const WeightArg& up, const float* x,
                         int64_t x_stride, const int32_t* x_map, int64_t n, float* h, GroupedProduct* out);

  std::shared_ptr<GpuRuntime> rt_;
  const KernelTable* k_ = nullptr;
  std::string name_;
  StreamHandle compute_ = nullptr, copy_ = nullptr;

  struct DevBytes {
    void* dev = nullptr;
    size_t bytes = 0;
  };
  struct SharedBlock {
    uint8_t* host = nullptr;
    uint8_t* dev = nullptr;
    uint64_t bytes = 0;
  };
  // Discrete GPUs: a device tier of expert slots, as many as the store's host slots, shared by the
  // instances by backends/device_tier.h's rule. On release the holder records `released` on its
  // compute stream (after every kernel that reads the slot), and the next holder's copy stream
  // waits for it before copying in; a kernel reading a matrix waits for that matrix's `copied`.
  struct TierSlot : TierEntry {
    uint8_t* chunk[3] = {nullptr, nullptr, nullptr};
    size_t capacity[3] = {0, 0, 0};
    bool has[3] = {false, false, false};
    EventHandle copied[3] = {nullptr, nullptr, nullptr};
    EventHandle released = nullptr;
  };
  // What an instance and its peers share: under `mu`, device copies of weights by host address and
  // the zero-copy blocks handed to the expert store; under `tier_mu` (taken after `mu` where both
  // are), the device tier. The first instance frees them; its peers are destroyed before it.
  struct Shared {
    std::mutex mu;
    std::unordered_map<const void*, DevBytes> weights;
    std::vector<SharedBlock> blocks;
    std::mutex tier_mu;
    std::vector<TierSlot> tier;
    uint64_t tier_clock = 0;
  };
  std::shared_ptr<Shared> shared_;
  bool is_peer_ = false;
  Arena uploads_, scratch_, tables_;

  struct KvRef {
    std::vector<float*> k, v;  // per layer: slots x kv_dim floats
  };
  float* attn_partial_ = nullptr;  // the split attention's per-chunk results
  size_t attn_partial_floats_ = 0;

  int64_t tier_slots_ = 0;
  // Matrices found in the tier, copied into it, and copied into scratch because peers held the slots.
  uint64_t tier_hits_ = 0, tier_loads_ = 0, tier_own_copies_ = 0;
  EventHandle compute_point_ = nullptr, own_copied_ = nullptr;

  bool int8_ = true;  // integer products for quantized weights (MOELITE_CUDA_PRODUCTS)

  // The routed-expert pass in progress.
  const float* pass_x_ = nullptr;
  int64_t pass_cols_ = 0, pass_rows_ = 0, pass_n_ = 0;
  const uint8_t* pass_q_[3] = {nullptr, nullptr, nullptr};  // its input quantized, by format
  FfnKind pass_kind_;
  float* pass_out_ = nullptr;
  struct PendingTask {
    float* h = nullptr;
    int64_t ff = 0, rows = 0;
    const int32_t* out_map = nullptr;  // device rows of the pass's outputs the down product writes
  };
  std::vector<PendingTask> pending_;
};

}  // namespace moelite::cuda
