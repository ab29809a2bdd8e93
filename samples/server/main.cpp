// moelite-server: a local server for desktop apps with the OpenAI-compatible chat-completions and
// completions endpoints (streaming as server-sent events), model info, the expert store's
// statistics, and a chat page (GET /) that streams answers and shows tokens/s and the hit rate.
//
//   moelite-server -m MODEL [--host 127.0.0.1] [--port 8080] [--budget B] [-t N] [--parallel N] [-c N]
//                  [--api-key KEY | --api-key-file FILE] [--allow-origin ORIGIN] [--allow-host NAME]
//                  [--max-connections N] [--request-timeout SECONDS] [--gating MODE] [--threshold T]
//                  [--profile FILE] [--quality-target T] [--quality-sample R]
//
// HTTP: cpp-httplib (Debian's libcpp-httplib-dev); JSON: nlohmann/json (nlohmann-json3-dev). It
// listens on 127.0.0.1 unless told otherwise. Who may call it: access.h; how many and how slow:
// connection_limits.h.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "access.h"
#include "batcher.h"
#include "connection.h"
#include "connection_limits.h"
#include "moelite.h"
#include "openai.h"

using nlohmann::json;

extern const char* const kChatPage;  // chat.html, embedded at build time

namespace {

struct Options {
  std::string model, host = "127.0.0.1", budget;
  int port = 8080, threads = 0, parallel = 2, n_ctx = 4096;
  bool n_ctx_given = false;
  moelite_backend backend = MOELITE_BACKEND_AUTO;
  // Adaptive gating, as the CLI sets it (moelite_model_params_set_gating / set_profile), and the
  // batcher's quality meter and governor.
  std::string gating, profile;
  double threshold = 0;
  bool threshold_given = false;
  Batcher::Quality quality;
  AccessRules access;
  ConnectionLimits limits;
};

// The largest request body read (a conversation of a few hundred thousand characters).
constexpr size_t kMaxBodyBytes = size_t{4} << 20;
// A larger body announced by Content-Length is refused unread beyond this (see the pre-routing
// handler); up to it, it is read and dropped.
constexpr size_t kDrainBytes = size_t{64} << 20;

int usage(const char* why) {
  if (why) fprintf(stderr, "moelite-server: %s\n", why);
  fprintf(stderr,
          "usage: moelite-server -m MODEL [--host 127.0.0.1] [--port 8080] [--budget SIZE|P%%|auto] [-t THREADS]\n"
          "                      [--parallel N] [-c N_CTX] [--backend auto|cpu|vulkan|cuda]\n"
          "                      [--api-key KEY | --api-key-file FILE] [--allow-origin ORIGIN]...\n"
          "                      [--allow-host NAME]... [--max-connections N] [--request-timeout SECONDS]\n"
          "                      [--gating MODE] [--threshold T] [--profile FILE] [--quality-target T]\n"
          "                      [--quality-sample R]\n"
          "  --port 0 picks a free port; the address is printed as \"listening on http://HOST:PORT\".\n"
          "  --parallel N: up to N requests decode together, batched in one context (default 2);\n"
          "  others wait their turn.\n"
          "  --api-key: every endpoint but the chat page and /health needs 'Authorization: Bearer KEY'.\n"
          "  --allow-origin: a web origin (http://host:port, or *) whose pages may call the server; pages\n"
          "  on localhost and the chat page always may. --allow-host: a host name clients may use for\n"
          "  it besides localhost and IP addresses (or *).\n"
          "  --max-connections N (default 32): more evict the slowest reader or get 503.\n"
          "  --request-timeout S (default 10): a connection must send each request within S seconds.\n"
          "  --gating exact|sensitivity|cache-aware|score, --threshold T, --profile FILE: adaptive gating (lossy\n"
          "  unless exact) and its calibration profile, as in `moelite run`.\n"
          "  --quality-target T: hold gating's cost at T by moving the threshold, a perplexity rise (1%%, 0.5%%)\n"
          "  or kl:X nats per token; needs --gating sensitivity or cache-aware, a profile optional.\n"
          "  --quality-sample R: compare a share R in [0, 1] of the decode steps with exact routing (default 0,\n"
          "  1/8 with a target); GET /v1/moelite/stats shows the result under \"quality\".\n");
  return 2;
}

bool parse_int(const char* s, int lo, int hi, int* out) {
  char* end = nullptr;
  const long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_double(const char* s, double lo, double hi, double* out) {
  char* end = nullptr;
  const double v = strtod(s, &end);
  if (!*s || *end || !(v >= lo && v <= hi)) return false;  // NaN fails the comparison
  *out = v;
  return true;
}

// Whether the library takes `target` as a quality target (the reason in *why if not): checked at
// start, so a typo is a usage error rather than a context that cannot be made.
bool quality_target_ok(const char* target, std::string* why) {
  moelite_context_params* cp = moelite_context_params_create();
  if (!cp) {
    *why = "out of memory";
    return false;
  }
  const bool ok = moelite_context_params_set_quality_target(cp, target) == MOELITE_OK;
  if (!ok) *why = moelite_last_error();
  moelite_context_params_free(cp);
  return ok;
}

// The key of --api-key-file: its first line, without the line end. Empty on failure, with `why`.
std::string read_api_key_file(const char* path, std::string* why) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    *why = std::string("cannot open '") + path + "': " + strerror(errno);
    return "";
  }
  char line[4096];
  const bool got = fgets(line, sizeof line, f) != nullptr;
  fclose(f);
  std::string key = got ? line : "";
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.empty()) *why = std::string("'") + path + "' holds no key on its first line";
  return key;
}

