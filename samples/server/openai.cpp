#include "openai.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

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
        // Each field's type is checked before it is read: value("type", "") throws on a non-string.
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string() || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string())
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

// The JSON type each known field must have (null always means "not given"). Checked before any
// field is used, so a wrong type is a 400 naming the field, never ignored or a 500.
enum class Kind { Boolean, Integer, Number, String, Object, StringOrArray, Any };

bool type_ok(const json& v, Kind k) {
  switch (k) {
    case Kind::Boolean: return v.is_boolean();
    case Kind::Integer: return v.is_number_integer();
    case Kind::Number: return v.is_number();
    case Kind::String: return v.is_string();
    case Kind::Object: return v.is_object();
    case Kind::StringOrArray: return v.is_string() || v.is_array();
    case Kind::Any: return true;
  }
  return false;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Boolean: return "a boolean";
    case Kind::Integer: return "an integer";
    case Kind::Number: return "a number";
    case Kind::String: return "a string";
    case Kind::Object: return "an object";
    case Kind::StringOrArray: return "a string or an array";
    case Kind::Any: return "anything";
  }
  return "";
}

bool check_field_types(const json& body, RequestError* e) {
  static const std::pair<const char*, Kind> kFields[] = {
      {"model", Kind::String},           {"user", Kind::String},
      {"stream", Kind::Boolean},         {"stream_options", Kind::Object},
      {"max_tokens", Kind::Integer},     {"max_completion_tokens", Kind::Integer},
      {"temperature", Kind::Number},     {"top_p", Kind::Number},
      {"seed", Kind::Integer},           {"n", Kind::Integer},
      {"stop", Kind::StringOrArray},     {"logit_bias", Kind::Object},
      {"presence_penalty", Kind::Number}, {"frequency_penalty", Kind::Number},
      {"echo", Kind::Boolean},           {"best_of", Kind::Integer},
      {"suffix", Kind::String},
  };
  for (const auto& [key, kind] : kFields)
    if (body.contains(key) && !body[key].is_null() && !type_ok(body[key], kind))
      return fail(e, std::string("'") + key + "' must be " + kind_name(kind), key);
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    const json& so = body["stream_options"];
    if (so.contains("include_usage") && !so["include_usage"].is_null() && !so["include_usage"].is_boolean())
      return fail(e, "'stream_options.include_usage' must be a boolean", "stream_options");
  }
  return true;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}; -100 bans the token.
bool parse_logit_bias(const json& bias, moelite_model* model, CompletionRequest* r, RequestError* e) {
  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  for (const auto& [key, value] : bias.items()) {
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != 0 || errno == ERANGE || id < 0 || id >= n_vocab)
      return fail(e, "'logit_bias' keys must be token ids in [0, " + std::to_string(n_vocab) + "), not '" + key + "'",
                  "logit_bias");
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100)
      return fail(e, "'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
    const double b = value.get<double>();
    r->logit_bias.emplace_back(static_cast<int32_t>(id),
                               b <= -100 ? -std::numeric_limits<float>::infinity() : static_cast<float>(b));
  }
  return true;
}

}  // namespace

bool parse_completion_request(const json& body, bool chat, moelite_model* model, int32_t n_ctx,
                              CompletionRequest* r, RequestError* e) {
  if (!body.is_object()) return fail(e, "the request body must be a JSON object");
  r->chat = chat;
  if (!check_field_types(body, e)) return false;
  for (const char* unsupported : {"tools", "functions", "logprobs", "top_logprobs", "response_format"})
    if (body.contains(unsupported) && !body[unsupported].is_null() && body[unsupported] != false)
      return fail(e, std::string("'") + unsupported + "' is not supported by this server", unsupported);
  if (body.contains("n") && !body["n"].is_null() && body["n"] != 1)
    return fail(e, "only n = 1 is supported", "n");
  if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != 1)
    return fail(e, "only best_of = 1 is supported", "best_of");
  for (const char* penalty : {"presence_penalty", "frequency_penalty"})
    if (body.contains(penalty) && !body[penalty].is_null() && body[penalty].get<double>() != 0.0)
      return fail(e, std::string("'") + penalty + "' is not supported by this server (only 0)", penalty);
  if (body.contains("echo") && body["echo"] == true) return fail(e, "'echo' is not supported by this server", "echo");
  if (body.contains("suffix") && !body["suffix"].is_null() && !body["suffix"].get<std::string>().empty())
    return fail(e, "'suffix' is not supported by this server", "suffix");
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
  if (body.contains("seed") && !body["seed"].is_null())  // any 64-bit integer, signed or not
    r->seed = body["seed"].is_number_unsigned() ? body["seed"].get<uint64_t>()
                                                : static_cast<uint64_t>(body["seed"].get<int64_t>());
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
    for (const std::string& x : r->stop) {
      if (x.empty()) return fail(e, "stop strings must not be empty", "stop");
      // The library takes C strings: a NUL would cut the stop string short without a word.
      if (x.find('\0') != std::string::npos) return fail(e, "stop strings must not contain U+0000", "stop");
    }
  }
  if (body.contains("stream") && !body["stream"].is_null()) r->stream = body["stream"];
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    const json& so = body["stream_options"];
    r->include_usage = so.contains("include_usage") && so["include_usage"] == true;
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
      !parse_logit_bias(body["logit_bias"], model, r, e))
    return false;
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
  // cached_tokens stays 0: the cache is shared by every client, so the count would tell one client
  // how much of its prompt another client sent before (a prefix oracle).
  return {{"prompt_tokens", prompt},
          {"completion_tokens", s.n_generated_tokens},
          {"total_tokens", prompt + s.n_generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", 0}}}};
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
