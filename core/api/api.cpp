// The C API: argument checks, translation to the C++ core, and nothing else.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <system_error>

#include "base/options.h"
#include "core/api/handles.h"
#include "core/calibrate/calibrate.h"
#include "core/exec/context.h"
#include "core/exec/runtime.h"
#include "core/experts/cache_policy.h"
#include "core/experts/expert_budget.h"
#include "core/experts/expert_read_probe.h"
#include "core/experts/expert_store.h"
#include "core/experts/memory_plan.h"
#include "core/experts/predictor.h"
#include "core/model/arch/arch.h"
#include "core/model/model.h"
#include "core/text/chat_template.h"
#include "moelite.h"

using moelite::api::busy;
using moelite::api::ContextTurn;
using moelite::api::copy_out;
using moelite::api::guarded;
using moelite::api::null_arg;
using moelite::api::release_model;
using moelite::api::tokenizer_of;
using moelite::fail;

namespace {
// The per-layer store counters summed over `layer` (-1: all) into the public struct.
moelite_expert_stats sum_expert_stats(const std::vector<moelite::ExpertLayerStats>& per_layer, int32_t layer,
                                      size_t struct_size) {
  moelite_expert_stats total;
  memset(&total, 0, sizeof total);
  total.struct_size = struct_size;
  for (size_t l = 0; l < per_layer.size(); ++l) {
    if (layer >= 0 && static_cast<size_t>(layer) != l) continue;
    const moelite::ExpertLayerStats& s = per_layer[l];
    total.activations += s.activations;
    total.hits += s.hits;
    total.misses += s.misses;
    total.prefetches_issued += s.prefetches_issued;
    total.prefetches_used += s.prefetches_used;
    total.prefetches_wasted += s.prefetches_wasted;
    total.bytes_read += s.bytes_read;
    total.wait_seconds += s.wait_seconds;
    total.predicted += s.predicted;
    total.predictions += s.predictions;
    total.ready_when_needed += s.ready_when_needed;
    total.reads += s.reads;
  }
  return total;
}
}  // namespace

extern "C" {

MOELITE_API unsigned moelite_version_number(void) { return MOELITE_VERSION_NUMBER; }

MOELITE_API const char* moelite_version_string(void) {
#define MOELITE_STR2(x) #x
#define MOELITE_STR(x) MOELITE_STR2(x)
  return MOELITE_STR(MOELITE_VERSION_MAJOR) "." MOELITE_STR(MOELITE_VERSION_MINOR) "." MOELITE_STR(
      MOELITE_VERSION_PATCH);
}

MOELITE_API const char* moelite_status_name(moelite_status s) {
  switch (s) {
#define CASE(x) \
  case x: return #x;
    CASE(MOELITE_OK)
    CASE(MOELITE_ERR_INVALID_ARGUMENT)
    CASE(MOELITE_ERR_OUT_OF_MEMORY)
    CASE(MOELITE_ERR_FILE_NOT_FOUND)
    CASE(MOELITE_ERR_IO)
    CASE(MOELITE_ERR_BUFFER_TOO_SMALL)
    CASE(MOELITE_ERR_SYSTEM_LIMIT)
    CASE(MOELITE_ERR_GGUF_BAD_MAGIC)
    CASE(MOELITE_ERR_GGUF_BAD_VERSION)
    CASE(MOELITE_ERR_GGUF_TRUNCATED)
    CASE(MOELITE_ERR_GGUF_CORRUPT)
    CASE(MOELITE_ERR_GGUF_UNKNOWN_TYPE)
    CASE(MOELITE_ERR_GGUF_OUT_OF_BOUNDS)
    CASE(MOELITE_ERR_GGUF_OVERLAP)
    CASE(MOELITE_ERR_UNSUPPORTED_ARCH)
    CASE(MOELITE_ERR_UNSUPPORTED_TYPE)
    CASE(MOELITE_ERR_MISSING_TENSOR)
    CASE(MOELITE_ERR_BAD_SHAPE)
    CASE(MOELITE_ERR_MISSING_METADATA)
    CASE(MOELITE_ERR_BAD_METADATA)
    CASE(MOELITE_ERR_BACKEND_UNAVAILABLE)
    CASE(MOELITE_ERR_BUDGET_TOO_SMALL)
    CASE(MOELITE_ERR_NOT_IMPLEMENTED)
    CASE(MOELITE_ERR_BAD_PROFILE)
    CASE(MOELITE_ERR_BACKEND)
    CASE(MOELITE_ERR_CONTEXT_FULL)
    CASE(MOELITE_ERR_BAD_TOKEN)
    CASE(MOELITE_ERR_ABORTED)
    CASE(MOELITE_ERR_PROGRESS_ABORTED)
    CASE(MOELITE_ERR_BUSY)
    CASE(MOELITE_ERR_BAD_SESSION)
    CASE(MOELITE_ERR_SESSION_MISMATCH)
    CASE(MOELITE_ERR_INTERNAL)
#undef CASE
  }
  return "MOELITE_ERR_UNKNOWN";
}

// ---- model parameters

MOELITE_API moelite_model_params* moelite_model_params_create(void) {
  return new (std::nothrow) moelite_model_params();
}
MOELITE_API void moelite_model_params_free(moelite_model_params* p) { delete p; }

MOELITE_API moelite_status moelite_model_params_set_threads(moelite_model_params* p, int32_t n) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (n < 0 || n > MOELITE_MAX_THREADS)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "thread count %d is outside 0..%d", n, MOELITE_MAX_THREADS);
    p->run.n_threads = n;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_backend(moelite_model_params* p, moelite_backend b) {
  // Not through guarded(): nothing here can throw, and reading an out-of-range enum value back
  // from a lambda's capture is undefined behaviour (UBSan reports it) where the parameter is not.
  if (!p) return null_arg(__func__, "params");
  if (b < MOELITE_BACKEND_AUTO || b > MOELITE_BACKEND_CUDA)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown backend %d", static_cast<int>(b));
  p->run.backend = static_cast<moelite::BackendKind>(b);
  return MOELITE_OK;
}

