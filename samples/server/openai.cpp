#include "openai.h"

#include <algorithm>
#include <cmath>

using nlohmann::json;

namespace {

bool fail(RequestError* e, const std::string& message, const std::string& param = "", const std::string& code = "") {
  e->http_status = 400;
  e->message = message;
  e->param = param;
  e->code = code;
  return false;
}

// The token ids of a chat conversation: message text stays text even where it spells a control
// token (moelite_chat_tokenize), so a user cannot forge a system turn.
bool chat_tokens(moelite_model* model, const json& messages, std::vector<int32_t>* out, RequestError* e) {
  if (!messages.is_array() || messages.empty())
    return fail(e, "'messages' must be a non-empty array", "messages");
  std::vector<std::string> roles, contents;
  for (const json& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return fail(e, "each message needs a string 'role'", "messages");
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      return fail(e, "unsupported message role '" + role + "'", "messages");
    std::string content;
    const json& c = m.contains("content") ? m["content"] : json();
    if (c.is_string()) {
      content = c;
    } else if (c.is_array()) {  // content parts: text only
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return fail(e, "only text content parts are supported", "messages");
        content += part["text"].get<std::string>();
      }
    } else {
      return fail(e, "each message needs a string 'content'", "messages");
    }
    roles.push_back(role == "developer" ? "system" : role);
    contents.push_back(std::move(content));
  }
  std::vector<moelite_chat_message> msgs;
  for (size_t i = 0; i < roles.size(); ++i) msgs.push_back({roles[i].c_str(), contents[i].c_str()});
  int32_t n = 0;
  moelite_status st = moelite_chat_tokenize(model, msgs.data(), msgs.size(), 1, nullptr, 0, &n);
  if (st == MOELITE_ERR_BUFFER_TOO_SMALL) {
    out->resize(static_cast<size_t>(n));
    st = moelite_chat_tokenize(model, msgs.data(), msgs.size(), 1, out->data(), n, &n);
  }
  if (st != MOELITE_OK) return fail(e, std::string("the chat template failed: ") + moelite_last_error(), "messages");
  out->resize(static_cast<size_t>(n));
  return true;
}

bool text_tokens(moelite_model* model, const json& prompt, std::vector<int32_t>* out, RequestError* e) {
  std::string text;
  if (prompt.is_string()) {
    text = prompt;
  } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
    text = prompt[0];
  } else {
    return fail(e, "'prompt' must be a string (one prompt per request)", "prompt");
  }
  int32_t n = 0;
  moelite_status st =
      moelite_tokenize(model, text.data(), text.size(), MOELITE_TOKENIZE_ADD_SPECIAL, nullptr, 0, &n);
  if (st == MOELITE_ERR_BUFFER_TOO_SMALL) {
    out->resize(static_cast<size_t>(n));
    st = moelite_tokenize(model, text.data(), text.size(), MOELITE_TOKENIZE_ADD_SPECIAL, out->data(), n, &n);
  }
  if (st != MOELITE_OK) return fail(e, std::string("tokenizing the prompt failed: ") + moelite_last_error(), "prompt");
  out->resize(static_cast<size_t>(n));
  if (out->empty()) return fail(e, "the prompt is empty", "prompt");
  return true;
}

bool number_in(const json& body, const char* key, double lo, double hi, std::optional<float>* out, RequestError* e) {
  if (!body.contains(key) || body[key].is_null()) return true;
  if (!body[key].is_number()) return fail(e, std::string("'") + key + "' must be a number", key);
  const double v = body[key];
  if (!std::isfinite(v) || v < lo || v > hi)
    return fail(e, std::string("'") + key + "' must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                key);
  *out = static_cast<float>(v);
  return true;
}

}  // namespace

