// The C API's batch planner: argument checks, the planner's inputs read from a model (inspected
// or loaded) and the platform, and the plan handle. The arithmetic is core/serve/batch_plan.cpp's.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "core/api/handles.h"
#include "core/exec/context.h"
#include "core/exec/runtime.h"
#include "core/experts/budget_auto.h"
#include "core/experts/expert_budget.h"
#include "core/experts/expert_store.h"
#include "core/experts/memory_plan.h"
#include "core/experts/trace_replay.h"
#include "core/model/model.h"
#include "core/model/profile.h"
#include "core/serve/batch_plan.h"
#include "moelite.h"
#include "platforms/system_info.h"

using moelite::fail;
using moelite::api::guarded;
using moelite::api::null_arg;

struct moelite_plan_params {
  int32_t min_sequences = 1;
  int32_t max_sequences = 16;
  uint64_t memory = 0;        // 0: the room now
  uint64_t headroom = 0;      // 0: budget auto's default
  uint64_t expert_budget = 0;  // MOELITE_PLAN_BUDGET_AUTO (0), MOELITE_PLAN_RESIDENT or bytes
  double expert_share = 0;     // > 0: a share of the experts (set_expert_budget_text), resolved by the model's plan
  double storage_gb_s = 0;
  double compute_gb_s = 0;
  moelite::CachePools pools = moelite::CachePools::kChoose;
  std::string profile;  // routing shares from this calibration profile ("": the loaded model's, else uniform)
  std::string trace;    // a recorded routing replayed instead ("": none)
  // Or the routing given in memory (moelite_plan_params_set_routing): tokens x MoE layers x k ids.
  int32_t routing_tokens = 0, routing_layers = 0, routing_k = 0;
  std::vector<int32_t> routing;
};

struct moelite_batch_plan {
  moelite::BatchPlanInputs inputs;
  moelite::BatchPlan plan;
  std::string json;
};

namespace {

// Each MoE layer's share of tokens routed to each expert, from a profile's counts.
moelite::Status routing_shares(const moelite::Profile& prof, const moelite::HParams& hp, std::vector<double>* out) {
  MOELITE_TRY(prof.check_model(hp));
  out->clear();
  for (int32_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    const std::vector<uint64_t>& counts = prof.layers[static_cast<size_t>(l)].expert_counts;
    if (counts.size() != static_cast<size_t>(hp.n_expert))
      return moelite::fail(MOELITE_ERR_BAD_PROFILE, "the profile has no expert counts for layer %d", l);
    double routed = 0;
    for (uint64_t c : counts) routed += static_cast<double>(c);
    const double tokens = routed / hp.n_expert_used;
    for (uint64_t c : counts) out->push_back(tokens > 0 ? static_cast<double>(c) / tokens : 0.0);
  }
  return MOELITE_OK;
}

// A routing trace (`moelite trace record`: model layer numbers, MoE layers only) as the planner's
// tokens x MoE layers expert lists. Tokens in order of their numbers; a (token, layer) the trace
// lacks reads nothing, one it lists twice reads the union.
moelite::Status routing_trace(const moelite::Trace& t, const moelite::HParams& hp, const std::string& path,
                              moelite::RoutingTrace* out) {
  if (t.n_experts > hp.n_expert || t.n_layers > hp.n_layer)
    return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT,
                         "routing trace '%s' is of a model with %d layers of %d experts; this one has %d of %d", path.c_str(),
                         t.n_layers, t.n_experts, hp.n_layer, hp.n_expert);
  std::map<int64_t, int32_t> index;  // token number -> row
  for (const moelite::TraceEntry& e : t.entries) {
    if (!hp.is_moe_layer(e.layer))
      return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT, "routing trace '%s' routes layer %d, which has no experts",
                           path.c_str(), e.layer);
    index.emplace(e.token, 0);
  }
  if (index.size() > static_cast<size_t>(INT32_MAX / std::max(1, hp.n_moe_layers())))
    return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT, "routing trace '%s' has too many tokens", path.c_str());
  int32_t row = 0;
  for (auto& [token, at] : index) at = row++;
  const size_t L = static_cast<size_t>(hp.n_moe_layers());
  out->tokens = row;
  out->experts.assign(static_cast<size_t>(row) * L, {});
  for (const moelite::TraceEntry& e : t.entries) {
    std::vector<int32_t>& ids =
        out->experts[static_cast<size_t>(index[e.token]) * L + static_cast<size_t>(e.layer - hp.n_dense_lead)];
    for (int32_t x : e.experts)
      if (std::find(ids.begin(), ids.end(), x) == ids.end()) ids.push_back(x);
  }
  return MOELITE_OK;
}

