// Where routed-expert weights come from: the interface core/moe/ drives for every layer, and its
// resident implementation (views into the model file). The memory-budgeted ExpertStore
// (expert_store.h) implements the same interface with a slot pool and asynchronous loads.
//
// Only core/moe/expert_executor.cpp calls the load protocol (prepare, extend_round, acquire_next,
// wait_down, release); predictors reach the source through hint() and on_routing() only.
#pragma once
#include <climits>
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "core/experts/cache_policy.h"

namespace moelite {

struct LayerWeights;

// An expert handed out by ExpertSource::take_ready: its id and where its matrices are.
struct ReadyExpert {
  int32_t expert = 0;
  ExpertWeights w;
};

// Protocol for one layer: `prepare(layer, experts)` starts making a round of at most capacity()
// experts available (loads begin, in the given order); then `take_ready` may hand out at once
// those already in memory, and `acquire_next` is called until the round is used up: it blocks
// until *some* expert of the round is ready and returns that one, so resident experts are computed
// first and the rest in arrival order (ProMoE); each is `release`d once the backend no longer
// reads it.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // True when every expert is always in memory at a fixed address (a layer's experts may then
  // run in one pass, and a device backend may keep its copies).
  virtual bool all_resident() const { return false; }
  // Whether expert `expert` of `layer` is in memory or already being loaded (using it needs no
  // new read from storage). Thread-safe; a snapshot that loads and evictions may change at once.
  virtual bool resident_or_loading(int32_t layer, int32_t expert) const { return true; }
  // The same for every expert of `layer` under one lock: (*mask)[e] for e < n_expert, 1 or 0.
  virtual void residency(int32_t layer, int32_t n_expert, std::vector<uint8_t>* mask) const {
    mask->assign(static_cast<size_t>(n_expert), 1);
  }
  // Most experts of `layer` that can be held at once.
  virtual int32_t capacity(int32_t layer) const = 0;
  // Experts the source keeps in memory at once over all layers (its slot pool; 0 when unbounded).
  virtual int64_t pool_slots() const { return 0; }
  // Routing of `layer` is now known: speculative work for it that `routing` does not need may be
  // dropped (early preemption).
  virtual void on_routing(int32_t layer, const Routing& routing) {}
  // Predicted experts of coming layers (a predictor's guesses): the source may load them
  // speculatively. `upcoming_layer` is the layer whose prepare() comes next: its experts are
  // secured first, so the guesses wait for that prepare(); -1 issues them at once.
  virtual void hint(const std::vector<Prediction>& predictions, int32_t upcoming_layer) {}
  [[nodiscard]] virtual Status prepare(int32_t layer, const std::vector<int32_t>& experts) = 0;
  // Adds `expert` to the round being used, as prepare() would have (its load begins, acquire_next
  // may hand it out), when that needs no wait for another context: *added is false, and nothing
  // changes, when the pins handed out in this pool (to every context) plus one would exceed
  // capacity(layer) or another context waits for the pool. A layer whose experts take several
  // rounds then keeps its reads in flight as each computed expert is released (a sliding window),
  // instead of letting the storage idle between one round's last load and the next round's first.
  // The default never adds.
  [[nodiscard]] virtual Status extend_round(int32_t layer, int32_t expert, bool* added) {
    *added = false;
    return MOELITE_OK;
  }
  // Hands out, without waiting, every expert of *pending whose matrices are all in memory now (the
  // round's hits), removing them from *pending and appending them to *out in *pending's order, so
  // that they can be computed in one pass. *out must have room for pending->size() more elements
  // (reserved): between taking an expert and appending it nothing may fail. The default hands out
  // none (acquire_next then hands them out one at a time).
  virtual void take_ready(int32_t layer, std::vector<int32_t>* pending, std::vector<ReadyExpert>* out) {}
  // Waits until one expert of *pending is ready, removes it from *pending and returns it. On an
  // I/O error returns that status; experts still pending are then released by the source.
  [[nodiscard]] virtual Status acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert,
                                            ExpertWeights* out) = 0;
  virtual void release(int32_t layer, int32_t expert) = 0;
  // An expert may be handed out by acquire_next while its down projection is still loading
  // (chunked loads); it must be waited for before `down` is used.
  [[nodiscard]] virtual Status wait_down(int32_t layer, int32_t expert) { return MOELITE_OK; }
};

// Hands out views into the model's own expert weights (everything resident).
class ResidentExperts final : public ExpertSource {
 public:
  explicit ResidentExperts(const std::vector<LayerWeights>* layers) : layers_(layers) {}
  bool all_resident() const override { return true; }
  int32_t capacity(int32_t) const override { return INT32_MAX; }
  Status prepare(int32_t, const std::vector<int32_t>&) override { return MOELITE_OK; }
  Status acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert, ExpertWeights* out) override;
  void release(int32_t, int32_t) override {}

 private:
  const std::vector<LayerWeights>* layers_;
};

}  // namespace moelite
