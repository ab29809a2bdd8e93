// The compute-backend interface: everything the model code asks of a device.
//
// Model code (core/forward.cpp) never touches activation memory directly. It holds activations as
// `Act` handles that the backend allocates, and calls the operations below on them, so a GPU
// backend keeps activations in device memory and only routing decisions (expert ids and weights)
// and final logits come back to the host. Weights are described by `WeightView`s; a backend
// `place_weight`s each one at load time (the CPU backend uses the host bytes in place, a GPU backend
// uploads them). Routed experts are not placed at load: they come from an `ExpertSource`, which is
// where the memory-budgeted expert store plugs in.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/expert_cache/policy.h"
#include "core/status.h"
#include "core/types.h"

namespace moelite {

// A 2-D weight matrix in its file format: `rows` rows of `cols` elements (GGUF ne1 x ne0),
// each row `row_bytes` long, rows contiguous.
struct WeightView {
  TensorType type = TensorType::F32;
  int64_t cols = 0;  // input dimension (ne0)
  int64_t rows = 0;  // output dimension (ne1)
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;  // host bytes (file mapping or owned copy); null for experts
                                  // that live only in the file (expert store)
  uint64_t file_offset = 0;       // where the bytes are in the model file
  void* device = nullptr;         // backend's placement of the weight, if any
  bool valid() const { return data != nullptr || device != nullptr; }
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
  int32_t n_rot = 0;       // rotated dimensions per head (<= head_dim)
  float freq_base = 10000.0f;
};

// Router output for a batch: for token t, slot j: expert ids[t*k + j] with weight w[t*k + j].
// Adaptive gating marks a dropped slot with id -1 and weight 0; backends skip such slots.
struct Routing {
  int32_t n_tokens = 0;
  int32_t k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// A batch's routing grouped by expert, for backends' moe_ffn: the experts used (ascending id) and,
// per expert, the token rows it reads and the (token * k + slot) rows its outputs fill. Slots
// dropped by adaptive gating (id -1) are left out.
class ExpertGroups {
 public:
  explicit ExpertGroups(const Routing& r);
  const std::vector<int32_t>& order() const { return order_; }
  void rows(int32_t expert, std::vector<int32_t>* x_rows, std::vector<int32_t>* out_rows) const;

 private:
  int32_t k_;
  std::vector<std::pair<int32_t, int32_t>> pairs_;  // (expert, token * k + slot), sorted
  std::vector<int32_t> order_;
};

// The three matrices of one routed expert.
struct ExpertWeights {
  WeightView gate, up, down;
};

// Supplies routed-expert weights to the backend. The resident implementation hands out views
// into the model file; the expert store (memory budget) loads on demand into a slot pool.
//
// Protocol for one layer: `prepare(layer, experts)` starts making a group of at most capacity()
// experts available (loads begin, in the given order); then `acquire_next` is called until the
// group is used up: it blocks until *some* expert of the group is ready and returns that one, so
// the backend computes resident experts first and the rest in arrival order (ProMoE); each is
// `release`d after its computation.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // True when every expert is always in memory (the backend may then batch all of a layer's
  // experts into one pass).
  virtual bool all_resident() const { return false; }
  // Most experts of `layer` that can be held at once.
  virtual int32_t capacity(int32_t layer) const = 0;
  // Experts the source keeps in memory at once over all layers (its slot pool; 0 when unbounded):
  // a GPU backend sizes its device tier of expert slots to match.
  virtual int64_t pool_slots() const { return 0; }
  // Routing of `layer` is now known: speculative work for it that `routing` does not need may be
  // dropped (early preemption).
  virtual void on_routing(int32_t layer, const Routing& routing) {}
  // Predicted experts of coming layers (a predictor's guesses): the source may load them
  // speculatively. `upcoming_layer` is the layer whose prepare() comes next: its experts are
  // secured first, so the guesses wait for that prepare(); -1 issues them at once.
  virtual void hint(const std::vector<Prediction>& predictions, int32_t upcoming_layer) {}
  virtual Status prepare(int32_t layer, const std::vector<int32_t>& experts) = 0;
  // Waits until one expert of *pending is ready, removes it from *pending and returns it. On an
  // I/O error returns that status; experts still pending are then released by the source.
  virtual Status acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert,
                              ExpertWeights* out) = 0;
  virtual void release(int32_t layer, int32_t expert) = 0;
  // An expert may be handed out by acquire_next while its down projection is still loading
  // (chunked loads); the backend calls this before using `down`.
  virtual Status wait_down(int32_t layer, int32_t expert) { return MOELITE_OK; }
};

