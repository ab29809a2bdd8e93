// What the C API's files share: the handles behind the opaque types of moelite.h and the
// helpers every entry point uses (argument errors, the exception barrier, output copies). Only
// core/api*.cpp include it.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "base/status.h"
#include "core/exec/context.h"
#include "core/exec/runtime.h"
#include "core/model/model.h"
#include "core/serve/generate.h"
#include "core/text/sampling.h"
#include "moelite.h"

// How the file is read (LoadOptions) and how the model executes (RuntimeOptions).
struct moelite_model_params {
  moelite::LoadOptions load;
  moelite::RuntimeOptions run;
};
struct moelite_context_params {
  moelite::ContextOptions opts;
};
struct moelite_generate_params {
  moelite::GenerateOptions opts;
};
// The immutable model and the runtime that executes it (null for a vocabulary-only load). The
// runtime is declared second so it is destroyed first: its store and backend refer to the model.
//
// Lifetime: the handle is reference counted. The application's moelite_model_load holds one
// reference and every context holds one, so the model lives until the later of
// moelite_model_free and the last moelite_context_free, whatever the order (bindings whose
// finalizers run in any order rely on this).
struct moelite_model {
  std::unique_ptr<moelite::Model> impl;
  std::unique_ptr<moelite::Runtime> runtime;
  std::atomic<int64_t> refs{1};
};
struct moelite_context {
  std::unique_ptr<moelite::Context> impl;
  moelite_model* owner = nullptr;  // one reference, dropped after impl is destroyed
  // The thread inside a call on this context (no thread: std::thread::id()). The header's "one
  // thread at a time" is checked here rather than trusted: two threads evaluating one context
  // would write the same KV cache, logits and scratch at once, so the second thread's call is
  // refused (MOELITE_ERR_BUSY) before it touches anything. Mutable: reading calls (save,
  // get_tokens) take their turn too, since an evaluation rewrites what they read.
  mutable std::atomic<std::thread::id> user{};
};

