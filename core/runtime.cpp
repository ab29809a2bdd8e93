#include "core/runtime.h"

#include <algorithm>
#include <cstdlib>

#include "core/adaptive/predictor.h"
#include "core/adaptive/profile.h"
#include "core/adaptive/setup.h"
#include "core/expert_store/expert_store.h"
#include "core/trace.h"
#include "platforms/system_info.h"

namespace moelite {

void RoutingCounters::reset(int32_t n_layer) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_.assign(static_cast<size_t>(n_layer), 0);
  experts_.assign(static_cast<size_t>(n_layer), 0);
}

void RoutingCounters::add(int32_t layer, uint64_t tokens, uint64_t experts) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[static_cast<size_t>(layer)] += tokens;
  experts_[static_cast<size_t>(layer)] += experts;
}

void RoutingCounters::totals(int32_t layer, uint64_t* tokens, uint64_t* experts) const {
  std::lock_guard<std::mutex> lock(mu_);
  *tokens = *experts = 0;
  for (size_t l = 0; l < tokens_.size(); ++l) {
    if (layer >= 0 && static_cast<size_t>(layer) != l) continue;
    *tokens += tokens_[l];
    *experts += experts_[l];
  }
}

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
  auto recorder = std::make_shared<TraceRecorder>();
  MOELITE_TRY(recorder->write(path));  // the path must take a file, or the run's trace would be lost at its end
  trace_path = path;
  if (store) store->set_trace(recorder);
  std::atomic_store(&trace, recorder);
  return MOELITE_OK;
}

Status Runtime::end_trace() {
  std::lock_guard<std::mutex> lock(trace_mutex);
  std::shared_ptr<TraceRecorder> recorder = std::atomic_load(&trace);
  if (!recorder) return fail(MOELITE_ERR_INVALID_ARGUMENT, "no trace of this model is being recorded");
  std::atomic_store(&trace, std::shared_ptr<TraceRecorder>());
  if (store) store->set_trace(nullptr);
  return recorder->write(trace_path);
}

namespace {

Status place_dense_weights(const Model& m, Backend& be) {
  MOELITE_TRY(be.place_weight(m.tok_embd));
  if (m.output.data != m.tok_embd.data) MOELITE_TRY(be.place_weight(m.output));
  for (const LayerWeights& lw : m.layers) {
    // Every dense matrix the layer has (MLA's instead of q/k/v, a dense FFN instead of experts).
    for (const WeightView* v : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.router, &lw.pregate, &lw.mla.wq_a, &lw.mla.wq,
                                &lw.mla.wkv_a})
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

Status Runtime::create(const Model& m, const LoadOptions& opts, std::unique_ptr<Runtime>* out) {
  auto rt = std::make_unique<Runtime>();
  // Default: the big cores on a big.LITTLE CPU (the pool is pinned to them), else physical cores.
  const int32_t threads = opts.n_threads > 0 ? opts.n_threads : platform::default_thread_count();
  MOELITE_TRY(create_backend(opts.backend, threads, &rt->backend));
  MOELITE_TRY(place_dense_weights(m, *rt->backend));
  rt->routed.reset(m.hp.n_layer);
  MOELITE_TRY(setup_adaptive(m, opts, &rt->profile, &rt->gating));
  LoadOptions eff = opts;  // the budget actually used, for the store and its planning
  if (opts.expert_budget_auto) {
    const bool shared_device =
        rt->backend->kind() != BackendKind::Cpu && platform::read_system_info().unified_memory;
    MOELITE_TRY(choose_auto_budget(m, opts, shared_device, &rt->auto_budget));
    rt->budget_auto = true;
    eff.expert_budget_bytes = rt->auto_budget.budget;
  } else if (opts.expert_budget_fraction > 0) {
    // A share of what holding every expert takes (the expert bytes plus slot alignment and the
    // store's reserve), so 1.0 keeps them all. At least one byte: a tiny share still loads
    // budgeted, and is refused as too small.
    const double all = static_cast<double>(planned_store_limits(m, opts).cap);
    eff.expert_budget_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(opts.expert_budget_fraction * all));
  }
  if (eff.expert_budget_bytes > 0) {
    ExpertStoreOptions so;
    so.budget_bytes = eff.expert_budget_bytes;
    so.policy = opts.expert_policy;
    so.per_layer = opts.expert_per_layer;
    MOELITE_TRY(plan_expert_store(m, rt->profile.get(), eff, &so));
    if (const char* t = getenv("MOELITE_IO_THREADS")) so.io_threads = std::min(64, std::max(1, atoi(t)));
    std::unique_ptr<ExpertStore> store;
    MOELITE_TRY(ExpertStore::create(m, *rt->backend, so, &store));
    rt->store = store.get();
    rt->backend->set_expert_pool(store->pool_slots());
    rt->expert_budget = eff.expert_budget_bytes;
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