// Routing given in memory (tokens x MoE layers x k ids, -1 an empty slot) as the planner's trace.
moelite::Status given_routing(const moelite_plan_params& pp, const moelite::HParams& hp, moelite::RoutingTrace* out) {
  if (pp.routing_layers != hp.n_moe_layers() || pp.routing_k < hp.n_expert_used)
    return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT,
                         "the routing given has %d layers of %d slots a token; this model has %d layers with experts, "
                         "top-%d",
                         pp.routing_layers, pp.routing_k, hp.n_moe_layers(), hp.n_expert_used);
  const size_t k = static_cast<size_t>(pp.routing_k);
  out->tokens = pp.routing_tokens;
  out->experts.assign(static_cast<size_t>(pp.routing_tokens) * static_cast<size_t>(pp.routing_layers), {});
  for (size_t cell = 0; cell < out->experts.size(); ++cell)
    for (size_t j = 0; j < k; ++j) {
      const int32_t x = pp.routing[cell * k + j];
      if (x >= hp.n_expert)
        return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT, "the routing given names expert %d; this model has %d", x,
                             hp.n_expert);
      std::vector<int32_t>& ids = out->experts[cell];
      if (x >= 0 && std::find(ids.begin(), ids.end(), x) == ids.end()) ids.push_back(x);
    }
  // A token's experts are a set, in id order as a trace file's (parse_trace sorts them): the
  // replay's LRU order within a step follows it, so both give the same plan.
  for (std::vector<int32_t>& ids : out->experts) std::sort(ids.begin(), ids.end());
  return MOELITE_OK;
}

constexpr double kMaxBandwidthGbs = 1e6;  // a petabyte per second: beyond any device, refused as absurd

moelite_status check_bandwidth(const char* fn, const char* what, double gbs) {
  if (!(gbs >= 0) || gbs > kMaxBandwidthGbs)  // NaN fails the first test
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: %s bandwidth %g GB/s is outside 0..%g", fn, what, gbs, kMaxBandwidthGbs);
  return MOELITE_OK;
}

// A sequence-count setter: 1..MOELITE_MAX_SEQUENCES into `field`.
moelite_status set_sequences(const char* api_fn, moelite_plan_params* p, int32_t n, int32_t moelite_plan_params::*field) {
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (n < 1 || n > MOELITE_MAX_SEQUENCES)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: %d sequences is outside 1..%d", api_fn, n, MOELITE_MAX_SEQUENCES);
    p->*field = n;
    return MOELITE_OK;
  });
}

// A size setter: bytes up to 2^62 (or the one special value `also`) into `field`.
moelite_status set_size(const char* api_fn, moelite_plan_params* p, uint64_t bytes, uint64_t moelite_plan_params::*field,
                        uint64_t also = 0) {
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (bytes > MOELITE_MAX_BUDGET_HEADROOM && !(also != 0 && bytes == also))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: %llu bytes is above 2^62", api_fn, (unsigned long long)bytes);
    p->*field = bytes;
    return MOELITE_OK;
  });
}

// A file path setter: a copy of `path` into `field` (NULL: "", none).
moelite_status set_path(const char* api_fn, moelite_plan_params* p, const char* path,
                        std::string moelite_plan_params::*field) {
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->*field = path ? path : "";
    return MOELITE_OK;
  });
}

}  // namespace

