// The C API's request queue (core/serve/request_queue.h): argument checks and translation, nothing else.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/api/handles.h"
#include "core/serve/request_queue.h"
#include "moelite.h"
#include "platforms/platform.h"

using moelite::fail;
using moelite::api::busy;
using moelite::api::ContextTurn;
using moelite::api::guarded;
using moelite::api::null_arg;

struct moelite_queue {
  std::unique_ptr<moelite::RequestQueue> impl;
  moelite_context* ctx = nullptr;  // borrowed (the header: the context outlives the queue)
  bool stepping = false;  // inside moelite_queue_step: its callbacks may not re-enter the queue
};

namespace {

// A queue that exists and is not inside one of its own steps' callbacks.
moelite_status usable(const char* fn, const moelite_queue* q) {
  if (!q) return null_arg(fn, "queue");
  if (q->stepping)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: called from a callback of moelite_queue_step on the same queue", fn);
  return MOELITE_OK;
}

// guarded() for a queue's functions, on a turn of the queue's context (ContextTurn): its requests
// live in the context's sequences and a step evaluates it, so a thread calling while another is
// inside a call on the queue or its context gets MOELITE_ERR_BUSY instead of racing it.
template <class Body>
moelite_status queue_guarded(const char* fn, const moelite_queue* q, Body&& body) {
  return guarded(fn, [&]() -> moelite_status {
    const ContextTurn turn(q ? q->ctx : nullptr);
    if (q && !turn.ok()) return busy(fn);
    return body();
  });
}

// A request of the queue, or a specific error for an id it does not hold.
moelite_status request_of(const char* fn, const moelite_queue* q, int64_t id,
                          const moelite::RequestQueue::Request** out) {
  MOELITE_TRY(usable(fn, q));
  *out = q->impl->find(id);
  if (!*out) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: the queue holds no request %lld", fn, (long long)id);
  return MOELITE_OK;
}

}  // namespace

extern "C" {

MOELITE_API moelite_status moelite_queue_create(moelite_context* ctx, moelite_queue** out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!ctx) return null_arg(api_fn, "ctx");
    if (!out) return null_arg(api_fn, "out");
    const ContextTurn turn(ctx);
    if (!turn.ok()) return busy(api_fn);
    if (!ctx->impl->model().tokenizer)
      return fail(MOELITE_ERR_MISSING_METADATA, "%s: the model has no tokenizer; generation needs one", api_fn);
    auto q = std::make_unique<moelite_queue>();
    q->impl = std::make_unique<moelite::RequestQueue>(*ctx->impl);
    q->ctx = ctx;
    *out = q.release();
    return MOELITE_OK;
  });
}

MOELITE_API void moelite_queue_free(moelite_queue* queue) { delete queue; }

MOELITE_API moelite_status moelite_queue_add(moelite_queue* q, const int32_t* prompt, int32_t n_prompt,
                                             const moelite_generate_params* params, int64_t* out_id) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    MOELITE_TRY(usable(api_fn, q));
    if (!out_id) return null_arg(api_fn, "out_id");
    if (n_prompt < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: n_prompt is %d; a prompt has at least one token", api_fn, n_prompt);
    if (!prompt) return null_arg(api_fn, "prompt");
    const moelite::GenerateOptions defaults;
    return q->impl->add(std::vector<int32_t>(prompt, prompt + n_prompt), params ? params->opts : defaults, out_id);
  });
}

MOELITE_API moelite_status moelite_queue_step(moelite_queue* q, int32_t* out_n_events) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    MOELITE_TRY(usable(api_fn, q));
    q->stepping = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{q->stepping};
    moelite_status st;
    try {
      st = q->impl->step();
    } catch (const std::bad_alloc&) {
      st = fail(MOELITE_ERR_OUT_OF_MEMORY, "%s: out of memory", api_fn);
    }
    if (st == MOELITE_OK && out_n_events) *out_n_events = static_cast<int32_t>(q->impl->events().size());
    return st;
  });
}

