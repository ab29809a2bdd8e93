#include "core/serve/generate.h"

#include <algorithm>

#include "platforms/platform.h"

namespace moelite {

namespace {

// Length of the longest prefix of s that ends on a UTF-8 character boundary.
size_t complete_utf8_prefix(const std::string& s) {
  size_t n = s.size();
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < need ? n - back : n;
  }
  return n;
}

}  // namespace

std::string StreamFilter::push(const std::string& bytes, bool* stopped) {
  *stopped = false;
  held_ += bytes;
  // A completed stop string ends the stream just before its first occurrence.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    size_t at = held_.find(s);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    *stopped = true;
    return out;
  }
  // Hold back a tail that could still become a stop string, and any unfinished character.
  size_t keep_from = held_.size();
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    for (size_t len = std::min(s.size() - 1, held_.size()); len > 0; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep_from = std::min(keep_from, held_.size() - len);
        break;
      }
    }
  }
  const size_t emit = complete_utf8_prefix(held_.substr(0, keep_from));
  std::string out = held_.substr(0, emit);
  held_.erase(0, emit);
  return out;
}

std::string StreamFilter::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

Status check_prompt(const Model& model, const std::vector<int32_t>& tokens, int32_t n_ctx) {
  if (!model.tokenizer) return fail(MOELITE_ERR_MISSING_METADATA, "the model has no tokenizer; generation needs one");
  if (tokens.empty()) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the prompt has no tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= model.hp.n_vocab)
      return fail(MOELITE_ERR_BAD_TOKEN, "prompt token %d at index %zu is outside the vocabulary [0, %d)", tokens[i], i,
                  model.hp.n_vocab);
  if (tokens.size() > static_cast<size_t>(n_ctx))
    return fail(MOELITE_ERR_CONTEXT_FULL, "the prompt has %zu tokens, the context holds %d", tokens.size(), n_ctx);
  return MOELITE_OK;
}

bool emit_text(const GenerateOptions& opts, int32_t token, const std::string& text, std::string* emitted) {
  *emitted += text;
  bool go_on = true;
  if (opts.on_token) go_on = opts.on_token(token, text.data(), text.size(), opts.token_user) != 0;
  if (!text.empty() && opts.on_piece) go_on = opts.on_piece(text.data(), text.size(), opts.user) != 0 && go_on;
  return go_on;
}

Status generate(Context& ctx, const std::string& prompt, const GenerateOptions& opts, GenerateResult* res) {
  const Model& model = ctx.model();
  if (!model.tokenizer) return fail(MOELITE_ERR_MISSING_METADATA, "the model has no tokenizer; generation needs one");
  return generate_tokens(ctx, model.tokenizer->tokenize(prompt, /*add_special=*/true, opts.parse_special), opts, res);
}

Status generate_tokens(Context& ctx, const std::vector<int32_t>& tokens, const GenerateOptions& opts,
                       GenerateResult* res) {
  const Model& model = ctx.model();
  res->stop = MOELITE_STOP_ERROR;
  // Context::eval checks ids too, but only after the cached prefix below was truncated: a bad id
  // must fail with the cache untouched.
  if (const Status st = check_prompt(model, tokens, ctx.n_ctx()); st != MOELITE_OK) {
    if (st == MOELITE_ERR_CONTEXT_FULL) res->stop = MOELITE_STOP_CONTEXT_FULL;
    return st;
  }
  const Tokenizer& tok = *model.tokenizer;

  // Reuse the cached prefix; at least one token is evaluated so there are logits to sample from.
  const std::vector<int32_t>& cached = ctx.tokens();
  size_t reuse = 0;
  while (reuse < cached.size() && reuse < tokens.size() && cached[reuse] == tokens[reuse]) ++reuse;
  if (reuse == tokens.size()) --reuse;
  ctx.truncate(static_cast<int32_t>(reuse));
  reuse = static_cast<size_t>(ctx.length());  // a sliding-window cache may keep less than asked
  res->n_cached = static_cast<int32_t>(reuse);
  res->n_prompt = static_cast<int32_t>(tokens.size() - reuse);

  const double t0 = platform::now_seconds();
  MOELITE_TRY(ctx.eval(tokens.data() + reuse, res->n_prompt, false));
  const double t1 = platform::now_seconds();
  res->prompt_seconds = t1 - t0;

  Sampler sampler(opts.sampler);
  StreamFilter filter(opts.stops);
  std::vector<int32_t> history = tokens;
  // Hands released text to the callbacks; false when one of them asked to stop.
  auto emit = [&](int32_t token, const std::string& text) { return emit_text(opts, token, text, &res->text); };
  res->stop = MOELITE_STOP_MAX_TOKENS;
  bool ended_by_filter = false;
  Status status = MOELITE_OK;
  for (int32_t i = 0; i < opts.max_tokens; ++i) {
    int32_t next = -1;
    const Sampler::Outcome outcome = sampler.pick(ctx.logits(-1), model.hp.n_vocab, history, &next);
    if (i == 0) res->ttft_seconds = platform::now_seconds() - t0;
    if (outcome == Sampler::Outcome::Stopped) {
      res->stop = MOELITE_STOP_ABORTED;
      break;
    }
    if (outcome == Sampler::Outcome::NoCandidate) {
      res->stop = MOELITE_STOP_ERROR;
      status = fail(MOELITE_ERR_INVALID_ARGUMENT,
                    "no token can be sampled: the logit bias or the logits callback banned every token");
      break;
    }
    if (tok.is_end_of_generation(next)) {
      res->stop = MOELITE_STOP_END_TOKEN;
      break;
    }
    history.push_back(next);
    res->tokens.push_back(next);
    ++res->n_generated;
    bool stopped = false;
    const std::string text = filter.push(tok.token_to_piece(next, false), &stopped);
    if (!emit(next, text)) {
      res->stop = MOELITE_STOP_ABORTED;
      ended_by_filter = true;
      break;
    }
    if (stopped) {
      res->stop = MOELITE_STOP_STRING;
      ended_by_filter = true;
      break;
    }
    if (i + 1 == opts.max_tokens) break;
    if (ctx.length() >= ctx.n_ctx()) {
      res->stop = MOELITE_STOP_CONTEXT_FULL;
      status = fail(MOELITE_ERR_CONTEXT_FULL,
                    "generation reached the end of the context (%d tokens) after %d tokens; the text so far was "
                    "delivered",
                    ctx.n_ctx(), res->n_generated);
      break;
    }
    status = ctx.eval(&next, 1, false);
    if (status != MOELITE_OK) {
      res->stop = MOELITE_STOP_ERROR;
      break;
    }
  }
  if (!ended_by_filter) {
    const std::string rest = filter.flush();
    if (!rest.empty()) emit(-1, rest);
  }
  res->generate_seconds = platform::now_seconds() - t1;
  return status;
}

}  // namespace moelite
