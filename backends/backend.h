// The compute-backend interface: everything core asks of a device, and nothing more.
//
// A backend only computes. Core (core/) decides what runs, in which order and with which weights:
// the layer sequence, routing, gating, prediction, the expert store's loads, pins and releases all
// live there, once. Model code holds activations as opaque `Act` handles that the backend
// allocates, so a GPU backend keeps them in device memory and only routing decisions (expert ids
// and weights) and final logits come back to the host.
//
// Weights are `WeightView`s: bytes in their file format. Dense weights are `place_weight`ed once
// at load (the CPU backend uses the host bytes in place, a GPU backend uploads them and finds its
// copy again by the host address). Routed experts are handed to the backend one task at a time by
// core/moe/ (see the expert operations below); their bytes may come from the file mapping or from
// a slot of the memory-budgeted expert store.
//
// Errors: every operation that can fail returns a Status. A backend that records work and runs
// it later (Vulkan, CUDA) reports a failure of recorded work from the next operation that waits
// for the device, and at the latest from sync(), which core calls before an evaluation reports
// success. No operation throws.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/rope_angles.h"
#include "base/status.h"
#include "base/types.h"

namespace moelite {

// A 2-D weight matrix in its file format: `rows` rows of `cols` elements (GGUF ne1 x ne0),
// each row `row_bytes` long, rows contiguous.
struct WeightView {
  TensorType type = TensorType::F32;
  int64_t cols = 0;  // input dimension (ne0)
  int64_t rows = 0;  // output dimension (ne1)
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;  // host bytes (file mapping, owned copy or expert-store slot);
                                  // null for experts that live only in the file (expert store)
  uint64_t file_offset = 0;       // where the bytes are in the model file
  // The bytes are the model file's read-only mapping: a backend that keeps a copy of its own may
  // drop them from the process's memory (platform::release_mapped_pages); they are read again from
  // the file if touched. False for owned copies and expert-store slots, whose memory is the data.
  bool mapped = false;
  bool valid() const { return data != nullptr; }
  uint64_t bytes() const { return row_bytes * static_cast<uint64_t>(rows); }
};

// An activation matrix owned by the backend: `rows` vectors (tokens) of `cols` floats.
struct Act {
  void* handle = nullptr;  // backend-specific (host float* on the CPU backend)
  int64_t rows = 0;
  int64_t cols = 0;
};

enum class RopeStyle { Normal /* pairs (2i, 2i+1) */, Neox /* pairs (i, i + n_rot/2) */ };

struct RopeParams {
  RopeStyle style = RopeStyle::Normal;
  int32_t n_rot = 0;  // rotated dimensions per head (<= head_dim)
  float freq_base = 10000.0f;
  RopeScaling scaling;  // context extension (YaRN); none by default (base/rope_angles.h)
};

// Router output for a batch: for token t, slot j: expert ids[t*k + j] with weight w[t*k + j].
// Adaptive gating marks a dropped slot with id -1 and weight 0; it contributes nothing.
struct Routing {
  int32_t n_tokens = 0;
  int32_t k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// How an expert's gate and up projections combine into its hidden activation h.
enum class FfnActivation {
  SwiGLU,         // h = silu(g) * u (Mixtral, Qwen, OLMoE, DeepSeek)
  SwiGLUClamped,  // gpt-oss: g' = min(g, limit), u' = clamp(u, -limit, limit),
                  // h = g' * sigmoid(alpha * g') * (u' + 1)
};

struct FfnKind {
  FfnActivation activation = FfnActivation::SwiGLU;
  float alpha = 1.702f;  // SwiGLUClamped only
  float limit = 7.0f;    // SwiGLUClamped only
};

// The three matrices of one routed (or shared) expert, with optional per-output-row biases
// (host floats that live as long as the model; null when the architecture has none).
struct ExpertWeights {
  WeightView gate, up, down;
  const float* gate_bias = nullptr;  // gate.rows floats
  const float* up_bias = nullptr;    // up.rows floats
  const float* down_bias = nullptr;  // down.rows floats
  // Matrix c in the order the file and a slot hold them: 0 gate, 1 up, 2 down.
  const WeightView& matrix(int c) const { return c == 0 ? gate : c == 1 ? up : down; }
  WeightView& matrix(int c) { return c == 0 ? gate : c == 1 ? up : down; }
};

// One routed expert applied to some rows of a layer's MoE input (core/moe/ builds these).
struct ExpertTask {
  int32_t layer = 0, expert = 0;
  ExpertWeights w;
  // The weight bytes stay at this address for the model's life (resident experts): a device
  // backend may keep its copy across calls. False for expert-store slots, which are refilled.
  bool resident = false;
  const int32_t* x_rows = nullptr;    // rows of the MoE input this expert reads
  const int32_t* out_rows = nullptr;  // rows (token * k + slot) of the pass's outputs it writes
  int32_t n_rows = 0;
};

// Each layer's cache holds its last `slots[l]` positions: position p lives in slot p % slots[l].
// A layer that attends to everything holds the whole context (slots = n_ctx); a sliding-window
// layer holds only its window plus one batch, which is what bounds a long context's cache.
// A keys-only cache (values = false) stores no value rows: each head's value is the first
// AttentionSpec::head_dim_v floats of its key row. That is multi-head latent attention (DeepSeek)
// after absorption, where one shared row [latent | rope key] serves every head as key and value,
// and it is why such a cache is several times smaller than K and V of the same heads.
struct KvCache {
  void* handle = nullptr;
  int32_t n_layers = 0;
  int32_t n_ctx = 0;  // positions a sequence may have
  int64_t kv_dim = 0;  // floats of one position's key row (and value row, if stored)
  bool values = true;
  std::vector<int32_t> slots;  // per layer, 1 <= slots[l] <= n_ctx
};

// How a layer attends, beyond causal softmax(q.k * scale) v over every earlier position.
struct AttentionSpec {
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  // Floats of a value head and of each output head; 0: head_dim. Below head_dim only with a
  // keys-only cache (the value is the key row's first head_dim_v floats).
  int64_t head_dim_v = 0;
  // > 0: the query at position p sees only keys at positions (p - window, p] (sliding window);
  // the layer's cache must hold at least window - 1 + (the batch's tokens) slots.
  int32_t window = 0;
  // n_head host floats that live as long as the model, or null: head h's "sink" logit joins its
  // softmax denominator and weighs no value (gpt-oss), so a head can attend to nothing.
  const float* sinks = nullptr;
};

enum class BackendKind { Auto = 0, Cpu = 1, Vulkan = 2, Cuda = 3 };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // Human-readable name, e.g. "cpu (avx512)".
  virtual const char* name() const = 0;
  virtual int32_t n_threads() const = 0;

