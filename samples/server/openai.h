// The OpenAI-compatible wire format: requests of /v1/chat/completions and /v1/completions parsed
// and checked into a CompletionRequest, and the responses and stream chunks built back.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moelite.h"

struct CompletionRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage: a last chunk with usage
  std::vector<int32_t> prompt;   // token ids (chat: the conversation through the chat template)
  int32_t max_tokens = 0;  // bounded by the room the context has left after the prompt
  std::optional<float> temperature, top_p;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  // logit_bias: token id → bias added to its logit (-INFINITY: banned, OpenAI's -100).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// A request the server refuses: HTTP status and the message of the JSON error body.
struct RequestError {
  int http_status = 400;
  std::string message;
  std::string param;  // the offending field, when one is to blame
  std::string code;   // OpenAI's error code where one applies: "context_length_exceeded"
};

// Parses a request body (already valid JSON) for the chat (`chat`) or the completions endpoint:
// field types and ranges as OpenAI documents them, message roles, prompt length against n_ctx
// (a prompt that leaves no room to answer is a 400 naming both sizes). max_tokens is the room the
// context has left after the prompt, or less when the request asks for less: a generation ends
// with finish_reason "length" there instead of running into the end of the context.
// Unsupported options that would change the answer (n > 1, tools, logprobs, penalties) are
// refused rather than ignored, and every field this server knows is type-checked: a 400 names it.
// Fields it does not know are ignored, as clients send vendor extensions.
bool parse_completion_request(const nlohmann::json& body, bool chat, moelite_model* model, int32_t n_ctx,
                              CompletionRequest* out, RequestError* error);

// The prompt of a chat ({"messages": [...]}) or completion ({"prompt": "..."}) body in tokens, as
// the completion endpoints would count it: how a client (the chat page) keeps a conversation
// within the context without guessing at the tokenizer.
bool count_prompt_tokens(const nlohmann::json& body, moelite_model* model, int32_t* n_tokens, RequestError* error);

// {"error": {"message", "type", "param", "code"}} as OpenAI's clients expect.
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param = "",
                          const std::string& code = "");

// finish_reason of a generation's stop reason.
const char* finish_reason(int32_t stop_reason);

struct ResponseIds {
  std::string id;  // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;
  std::string model;
};

nlohmann::json completion_response(const CompletionRequest& r, const ResponseIds& ids, const std::string& text,
                                   int32_t stop_reason, const moelite_generate_stats& stats);
// One stream chunk: `text` as the delta (chat: with the assistant role in the first chunk), or the
// last chunk with its finish_reason when `finish` is set.
nlohmann::json stream_chunk(const CompletionRequest& r, const ResponseIds& ids, const std::string& text, bool first,
                            const char* finish);
nlohmann::json usage_chunk(const CompletionRequest& r, const ResponseIds& ids, const moelite_generate_stats& stats);