MOELITE_API moelite_status moelite_model_params_set_expert_budget(moelite_model_params* p, uint64_t bytes) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (bytes > (uint64_t{1} << 62))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "an expert budget of %llu bytes is larger than any memory",
                  static_cast<unsigned long long>(bytes));
    p->run.expert_budget = moelite::ExpertBudget::of_bytes(bytes);  // the last of the budget setters wins
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_expert_budget_auto(moelite_model_params* p,
                                                                       uint64_t headroom_bytes) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (headroom_bytes > MOELITE_MAX_BUDGET_HEADROOM)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "a budget headroom of %llu bytes is larger than any memory",
                  static_cast<unsigned long long>(headroom_bytes));
    p->run.expert_budget = moelite::ExpertBudget::automatic(headroom_bytes);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_expert_budget_fraction(moelite_model_params* p,
                                                                           double fraction) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!(fraction > 0.0 && fraction <= 1.0))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the budget fraction %g is outside (0, 1]", fraction);
    p->run.expert_budget = moelite::ExpertBudget::of_share(fraction);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_expert_budget_text(moelite_model_params* p, const char* text) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!text) return null_arg(api_fn, "text");
    moelite::ExpertBudget budget;
    MOELITE_TRY(moelite::parse_expert_budget(text, &budget));
    p->run.expert_budget = budget;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_parse_size(const char* text, uint64_t* out_bytes) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!text) return null_arg(api_fn, "text");
    if (!out_bytes) return null_arg(api_fn, "out_bytes");
    return moelite::parse_size(text, out_bytes);
  });
}

MOELITE_API moelite_status moelite_model_params_set_chat_template(moelite_model_params* p, const char* chat_template) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    std::string option = chat_template ? chat_template : "";
    if (!option.empty()) {
      moelite::ChatTemplate t;
      MOELITE_TRY(moelite::chat_template_from_option(option, &t));
    }
    p->load.chat_template = std::move(option);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_cache_policy(moelite_model_params* p, const char* policy) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!policy) return null_arg(api_fn, "policy");
    std::unique_ptr<moelite::CachePolicy> check;
    MOELITE_TRY(moelite::make_policy(policy, &check));
    p->run.cache_policy = policy;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_predictor(moelite_model_params* p, const char* predictor) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!predictor) return null_arg(api_fn, "predictor");
    MOELITE_TRY(moelite::check_predictor_name(predictor));
    p->run.expert_predictor = predictor;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_expert_policy(moelite_model_params* p, const char* policy) {
  return moelite_model_params_set_cache_policy(p, policy);
}
MOELITE_API moelite_status moelite_model_params_set_expert_predictor(moelite_model_params* p, const char* predictor) {
  return moelite_model_params_set_predictor(p, predictor);
}