  // Another instance of this backend for a context that evaluates while others do: it computes
  // with the weights placed on this one (which must outlive it) and has its own threads (CPU) or
  // command stream (Vulkan) and scratch, so two instances may run operations at the same time.
  // MOELITE_ERR_NOT_IMPLEMENTED where the instance cannot be shared that way (a backend that does
  // not override this): the contexts of such a backend take turns on the one instance.
  [[nodiscard]] virtual Status create_peer(std::unique_ptr<Backend>* out) {
    return fail(MOELITE_ERR_NOT_IMPLEMENTED, "%s: contexts take turns on one instance", name());
  }
  // Peers evaluating at the same time share the machine's cores: the next operations use at most
  // `n` of this instance's threads (clamped to 1..n_threads(); n_threads() gives them all back).
  virtual void limit_threads(int32_t n) {}

  // ---- memory
  // Host memory this backend computes on in place (a unified-memory GPU's host-visible device
  // memory), for the expert store's slot pool: `bytes` at a 4096-aligned address, or null when the
  // backend has none to offer (the store then uses ordinary memory and the backend copies experts
  // in). Released with free_shared before the backend is destroyed.
  virtual void* alloc_shared(uint64_t bytes) { return nullptr; }
  virtual void free_shared(void* p) {}
  // Most expert slots a device tier (a discrete GPU's copies of store-loaded experts) may keep,
  // decided by core's memory plan (ExpertMemoryPlan::device_tier_slots): no more than the host
  // pool, so device memory stays within the budget too (but for one submission's copies where peers
  // hold the slots it would use). A backend without a device tier ignores it.
  virtual void set_device_tier_slots(int64_t slots) {}
  // Called once per dense weight at load; the weight's host bytes stay valid and unchanged for the
  // backend's life, so a device copy can be found again by `w.data`.
  [[nodiscard]] virtual Status place_weight(const WeightView& w) = 0;
  // Whether the backend can compute with this weight's type (for weights placed later, such as
  // experts the store loads).
  [[nodiscard]] virtual Status check_weight(const WeightView& w) = 0;
  // Called once per routed expert at load when every expert stays resident (no expert store), so
  // its bytes stay valid and unchanged for the backend's life: the backend may lay out a copy of
  // its own now instead of on first use (the CPU backend's grouped rows). Default: nothing.
  [[nodiscard]] virtual Status place_expert(const ExpertWeights& w) { return MOELITE_OK; }
  [[nodiscard]] virtual Status alloc_act(int64_t rows, int64_t cols, Act* out) = 0;
  virtual void free_act(Act* a) = 0;
  // Rows [row0, row0 + n) of `a` as an Act sharing its memory (not to be freed).
  virtual Act view_rows(const Act& a, int64_t row0, int64_t n) = 0;
  // Copies rows [row0, row0 + n) of `a` to host floats (n * cols); waits for the device.
  [[nodiscard]] virtual Status read_rows(const Act& a, int64_t row0, int64_t n, float* dst) = 0;