extern "C" {

MOELITE_API moelite_plan_params* moelite_plan_params_create(void) { return new (std::nothrow) moelite_plan_params; }
MOELITE_API void moelite_plan_params_free(moelite_plan_params* params) { delete params; }

MOELITE_API moelite_status moelite_plan_params_set_max_sequences(moelite_plan_params* p, int32_t n) {
  return set_sequences(__func__, p, n, &moelite_plan_params::max_sequences);
}

MOELITE_API moelite_status moelite_plan_params_set_min_sequences(moelite_plan_params* p, int32_t n) {
  return set_sequences(__func__, p, n, &moelite_plan_params::min_sequences);
}

MOELITE_API moelite_status moelite_plan_params_set_memory(moelite_plan_params* p, uint64_t bytes) {
  return set_size(__func__, p, bytes, &moelite_plan_params::memory);
}

MOELITE_API moelite_status moelite_plan_params_set_headroom(moelite_plan_params* p, uint64_t bytes) {
  return set_size(__func__, p, bytes, &moelite_plan_params::headroom);
}

MOELITE_API moelite_status moelite_plan_params_set_expert_budget(moelite_plan_params* p, uint64_t bytes) {
  if (p) p->expert_share = 0;
  return set_size(__func__, p, bytes, &moelite_plan_params::expert_budget, MOELITE_PLAN_RESIDENT);
}

MOELITE_API moelite_status moelite_plan_params_set_expert_budget_text(moelite_plan_params* p, const char* text) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!text) return null_arg(api_fn, "text");
    moelite::ExpertBudget b;
    MOELITE_TRY(moelite::parse_expert_budget(text, &b));
    p->expert_share = 0;
    switch (b.kind) {
      case moelite::ExpertBudget::Kind::None: p->expert_budget = MOELITE_PLAN_RESIDENT; break;
      case moelite::ExpertBudget::Kind::Auto: p->expert_budget = MOELITE_PLAN_BUDGET_AUTO; break;
      case moelite::ExpertBudget::Kind::Bytes: p->expert_budget = b.bytes; break;
      case moelite::ExpertBudget::Kind::Share:
        p->expert_budget = MOELITE_PLAN_BUDGET_AUTO;
        p->expert_share = b.share;
        break;
    }
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_plan_params_set_cache_allocation(moelite_plan_params* p, const char* allocation) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!allocation) return null_arg(api_fn, "allocation");
    const std::string a = allocation;
    if (a == "auto") p->pools = moelite::CachePools::kChoose;
    else if (a == "global") p->pools = moelite::CachePools::kGlobal;
    else if (a == "uniform" || a == "dp") p->pools = moelite::CachePools::kPerLayer;
    else
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: '%s' is not auto, global, uniform or dp", api_fn, allocation);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_plan_params_set_profile(moelite_plan_params* p, const char* path) {
  return set_path(__func__, p, path, &moelite_plan_params::profile);
}

MOELITE_API moelite_status moelite_plan_params_set_routing_trace(moelite_plan_params* p, const char* path) {
  const moelite_status st = set_path(__func__, p, path, &moelite_plan_params::trace);
  if (st == MOELITE_OK && !p->trace.empty()) {  // the last routing set is the one used
    p->routing.clear();
    p->routing_tokens = p->routing_layers = p->routing_k = 0;
  }
  return st;
}