MOELITE_API moelite_status moelite_model_params_set_predictor_depth(moelite_model_params* p, int32_t depth) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (depth < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "predictor depth %d must be at least 1", depth);
    p->run.predictor_depth = depth;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_profile(moelite_model_params* p, const char* path) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->run.profile_path = path ? path : "";
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_gating(moelite_model_params* p, const char* mode, float threshold) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!mode) return null_arg(api_fn, "mode");
    moelite::GatingMode m;
    if (!moelite::parse_gating_mode(mode, &m))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown gating mode '%s' (available: exact, sensitivity, score, cache-aware)",
                  mode);
    if (!(threshold >= 0.0f) || !std::isfinite(threshold))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating threshold must be a finite number >= 0");
    p->run.gating.mode = m;
    p->run.gating.threshold = threshold;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_gating_penalty(moelite_model_params* p, float penalty) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!(penalty >= 1.0f) || !std::isfinite(penalty))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating penalty must be a finite number >= 1 (got %g)",
                  static_cast<double>(penalty));
    p->run.gating.penalty = penalty;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_gating_substitutes(moelite_model_params* p, int32_t n) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (n < 0 || n > moelite::kMaxGatingSubstitutes)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the gating substitutes must be in [0, %d] (got %d)",
                  moelite::kMaxGatingSubstitutes, n);
    p->run.gating.substitutes = n;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_cache_allocation(moelite_model_params* p, const char* allocation) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!allocation) return null_arg(api_fn, "allocation");
    MOELITE_TRY(moelite::check_cache_allocation(allocation));
    p->run.cache_allocation = allocation;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_expert_per_layer(moelite_model_params* p, int32_t per_layer) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->run.expert_per_layer = per_layer != 0;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_use_mmap(moelite_model_params* p, int32_t use_mmap) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->load.use_mmap = use_mmap != 0;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_vocab_only(moelite_model_params* p, int32_t vocab_only) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->load.vocab_only = vocab_only != 0;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_params_set_progress_callback(moelite_model_params* p, moelite_progress_fn fn,
                                                                      void* user) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->load.progress = fn;
    p->load.progress_user = user;
    return MOELITE_OK;
  });
}

// ---- models

MOELITE_API moelite_status moelite_model_load(const char* path, const moelite_model_params* params,
                                              moelite_model** out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!path) return null_arg(api_fn, "path");
    if (!out) return null_arg(api_fn, "out_model");
    MOELITE_TRY(moelite::check_options());
    const moelite_model_params defaults;
    const moelite_model_params& p = params ? *params : defaults;
    moelite::LoadOptions load = p.load;
    load.stream_experts = p.run.expert_budget.streams();
    try {
      std::unique_ptr<moelite::Model> m;
      MOELITE_TRY(moelite::Model::load(path, load, &m));
      std::unique_ptr<moelite::Runtime> rt;
      if (!m->vocab_only) MOELITE_TRY(moelite::Runtime::create(*m, p.run, &rt));
      auto* handle = new moelite_model{std::move(m), std::move(rt)};
      *out = handle;
      return MOELITE_OK;
    } catch (const std::bad_alloc&) {
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory while loading '%s'", path);
    } catch (const std::exception& e) {
      return fail(MOELITE_ERR_INTERNAL, "unexpected error while loading '%s': %s", path, e.what());
    }
  });
}

MOELITE_API void moelite_model_free(moelite_model* m) {
  moelite::ApiErrorScope scope;  // teardown never changes moelite_last_error()
  release_model(m);
}