namespace moelite::api {

inline void release_model(moelite_model* m) noexcept {
  // acq_rel: the thread that destroys the model sees every write other holders made before
  // dropping their reference.
  if (m && m->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete m;
}

inline moelite_status null_arg(const char* fn, const char* what) {
  return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
}

// A turn on a context for the calling thread, for the length of one API call (see
// moelite_context::user). ok() is false when another thread is inside a call on it; the same
// thread may enter again, since callbacks (abort, routing, piece, token, logits) run inside its
// call and may read the context (moelite_get_logits, moelite_context_get_tokens).
class ContextTurn {
 public:
  explicit ContextTurn(const moelite_context* c) noexcept : c_(c) {
    if (!c_) return;
    std::thread::id current;  // none
    const std::thread::id me = std::this_thread::get_id();
    // acquire/release: the next thread to take the context sees every write of this call.
    if (c_->user.compare_exchange_strong(current, me, std::memory_order_acquire, std::memory_order_acquire))
      owner_ = true;
    else
      ok_ = current == me;
  }
  ~ContextTurn() {
    if (owner_) c_->user.store(std::thread::id(), std::memory_order_release);
  }
  ContextTurn(const ContextTurn&) = delete;
  ContextTurn& operator=(const ContextTurn&) = delete;
  bool ok() const { return owner_ || ok_; }

 private:
  const moelite_context* c_;
  bool owner_ = false;
  bool ok_ = false;
};

inline moelite_status busy(const char* fn) {
  return moelite::fail(MOELITE_ERR_BUSY,
                       "%s: another thread is inside a call on this context (a context is used by one thread at a "
                       "time); nothing was done",
                       fn);
}

// Every API function that returns a status runs its body through this: no C++ exception may
// leave moelite through the C ABI. fail() formats into a fixed buffer, so it cannot throw here.
template <class Body>
moelite_status guarded_body(const char* fn, Body& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return moelite::fail(MOELITE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  } catch (const std::system_error& e) {  // threads, mutexes: the OS refused a resource
    return moelite::fail(MOELITE_ERR_SYSTEM_LIMIT, "%s: %s", fn, e.what());
  } catch (const std::exception& e) {
    return moelite::fail(MOELITE_ERR_INTERNAL, "%s: unexpected error: %s", fn, e.what());
  } catch (...) {
    return moelite::fail(MOELITE_ERR_INTERNAL, "%s: unexpected exception", fn);
  }
}

// ... and keeps moelite_last_error() as it was when the call succeeds (internal code may fail
// and recover on the way: backend probes, O_DIRECT fallbacks).
template <class Body>
moelite_status guarded(const char* fn, Body&& body) noexcept {
  moelite::ApiErrorScope error_scope;
  return error_scope.finish(guarded_body(fn, body));
}

inline moelite_status tokenizer_of(const moelite_model* model, const char* fn, const moelite::Tokenizer** out) {
  if (!model) return null_arg(fn, "model");
  if (!model->impl->tokenizer)
    return moelite::fail(MOELITE_ERR_MISSING_METADATA, "%s: the model file has no tokenizer (tokenizer.ggml.*)", fn);
  *out = model->impl->tokenizer.get();
  return MOELITE_OK;
}

// Copies `text` out following the BUFFER_TOO_SMALL convention.
inline moelite_status copy_out(const std::string& text, char* buf, size_t capacity, size_t* len) {
  *len = text.size();
  if (text.size() > capacity)
    return moelite::fail(MOELITE_ERR_BUFFER_TOO_SMALL, "output needs %zu bytes, the buffer has %zu", text.size(), capacity);
  if (!text.empty()) memcpy(buf, text.data(), text.size());
  return MOELITE_OK;
}

// Copies token ids out following the BUFFER_TOO_SMALL convention (*n_tokens: the count needed).
inline moelite_status copy_tokens_out(const char* fn, const std::vector<int32_t>& held, int32_t* tokens,
                                      int32_t capacity, int32_t* n_tokens) {
  if (!n_tokens) return null_arg(fn, "n_tokens");
  if (capacity < 0 || (!tokens && capacity > 0))
    return moelite::fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: bad token buffer", fn);
  *n_tokens = static_cast<int32_t>(held.size());
  if (held.size() > static_cast<size_t>(capacity))
    return moelite::fail(MOELITE_ERR_BUFFER_TOO_SMALL, "%zu tokens do not fit a buffer of %d", held.size(), capacity);
  std::copy(held.begin(), held.end(), tokens);
  return MOELITE_OK;
}

// Versioned output structs (moelite_expert_stats, moelite_generate_stats, moelite_quality_stats,
// moelite_expert_read_probe): the bytes to copy for a
// caller's struct_size, ending at the last field that lies wholly within it, so a struct_size
// that is not a field boundary never gets half a field.
#define MOELITE_FIELD_END(T, f) (offsetof(T, f) + sizeof(static_cast<T*>(nullptr)->f))
template <size_t N>
size_t whole_fields(size_t struct_size, const size_t (&field_ends)[N]) {
  size_t bytes = 0;
  for (size_t end : field_ends)
    if (end <= struct_size && end > bytes) bytes = end;
  return bytes;
}
inline size_t expert_stats_bytes(size_t struct_size) {
  using S = moelite_expert_stats;
  static const size_t ends[] = {
      MOELITE_FIELD_END(S, struct_size),       MOELITE_FIELD_END(S, activations),    MOELITE_FIELD_END(S, hits),
      MOELITE_FIELD_END(S, misses),            MOELITE_FIELD_END(S, prefetches_issued),
      MOELITE_FIELD_END(S, prefetches_used),   MOELITE_FIELD_END(S, prefetches_wasted),
      MOELITE_FIELD_END(S, bytes_read),        MOELITE_FIELD_END(S, wait_seconds),   MOELITE_FIELD_END(S, predicted),
      MOELITE_FIELD_END(S, predictions),       MOELITE_FIELD_END(S, ready_when_needed),
      MOELITE_FIELD_END(S, routed_tokens),     MOELITE_FIELD_END(S, routed_experts),
      MOELITE_FIELD_END(S, read_busy_seconds), MOELITE_FIELD_END(S, reads)};
  return whole_fields(struct_size, ends);
}
inline size_t quality_stats_bytes(size_t struct_size) {
  using S = moelite_quality_stats;
  static const size_t ends[] = {MOELITE_FIELD_END(S, struct_size), MOELITE_FIELD_END(S, gated_tokens), MOELITE_FIELD_END(S, predicted_loss), MOELITE_FIELD_END(S, metered_tokens), MOELITE_FIELD_END(S, kl_mean), MOELITE_FIELD_END(S, kl_stderr), MOELITE_FIELD_END(S, top1_agreement), MOELITE_FIELD_END(S, top1_stderr), MOELITE_FIELD_END(S, predicted_loss_metered), MOELITE_FIELD_END(S, meter_evaluations), MOELITE_FIELD_END(S, meter_seconds), MOELITE_FIELD_END(S, threshold), MOELITE_FIELD_END(S, target_kl), MOELITE_FIELD_END(S, kl_per_predicted)};
  return whole_fields(struct_size, ends);
}
inline size_t expert_read_probe_bytes(size_t struct_size) {
  using S = moelite_expert_read_probe;
  static const size_t ends[] = {MOELITE_FIELD_END(S, struct_size), MOELITE_FIELD_END(S, read_gb_per_s), MOELITE_FIELD_END(S, reads_per_s), MOELITE_FIELD_END(S, read_bytes), MOELITE_FIELD_END(S, reads_in_flight), MOELITE_FIELD_END(S, copy_gb_per_s)};
  return whole_fields(struct_size, ends);
}
inline size_t generate_stats_bytes(size_t struct_size) {
  using S = moelite_generate_stats;
  static const size_t ends[] = {MOELITE_FIELD_END(S, struct_size),
                                MOELITE_FIELD_END(S, n_prompt_tokens),
                                MOELITE_FIELD_END(S, n_cached_tokens),
                                MOELITE_FIELD_END(S, n_generated_tokens),
                                MOELITE_FIELD_END(S, stop_reason),
                                MOELITE_FIELD_END(S, prompt_seconds),
                                MOELITE_FIELD_END(S, generate_seconds),
                                MOELITE_FIELD_END(S, time_to_first_token_seconds),
                                MOELITE_FIELD_END(S, prompt_tokens_per_second),
                                MOELITE_FIELD_END(S, generated_tokens_per_second)};
  return whole_fields(struct_size, ends);
}

}  // namespace moelite::api

struct moelite_sampler {
  moelite::Sampler impl;  // its params() restart it on reset
  std::vector<int32_t> history;
};
