// The C API's generation side: generation parameters, moelite_generate / _generate_tokens,
// samplers and safe chat tokenization. Argument checks and translation, nothing else.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/api/handles.h"
#include "core/serve/generate.h"
#include "core/text/chat_template.h"
#include "core/text/sampling.h"
#include "moelite.h"

using moelite::fail;
using moelite::api::busy;
using moelite::api::ContextTurn;
using moelite::api::guarded;
using moelite::api::null_arg;
using moelite::api::tokenizer_of;

namespace {

void fill_stats(const moelite::GenerateResult& r, moelite_generate_stats* stats) {
  if (!stats) return;
  moelite_generate_stats full;
  memset(&full, 0, sizeof full);
  full.struct_size = stats->struct_size;
  full.n_prompt_tokens = r.n_prompt;
  full.n_cached_tokens = r.n_cached;
  full.n_generated_tokens = r.n_generated;
  full.stop_reason = r.stop;
  full.prompt_seconds = r.prompt_seconds;
  full.generate_seconds = r.generate_seconds;
  full.time_to_first_token_seconds = r.ttft_seconds;
  full.prompt_tokens_per_second = r.prompt_seconds > 0 ? r.n_prompt / r.prompt_seconds : 0.0;
  full.generated_tokens_per_second = r.generate_seconds > 0 ? r.n_generated / r.generate_seconds : 0.0;
  memcpy(stats, &full, moelite::api::generate_stats_bytes(stats->struct_size));
}

// Runs one generation call (text or tokens) and fills stats whatever the outcome: the header
// promises the stats of a failed call say what was done before the failure.
template <class Run>
moelite_status run_generation(const char* fn, moelite_context* ctx, moelite_generate_stats* stats, Run&& run) {
  return guarded(fn, [&]() -> moelite_status {
    if (!ctx) return null_arg(fn, "ctx");
    if (stats && stats->struct_size < sizeof(size_t))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "stats->struct_size must be set to sizeof(moelite_generate_stats)");
    moelite::GenerateResult r;
    const ContextTurn turn(ctx);
    if (!turn.ok()) {
      r.stop = MOELITE_STOP_ERROR;  // nothing done, and the stats say so
      fill_stats(r, stats);
      return busy(fn);
    }
    moelite_status st;
    try {
      st = run(&r);
    } catch (const std::bad_alloc&) {
      r.stop = MOELITE_STOP_ERROR;
      st = fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory during generation");
    }
    fill_stats(r, stats);
    return st;
  });
}

}  // namespace

extern "C" {

MOELITE_API moelite_generate_params* moelite_generate_params_create(void) {
  return new (std::nothrow) moelite_generate_params();
}
MOELITE_API void moelite_generate_params_free(moelite_generate_params* p) { delete p; }

#define GEN_SETTER(name, type, check, range, assign)                                                       \
  MOELITE_API moelite_status moelite_generate_params_set_##name(moelite_generate_params* p, type v) {      \
    moelite::ApiErrorScope scope;                                                                          \
    if (!p) return scope.finish(null_arg(__func__, "params"));                                             \
    if (!(check)) return scope.finish(fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: the value must be %s", __func__, range)); \
    assign;                                                                                                \
    return MOELITE_OK;                                                                                     \
  }
GEN_SETTER(max_tokens, int32_t, v >= 0, ">= 0", p->opts.max_tokens = v)
GEN_SETTER(temperature, float, v >= 0.0f && std::isfinite(v), "finite and >= 0", p->opts.sampler.temperature = v)
GEN_SETTER(top_k, int32_t, v >= 0, ">= 0", p->opts.sampler.top_k = v)
GEN_SETTER(top_p, float, v > 0.0f && v <= 1.0f, "in (0, 1]", p->opts.sampler.top_p = v)
GEN_SETTER(min_p, float, v >= 0.0f && v <= 1.0f, "in [0, 1]", p->opts.sampler.min_p = v)
GEN_SETTER(seed, uint64_t, true, "any value", p->opts.sampler.seed = v)
GEN_SETTER(parse_special, int32_t, true, "any value", p->opts.parse_special = v != 0)
#undef GEN_SETTER

MOELITE_API moelite_status moelite_generate_params_set_repeat_penalty(moelite_generate_params* p, float penalty,
                                                                      int32_t last_n) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!(penalty > 0.0f) || !std::isfinite(penalty) || last_n < -1)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "the repeat penalty must be finite and > 0, and last_n >= -1");
    p->opts.sampler.repeat_penalty = penalty;
    p->opts.sampler.repeat_last_n = last_n;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_generate_params_add_stop(moelite_generate_params* p, const char* stop) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!stop || !*stop) return fail(MOELITE_ERR_INVALID_ARGUMENT, "a stop string must be non-empty");
    p->opts.stops.emplace_back(stop);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_generate_params_set_logit_bias(moelite_generate_params* p, int32_t token,
                                                                  float bias) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (token < 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "logit bias for token %d: ids are >= 0", token);
    if (std::isnan(bias) || bias == INFINITY)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "a logit bias must be finite or -INFINITY");
    p->opts.sampler.set_bias(token, bias);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_generate_params_clear_logit_bias(moelite_generate_params* p) {
  if (!p) return null_arg(__func__, "params");
  p->opts.sampler.logit_bias.clear();
  return MOELITE_OK;
}