MOELITE_API moelite_status moelite_queue_event(const moelite_queue* q, int32_t i, int64_t* request_id, int32_t* token,
                                               int32_t* state) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    MOELITE_TRY(usable(api_fn, q));
    const auto& events = q->impl->events();
    if (i < 0 || static_cast<size_t>(i) >= events.size())
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: event %d of the last step's %zu", api_fn, i, events.size());
    const moelite::RequestQueue::Event& e = events[static_cast<size_t>(i)];
    if (request_id) *request_id = e.request;
    if (token) *token = e.token;
    if (state) *state = e.state;
    return MOELITE_OK;
  });
}

MOELITE_API int64_t moelite_queue_waiting(const moelite_queue* q) { return q ? q->impl->waiting() : 0; }
MOELITE_API int64_t moelite_queue_running(const moelite_queue* q) { return q ? q->impl->running() : 0; }
MOELITE_API int64_t moelite_queue_finished(const moelite_queue* q) { return q ? q->impl->finished() : 0; }

MOELITE_API moelite_status moelite_queue_request_state(const moelite_queue* q, int64_t id, int32_t* state) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    const moelite::RequestQueue::Request* r = nullptr;
    MOELITE_TRY(request_of(api_fn, q, id, &r));
    if (!state) return null_arg(api_fn, "state");
    *state = r->state;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_queue_request_stats(const moelite_queue* q, int64_t id,
                                                       moelite_generate_stats* stats) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    const moelite::RequestQueue::Request* r = nullptr;
    MOELITE_TRY(request_of(api_fn, q, id, &r));
    if (!stats) return null_arg(api_fn, "stats");
    if (stats->struct_size < sizeof(size_t))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "stats->struct_size must be set to sizeof(moelite_generate_stats)");
    const double now = moelite::platform::now_seconds();
    const double end = r->t_finished > 0 ? r->t_finished : now;
    moelite_generate_stats full;
    memset(&full, 0, sizeof full);
    full.struct_size = stats->struct_size;
    full.n_cached_tokens = r->cached;
    full.n_prompt_tokens = r->t_admitted > 0 ? static_cast<int32_t>(r->prompt.size()) - r->cached : 0;
    full.n_generated_tokens = static_cast<int32_t>(r->generated.size());
    full.stop_reason = r->state;
    if (r->t_admitted > 0) full.prompt_seconds = (r->t_first > 0 ? r->t_first : end) - r->t_admitted;
    if (r->t_first > 0) {
      full.time_to_first_token_seconds = r->t_first - r->t_added;
      full.generate_seconds = end - r->t_first;
    }
    full.prompt_tokens_per_second = full.prompt_seconds > 0 ? full.n_prompt_tokens / full.prompt_seconds : 0.0;
    // The first token came with the prompt's logits: the decode rate counts those after it.
    full.generated_tokens_per_second =
        full.generate_seconds > 0 && full.n_generated_tokens > 1 ? (full.n_generated_tokens - 1) / full.generate_seconds : 0.0;
    memcpy(stats, &full, moelite::api::generate_stats_bytes(stats->struct_size));
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_queue_request_tokens(const moelite_queue* q, int64_t id, int32_t* tokens,
                                                        int32_t capacity, int32_t* n_tokens) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    const moelite::RequestQueue::Request* r = nullptr;
    MOELITE_TRY(request_of(api_fn, q, id, &r));
    return moelite::api::copy_tokens_out(api_fn, r->generated, tokens, capacity, n_tokens);
  });
}

MOELITE_API moelite_status moelite_queue_request_text(const moelite_queue* q, int64_t id, char* buf, size_t capacity,
                                                      size_t* length) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    const moelite::RequestQueue::Request* r = nullptr;
    MOELITE_TRY(request_of(api_fn, q, id, &r));
    if (!buf && capacity > 0) return null_arg(api_fn, "buf");
    if (!length) return null_arg(api_fn, "length");
    return moelite::api::copy_out(r->text, buf, capacity, length);
  });
}

MOELITE_API moelite_status moelite_queue_cancel(moelite_queue* q, int64_t id) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    MOELITE_TRY(usable(api_fn, q));
    return q->impl->cancel(id);
  });
}

MOELITE_API moelite_status moelite_queue_remove(moelite_queue* q, int64_t id) {
  const char* const api_fn = __func__;
  return queue_guarded(api_fn, q, [&]() -> moelite_status {
    MOELITE_TRY(usable(api_fn, q));
    return q->impl->remove(id);
  });
}

}  // extern "C"