MOELITE_API int64_t moelite_model_get(const moelite_model* model, moelite_model_key key) {
  if (!model) return -1;
  const moelite::Model& m = *model->impl;
  const moelite::Runtime* rt = model->runtime.get();
  const moelite::ExpertStore* store = rt ? rt->store : nullptr;
  const bool auto_budget = rt && rt->memory_plan.budget.kind == moelite::ExpertBudget::Kind::Auto;
  const moelite::HParams& hp = m.hp;
  switch (key) {
    case MOELITE_MODEL_N_LAYERS: return hp.n_layer;
    case MOELITE_MODEL_N_EXPERTS: return hp.n_expert;
    case MOELITE_MODEL_N_EXPERTS_USED: return hp.n_expert_used;
    case MOELITE_MODEL_N_SHARED_EXPERTS:
      if (m.layers.empty() || !m.layers[static_cast<size_t>(hp.n_dense_lead)].has_shared) return 0;
      // DeepSeek's shared experts are one FFN of expert_shared_count experts' width.
      return hp.n_ff_expert > 0 && hp.arch == "deepseek2" ? hp.n_ff_shared / hp.n_ff_expert : 1;
    case MOELITE_MODEL_N_DENSE_LAYERS: return hp.n_dense_lead;
    case MOELITE_MODEL_KV_BYTES_PER_TOKEN:
      return moelite::Context::kv_position_floats(hp) * hp.n_layer * static_cast<int64_t>(sizeof(float));
    case MOELITE_MODEL_N_VOCAB: return hp.n_vocab;
    case MOELITE_MODEL_N_EMBD: return hp.n_embd;
    case MOELITE_MODEL_N_HEAD: return hp.n_head;
    case MOELITE_MODEL_N_HEAD_KV: return hp.n_head_kv;
    case MOELITE_MODEL_HEAD_DIM: return hp.head_dim;
    case MOELITE_MODEL_N_FF_EXPERT: return hp.n_ff_expert;
    case MOELITE_MODEL_N_FF_SHARED: return hp.n_ff_shared;
    case MOELITE_MODEL_N_CTX_TRAIN: return hp.n_ctx_train;
    case MOELITE_MODEL_EXPERT_BYTES: return static_cast<int64_t>(m.expert_bytes);
    case MOELITE_MODEL_DENSE_BYTES: return static_cast<int64_t>(m.dense_bytes);
    case MOELITE_MODEL_N_PARAMS: return static_cast<int64_t>(m.n_params);
    case MOELITE_MODEL_N_ACTIVE_PARAMS: return static_cast<int64_t>(m.n_active_params);
    case MOELITE_MODEL_THREADS: return rt ? rt->backend->n_threads() : 0;
    case MOELITE_MODEL_BACKEND: return rt ? static_cast<int64_t>(rt->backend->kind()) : -1;
    case MOELITE_MODEL_ACTIVE_BYTES: return static_cast<int64_t>(m.active_bytes);
    case MOELITE_MODEL_EXPERT_BUDGET: return rt ? static_cast<int64_t>(rt->memory_plan.budget_bytes) : 0;
    case MOELITE_MODEL_EXPERT_POOL_BYTES: return store ? static_cast<int64_t>(store->pool_bytes()) : 0;
    case MOELITE_MODEL_EXPERT_PEAK_BYTES: return store ? static_cast<int64_t>(store->peak_bytes()) : 0;
    case MOELITE_MODEL_EXPERT_SLOTS:
      return rt ? rt->memory_plan.n_slots : m.hp.n_moe_layers() * int64_t{m.hp.n_expert};
    case MOELITE_MODEL_BUDGET_AUTO: return auto_budget ? 1 : 0;
    case MOELITE_MODEL_BUDGET_AUTO_ROOM: return auto_budget ? static_cast<int64_t>(rt->memory_plan.auto_budget.room) : 0;
    case MOELITE_MODEL_BUDGET_AUTO_CONTEXT_BYTES:
      return auto_budget ? static_cast<int64_t>(rt->memory_plan.auto_budget.context) : 0;
    case MOELITE_MODEL_BUDGET_AUTO_HEADROOM:
      return auto_budget ? static_cast<int64_t>(rt->memory_plan.auto_budget.headroom) : 0;
    case MOELITE_MODEL_EXPERT_MIN_BUDGET: {
      if (m.vocab_only || m.layers.empty()) return 0;
      return static_cast<int64_t>(rt ? rt->memory_plan.limits.minimum : moelite::expert_pool_limits(m, false).minimum);
    }
    case MOELITE_MODEL_SLIDING_WINDOW: return hp.max_window();
    case MOELITE_MODEL_N_WINDOWED_LAYERS: {
      int64_t n = 0;
      for (int32_t l = 0; l < hp.n_layer; ++l) n += hp.window_of(l) > 0 ? 1 : 0;
      return n;
    }
    case MOELITE_MODEL_EXPERTS_ALL_FIT: return rt && rt->memory_plan.all_resident ? 1 : 0;
  }
  return -1;
}

MOELITE_API moelite_status moelite_model_expert_stats(const moelite_model* model, int32_t layer,
                                                      moelite_expert_stats* out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!out || out->struct_size < sizeof(size_t))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: out->struct_size must be set", api_fn);
    const moelite::Model& m = *model->impl;
    const moelite::Runtime* rt = model->runtime.get();
    if (layer < -1 || layer >= m.hp.n_layer) return fail(MOELITE_ERR_INVALID_ARGUMENT, "layer %d out of range", layer);
    moelite_expert_stats total = sum_expert_stats(rt && rt->store ? rt->store->stats()
                                                                  : std::vector<moelite::ExpertLayerStats>(),
                                                  layer, out->struct_size);
    if (layer < 0 && rt && rt->store) total.read_busy_seconds = rt->store->read_busy_seconds();
    if (rt) rt->routed.totals(layer, &total.routed_tokens, &total.routed_experts);
    memcpy(out, &total, moelite::api::expert_stats_bytes(out->struct_size));
    return MOELITE_OK;
  });
}

MOELITE_API void moelite_model_reset_expert_stats(moelite_model* model) {
  if (!model) return;
  moelite::Runtime* rt = model->runtime.get();
  if (!rt) return;
  try {
    if (rt->store) rt->store->reset_stats();
    rt->routed.reset(model->impl->hp.n_layer);
  } catch (...) {  // no status to return; the counters keep their values
    fail(MOELITE_ERR_OUT_OF_MEMORY, "moelite_model_reset_expert_stats: could not reset the counters");
  }
}