bool parse_completion_request(const json& body, bool chat, moelite_model* model, int32_t n_ctx,
                              CompletionRequest* r, RequestError* e) {
  if (!body.is_object()) return fail(e, "the request body must be a JSON object");
  r->chat = chat;
  for (const char* unsupported : {"tools", "functions", "logprobs", "top_logprobs", "response_format"})
    if (body.contains(unsupported) && !body[unsupported].is_null() && body[unsupported] != false)
      return fail(e, std::string("'") + unsupported + "' is not supported by this server", unsupported);
  if (body.contains("n") && !body["n"].is_null() && body["n"] != 1)
    return fail(e, "only n = 1 is supported", "n");
  if (chat) {
    if (!body.contains("messages")) return fail(e, "'messages' is required", "messages");
    if (!chat_tokens(model, body["messages"], &r->prompt, e)) return false;
  } else {
    if (!body.contains("prompt")) return fail(e, "'prompt' is required", "prompt");
    if (!text_tokens(model, body["prompt"], &r->prompt, e)) return false;
  }
  if (static_cast<int64_t>(r->prompt.size()) >= n_ctx)
    return fail(e,
                "the prompt has " + std::to_string(r->prompt.size()) + " tokens and this server's context holds " +
                    std::to_string(n_ctx) + ", leaving no room for an answer (shorten the " +
                    (chat ? "conversation" : "prompt") + ", or start the server with a larger -c)",
                chat ? "messages" : "prompt", "context_length_exceeded");
  const int32_t room = n_ctx - static_cast<int32_t>(r->prompt.size());
  r->max_tokens = room;
  const char* max_key = body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (body.contains(max_key) && !body[max_key].is_null()) {
    if (!body[max_key].is_number_integer() || body[max_key] < 1)
      return fail(e, std::string("'") + max_key + "' must be a positive integer", max_key);
    r->max_tokens = static_cast<int32_t>(std::min<int64_t>(body[max_key].get<int64_t>(), room));
  }
  if (!number_in(body, "temperature", 0.0, 2.0, &r->temperature, e)) return false;
  if (!number_in(body, "top_p", 0.0, 1.0, &r->top_p, e)) return false;
  if (r->top_p && *r->top_p <= 0.0f) return fail(e, "'top_p' must be above 0", "top_p");
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return fail(e, "'seed' must be an integer", "seed");
    r->seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r->stop.push_back(s);
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string()) return fail(e, "'stop' must be a string or up to 4 strings", "stop");
        r->stop.push_back(x);
      }
    } else {
      return fail(e, "'stop' must be a string or up to 4 strings", "stop");
    }
    for (const std::string& x : r->stop)
      if (x.empty()) return fail(e, "stop strings must not be empty", "stop");
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return fail(e, "'stream' must be a boolean", "stream");
    r->stream = body["stream"];
  }
  if (body.contains("stream_options") && body["stream_options"].is_object())
    r->include_usage = body["stream_options"].value("include_usage", false);
  return true;
}

bool count_prompt_tokens(const json& body, moelite_model* model, int32_t* n_tokens, RequestError* e) {
  if (!body.is_object()) return fail(e, "the request body must be a JSON object");
  std::vector<int32_t> tokens;
  if (body.contains("messages")) {
    if (!chat_tokens(model, body["messages"], &tokens, e)) return false;
  } else if (body.contains("prompt")) {
    if (!text_tokens(model, body["prompt"], &tokens, e)) return false;
  } else {
    return fail(e, "'messages' or 'prompt' is required", "messages");
  }
  *n_tokens = static_cast<int32_t>(tokens.size());
  return true;
}

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json() : json(code)}}}};
}

const char* finish_reason(int32_t stop_reason) {
  switch (stop_reason) {
    case MOELITE_STOP_END_TOKEN:
    case MOELITE_STOP_STRING:
      return "stop";
    default:
      return "length";  // max tokens, or the end of the context
  }
}

static json usage_of(const moelite_generate_stats& s) {
  const int64_t prompt = s.n_prompt_tokens + s.n_cached_tokens;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", s.n_generated_tokens},
          {"total_tokens", prompt + s.n_generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.n_cached_tokens}}}};
}

json completion_response(const CompletionRequest& r, const ResponseIds& ids, const std::string& text,
                         int32_t stop_reason, const moelite_generate_stats& stats) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason(stop_reason)}, {"logprobs", json()}};
  if (r.chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  return {{"id", ids.id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})},
          {"usage", usage_of(stats)}};
}

json stream_chunk(const CompletionRequest& r, const ResponseIds& ids, const std::string& text, bool first,
                  const char* finish) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json()}, {"logprobs", json()}};
  if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = finish ? "" : text;
  }
  return {{"id", ids.id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const CompletionRequest& r, const ResponseIds& ids, const moelite_generate_stats& stats) {
  return {{"id", ids.id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage", usage_of(stats)}};
}
