// What the C API's files share: the handles behind the opaque types of moelite.h and the
// helpers every entry point uses (argument errors, the exception barrier, output copies). Only
// core/api*.cpp include it.
#pragma once
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "base/status.h"
#include "core/context.h"
#include "core/generate.h"
#include "core/model.h"
#include "core/runtime.h"
#include "core/sampling.h"
#include "moelite.h"

struct moelite_model_params {
  moelite::LoadOptions opts;
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

}  // namespace moelite::api

struct moelite_sampler {
  moelite::Sampler impl;
  moelite::SamplerParams params;  // for reset
  std::vector<int32_t> history;
};