// ---- calibration

struct moelite_calibrate_params {
  moelite::CalibrateOptions opts;
};

MOELITE_API moelite_calibrate_params* moelite_calibrate_params_create(void) {
  return new (std::nothrow) moelite_calibrate_params();
}
MOELITE_API void moelite_calibrate_params_free(moelite_calibrate_params* p) { delete p; }

MOELITE_API moelite_status moelite_calibrate_params_set_window(moelite_calibrate_params* p, int32_t window) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (window < 2) return fail(MOELITE_ERR_INVALID_ARGUMENT, "calibration window %d must be at least 2", window);
    p->opts.window = window;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_calibrate_params_set_stride(moelite_calibrate_params* p, int32_t stride) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (stride < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "predictor stride %d must be at least 1", stride);
    p->opts.stride = stride;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_calibrate_params_set_holdout(moelite_calibrate_params* p, double share) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!(share > 0.0 && share < 1.0))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the held-out share must lie in (0, 1)");
    p->opts.holdout = share;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_calibrate_params_set_sensitivity_tokens(moelite_calibrate_params* p,
                                                                           int64_t tokens) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (tokens < -1)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "sensitivity tokens %lld must be -1 (default), 0 (all) or positive",
                  static_cast<long long>(tokens));
    p->opts.sensitivity_tokens = tokens;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_calibrate_params_set_progress_callback(moelite_calibrate_params* p,
                                                                          moelite_progress_fn fn, void* user_data) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->opts.progress = fn;
    p->opts.progress_user = user_data;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_calibrate(moelite_model* model, const int32_t* tokens, int32_t n_tokens,
                                             const moelite_calibrate_params* params, const char* profile_path) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!tokens && n_tokens > 0) return null_arg(api_fn, "tokens");
    if (!profile_path || !*profile_path) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: profile_path is empty", api_fn);
    const moelite::Model& m = *model->impl;
    if (!model->runtime)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the model was loaded vocabulary-only or by moelite_model_inspect");
    if (n_tokens < 2)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "calibration needs at least two tokens, got %d", n_tokens);
    for (int32_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= m.hp.n_vocab)
        return fail(MOELITE_ERR_BAD_TOKEN, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                    m.hp.n_vocab);
    const moelite::CalibrateOptions opts = params ? params->opts : moelite::CalibrateOptions();
    moelite::Profile profile;
    MOELITE_TRY(
        moelite::calibrate(m, *model->runtime, std::vector<int32_t>(tokens, tokens + n_tokens), opts, &profile));
    return profile.save(profile_path);
  });
}

MOELITE_API const char* moelite_model_arch(const moelite_model* m) { return m ? m->impl->hp.arch.c_str() : nullptr; }
MOELITE_API const char* moelite_model_name(const moelite_model* m) { return m ? m->impl->hp.name.c_str() : nullptr; }
MOELITE_API const char* moelite_model_expert_type(const moelite_model* m) {
  return m ? moelite::type_name(m->impl->expert_type) : nullptr;
}
MOELITE_API const char* moelite_model_backend_name(const moelite_model* m) {
  return m ? (m->runtime ? m->runtime->backend->name() : "none (vocabulary only)") : nullptr;
}
MOELITE_API const char* moelite_supported_archs(void) { return moelite::supported_arch_list(); }

MOELITE_API moelite_status moelite_model_measure_device_bandwidth(moelite_model* model, double* gb_per_s) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!gb_per_s) return null_arg(api_fn, "gb_per_s");
    if (!model->runtime) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: a vocabulary-only or inspected model has no device", api_fn);
    std::lock_guard<std::mutex> lock(model->runtime->eval_mutex);  // the backend is shared by the contexts
    return model->runtime->backend->measure_memory_bandwidth(gb_per_s);
  });
}

MOELITE_API moelite_status moelite_model_measure_expert_reads(const moelite_model* model, uint64_t bytes,
                                                              moelite_expert_read_probe* out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!out || out->struct_size < sizeof(size_t))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: out->struct_size must be set", api_fn);
    int32_t loaders = moelite::ExpertStoreOptions().io_threads;  // as the store's (core/exec/runtime.cpp)
    if (int64_t v = 0; moelite::option_int(moelite::Option::IoThreads, &v)) loaders = static_cast<int32_t>(v);
    moelite::ExpertReadProbe p;
    MOELITE_TRY(moelite::probe_expert_reads(*model->impl, loaders, bytes ? bytes : uint64_t{256} << 20, &p));
    moelite_expert_read_probe r;
    memset(&r, 0, sizeof r);
    r.struct_size = out->struct_size;
    r.read_gb_per_s = p.gb_per_s;
    r.reads_per_s = p.reads_per_s;
    r.read_bytes = p.read_bytes;
    r.reads_in_flight = p.reads_in_flight;
    r.copy_gb_per_s = p.copy_gb_per_s;
    memcpy(out, &r, moelite::api::expert_read_probe_bytes(out->struct_size));
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_model_trace_begin(moelite_model* model, const char* path) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!path) return null_arg(api_fn, "path");
    if (!model->runtime) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: a vocabulary-only or inspected model runs nothing to trace", api_fn);
    return model->runtime->begin_trace(path);
  });
}