// What the page and /v1/moelite/stats show besides the store's counters.
struct ServerCounters {
  std::atomic<uint64_t> requests{0}, generated_tokens{0}, disconnects{0};
  std::atomic<int> active{0};
  std::mutex mu;
  double last_tok_s = 0;  // decode speed of the last finished request
};

struct Server {
  moelite_model* model = nullptr;
  std::string model_id;
  Batcher batcher;
  ServerCounters counters;
};

// JSON for the wire. Generated text need not be valid UTF-8 (a model may emit byte tokens that
// form no character, which the library passes on whole); such bytes become U+FFFD here instead
// of an exception (nlohmann::json throws on them by default).
std::string wire(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param = "", const std::string& code = "") {
  res.status = status;
  res.set_content(wire(error_body(message, type, param, code)), "application/json");
}

using Outcome = Batcher::Outcome;

// What the request log line says of a request beyond method, path and status: its tokens, and when
// it started. Kept per HTTP worker thread: the handler, a streaming response's content provider and
// the logger of one request all run on the thread that serves its connection.
struct RequestLog {
  std::chrono::steady_clock::time_point start;
  int64_t tokens_in = -1, tokens_out = -1;
};
thread_local RequestLog t_request_log;

// Generates the completion of r through the batcher, together with whatever else is running;
// `on_piece` receives the text as it comes and returns false to stop (the client went away).
Outcome generate(Server& s, const CompletionRequest& r, const std::function<bool(const char*, size_t)>& on_piece) {
  Outcome o;
  o.stats.struct_size = sizeof(o.stats);
  moelite_generate_params* gp = moelite_generate_params_create();
  if (!gp) {
    o.status = MOELITE_ERR_OUT_OF_MEMORY;
    o.error = "out of memory";
    return o;
  }
  moelite_status st = moelite_generate_params_set_max_tokens(gp, r.max_tokens);
  if (st == MOELITE_OK && r.temperature) st = moelite_generate_params_set_temperature(gp, *r.temperature);
  if (st == MOELITE_OK && r.top_p) st = moelite_generate_params_set_top_p(gp, *r.top_p);
  // Without a seed each request samples differently, as OpenAI's do.
  const uint64_t seed = r.seed ? *r.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  if (st == MOELITE_OK) st = moelite_generate_params_set_seed(gp, seed);
  for (const std::string& stop : r.stop)
    if (st == MOELITE_OK) st = moelite_generate_params_add_stop(gp, stop.c_str());
  for (const auto& [token, bias] : r.logit_bias)
    if (st == MOELITE_OK) st = moelite_generate_params_set_logit_bias(gp, token, bias);
  if (st == MOELITE_OK) {
    s.counters.active++;
    o = s.batcher.generate(r.prompt, gp, on_piece);
    s.counters.active--;
    st = o.status;
  } else {
    o.error = std::string(moelite_status_name(st)) + ": " + moelite_last_error();
  }
  moelite_generate_params_free(gp);
  o.status = st;
  s.counters.requests++;
  s.counters.generated_tokens += static_cast<uint64_t>(std::max(0, o.stats.n_generated_tokens));
  t_request_log.tokens_in = static_cast<int64_t>(r.prompt.size());
  t_request_log.tokens_out = std::max(0, o.stats.n_generated_tokens);
  if (o.stats.stop_reason == MOELITE_STOP_ABORTED) s.counters.disconnects++;
  if (o.stats.n_generated_tokens > 1) {
    std::lock_guard<std::mutex> lock(s.counters.mu);
    s.counters.last_tok_s = o.stats.generated_tokens_per_second;
  }
  return o;
}

