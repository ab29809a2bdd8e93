#include "core/exec/runtime.h"

#include <algorithm>
#include <cstdlib>

#include "base/options.h"
#include "core/exec/context.h"
#include "core/experts/expert_store.h"
#include "core/experts/predictor.h"
#include "core/model/profile.h"
#include "core/support/timeline.h"
#include "platforms/platform.h"
#include "platforms/system_info.h"

namespace moelite {

Runtime::~Runtime() {
  // A trace still running when the model goes is written now (nobody is left to end it).
  if (std::atomic_load(&trace) && end_trace() != MOELITE_OK)
    log_msg(MOELITE_LOG_WARN, "the trace of this model could not be written: %s", last_error_message());
  predictor.reset();
  experts.reset();
  backend.reset();
}

Status Runtime::begin_trace(const std::string& path) {
  std::lock_guard<std::mutex> lock(trace_mutex);
  if (std::atomic_load(&trace))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "a trace of this model is already being recorded (to '%s')",
                trace_path.c_str());
  auto recorder = std::make_shared<TimelineRecorder>();
  MOELITE_TRY(platform::check_writable(path));  // now, or the run's trace would be lost at its end
  trace_path = path;
  if (store) store->set_trace(recorder);
  std::atomic_store(&trace, recorder);
  return MOELITE_OK;
}

Status Runtime::end_trace() {
  std::lock_guard<std::mutex> lock(trace_mutex);
  std::shared_ptr<TimelineRecorder> recorder = std::atomic_load(&trace);
  if (!recorder) return fail(MOELITE_ERR_INVALID_ARGUMENT, "no trace of this model is being recorded");
  std::atomic_store(&trace, std::shared_ptr<TimelineRecorder>());
  if (store) store->set_trace(nullptr);
  return recorder->write(trace_path);
}

namespace {

Status place_dense_weights(const Model& m, Backend& be) {
  MOELITE_TRY(be.place_weight(m.tok_embd));
  if (m.output.data != m.tok_embd.data) MOELITE_TRY(be.place_weight(m.output));
  for (const LayerWeights& lw : m.layers) {
    // Every dense matrix the layer has (MLA's instead of q/k/v, a dense FFN instead of experts).
    for (const WeightView* v :
         {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.router, &lw.pregate, &lw.mla.wq_a, &lw.mla.wq, &lw.mla.wkv_a})
      if (v->valid()) MOELITE_TRY(be.place_weight(*v));
    for (const std::vector<WeightView>* heads : {&lw.mla.k_b, &lw.mla.v_b})
      for (const WeightView& v : *heads) MOELITE_TRY(be.place_weight(v));
    for (const ExpertWeights* f : {&lw.shared, &lw.dense})
      if (f->gate.valid())
        for (const WeightView* v : {&f->gate, &f->up, &f->down}) MOELITE_TRY(be.place_weight(*v));
    if (!lw.experts.present()) continue;
    const ExpertWeights e0 = lw.experts.expert(0);
    for (const WeightView* v : {&e0.gate, &e0.up, &e0.down}) MOELITE_TRY(be.check_weight(*v));
  }
  return MOELITE_OK;
}

// Every expert stays where it is for the model's life, so a backend may lay out copies of its own
// now (the CPU backend's grouped rows). Such copies turn the experts' mapped pages, which the
// kernel can drop and read again, into memory of the process's own: only where all of them fit in
// what is free now with a quarter to spare, so a model that only fits through the page cache
// keeps streaming from it as before (the results are the same bits either way).
Status place_resident_experts(const Model& m, Backend& be) {
  const uint64_t room = platform::read_memory_info().room_bytes();
  const uint64_t want = m.expert_bytes + m.expert_bytes / 4;
  if (room < want) {
    log_msg(MOELITE_LOG_INFO,
            "experts used in place from the file: %.0f MiB of them and %.0f MiB free (copies need %.0f MiB)",
            static_cast<double>(m.expert_bytes) / 1048576.0, static_cast<double>(room) / 1048576.0,
            static_cast<double>(want) / 1048576.0);
    return MOELITE_OK;
  }
  for (const LayerWeights& lw : m.layers)
    if (lw.experts.present())
      for (int32_t e = 0; e < m.hp.n_expert; ++e) MOELITE_TRY(be.place_expert(lw.experts.expert(e)));
  return MOELITE_OK;
}

}  // namespace

Status Runtime::create(const Model& m, const RuntimeOptions& opts, std::unique_ptr<Runtime>* out) {
  auto rt = std::make_unique<Runtime>();
  // Default: the big cores on a big.LITTLE CPU (the pool is pinned to them), else physical cores.
  const int32_t threads = opts.n_threads > 0 ? opts.n_threads : platform::default_thread_count();
  MOELITE_TRY(create_backend(opts.backend, threads, &rt->backend));
  MOELITE_TRY(place_dense_weights(m, *rt->backend));
  rt->routed.reset(m.hp.n_layer);
  if (!opts.profile_path.empty()) {
    auto p = std::make_unique<Profile>();
    MOELITE_TRY(Profile::load(opts.profile_path, p.get()));
    MOELITE_TRY(p->check_model(m.hp));
    rt->profile = std::move(p);
  }
  MOELITE_TRY(make_gating_config(m.hp, opts.gating, rt->profile.get(), &rt->gating));

  ExpertMemoryRequest request;
  request.budget = opts.expert_budget;
  request.allocation = opts.allocation();
  request.profile = rt->profile.get();
  request.predictors = opts.expert_predictor;
  request.context_bytes = Context::estimate_bytes(m.hp, ContextOptions{});
  request.dense_counted_twice = rt->backend->kind() != BackendKind::Cpu && platform::read_system_info().unified_memory;
  MOELITE_TRY(plan_expert_memory(m, request, &rt->memory_plan));
  const ExpertMemoryPlan& plan = rt->memory_plan;
  if (plan.streams) {
    ExpertStoreOptions so;
    so.policy = opts.cache_policy;
    int64_t io_threads;
    if (option_int(Option::IoThreads, &io_threads)) so.io_threads = static_cast<int32_t>(io_threads);
    (void)option_number(Option::PredictMinPrecision, &so.guess_min_precision);
    std::unique_ptr<ExpertStore> store;
    MOELITE_TRY(ExpertStore::create(m, *rt->backend, plan, so, &store));
    rt->store = store.get();
    rt->backend->set_device_tier_slots(plan.device_tier_slots);
    rt->experts = std::move(store);
    MOELITE_TRY(make_predictor(opts.expert_predictor, opts.predictor_depth, m, rt->profile.get(), &rt->predictor));
  } else {
    rt->experts = std::make_unique<ResidentExperts>(&m.layers);
    MOELITE_TRY(place_resident_experts(m, *rt->backend));
    // Without a budget nothing loads, so a predictor has nothing to do (and is not built: its
    // tables can be large); a bad name or a missing fit still fails.
    MOELITE_TRY(make_predictor(opts.expert_predictor, opts.predictor_depth, m, rt->profile.get(), nullptr));
  }
  *out = std::move(rt);
  return MOELITE_OK;
}

}  // namespace moelite