MOELITE_API moelite_status moelite_model_trace_end(moelite_model* model) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!model->runtime) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: no trace of this model is being recorded", api_fn);
    return model->runtime->end_trace();
  });
}

// ---- context parameters

MOELITE_API moelite_context_params* moelite_context_params_create(void) {
  return new (std::nothrow) moelite_context_params();
}
MOELITE_API void moelite_context_params_free(moelite_context_params* p) { delete p; }

MOELITE_API moelite_status moelite_context_params_set_n_ctx(moelite_context_params* p, int32_t n_ctx) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (n_ctx < 0 || n_ctx > MOELITE_MAX_CONTEXT)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "n_ctx %d is outside 0..%d", n_ctx, MOELITE_MAX_CONTEXT);
    p->opts.n_ctx = n_ctx;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_params_set_n_batch(moelite_context_params* p, int32_t n_batch) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (n_batch < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "n_batch %d must be at least 1", n_batch);
    p->opts.n_batch = n_batch;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_params_set_n_seq(moelite_context_params* p, int32_t n_seq) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (n_seq < 1 || n_seq > MOELITE_MAX_SEQUENCES)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "n_seq %d is outside 1..%d", n_seq, MOELITE_MAX_SEQUENCES);
    p->opts.n_seq = n_seq;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_params_set_abort_callback(moelite_context_params* p, moelite_abort_fn fn,
                                                                     void* user) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->opts.abort = fn;
    p->opts.abort_user = user;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_params_set_routing_callback(moelite_context_params* p, moelite_routing_fn fn,
                                                                       void* user) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    p->opts.on_route = fn;
    p->opts.route_user = user;
    return MOELITE_OK;
  });
}

// ---- contexts

MOELITE_API moelite_status moelite_context_create(moelite_model* model, const moelite_context_params* params,
                                                  moelite_context** out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!out) return null_arg(api_fn, "out_ctx");
    moelite::ContextOptions opts = params ? params->opts : moelite::ContextOptions{};
    try {
      if (!model->runtime)
        return fail(MOELITE_ERR_INVALID_ARGUMENT,
                    "the model was loaded vocabulary-only or by moelite_model_inspect; contexts need its weights");
      std::unique_ptr<moelite::Context> c;
      MOELITE_TRY(moelite::Context::create(*model->impl, *model->runtime, opts, &c));
      auto* handle = new moelite_context{std::move(c), model};
      model->refs.fetch_add(1, std::memory_order_relaxed);
      *out = handle;
      return MOELITE_OK;
    } catch (const std::bad_alloc&) {
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory while creating a context");
    }
  });
}

MOELITE_API void moelite_context_free(moelite_context* c) {
  if (!c) return;
  moelite::ApiErrorScope scope;
  moelite_model* owner = c->owner;
  delete c;  // the context first: it reads the model until its destructor returns
  release_model(owner);
}

MOELITE_API moelite_status moelite_eval(moelite_context* c, const int32_t* tokens, int32_t n_tokens,
                                        int32_t logits_all) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    if (!tokens) return null_arg(api_fn, "tokens");
    try {
      return c->impl->eval(tokens, n_tokens, logits_all != 0);
    } catch (const std::bad_alloc&) {
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory during evaluation");
    }
  });
}

MOELITE_API moelite_status moelite_eval_batch(moelite_context* c, const int32_t* tokens, const int32_t* seq_ids,
                                              const uint8_t* want_logits, int32_t n_tokens) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    if (!tokens) return null_arg(api_fn, "tokens");
    try {
      return c->impl->eval_seqs(tokens, seq_ids, want_logits, n_tokens);
    } catch (const std::bad_alloc&) {
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory during evaluation");
    }
  });
}

MOELITE_API moelite_status moelite_context_save(const moelite_context* c, const char* path) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    if (!path) return null_arg(api_fn, "path");
    return c->impl->save(path);
  });
}

MOELITE_API moelite_status moelite_context_load(moelite_context* c, const char* path) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    if (!path) return null_arg(api_fn, "path");
    return c->impl->load(path);
  });
}