  // A KV cache for sequences of up to n_ctx positions: layer l holds slots[l] positions (see
  // KvCache) of kv_dim floats each for keys and, if `values`, for values. Each context owns one; the
  // backend instance is shared by the contexts that take turns on it (core/exec/runtime.h).
  [[nodiscard]] virtual Status alloc_kv(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim,
                                        bool values, KvCache* out) = 0;
  virtual void free_kv(KvCache* kv) = 0;
  // Copies slots [slot0, slot0 + n) of `layer`'s cache to host floats: n * kv_dim key floats to
  // `keys` and, if the cache stores values, as many to `values` (else unused). Waits for the
  // device. Saving a context's state (core/exec/session.cpp).
  [[nodiscard]] virtual Status read_kv(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n, float* keys,
                                       float* values) = 0;
  // The reverse: host rows into those slots (restoring a saved state). Waits for the device.
  [[nodiscard]] virtual Status write_kv(KvCache* kv, int32_t layer, int32_t slot0, int32_t n, const float* keys,
                                        const float* values) = 0;

  // Measures the device's own memory bandwidth in GB/s (bytes read plus bytes written per second by a
  // copy within device memory) for benchmarks' decode bounds; MOELITE_ERR_NOT_IMPLEMENTED where the
  // device is the host's memory (the CPU backend: measure DRAM instead). Waits for the device.
  [[nodiscard]] virtual Status measure_memory_bandwidth(double* gb_per_s) {
    return fail(MOELITE_ERR_NOT_IMPLEMENTED, "%s computes in host memory: measure DRAM bandwidth", name());
  }

  // Waits for all recorded work and returns the first error of any of it since the last sync()
  // (MOELITE_OK when everything ran). Core calls it before an evaluation reports success.
  [[nodiscard]] virtual Status sync() = 0;

  // ---- dense operations. Unless stated, `rows` of the output equals `rows` of the input.