MOELITE_API moelite_status moelite_generate_params_set_callback(moelite_generate_params* p, moelite_piece_fn fn,
                                                                void* user) {
  if (!p) return null_arg(__func__, "params");
  p->opts.on_piece = fn;
  p->opts.user = user;
  return MOELITE_OK;
}

MOELITE_API moelite_status moelite_generate_params_set_token_callback(moelite_generate_params* p, moelite_token_fn fn,
                                                                      void* user) {
  if (!p) return null_arg(__func__, "params");
  p->opts.on_token = fn;
  p->opts.token_user = user;
  return MOELITE_OK;
}

MOELITE_API moelite_status moelite_generate_params_set_logits_callback(moelite_generate_params* p,
                                                                       moelite_logits_fn fn, void* user) {
  if (!p) return null_arg(__func__, "params");
  p->opts.sampler.on_logits = fn;
  p->opts.sampler.logits_user = user;
  return MOELITE_OK;
}

MOELITE_API moelite_status moelite_generate(moelite_context* ctx, const char* prompt, size_t prompt_len,
                                            const moelite_generate_params* params, moelite_generate_stats* stats) {
  return run_generation(__func__, ctx, stats, [&](moelite::GenerateResult* r) -> moelite_status {
    if (!prompt && prompt_len) return null_arg("moelite_generate", "prompt");
    const moelite::GenerateOptions opts = params ? params->opts : moelite::GenerateOptions{};
    return moelite::generate(*ctx->impl, std::string(prompt ? prompt : "", prompt_len), opts, r);
  });
}

MOELITE_API moelite_status moelite_generate_tokens(moelite_context* ctx, const int32_t* tokens, int32_t n_tokens,
                                                   const moelite_generate_params* params,
                                                   moelite_generate_stats* stats) {
  return run_generation(__func__, ctx, stats, [&](moelite::GenerateResult* r) -> moelite_status {
    if (n_tokens < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "moelite_generate_tokens: n_tokens must be >= 1");
    if (!tokens) return null_arg("moelite_generate_tokens", "tokens");
    const moelite::GenerateOptions opts = params ? params->opts : moelite::GenerateOptions{};
    return moelite::generate_tokens(*ctx->impl, std::vector<int32_t>(tokens, tokens + n_tokens), opts, r);
  });
}

// ---- samplers

MOELITE_API moelite_status moelite_sampler_create(const moelite_generate_params* params, moelite_sampler** out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!out) return null_arg(api_fn, "out");
    const moelite::SamplerParams sp = params ? params->opts.sampler : moelite::SamplerParams{};
    *out = new moelite_sampler{moelite::Sampler(sp), {}};
    return MOELITE_OK;
  });
}

MOELITE_API void moelite_sampler_free(moelite_sampler* s) { delete s; }