MOELITE_API int32_t moelite_context_n_seq(const moelite_context* c) { return c ? c->impl->n_seq() : 0; }
MOELITE_API int32_t moelite_context_seq_length(const moelite_context* c, int32_t seq) {
  return c && seq >= 0 && seq < c->impl->n_seq() ? c->impl->length(seq) : 0;
}
MOELITE_API moelite_status moelite_context_seq_truncate(moelite_context* c, int32_t seq, int32_t n_keep) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    if (seq < 0 || seq >= c->impl->n_seq())
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "sequence id %d is outside 0..%d", seq, c->impl->n_seq() - 1);
    c->impl->truncate(n_keep, seq);
    return MOELITE_OK;
  });
}

MOELITE_API const float* moelite_get_logits(const moelite_context* c, int32_t i) {
  const ContextTurn turn(c);
  return c && turn.ok() ? c->impl->logits(i) : nullptr;  // another thread's evaluation rewrites them
}
MOELITE_API moelite_model* moelite_context_model(const moelite_context* c) { return c ? c->owner : nullptr; }
MOELITE_API int32_t moelite_context_kv_length(const moelite_context* c) { return c ? c->impl->length() : 0; }
MOELITE_API int32_t moelite_context_n_ctx(const moelite_context* c) { return c ? c->impl->n_ctx() : 0; }
MOELITE_API uint64_t moelite_context_kv_bytes(const moelite_context* c) { return c ? c->impl->kv_bytes() : 0; }
// Without a status to say MOELITE_ERR_BUSY, these do nothing while another thread is inside a call
// on the context (the header says so): cutting a cache that an evaluation is writing corrupts it.
MOELITE_API void moelite_context_kv_reset(moelite_context* c) {
  moelite::ApiErrorScope scope;
  const ContextTurn turn(c);
  if (c && turn.ok()) c->impl->truncate(0);
}
MOELITE_API void moelite_context_kv_truncate(moelite_context* c, int32_t n_keep) {
  moelite::ApiErrorScope scope;
  const ContextTurn turn(c);
  if (c && turn.ok()) c->impl->truncate(n_keep);
}
MOELITE_API int32_t moelite_kv_length(const moelite_context* c) { return moelite_context_kv_length(c); }
MOELITE_API void moelite_kv_reset(moelite_context* c) { moelite_context_kv_reset(c); }
MOELITE_API void moelite_kv_truncate(moelite_context* c, int32_t n_keep) { moelite_context_kv_truncate(c, n_keep); }

MOELITE_API moelite_status moelite_context_set_abort_callback(moelite_context* c, moelite_abort_fn fn, void* user) {
  if (!c) return null_arg(__func__, "ctx");
  const ContextTurn turn(c);
  if (!turn.ok()) return busy(__func__);  // the evaluation of another thread is polling the callback
  c->impl->set_abort(fn, user);
  return MOELITE_OK;
}

MOELITE_API moelite_status moelite_context_get_tokens(const moelite_context* c, int32_t* tokens, int32_t capacity,
                                                      int32_t* n_tokens) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    return moelite::api::copy_tokens_out(api_fn, c->impl->tokens(), tokens, capacity, n_tokens);
  });
}

MOELITE_API moelite_status moelite_context_expert_stats(const moelite_context* c, int32_t layer,
                                                        moelite_expert_stats* out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);
    if (!turn.ok()) return busy(api_fn);
    if (!out || out->struct_size < sizeof(size_t))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: out->struct_size must be set", api_fn);
    const int32_t n_layer = c->impl->model().hp.n_layer;
    if (layer < -1 || layer >= n_layer) return fail(MOELITE_ERR_INVALID_ARGUMENT, "layer %d out of range", layer);
    const moelite::ExpertCounters k = c->impl->counters();
    std::vector<moelite::ExpertLayerStats> store = k.store;
    store.resize(static_cast<size_t>(n_layer));
    moelite_expert_stats total = sum_expert_stats(store, layer, out->struct_size);
    const std::vector<uint64_t>&tokens = c->impl->routed_tokens(), &experts = c->impl->routed_experts();
    for (int32_t l = 0; l < n_layer; ++l) {
      if (layer >= 0 && l != layer) continue;
      total.routed_tokens += tokens[static_cast<size_t>(l)];
      total.routed_experts += experts[static_cast<size_t>(l)];
    }
    if (layer < 0) total.read_busy_seconds = k.read_busy_seconds;
    memcpy(out, &total, moelite::api::expert_stats_bytes(out->struct_size));
    return MOELITE_OK;
  });
}