struct KvCache {
  void* handle = nullptr;
  int32_t n_layers = 0;
  int32_t n_ctx = 0;
  int64_t kv_dim = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Human-readable name, e.g. "cpu (avx512)".
  virtual const char* name() const = 0;
  virtual int32_t n_threads() const = 0;

  // ---- memory
  // Host memory this backend computes on in place (a unified-memory GPU's host-visible device
  // memory), for the expert store's slot pool: `bytes` at a 4096-aligned address, or null when the
  // backend has none to offer (the store then uses ordinary memory and the backend copies experts
  // in). Released with free_shared before the backend is destroyed.
  virtual void* alloc_shared(uint64_t bytes) { return nullptr; }
  virtual void free_shared(void* p) {}
  virtual Status place_weight(WeightView* w) = 0;
  // Whether the backend can compute with this weight's type (for weights placed later, such as
  // experts the store loads).
  virtual Status check_weight(const WeightView& w) = 0;
  virtual Status alloc_act(int64_t rows, int64_t cols, Act* out) = 0;
  virtual void free_act(Act* a) = 0;
  // Rows [row0, row0 + n) of `a` as an Act sharing its memory (not to be freed).
  virtual Act view_rows(const Act& a, int64_t row0, int64_t n) = 0;
  // Copies rows [row0, row0 + n) of `a` to host floats (n * cols).
  virtual void read_rows(const Act& a, int64_t row0, int64_t n, float* dst) = 0;

  // A KV cache of n_layers x n_ctx positions of kv_dim floats each for keys and for values.
  // Each context owns one; the backend is shared by all contexts of a model (which evaluate one
  // at a time, see core/model.h).
  virtual Status alloc_kv(int32_t n_layers, int32_t n_ctx, int64_t kv_dim, KvCache* out) = 0;
  virtual void free_kv(KvCache* kv) = 0;

  // ---- operations. Unless stated, `rows` of the output equals `rows` of the input; all
  // operations on a batch act on its first `n` rows where an `n` is given.

  // out[t] = dequant(embedding row tokens[t]).
  virtual void get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) = 0;
  // out = x / rms(x) * w over groups of `group` columns (group = cols for a plain RMSNorm,
  // head_dim for a per-head norm); `w` has `group` floats or is null. In place is allowed.
  virtual void rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) = 0;
  // out[t] = W x[t] (+ bias). out->cols must be W.rows.
  virtual void matmul(const WeightView& w, const Act& x, const float* bias, Act* out) = 0;
  // x += y.
  virtual void add(Act* x, const Act& y) = 0;
  // Rotates the first n_rot dims of each head_dim-sized head of x; token t is at positions[t].
  virtual void rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) = 0;
  // Writes the k and v rows of a batch into the cache of `layer` at positions pos0.. and attends:
  // out[t] for query heads q[t] over cache positions [0, pos0 + t] (causal), GQA by n_head_kv.
  virtual void attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                         int32_t n_head, int32_t n_head_kv, int64_t head_dim, Act* out) = 0;
  // softmax over each row of `logits` (n_tokens x n_expert), top-k, optional renormalisation of
  // the k weights to sum 1. Fills `r` on the host.
  virtual void route(const Act& logits, int32_t k, bool renormalize, Routing* r) = 0;
  // out[t] = sum_j r.weights[t,j] * FFN_{r.ids[t,j]}(x[t]) with SwiGLU experts, adding in slot
  // order j = 0..k-1 regardless of execution order (results do not depend on which experts were
  // resident). Tokens routed to the same expert share one pass over its weights.
  virtual Status moe_ffn(int32_t layer, const Act& x, const Routing& r, ExpertSource* experts,
                         Act* out) = 0;
  // out[t] = down(silu(gate x[t]) * up x[t]) * (gate_inp ? sigmoid(gate_inp . x[t]) : 1).
  virtual void dense_ffn(const ExpertWeights& w, const float* gate_inp, const Act& x, Act* out) = 0;
};

enum class BackendKind { Auto = 0, Cpu = 1, Vulkan = 2, Cuda = 3 };

// Creates a backend. Unavailable kinds (not built, no device) fail with
// MOELITE_ERR_BACKEND_UNAVAILABLE and a message saying why.
Status create_backend(BackendKind kind, int32_t n_threads, std::unique_ptr<Backend>* out);

}  // namespace moelite