  // out[t] = dequant(embedding row tokens[t]).
  [[nodiscard]] virtual Status get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) = 0;
  // out = x / rms(x) * w over groups of `group` columns (group = cols for a plain RMSNorm,
  // head_dim for a per-head norm); `w` has `group` floats or is null. In place is allowed.
  [[nodiscard]] virtual Status rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) = 0;
  // out[t] = W x[t] (+ bias). out->cols must be W.rows.
  [[nodiscard]] virtual Status matmul(const WeightView& w, const Act& x, const float* bias, Act* out) = 0;
  // x += y.
  [[nodiscard]] virtual Status add(Act* x, const Act& y) = 0;
  // x *= s (Granite's embedding and residual multipliers).
  [[nodiscard]] virtual Status scale(Act* x, float s) = 0;
  // x[t] += bias for every row t; `bias` has x->cols host floats that live as long as the model
  // (norms with a bias: phimoe).
  [[nodiscard]] virtual Status add_bias(Act* x, const float* bias) = 0;
  // Copies column blocks: for g < n_groups and c < width,
  //   out[t, g * out_stride + out_offset + c] = x[t, g * x_stride + x_offset + c]
  // for every row t of x (out has at least as many rows). Gathers one head's slice of every
  // token, or lays pieces side by side (MLA's [latent | rope key] rows). x and out differ.
  [[nodiscard]] virtual Status copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups,
                                            int64_t width, Act* out, int64_t out_stride, int64_t out_offset) = 0;
  // Rotates the first n_rot dims of each head_dim-sized head of x; token t is at positions[t].
  [[nodiscard]] virtual Status rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) = 0;
  // Writes the k and v rows of a batch into the cache of `layer` at positions pos0.. and attends:
  // out[t] for query heads q[t] over cache positions [0, pos0 + t] (causal; `spec` may narrow it to
  // a window and add sinks), GQA by n_head_kv. With a keys-only cache `v` is not read and each
  // value is the first spec.head_dim_v floats of its key; out has n_head * head_dim_v columns.
  [[nodiscard]] virtual Status attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v,
                                         int32_t pos0, int32_t n_head, int32_t n_head_kv, int64_t head_dim,
                                         const AttentionSpec& spec, Act* out) = 0;
  // softmax over each row of `logits` (n_tokens x n_expert), top-k (ties to the lower id),
  // optional renormalisation of the k weights to sum 1. Fills `r` on the host.
  [[nodiscard]] virtual Status route(const Act& logits, int32_t k, bool renormalize, Routing* r) = 0;
  // out[t] = FFN(x[t]) * (gate_inp ? sigmoid(gate_inp . x[t]) : 1): a shared expert.
  [[nodiscard]] virtual Status dense_ffn(const ExpertWeights& w, const FfnKind& kind, const float* gate_inp,
                                         const Act& x, Act* out) = 0;

  // ---- routed experts. core/moe/ drives one layer's pass:
  //   moe_begin
  //   { expert_gate_up(tasks) [core waits for the down matrices] expert_down(tasks) }...
  //   expert_round_end    (after each round: the experts the store holds at once)
  //   moe_combine
  // The calls of one pass come from one thread in this order, with nothing else in between.

  // Starts a layer's pass over the MoE input `x`; expert outputs go to `n_out_rows` rows
  // (token * k + slot) of scratch the backend keeps until moe_combine.
  [[nodiscard]] virtual Status moe_begin(const Act& x, const FfnKind& kind, int64_t n_out_rows) = 0;
  // First half of each task's FFN: h = act(gate x[row] + gate_bias, up x[row] + up_bias) for
  // every row of the task. The backend keeps h until the expert_down of the same tasks. A
  // budgeted task's down matrix may still be loading: its bytes must not be read (nor a copy of
  // them queued) before expert_down.
  [[nodiscard]] virtual Status expert_gate_up(const ExpertTask* tasks, int32_t n_tasks) = 0;
  // Second half, for the tasks of the last expert_gate_up: outputs[out_row] = down h + down_bias.
  [[nodiscard]] virtual Status expert_down(const ExpertTask* tasks, int32_t n_tasks) = 0;
  // End of a round of experts (as many as the store holds at once; where a device backend submits
  // its work and waits for it). When it returns, the backend reads no host bytes of the experts
  // passed since the last round end.
  [[nodiscard]] virtual Status expert_round_end() = 0;
  // out[t] = sum over slots j = 0..k-1, in that order, of r.weights[t,j] * outputs[t*k + j];
  // dropped slots (id -1) are skipped. Results never depend on the experts' execution order.
  [[nodiscard]] virtual Status moe_combine(const Routing& r, Act* out) = 0;
  // Whether the backend may still read an expert's host bytes after expert_down returns, until
  // the round ends (a device computing asynchronously from zero-copy memory). Core keeps such
  // experts pinned in the store until expert_round_end; otherwise it releases each at once. A
  // backend that answers false is done with each expert at expert_down, and core may also run
  // other operations (a shared expert's dense_ffn) between one expert's expert_down and the next
  // expert_gate_up of the same pass.
  virtual bool reads_experts_until_round_end() const { return false; }
};

// Creates a backend. Unavailable kinds (not built, no device) fail with
// MOELITE_ERR_BACKEND_UNAVAILABLE and a message saying why.
[[nodiscard]] Status create_backend(BackendKind kind, int32_t n_threads, std::unique_ptr<Backend>* out);

// What BackendKind::Auto picks on this machine and why (the backends tried before it and the
// reason each was passed over). Runs the same code as create_backend(Auto) -- the one place that
// decides -- and drops the backend it created; GPU probes are cached per process.
struct AutoBackendChoice {
  BackendKind kind = BackendKind::Cpu;
  std::string reason;
};
AutoBackendChoice explain_auto_backend();

}  // namespace moelite