MOELITE_API moelite_status moelite_sampler_accept(moelite_sampler* s, const int32_t* tokens, int32_t n_tokens) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!s) return null_arg(api_fn, "sampler");
    if (n_tokens < 0 || (!tokens && n_tokens > 0)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: bad token array", api_fn);
    s->history.insert(s->history.end(), tokens, tokens + n_tokens);
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_sampler_sample_logits(moelite_sampler* s, const float* logits, int32_t n_vocab,
                                                         int32_t* out_token) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!s) return null_arg(api_fn, "sampler");
    if (!logits) return null_arg(api_fn, "logits");
    if (!out_token) return null_arg(api_fn, "out_token");
    if (n_vocab < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: n_vocab must be >= 1", api_fn);
    // Room for the token first: a draw spends random numbers, so it must not fail after it.
    // (Doubling, as push_back would: reserving one more each time would copy it every draw.)
    if (s->history.size() == s->history.capacity()) s->history.reserve(std::max<size_t>(16, 2 * s->history.size()));
    int32_t token = -1;
    switch (s->impl.pick(logits, n_vocab, s->history, &token)) {
      case moelite::Sampler::Outcome::Stopped:
        return fail(MOELITE_ERR_ABORTED, "the logits callback asked to stop");
      case moelite::Sampler::Outcome::NoCandidate:
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "no token can be sampled: every logit is banned, masked or NaN");
      case moelite::Sampler::Outcome::Token: break;
    }
    s->history.push_back(token);
    *out_token = token;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_sampler_sample(moelite_sampler* s, const moelite_context* ctx, int32_t i,
                                                  int32_t* out_token) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!ctx) return null_arg(api_fn, "ctx");
    const ContextTurn turn(ctx);
    if (!turn.ok()) return busy(api_fn);  // another thread's evaluation rewrites the logits
    const float* logits = ctx->impl->logits(i);
    if (!logits) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: the last evaluation kept no logits for row %d", api_fn, i);
    return moelite_sampler_sample_logits(s, logits, ctx->impl->model().hp.n_vocab, out_token);
  });
}

MOELITE_API void moelite_sampler_reset(moelite_sampler* s) {
  if (!s) return;
  s->impl = moelite::Sampler(s->impl.params());
  s->history.clear();
}

// ---- chat

MOELITE_API moelite_status moelite_chat_tokenize(const moelite_model* model, const moelite_chat_message* messages,
                                                 size_t n_messages, int32_t add_assistant_prompt, int32_t* tokens,
                                                 int32_t capacity, int32_t* n_tokens) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    const moelite::Tokenizer* tok = nullptr;
    MOELITE_TRY(tokenizer_of(model, api_fn, &tok));
    if (!messages && n_messages) return null_arg(api_fn, "messages");
    if (!n_tokens) return null_arg(api_fn, "n_tokens");
    if (capacity < 0 || (!tokens && capacity > 0)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: bad token buffer", api_fn);
    std::vector<moelite::ChatMessage> msgs;
    for (size_t i = 0; i < n_messages; ++i) {
      if (!messages[i].role || !messages[i].content)
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "message %zu has a NULL role or content", i);
      msgs.push_back({messages[i].role, messages[i].content});
    }
    const moelite::Model& m = *model->impl;
    std::string eos;
    if (tok->eos() >= 0) eos = tok->text(tok->eos());
    const moelite::ChatText chat =
        moelite::format_chat_ranges(m.chat_template, msgs, add_assistant_prompt != 0, eos);
    const std::vector<int32_t> ids = tok->tokenize_trusted(chat.text, /*add_special=*/true, chat.template_ranges);
    if (ids.size() > static_cast<size_t>(INT32_MAX)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "conversation too long");
    if (ids.size() > static_cast<size_t>(capacity)) {
      *n_tokens = static_cast<int32_t>(ids.size());
      return fail(MOELITE_ERR_BUFFER_TOO_SMALL, "%zu tokens do not fit a buffer of %d", ids.size(), capacity);
    }
    std::copy(ids.begin(), ids.end(), tokens);
    *n_tokens = static_cast<int32_t>(ids.size());
    return MOELITE_OK;
  });
}

}  // extern "C"
