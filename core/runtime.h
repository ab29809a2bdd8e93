// What executes a Model: the backend, the source of routed-expert weights (resident views or the
// memory-budgeted store), the calibration profile, the predictor, the gating rule and the routing
// counters. One Runtime per loaded model, shared by all of its contexts.
//
// Threading: contexts with a backend instance of their own (Backend::create_peer) evaluate at the
// same time, sharing the expert store as its clients and splitting the threads
// (concurrent_evaluations), each guessing with a clone of the predictor; the others take turns
// (eval_mutex): on a backend that makes no peer (CUDA; Vulkan with a discrete GPU's budgeted
// device tier) or with cache-aware gating (Context::create decides), for their evaluations and
// for the rest of their use of the shared backend (Context::backend_turn). Context::eval
// takes the lock by polling try_lock, so a waiting context still honours its abort callback. The
// counters have their own lock so stats can be read while another thread evaluates. The Model
// itself is never written after load.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/adaptive/gating.h"
#include "core/budget_auto.h"
#include "core/model.h"

namespace moelite {

class ExpertSource;
class ExpertStore;
class ExpertPredictor;
class TraceRecorder;
struct Profile;

// Experts routed per layer after gating, and the (token, layer) pairs they serve.
class RoutingCounters {
 public:
  void reset(int32_t n_layer);
  void add(int32_t layer, uint64_t tokens, uint64_t experts);
  // Sums over `layer` (-1: all layers).
  void totals(int32_t layer, uint64_t* tokens, uint64_t* experts) const;

 private:
  mutable std::mutex mu_;
  std::vector<uint64_t> tokens_, experts_;
};

struct Runtime {
  // Declaration order is destruction order reversed: the predictor and the store go before the
  // backend whose shared memory the store's slots may live in.
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Profile> profile;  // null without a calibration profile
  std::unique_ptr<ExpertSource> experts;
  ExpertStore* store = nullptr;                // the same object as `experts` when a budget is set
  std::unique_ptr<ExpertPredictor> predictor;  // null: no prediction (no budget, or none asked)
  GatingConfig gating;
  RoutingCounters routed;
  uint64_t expert_budget = 0;
  bool budget_auto = false;  // expert_budget was sized by budget "auto"
  AutoBudget auto_budget;    // its inputs and result (budget_auto.h)
  std::mutex eval_mutex;
  // Contexts evaluating right now on backend instances of their own: they split the threads.
  std::atomic<int32_t> concurrent_evaluations{0};
  // The timeline being recorded (moelite_model_trace_begin), null when none: read with
  // std::atomic_load by evaluating threads, so ending a trace never pulls it from under them.
  std::shared_ptr<TraceRecorder> trace;
  std::string trace_path;  // where end_trace() writes it (under trace_mutex)
  std::mutex trace_mutex;
  // Starts recording; MOELITE_ERR_INVALID_ARGUMENT when a trace runs, MOELITE_ERR_IO when `path`
  // cannot be written (checked now by writing an empty trace there).
  Status begin_trace(const std::string& path);
  // Stops recording and writes the file; MOELITE_ERR_INVALID_ARGUMENT when none runs.
  Status end_trace();

  ~Runtime();
  // Creates the backend, places the model's dense weights on it, and sets up the expert source,
  // profile, gating and predictor from `opts`.
  static Status create(const Model& model, const LoadOptions& opts, std::unique_ptr<Runtime>* out);
};

}  // namespace moelite