MOELITE_API void moelite_context_reset_expert_stats(moelite_context* c) {
  const ContextTurn turn(c);
  if (c && turn.ok()) c->impl->reset_counters();  // nothing while another thread evaluates (as kv_reset)
}

// ---- tokens and text


MOELITE_API moelite_status moelite_tokenize(const moelite_model* model, const char* text, size_t text_len,
                                            uint32_t flags, int32_t* tokens, int32_t capacity, int32_t* n_tokens) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    const moelite::Tokenizer* tok = nullptr;
    MOELITE_TRY(tokenizer_of(model, api_fn, &tok));
    if (!text && text_len) return null_arg(api_fn, "text");
    if (!n_tokens) return null_arg(api_fn, "n_tokens");
    if (capacity < 0 || (!tokens && capacity > 0)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "bad token buffer");
    try {
      std::vector<int32_t> ids =
          tok->tokenize(std::string(text ? text : "", text_len), flags & MOELITE_TOKENIZE_ADD_SPECIAL,
                        flags & MOELITE_TOKENIZE_PARSE_SPECIAL);
      if (ids.size() > static_cast<size_t>(INT32_MAX)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "text too long");
      *n_tokens = static_cast<int32_t>(ids.size());
      if (ids.size() > static_cast<size_t>(capacity))
        return fail(MOELITE_ERR_BUFFER_TOO_SMALL, "%zu tokens do not fit a buffer of %d", ids.size(), capacity);
      std::copy(ids.begin(), ids.end(), tokens);
      return MOELITE_OK;
    } catch (const std::bad_alloc&) {
      return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory while tokenizing");
    }
  });
}

MOELITE_API moelite_status moelite_detokenize(const moelite_model* model, const int32_t* tokens, int32_t n_tokens,
                                              uint32_t flags, char* text, size_t capacity, size_t* text_len) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    const moelite::Tokenizer* tok = nullptr;
    MOELITE_TRY(tokenizer_of(model, api_fn, &tok));
    if ((!tokens && n_tokens > 0) || n_tokens < 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "bad token array");
    if (!text_len) return null_arg(api_fn, "text_len");
    if (!text && capacity > 0) return null_arg(api_fn, "text");
    for (int32_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= tok->n_tokens())
        return fail(MOELITE_ERR_BAD_TOKEN, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                    tok->n_tokens());
    std::string out =
        tok->detokenize(std::vector<int32_t>(tokens, tokens + n_tokens), flags & MOELITE_DETOKENIZE_RENDER_SPECIAL);
    return copy_out(out, text, capacity, text_len);
  });
}

MOELITE_API int32_t moelite_token_bos(const moelite_model* m) {
  return m && m->impl->tokenizer ? m->impl->tokenizer->bos() : -1;
}
MOELITE_API int32_t moelite_token_eos(const moelite_model* m) {
  return m && m->impl->tokenizer ? m->impl->tokenizer->eos() : -1;
}
MOELITE_API int32_t moelite_token_is_end(const moelite_model* m, int32_t token) {
  if (!m || !m->impl->tokenizer || token < 0 || token >= m->impl->tokenizer->n_tokens()) return 0;
  return m->impl->tokenizer->is_end_of_generation(token) ? 1 : 0;
}

MOELITE_API moelite_status moelite_chat_format(const moelite_model* model, const moelite_chat_message* messages,
                                               size_t n_messages, int32_t add_assistant_prompt, char* text,
                                               size_t capacity, size_t* text_len) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!model) return null_arg(api_fn, "model");
    if (!messages && n_messages) return null_arg(api_fn, "messages");
    if (!text_len) return null_arg(api_fn, "text_len");
    if (!text && capacity > 0) return null_arg(api_fn, "text");
    std::vector<moelite::ChatMessage> msgs;
    for (size_t i = 0; i < n_messages; ++i) {
      if (!messages[i].role || !messages[i].content)
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "message %zu has a NULL role or content", i);
      msgs.push_back({messages[i].role, messages[i].content});
    }
    const moelite::Model& m = *model->impl;
    if (m.chat_template == moelite::ChatTemplate::Plain && !m.chat_template_chosen)
      moelite::log_msg(MOELITE_LOG_WARN,
                       "no known chat template in the model; formatting as plain 'role: content' lines");
    std::string eos;
    if (m.tokenizer && m.tokenizer->eos() >= 0) eos = m.tokenizer->text(m.tokenizer->eos());
    return copy_out(moelite::format_chat(m.chat_template, msgs, add_assistant_prompt != 0, eos), text, capacity,
                    text_len);
  });
}

MOELITE_API const char* moelite_chat_template_kind(const moelite_model* m) {
  return m ? moelite::chat_template_name(m->impl->chat_template) : nullptr;
}

}  // extern "C"
