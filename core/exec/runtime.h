// What executes a Model: the backend, the source of routed-expert weights (resident views or the
// memory-budgeted store), the calibration profile, the predictor, the gating rule and the routing
// counters. One Runtime per loaded model, shared by all of its contexts.
//
// Threading: contexts with a backend instance of their own (Backend::create_peer) evaluate at the
// same time, sharing the expert store as its clients and splitting the threads
// (concurrent_evaluations), each guessing with a clone of the predictor; the others take turns
// (eval_mutex): where the backend makes no peer or with cache-aware gating, whose choices read the
// store's state (Context::create decides), for their evaluations and for the rest of their use of
// the shared backend (Context::backend_turn). Context::eval
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
#include "core/experts/expert_budget.h"
#include "core/experts/memory_plan.h"
#include "core/model/model.h"
#include "core/moe/gating.h"
#include "core/moe/routing_counters.h"

namespace moelite {

class ExpertSource;
class ExpertStore;
class ExpertPredictor;
class TimelineRecorder;
struct Profile;

// How a model executes: everything of moelite_model_params but how the file is read (LoadOptions).
struct RuntimeOptions {
  int32_t n_threads = 0;  // 0: physical cores (the big ones on a big.LITTLE CPU)
  BackendKind backend = BackendKind::Auto;
  ExpertBudget expert_budget;  // none: every expert resident in the file mapping
  std::string cache_policy = "cyclic";
  // How the budget's slots are divided among layers: "auto", "global", "uniform", "dp"
  // (core/experts/memory_plan.h). expert_per_layer is the older spelling of "uniform", for "auto".
  std::string cache_allocation = "auto";
  bool expert_per_layer = false;
  std::string expert_predictor = "none";  // see core/experts/predictor.h
  int32_t predictor_depth = 1;            // next-gate: layers ahead
  std::string profile_path;               // calibration profile ("": none)
  GatingSettings gating;
  // The cache allocation as the plan takes it ("auto" with expert_per_layer is "uniform").
  std::string allocation() const {
    return expert_per_layer && cache_allocation == "auto" ? std::string("uniform") : cache_allocation;
  }
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
  // How much expert memory the model has and how it is divided: the one answer every report and
  // the store read (core/experts/memory_plan.h).
  ExpertMemoryPlan memory_plan;
  std::mutex eval_mutex;
  // Contexts evaluating right now on backend instances of their own: they split the threads.
  std::atomic<int32_t> concurrent_evaluations{0};
  // The timeline being recorded (moelite_model_trace_begin), null when none: read with
  // std::atomic_load by evaluating threads, so ending a trace never pulls it from under them.
  std::shared_ptr<TimelineRecorder> trace;
  std::string trace_path;  // where end_trace() writes it (under trace_mutex)
  std::mutex trace_mutex;
  // Starts recording; MOELITE_ERR_INVALID_ARGUMENT when a trace runs, MOELITE_ERR_IO when `path`
  // cannot be written (checked now by writing an empty trace there).
  Status begin_trace(const std::string& path);
  // Stops recording and writes the file; MOELITE_ERR_INVALID_ARGUMENT when none runs.
  Status end_trace();

  ~Runtime();
  // Creates the backend, places the model's dense weights on it, and sets up the expert source,
  // profile, gating and predictor from `opts`. The model must have been loaded with
  // LoadOptions::stream_experts = opts.expert_budget.streams().
  static Status create(const Model& model, const RuntimeOptions& opts, std::unique_ptr<Runtime>* out);
};

}  // namespace moelite