ResponseIds new_ids(const Server& s, bool chat) {
  static std::atomic<uint64_t> counter{0};
  ResponseIds ids;
  ids.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                    .count();
  ids.id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(ids.created) + "-" + std::to_string(++counter);
  ids.model = s.model_id;
  return ids;
}

void handle_completion(Server& s, const httplib::Request& req, httplib::Response& res, bool chat) {
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return send_error(res, 400, "the request body is not valid JSON", "invalid_request_error");
  auto r = std::make_shared<CompletionRequest>();
  RequestError e;
  if (!parse_completion_request(body, chat, s.model, s.batcher.n_ctx(), r.get(), &e))
    return send_error(res, e.http_status, e.message, "invalid_request_error", e.param, e.code);
  const ResponseIds ids = new_ids(s, chat);
  if (!r->stream) {
    // A client that goes away stops its generation, as a streaming one's failed write does: its
    // connection is checked now and then as the text comes (a few checks a second).
    ConnectionWatch watch(req.remote_addr, req.remote_port);
    auto next_check = std::chrono::steady_clock::now();
    std::string text;
    const Outcome o = generate(s, *r, [&](const char* p, size_t n) {
      text.append(p, n);
      const auto now = std::chrono::steady_clock::now();
      if (now < next_check) return true;
      next_check = now + std::chrono::milliseconds(200);
      return !watch.closed();
    });
    if (o.stats.stop_reason == MOELITE_STOP_ABORTED) {  // nobody to answer; the log says so
      res.status = 499;
      return;
    }
    if (o.status != MOELITE_OK) return send_error(res, 500, o.error, "server_error");
    res.set_content(wire(completion_response(*r, ids, text, o.stats.stop_reason, o.stats)), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  Server* server = &s;
  res.set_chunked_content_provider("text/event-stream", [server, r, ids](size_t, httplib::DataSink& sink) {
    auto send = [&](const json& j) {
      const std::string event = "data: " + wire(j) + "\n\n";
      return sink.is_writable() && sink.write(event.data(), event.size());
    };
    bool first = true;
    const Outcome o = generate(*server, *r, [&](const char* p, size_t n) {
      const bool ok = send(stream_chunk(*r, ids, std::string(p, n), first, nullptr));
      first = false;
      return ok;  // false: the client is gone, stop generating
    });
    if (o.stats.stop_reason == MOELITE_STOP_ABORTED) return false;  // nobody to tell
    if (o.status != MOELITE_OK) {
      send(error_body(o.error, "server_error"));
    } else {
      if (first) send(stream_chunk(*r, ids, "", true, nullptr));  // the role, even for an empty answer
      send(stream_chunk(*r, ids, "", false, finish_reason(o.stats.stop_reason)));
      if (r->include_usage) send(usage_chunk(*r, ids, o.stats));
    }
    static const char kDone[] = "data: [DONE]\n\n";
    if (sink.is_writable()) sink.write(kDone, sizeof kDone - 1);
    sink.done();
    return true;
  });
}

json stats_json(Server& s) {
  moelite_expert_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  moelite_model_expert_stats(s.model, -1, &st);
  double last_tok_s;
  {
    std::lock_guard<std::mutex> lock(s.counters.mu);
    last_tok_s = s.counters.last_tok_s;
  }
  const int64_t budget = moelite_model_get(s.model, MOELITE_MODEL_EXPERT_BUDGET);
  const moelite_quality_stats q = s.batcher.quality_stats();
  return {{"model", s.model_id},
          {"backend", moelite_model_backend_name(s.model)},
          {"expert_budget_bytes", budget},
          {"expert_slots", moelite_model_get(s.model, MOELITE_MODEL_EXPERT_SLOTS)},
          {"expert_bytes", moelite_model_get(s.model, MOELITE_MODEL_EXPERT_BYTES)},
          {"sequences", s.batcher.n_seq()},
          {"active_requests", s.counters.active.load()},
          {"requests", s.counters.requests.load()},
          {"generated_tokens", s.counters.generated_tokens.load()},
          {"disconnects", s.counters.disconnects.load()},
          {"last_decode_tok_s", last_tok_s},
          {"experts",
           {{"activations", st.activations},
            {"hits", st.hits},
            {"misses", st.misses},
            {"hit_rate", st.activations ? double(st.hits) / double(st.activations) : 1.0},
            {"bytes_read", st.bytes_read},
            {"wait_seconds", st.wait_seconds}}},
          // What lossy gating cost, measured against exact routing on the metered decode steps (all
          // 0 with exact gating; metered_tokens 0 without --quality-sample or --quality-target).
          {"quality",
           {{"gated_tokens", q.gated_tokens},
            {"metered_tokens", q.metered_tokens},
            {"kl_mean", q.kl_mean},
            {"kl_stderr", q.kl_stderr},
            {"top1_agreement", q.top1_agreement},
            {"predicted_loss", q.predicted_loss},
            {"threshold", q.threshold},
            {"target_kl", q.target_kl}}}};
}

using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

// `handler` behind the access rules (access.h): run only for an allowed request, with CORS headers
// for an allowed cross-origin one. Its request has been read by now: answering is not timed.
Handler guarded(ConnectionGuard& guard, const AccessRules& rules, bool needs_key, Handler handler) {
  return [&guard, &rules, needs_key, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    guard.request_received();
    const AccessDecision d = check_access(rules, req, needs_key);
    if (d.http_status != 0) {
      if (d.http_status == 401) res.set_header("WWW-Authenticate", "Bearer");
      return send_error(res, d.http_status, d.message,
                        d.http_status == 401 ? "authentication_error" : "invalid_request_error");
    }
    add_cors_headers(req, res);
    handler(req, res);
  };
}

void add_routes(httplib::Server& http, ConnectionGuard& guard, Server& s, const AccessRules& rules) {
  const auto open = [&](Handler h) { return guarded(guard, rules, false, std::move(h)); };
  const auto keyed = [&](Handler h) { return guarded(guard, rules, true, std::move(h)); };
  http.Get("/", open([](const httplib::Request&, httplib::Response& res) {
    res.set_content(kChatPage, "text/html; charset=utf-8");
  }));
  http.Get("/health", open([](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  }));
  // A browser asks before a cross-origin POST with a JSON body (a "preflight").
  http.Options(R"(/.*)", open([](const httplib::Request&, httplib::Response& res) { res.status = 204; }));
  const auto model_entry = [&s] {
    return json{{"id", s.model_id},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "moelite"},
                {"arch", moelite_model_arch(s.model)},
                {"n_ctx", s.batcher.n_ctx()},
                {"n_vocab", moelite_model_get(s.model, MOELITE_MODEL_N_VOCAB)},
                {"expert_budget_bytes", moelite_model_get(s.model, MOELITE_MODEL_EXPERT_BUDGET)}};
  };
  http.Get("/v1/models", keyed([model_entry](const httplib::Request&, httplib::Response& res) {
    res.set_content(wire(json{{"object", "list"}, {"data", json::array({model_entry()})}}), "application/json");
  }));
  http.Get(R"(/v1/models/(.+))", keyed([&s, model_entry](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != s.model_id)
      return send_error(res, 404, "no model '" + std::string(req.matches[1]) + "'", "invalid_request_error", "model");
    res.set_content(wire(model_entry()), "application/json");
  }));
  http.Get("/v1/moelite/stats", keyed([&s, &guard](const httplib::Request&, httplib::Response& res) {
    json j = stats_json(s);
    const ConnectionCounters c = guard.counters();
    j["connections"] = {{"open", c.open},
                        {"accepted", c.accepted},
                        {"evicted", c.evicted},
                        {"refused", c.refused},
                        {"timed_out", c.timed_out}};
    res.set_content(wire(j), "application/json");
  }));
  // A conversation's (or prompt's) size in tokens and the context's: how the chat page keeps a
  // conversation within the context.
  http.Post("/v1/moelite/count_tokens", keyed([&s](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return send_error(res, 400, "the request body is not valid JSON", "invalid_request_error");
    int32_t n = 0;
    RequestError e;
    if (!count_prompt_tokens(body, s.model, &n, &e))
      return send_error(res, e.http_status, e.message, "invalid_request_error", e.param, e.code);
    res.set_content(wire(json{{"prompt_tokens", n}, {"n_ctx", s.batcher.n_ctx()}}), "application/json");
  }));
  http.Post("/v1/chat/completions",
            keyed([&s](const httplib::Request& req, httplib::Response& res) { handle_completion(s, req, res, true); }));
  http.Post("/v1/completions",
            keyed([&s](const httplib::Request& req, httplib::Response& res) { handle_completion(s, req, res, false); }));
  for (const char* path : {"/v1/chat/completions", "/v1/completions"})
    http.Get(path, [](const httplib::Request&, httplib::Response& res) {
      send_error(res, 405, "use POST", "invalid_request_error");
    });
  // Anything else, and errors httplib raises itself (a body over the limit), get a JSON error.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error body
    const std::string what = res.status == 404   ? "no route for " + req.method + " " + req.path
                             : res.status == 413 ? "the request body is too large"
                                                 : "request failed";
    res.set_content(wire(error_body(what, "invalid_request_error")), "application/json");
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what, "server_error");
  });
  http.set_payload_max_length(kMaxBodyBytes);
  // One line per request on stderr: method, path, status, tokens in and out (generations), time.
  // Before the body is read: a body announced far larger than the server reads is refused at once
  // (cpp-httplib would read and drop it first, holding the connection for as long as that takes).
  // One up to kDrainBytes is still read and dropped, then refused (413 by httplib): answering
  // early would reset the connection under a client still sending, which then sees no answer.
  http.set_pre_routing_handler([&guard](const httplib::Request& req, httplib::Response& res) {
    t_request_log = RequestLog{std::chrono::steady_clock::now(), -1, -1};
    const std::string length = req.get_header_value("Content-Length");
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = length.empty() ? 0 : strtoull(length.c_str(), &end, 10);
    if (!length.empty() && (*end != 0 || errno == ERANGE || n > kDrainBytes)) {
      send_error(res, 413, "the request body is too large (at most " + std::to_string(kMaxBodyBytes) + " bytes)",
                 "invalid_request_error");
      res.set_header("Connection", "close");
      guard.close_after_response();  // its body is not read, so it cannot be followed by a request
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_logger([&guard](const httplib::Request& req, const httplib::Response& res) {
    const RequestLog& l = t_request_log;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - l.start).count();
    char tokens[64] = "";
    if (l.tokens_in >= 0)
      snprintf(tokens, sizeof tokens, " tokens %lld in, %lld out,", static_cast<long long>(l.tokens_in),
               static_cast<long long>(l.tokens_out));
    fprintf(stderr, "moelite-server: %s %s %d%s %.0f ms\n", req.method.c_str(), req.path.c_str(), res.status, tokens, ms);
    guard.response_sent();
  });
}

// Why `host`:`port` cannot be listened on, as the OS says it (bind's error): "Address already in
// use" names the common case, another server on the port.
std::string bind_error(const std::string& host, int port) {
  addrinfo hints{}, *info = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &info); e != 0) return gai_strerror(e);
  std::string why = "cannot bind";
  for (addrinfo* a = info; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    const int rc = bind(fd, a->ai_addr, a->ai_addrlen);
    why = rc == 0 ? "cannot listen" : strerror(errno);
    close(fd);
    if (rc != 0) break;
  }
  freeaddrinfo(info);
  return why;
}

}  // namespace