MOELITE_API moelite_status moelite_plan_params_set_routing(moelite_plan_params* p, int32_t n_tokens, int32_t n_moe_layers,
                                                           int32_t k, const int32_t* experts) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!experts && n_tokens == 0) {
      p->routing.clear();
      p->routing_tokens = p->routing_layers = p->routing_k = 0;
      return MOELITE_OK;
    }
    if (!experts) return null_arg(api_fn, "experts");
    if (n_tokens < 1 || n_moe_layers < 1 || k < 1 || k > 1024 ||
        n_tokens > MOELITE_MAX_PLAN_ROUTING_IDS / n_moe_layers / k)  // divided: no product can overflow
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "%s: %d tokens x %d layers x %d slots is not a routing it takes (each >= 1, k <= 1024, at most 2^28 ids)",
                  api_fn, n_tokens, n_moe_layers, k);
    const size_t n = static_cast<size_t>(n_tokens) * static_cast<size_t>(n_moe_layers) * static_cast<size_t>(k);
    for (size_t i = 0; i < n; ++i)
      if (experts[i] < -1)
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: expert id %d at %zu (ids are >= 0, or -1 for an empty slot)",
                    api_fn, experts[i], i);
    p->routing.assign(experts, experts + n);  // std::bad_alloc: guarded answers MOELITE_ERR_OUT_OF_MEMORY
    p->routing_tokens = n_tokens;
    p->routing_layers = n_moe_layers;
    p->routing_k = k;
    p->trace.clear();
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_plan_params_set_bandwidths(moelite_plan_params* p, double storage_gb_per_s,
                                                              double compute_gb_per_s) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    MOELITE_TRY(check_bandwidth(api_fn, "storage", storage_gb_per_s));
    MOELITE_TRY(check_bandwidth(api_fn, "compute", compute_gb_per_s));
    p->storage_gb_s = storage_gb_per_s;
    p->compute_gb_s = compute_gb_per_s;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_plan_batch(const moelite_model* model, const moelite_context_params* cparams,
                                              const moelite_plan_params* pparams, moelite_batch_plan** out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!out) return null_arg(api_fn, "out_plan");
    *out = nullptr;
    if (!model) return null_arg(api_fn, "model");
    const moelite::Model& m = *model->impl;
    if (m.vocab_only) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: a vocabulary-only model has no weights to plan for", api_fn);
    if (m.hp.n_expert <= 0 || m.hp.n_moe_layers() <= 0)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: the model has no routed experts", api_fn);
    const moelite_plan_params defaults;
    const moelite_plan_params& pp = pparams ? *pparams : defaults;
    moelite::ContextOptions co = cparams ? cparams->opts : moelite::ContextOptions{};
    co.n_seq = 1;
    const uint64_t one = moelite::Context::estimate_bytes(m.hp, co);
    co.n_seq = 2;
    const uint64_t kv = moelite::Context::estimate_bytes(m.hp, co) - one;

    const moelite::Runtime* rt = model->runtime.get();
    const moelite::ExpertStore* store = rt ? rt->store : nullptr;
    const moelite::ExpertPoolLimits limits = moelite::expert_pool_limits(m, false);
    moelite::BatchPlanInputs in;
    in.context_base = one - kv;
    in.kv_per_sequence = kv;
    in.slot_bytes = limits.slot_bytes;
    in.minimum_budget = limits.minimum;
    in.minimum_per_layer = moelite::expert_pool_limits(m, true).minimum;
    in.pools = pp.pools;
    in.all_experts = limits.all;
    in.n_moe_layers = m.hp.n_moe_layers();
    in.n_expert = m.hp.n_expert;
    in.n_expert_used = m.hp.n_expert_used;
    in.min_sequences = pp.min_sequences;
    in.max_sequences = pp.max_sequences;
    in.storage_bytes_per_s = pp.storage_gb_s * 1e9;
    in.compute_bytes_per_s = pp.compute_gb_s * 1e9;
    const uint64_t room_now = moelite::platform::read_memory_info().room_bytes();
    if (rt) {
      // A loaded model: its budget is what it is. The room now already counts the dense weights
      // and the pool's slots that have held an expert; the rest of the pool is allocated but not
      // yet touched, so it is taken from the room here, not found missing later.
      in.resident = store == nullptr;
      in.dense = in.resident ? 0 : m.dense_bytes;
      in.fixed_budget = store ? store->pool_bytes() : 0;
      if (store) in.pools = store->per_layer() ? moelite::CachePools::kPerLayer : moelite::CachePools::kGlobal;
      in.memory = pp.memory > 0 ? pp.memory
                                : room_now + (in.resident ? 0 : m.dense_bytes + (store ? store->peak_bytes() : 0));
    } else {
      in.resident = pp.expert_budget == MOELITE_PLAN_RESIDENT;
      in.dense = in.resident ? 0 : m.dense_bytes;
      in.fixed_budget = in.resident ? 0 : pp.expert_budget;
      if (pp.expert_share > 0) {  // the bytes a load with this share would take (one global pool)
        moelite::ExpertMemoryRequest rq;
        rq.budget = moelite::ExpertBudget::of_share(pp.expert_share);
        rq.allocation = "global";
        moelite::ExpertMemoryPlan share_plan;
        MOELITE_TRY(moelite::plan_expert_memory(m, rq, &share_plan));
        in.fixed_budget = share_plan.budget_bytes;
      }
      in.memory = pp.memory > 0 ? pp.memory : room_now;
    }
    in.headroom = pp.headroom > 0 ? pp.headroom : moelite::default_headroom(in.memory);
    if (!in.resident && !(in.storage_bytes_per_s > 0))
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "%s: experts stream from storage under a budget: set its read bandwidth "
                  "(moelite_plan_params_set_bandwidths; `moelite info --storage` measures it)",
                  api_fn);
    if ((!pp.trace.empty() || !pp.routing.empty()) && !pp.profile.empty())
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: give a routing trace or a profile, not both", api_fn);
    if (!pp.routing.empty()) {
      auto given = std::make_shared<moelite::RoutingTrace>();
      MOELITE_TRY(given_routing(pp, m.hp, given.get()));
      in.trace = std::move(given);
    } else if (!pp.trace.empty()) {
      moelite::Trace trace;
      MOELITE_TRY(moelite::load_trace(pp.trace, &trace));
      auto recorded = std::make_shared<moelite::RoutingTrace>();
      MOELITE_TRY(routing_trace(trace, m.hp, pp.trace, recorded.get()));
      in.trace = std::move(recorded);
    } else if (!pp.profile.empty()) {
      moelite::Profile prof;
      MOELITE_TRY(moelite::Profile::load(pp.profile, &prof));
      MOELITE_TRY(routing_shares(prof, m.hp, &in.routing));
    } else if (rt && rt->profile &&
               static_cast<size_t>(m.hp.n_moe_layers()) * static_cast<size_t>(m.hp.n_expert) <= moelite::kMaxRoutingCells) {
      MOELITE_TRY(routing_shares(*rt->profile, m.hp, &in.routing));  // beyond the limit: uniform routing
    }
    std::unique_ptr<moelite_batch_plan> plan(new moelite_batch_plan);
    plan->inputs = in;
    MOELITE_TRY(moelite::plan_batch(in, &plan->plan));
    plan->json = moelite::batch_plan_json(in, plan->plan);
    *out = plan.release();
    return MOELITE_OK;
  });
}

