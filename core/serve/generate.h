// Text generation on a context: prompt -> tokens (reusing the cached prefix), then sample,
// stream and stop.
#pragma once
#include <string>
#include <vector>

#include "core/exec/context.h"
#include "core/text/sampling.h"
#include "moelite.h"

namespace moelite {

struct GenerateOptions {
  int32_t max_tokens = 256;
  SamplerParams sampler;
  std::vector<std::string> stops;
  bool parse_special = true;  // text prompts: control-token text becomes control tokens
  moelite_piece_fn on_piece = nullptr;
  void* user = nullptr;
  moelite_token_fn on_token = nullptr;
  void* token_user = nullptr;
};

struct GenerateResult {
  int32_t n_prompt = 0, n_cached = 0, n_generated = 0;
  moelite_stop_reason stop = MOELITE_STOP_MAX_TOKENS;
  double prompt_seconds = 0, generate_seconds = 0, ttft_seconds = 0;
  std::string text;             // everything emitted
  std::vector<int32_t> tokens;  // the generated ids (the end token excluded)
};

// A prompt generation can start from: a tokenizer, at least one token, every id in the
// vocabulary (MOELITE_ERR_BAD_TOKEN), at most n_ctx tokens (MOELITE_ERR_CONTEXT_FULL).
Status check_prompt(const Model& model, const std::vector<int32_t>& tokens, int32_t n_ctx);

// Hands text a token released to the options' callbacks (the token callback even for empty
// text, the piece callback only for text) and appends it to *emitted; false when a callback
// asked to stop. token -1: text held back until the end.
bool emit_text(const GenerateOptions& opts, int32_t token, const std::string& text, std::string* emitted);

// Generates after `prompt`, tokenized with BOS/EOS as the vocabulary asks and special tokens
// parsed when opts.parse_special.
Status generate(Context& ctx, const std::string& prompt, const GenerateOptions& opts, GenerateResult* result);
// The same from token ids (the whole sequence: the cached prefix it shares is reused). Fails with
// MOELITE_ERR_CONTEXT_FULL (stop reason CONTEXT_FULL) when generation reached the context's end.
Status generate_tokens(Context& ctx, const std::vector<int32_t>& tokens, const GenerateOptions& opts,
                       GenerateResult* result);

// Splits streamed bytes into pieces that never end inside a UTF-8 character and never contain the
// beginning of a stop string; used by generate() and unit-tested on its own.
class StreamFilter {
 public:
  explicit StreamFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds bytes; returns what can be emitted now. Sets *stopped when a stop string completed
  // (the returned text then ends just before it and later input is ignored).
  std::string push(const std::string& bytes, bool* stopped);
  // Whatever is still held back, at the end of generation.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace moelite