int main(int argc, char** argv) {
  // A closed standard descriptor (`moelite-server ... <&-`) is /dev/null instead, so that no file
  // opened later takes its number and gets written over by the log.
  for (int fd = 0; fd < 3; ++fd)
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int got = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (got >= 0 && got != fd) close(got);
    }
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "-h" || a == "--help") return usage(nullptr), 0;
    if (a == "-m" || a == "--model") {
      if (!(v = value())) return usage("-m needs a path");
      o.model = v;
    } else if (a == "--host") {
      if (!(v = value())) return usage("--host needs an address");
      o.host = v;
    } else if (a == "--port") {
      if (!(v = value()) || !parse_int(v, 0, 65535, &o.port)) return usage("--port needs 0..65535");
    } else if (a == "--budget") {
      if (!(v = value())) return usage("--budget needs a value");
      o.budget = v;
    } else if (a == "-t" || a == "--threads") {
      if (!(v = value()) || !parse_int(v, 1, MOELITE_MAX_THREADS, &o.threads)) return usage("-t needs 1..512");
    } else if (a == "--parallel") {
      if (!(v = value()) || !parse_int(v, 1, 64, &o.parallel)) return usage("--parallel needs 1..64");
    } else if (a == "-c" || a == "--ctx-size") {
      if (!(v = value()) || !parse_int(v, 16, MOELITE_MAX_CONTEXT, &o.n_ctx)) return usage("-c needs 16 or more");
      o.n_ctx_given = true;
    } else if (a == "--api-key") {
      if (!(v = value()) || !*v) return usage("--api-key needs a key");
      o.access.api_key = v;
    } else if (a == "--api-key-file") {
      if (!(v = value())) return usage("--api-key-file needs a path");
      std::string why;
      o.access.api_key = read_api_key_file(v, &why);
      if (o.access.api_key.empty()) return usage(("--api-key-file: " + why).c_str());
    } else if (a == "--allow-origin") {
      if (!(v = value()) || !*v) return usage("--allow-origin needs an origin (http://host:port) or *");
      o.access.allowed_origins.push_back(v);
    } else if (a == "--allow-host") {
      if (!(v = value()) || !*v) return usage("--allow-host needs a host name or *");
      std::string name = v;
      for (char& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
      o.access.allowed_hosts.push_back(name);
    } else if (a == "--max-connections") {
      if (!(v = value()) || !parse_int(v, 1, 1024, &o.limits.max_connections))
        return usage("--max-connections needs 1..1024");
    } else if (a == "--request-timeout") {
      if (!(v = value()) || !parse_double(v, 0.1, 3600, &o.limits.request_seconds))
        return usage("--request-timeout needs seconds in [0.1, 3600]");
    } else if (a == "--gating") {
      if (!(v = value()) || !*v) return usage("--gating needs exact, sensitivity, cache-aware or score");
      o.gating = v;
    } else if (a == "--threshold") {
      if (!(v = value()) || !parse_double(v, 0, FLT_MAX, &o.threshold)) return usage("--threshold needs a number >= 0");
      o.threshold_given = true;
    } else if (a == "--profile") {
      if (!(v = value()) || !*v) return usage("--profile needs a path");
      o.profile = v;
    } else if (a == "--quality-target") {
      std::string why;
      if (!(v = value())) return usage("--quality-target needs a target such as 1% or kl:0.01");
      if (!quality_target_ok(v, &why)) return usage(("--quality-target: " + why).c_str());
      o.quality.target = v;
    } else if (a == "--quality-sample") {
      if (!(v = value()) || !parse_double(v, 0, 1, &o.quality.sample))
        return usage("--quality-sample needs a share in [0, 1]");
    } else if (a == "--backend") {
      const std::string b = (v = value()) ? v : "";
      if (b == "auto") o.backend = MOELITE_BACKEND_AUTO;
      else if (b == "cpu") o.backend = MOELITE_BACKEND_CPU;
      else if (b == "vulkan") o.backend = MOELITE_BACKEND_VULKAN;
      else if (b == "cuda") o.backend = MOELITE_BACKEND_CUDA;
      else return usage("--backend needs auto, cpu, vulkan or cuda");
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  if (o.model.empty()) return usage("-m MODEL is required");

  // SIGINT/SIGTERM are taken by a thread of their own (below), which stops the server cleanly.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

  moelite_model_params* mp = moelite_model_params_create();
  moelite_status st = moelite_model_params_set_backend(mp, o.backend);
  if (st == MOELITE_OK && o.threads) st = moelite_model_params_set_threads(mp, o.threads);
  // The library parses --budget, so it means the same here as in the CLI and the bindings.
  if (st == MOELITE_OK && !o.budget.empty() &&
      moelite_model_params_set_expert_budget_text(mp, o.budget.c_str()) != MOELITE_OK) {
    const std::string why = moelite_last_error();
    moelite_model_params_free(mp);
    return usage(("--budget: " + why).c_str());
  }
  if (st == MOELITE_OK && !o.profile.empty()) st = moelite_model_params_set_profile(mp, o.profile.c_str());
  // The mode is checked here (the threshold was, when read): the library knows the modes.
  if (st == MOELITE_OK && (!o.gating.empty() || o.threshold_given) &&
      moelite_model_params_set_gating(mp, o.gating.empty() ? "exact" : o.gating.c_str(),
                                      static_cast<float>(o.threshold)) != MOELITE_OK) {
    const std::string why = moelite_last_error();
    moelite_model_params_free(mp);
    return usage(("--gating: " + why).c_str());
  }
  Server s;
  if (st == MOELITE_OK) st = moelite_model_load(o.model.c_str(), mp, &s.model);
  moelite_model_params_free(mp);
  if (st != MOELITE_OK) {
    fprintf(stderr, "moelite-server: %s: %s\n", moelite_status_name(st), moelite_last_error());
    return 1;
  }
  const std::string base = o.model.substr(o.model.find_last_of('/') + 1);
  s.model_id = base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0 ? base.substr(0, base.size() - 5) : base;
  std::string why;
  const int32_t n_ctx_train = static_cast<int32_t>(moelite_model_get(s.model, MOELITE_MODEL_N_CTX_TRAIN));
  const int32_t n_ctx = std::min<int32_t>(o.n_ctx, n_ctx_train);
  if (o.n_ctx_given && o.n_ctx > n_ctx_train)
    fprintf(stderr, "moelite-server: -c %d is more than the model was trained for; using its %d positions\n", o.n_ctx,
            n_ctx_train);
  if (!s.batcher.create(s.model, o.parallel, std::max<int32_t>(16, n_ctx), o.quality, &why)) {
    fprintf(stderr, "moelite-server: creating the context: %s\n", why.c_str());
    moelite_model_free(s.model);
    return 1;
  }

  o.access.bound_host = o.host;
  ConnectionGuard guard(o.limits);
  httplib::Server http;
  http.new_task_queue = [&guard] { return guard.new_task_queue(); };
  add_routes(http, guard, s, o.access);
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, which lets a second server
  // bind the same port and take a share of its requests at random instead of failing.
  http.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int port = o.port == 0 ? http.bind_to_any_port(o.host) : (http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) {
    fprintf(stderr, "moelite-server: cannot listen on %s:%d: %s\n", o.host.c_str(), o.port,
            bind_error(o.host, o.port).c_str());
    moelite_model_free(s.model);
    return 1;
  }
  // Stops the server on SIGINT/SIGTERM. stop() does nothing until listen_after_bind() has started
  // the accept loop, so a signal that comes right after the "listening" line is repeated until
  // the loop has ended.
  std::atomic<bool> listen_returned{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    while (!listen_returned.load()) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  printf("listening on http://%s:%d (model %s, %s, %d sequences of %d positions)\n", o.host.c_str(), port,
         s.model_id.c_str(), moelite_model_backend_name(s.model), s.batcher.n_seq(), s.batcher.n_ctx());
  fflush(stdout);
  const bool ok = http.listen_after_bind();
  listen_returned = true;
  pthread_kill(stopper.native_handle(), SIGTERM);  // if the server ended on its own
  stopper.join();
  moelite_model_free(s.model);  // the batcher's context keeps it alive until it goes
  return ok ? 0 : 1;
}