MOELITE_API int64_t moelite_batch_plan_get(const moelite_batch_plan* plan, moelite_batch_plan_key key) {
  if (!plan) return -1;
  switch (key) {
    case MOELITE_PLAN_N_SEQ: return plan->plan.n_seq;
    case MOELITE_PLAN_EXPERT_BUDGET: return static_cast<int64_t>(plan->plan.expert_budget);
    case MOELITE_PLAN_KV_BYTES: return static_cast<int64_t>(plan->plan.kv_bytes);
    case MOELITE_PLAN_LOOKAHEAD: return plan->plan.lookahead;
    case MOELITE_PLAN_MEMORY: return static_cast<int64_t>(plan->inputs.memory);
    case MOELITE_PLAN_HEADROOM: return static_cast<int64_t>(plan->inputs.headroom);
  }
  return -1;
}

MOELITE_API double moelite_batch_plan_decode_tok_s(const moelite_batch_plan* plan) {
  return plan ? plan->plan.tok_s : 0.0;
}

MOELITE_API const char* moelite_batch_plan_allocation(const moelite_batch_plan* plan) {
  return plan ? moelite::plan_pools_name(plan->inputs.resident, plan->plan.per_layer) : "";
}

MOELITE_API const char* moelite_batch_plan_reason(const moelite_batch_plan* plan) {
  return plan ? plan->plan.reason.c_str() : "";
}

MOELITE_API const char* moelite_batch_plan_json(const moelite_batch_plan* plan) {
  return plan ? plan->json.c_str() : "";
}

MOELITE_API void moelite_batch_plan_free(moelite_batch_plan* plan) { delete plan; }

}  // extern "C"
