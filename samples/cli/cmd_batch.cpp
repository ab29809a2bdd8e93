// `moelite batch`: many requests from a JSON-lines file, decoded together.
//
// The requests go into the library's request queue (moelite_queue_*) over one context of --n-seq
// sequences: every step evaluates one token of each decoding request plus prompt chunks of newly
// admitted ones in a single pass, so all of them share each layer's weight reads and each expert's
// load (continuous batching). A request's tokens do not depend on what it was batched with: the
// queue gives what moelite_generate_tokens gives alone, and each request's sampler is seeded from
// --seed and its line, so the output is the same for any --n-seq (and equals `moelite run`).
// This file reads the requests, plans the sequences and writes the results in input order.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "core/support/json.h"  // the library's strict JSON reader (the CLI links the static archive)
#include "platforms/platform.h"

namespace cli {

namespace json = moelite::json;

namespace {

const Command kBatchCommand = {
    "batch", "-m MODEL -f REQUESTS.jsonl [-o OUT.jsonl] [--n-seq N] [options]",
    "Completes JSON-lines requests ({\"prompt\": ...} or {\"messages\": [...]}, optional \"id\", \"max_tokens\"), "
    "decoding up to --n-seq of them together; writes one JSON line per request, in input order.",
    with_groups({{{"-f"}, "FILE", "requests, one JSON object per line"},
                 {{"-o"}, "FILE", "where results go (default: standard output)"},
                 {{"--n-seq"},
                  "N|auto",
                  "requests decoded together (default auto: the batch planner's choice among 1..min(requests, 16), "
                  "from the memory, the KV cache each sequence takes and the storage bandwidth; under a budget it "
                  "also picks the expert pools, and with --budget auto splits the memory between the KV caches "
                  "and the experts)"},
                 {{"--memory"},
                  "SIZE",
                  "with --n-seq auto or --budget auto: plan within this much memory (default: what is free now)"},
                 {{"--storage-gbs"},
                  "X",
                  "with --n-seq auto: the storage read bandwidth in GB/s (default: measured on the model file)"},
                 {{"--plan-trace"},
                  "TRACE",
                  "with --n-seq auto: plan from this routing trace (`moelite trace record` on text like the "
                  "requests) instead of the profile's shares: measures how a sequence reuses its recent experts"},
                 {{"--plan-record"},
                  "N",
                  "with --n-seq auto: first record the routing of up to N tokens of the requests' prompts and plan "
                  "from it as from --plan-trace (under a budget the model loads once more for it, at its smallest "
                  "budget)"},
                 {{"--plan"}, "", "print the plan as JSON and stop (with --n-seq auto)"},
                 {{"-c", "--ctx"}, "N", "context positions of each request (default 2048)"},
                 {{"-b", "--batch"}, "N", "most tokens per forward pass (default 512)"}},
                {&model_options(), &generate_options()})};

struct Request {
  std::string id_json = "null";  // the request's "id" as JSON, echoed back
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  // Sampling of this request where its line sets it; the run's options (--temp, ...) otherwise.
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k, seed;
  std::vector<std::string> stop;
  std::string error;  // a request that cannot run is answered with this
};

// The fields a request line may have: anything else (a typo such as "max_token") is an error
// naming it, not silently ignored.
constexpr const char* kRequestFields[] = {"id", "prompt", "messages", "max_tokens", "temperature", "top_p",
                                          "top_k", "min_p", "seed", "stop"};

// A number field of a request line in [lo, hi] (whole when `whole`); false with r->error.
bool number_field(const json::Value& v, const char* key, double lo, double hi, bool whole, Request* r,
                  std::optional<double>* out) {
  const json::Value* f = v.find(key);
  if (!f || f->kind == json::Value::Kind::Null) return true;
  if (!f->is_number() || !(f->number >= lo && f->number <= hi) || (whole && f->number != std::floor(f->number))) {
    r->error = std::string("\"") + key + "\" must be " + (whole ? "a whole number" : "a number") + " in [" +
               json::number(lo) + ", " + json::number(hi) + "]";
    return false;
  }
  *out = f->number;
  return true;
}

struct Result {
  bool done = false;
  std::string line;
};

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Reads one request line. Errors in a line answer that request, never the whole run.
Request read_request(moelite_model* model, const std::string& line, int64_t index, int32_t default_max) {
  Request r;
  r.max_tokens = default_max;
  json::Value v;
  std::string err;
  if (!json::parse(line, &v, &err)) {
    r.error = "line " + std::to_string(index + 1) + " is not JSON (" + err + ")";
    return r;
  }
  if (!v.is_object()) {
    r.error = "line " + std::to_string(index + 1) + ": expected an object";
    return r;
  }
  if (const json::Value* id = v.find("id")) {
    if (id->is_string())
      r.id_json = json::quote(id->string);
    else if (id->is_number())
      r.id_json = json::number(id->number);
  }
  for (const auto& [key, value] : v.object)
    if (std::find_if(std::begin(kRequestFields), std::end(kRequestFields),
                     [&](const char* k) { return key == k; }) == std::end(kRequestFields)) {
      r.error = "unknown field \"" + key + "\" (a request has id, prompt or messages, max_tokens, temperature, "
                "top_p, top_k, min_p, seed, stop)";
      return r;
    }
  std::optional<double> top_k, seed;
  if (!number_field(v, "temperature", 0, 1e6, false, &r, &r.temperature) ||
      !number_field(v, "top_p", 0, 1, false, &r, &r.top_p) || !number_field(v, "min_p", 0, 1, false, &r, &r.min_p) ||
      !number_field(v, "top_k", 0, 1e9, true, &r, &top_k) ||
      !number_field(v, "seed", -9007199254740992.0, 9007199254740992.0, true, &r, &seed))  // exact in a double
    return r;
  if (top_k) r.top_k = static_cast<int64_t>(*top_k);
  if (seed) r.seed = static_cast<int64_t>(*seed);
  if (const json::Value* stop = v.find("stop"); stop && stop->kind != json::Value::Kind::Null) {
    if (stop->is_string()) r.stop.push_back(stop->string);
    if (stop->is_array())
      for (const json::Value& x : stop->array) r.stop.push_back(x.is_string() ? x.string : "");
    const bool ok = (stop->is_string() || stop->is_array()) && r.stop.size() <= 4 &&
                    std::all_of(r.stop.begin(), r.stop.end(),
                                [](const std::string& x) { return !x.empty() && x.find('\0') == std::string::npos; });
    if (!ok) {
      r.error = "\"stop\" must be a non-empty string or up to 4 of them (without U+0000)";
      return r;
    }
  }
  if (const json::Value* mt = v.find("max_tokens")) {
    if (!mt->is_number() || mt->number < 0 || mt->number > 1e9 || mt->number != std::floor(mt->number)) {
      r.error = "\"max_tokens\" must be a whole number >= 0";
      return r;
    }
    r.max_tokens = static_cast<int32_t>(mt->number);
  }
  const json::Value* prompt = v.find("prompt");
  const json::Value* messages = v.find("messages");
  moelite_status st = MOELITE_OK;
  int32_t n = 0;
  if (prompt && prompt->is_string()) {
    const std::string& text = prompt->string;
    st = moelite_tokenize(model, text.data(), text.size(), MOELITE_TOKENIZE_ADD_SPECIAL, nullptr, 0, &n);
    if (st == MOELITE_ERR_BUFFER_TOO_SMALL || st == MOELITE_OK) {
      r.prompt.assign(static_cast<size_t>(n), 0);
      st = moelite_tokenize(model, text.data(), text.size(), MOELITE_TOKENIZE_ADD_SPECIAL, r.prompt.data(), n, &n);
    }
  } else if (messages && messages->is_array()) {
    std::vector<moelite_chat_message> msgs;
    for (const json::Value& m : messages->array) {
      const json::Value* role = m.find("role");
      const json::Value* content = m.find("content");
      if (!role || !content || !role->is_string() || !content->is_string()) {
        r.error = "each message needs string \"role\" and \"content\"";
        return r;
      }
      msgs.push_back({role->string.c_str(), content->string.c_str()});
    }
    st = moelite_chat_tokenize(model, msgs.data(), msgs.size(), 1, nullptr, 0, &n);
    if (st == MOELITE_ERR_BUFFER_TOO_SMALL || st == MOELITE_OK) {
      r.prompt.assign(static_cast<size_t>(n), 0);
      st = moelite_chat_tokenize(model, msgs.data(), msgs.size(), 1, r.prompt.data(), n, &n);
    }
  } else {
    r.error = "a request needs a string \"prompt\" or an array \"messages\"";
    return r;
  }
  if (st != MOELITE_OK)
    r.error = std::string("tokenizing: ") + moelite_last_error();
  else if (r.prompt.empty())
    r.error = "the prompt has no tokens";
  return r;
}

std::string detokenize(moelite_model* model, const std::vector<int32_t>& tokens) {
  size_t len = 0;
  moelite_status st =
      moelite_detokenize(model, tokens.data(), static_cast<int32_t>(tokens.size()), 0, nullptr, 0, &len);
  if (st != MOELITE_OK && st != MOELITE_ERR_BUFFER_TOO_SMALL) return "";
  std::string text(len, '\0');
  if (moelite_detokenize(model, tokens.data(), static_cast<int32_t>(tokens.size()), 0, text.data(), len, &len) !=
      MOELITE_OK)
    return "";
  text.resize(len);
  return text;
}

// --n-seq auto: the library's batch planner (moelite_plan_batch) picks the sequences from the
// memory, each sequence's KV cache and the storage bandwidth. Under a budget it plans before the
// model loads, which then loads with the plan's pools (and with --budget auto, its budget). At most
// kAutoMaxSequences (decoding more at once gains little on a CPU: tools/batch_table.py). Says what it
// chose and why on stderr; --plan prints the whole plan as JSON instead of running.
constexpr int64_t kAutoMaxSequences = 16;
constexpr size_t kStorageProbeBytes = size_t{256} << 20;
// --plan-record's most tokens: the planner replays at most 1024 steps of its sequences, started
// evenly apart over the tokens, so more would only cost recording time and memory.
constexpr int64_t kMaxRecordedTokens = 65536;

struct PlanChoice {
  int64_t n_seq = 1;
  std::string json;
};

// The routing of one sequence, as moelite_plan_params_set_routing takes it.
struct RecordedRouting {
  int32_t tokens = 0, layers = 0, k = 0;
  std::vector<int32_t> experts;  // [token][MoE layer][slot], -1 an empty slot
};

// --plan-record: the requests' prompts, one after another, each from position 0 of one sequence,
// until `limit` tokens, with the routing callback collecting each token's experts. `model` is the
// loaded model (resident), or null under a budget: then a model of its own loads at the smallest
// budget (one global pool), so recording takes no more memory than the plan may give.
int record_prompt_routing(const Args& args, moelite_model* model, const std::vector<std::string>& lines, int64_t limit,
                          int32_t n_ctx, int32_t n_batch, RecordedRouting* out) {
  const double t0 = now();
  moelite_model* own = nullptr;
  if (!model) {
    const std::string path = args.has("-m") ? args.get("-m") : args.get("--model");
    moelite_model* inspected = nullptr;
    moelite_status st = moelite_model_inspect(path.c_str(), &inspected);
    if (st != MOELITE_OK) return report(st, ("reading " + path).c_str());
    const int64_t smallest = moelite_model_get(inspected, MOELITE_MODEL_EXPERT_MIN_BUDGET);
    free_model(inspected);
    Args small = args;
    small.set("--budget", std::to_string(smallest));
    small.set("--allocation", "global");
    small.erase("--budget-headroom");
    if (int rc = load_model(small, &own)) return rc;
    model = own;
  }
  std::unique_ptr<moelite_model, void (*)(moelite_model*)> own_guard(own, free_model);
  const int32_t dense = static_cast<int32_t>(moelite_model_get(model, MOELITE_MODEL_N_DENSE_LAYERS));
  out->layers = static_cast<int32_t>(moelite_model_get(model, MOELITE_MODEL_N_LAYERS)) - dense;
  out->k = static_cast<int32_t>(moelite_model_get(model, MOELITE_MODEL_N_EXPERTS_USED));
  out->tokens = 0;
  out->experts.clear();
  struct Sink {
    RecordedRouting* out;
    int32_t dense = 0;
    int32_t base = 0;  // tokens recorded before the prompt being evaluated
  } sink{out, dense, 0};
  auto on_routing = [](int32_t layer, int32_t pos0, int32_t n_tokens, int32_t k, const int32_t* experts, const float*,
                       void* user) {
    Sink& s = *static_cast<Sink*>(user);
    RecordedRouting& r = *s.out;
    const int32_t l = layer - s.dense;
    if (l < 0 || l >= r.layers || k != r.k) return;
    const size_t row_ids = static_cast<size_t>(r.layers) * static_cast<size_t>(r.k);
    for (int32_t t = 0; t < n_tokens; ++t) {
      // The rows were made before the evaluation: nothing here allocates (or throws through the library).
      const size_t row = static_cast<size_t>(s.base) + static_cast<size_t>(pos0) + static_cast<size_t>(t);
      if ((row + 1) * row_ids > r.experts.size()) return;
      std::copy(experts + static_cast<size_t>(t) * r.k, experts + static_cast<size_t>(t + 1) * r.k,
                r.experts.begin() + static_cast<std::ptrdiff_t>(row * row_ids + static_cast<size_t>(l) * r.k));
    }
  };
  moelite_context_params* cp = moelite_context_params_create();
  moelite_status st = cp ? MOELITE_OK : MOELITE_ERR_OUT_OF_MEMORY;
  if (st == MOELITE_OK) st = moelite_context_params_set_n_ctx(cp, n_ctx);
  if (st == MOELITE_OK) st = moelite_context_params_set_n_batch(cp, n_batch);
  if (st == MOELITE_OK) st = moelite_context_params_set_routing_callback(cp, on_routing, &sink);
  moelite_context* ctx = nullptr;
  if (st == MOELITE_OK) st = moelite_context_create(model, cp, &ctx);
  moelite_context_params_free(cp);
  if (st != MOELITE_OK) return report(st, "creating a context to record the prompts' routing");
  std::unique_ptr<moelite_context, void (*)(moelite_context*)> ctx_guard(ctx, moelite_context_free);
  int64_t prompts = 0;
  for (size_t i = 0; i < lines.size() && sink.base < limit; ++i) {
    const Request r = read_request(model, lines[i], static_cast<int64_t>(i), 0);
    if (!r.error.empty()) continue;  // answered when the batch runs
    const int32_t n = static_cast<int32_t>(
        std::min<int64_t>({static_cast<int64_t>(r.prompt.size()), limit - sink.base, static_cast<int64_t>(n_ctx)}));
    out->experts.resize((static_cast<size_t>(sink.base) + static_cast<size_t>(n)) * static_cast<size_t>(out->layers) *
                            static_cast<size_t>(out->k),
                        -1);
    if ((st = moelite_context_seq_truncate(ctx, 0, 0)) != MOELITE_OK ||
        (st = moelite_eval(ctx, r.prompt.data(), n, 0)) != MOELITE_OK)
      return report(st, "recording the prompts' routing");
    sink.base += n;
    ++prompts;
  }
  out->tokens = sink.base;
  if (out->tokens == 0) return usage_error("--plan-record: no request has a prompt to record");
  fprintf(stderr, "moelite batch: recorded the routing of %d tokens of %lld prompt%s for the plan (%.1f s)\n",
          out->tokens, (long long)prompts, prompts == 1 ? "" : "s", now() - t0);
  return 0;
}

// `model` is the loaded model (resident), or null under a budget (then the file is only inspected,
// and args gets the planned --budget and --allocation).
// `fixed_n` > 0: --n-seq was given; the plan is then only for its pools under the budget.
// `routing`: recorded by --plan-record, or null.
int plan_batch(Args& args, moelite_model* model, int32_t n_ctx, int32_t n_batch, int64_t n_requests, int64_t fixed_n,
               const RecordedRouting* routing, PlanChoice* out) {
  const std::string path = args.has("-m") ? args.get("-m") : args.get("--model");
  std::string err;
  uint64_t memory = 0, headroom = 0;
  double storage_gbs = 0;
  if ((args.has("--memory") && !parse_size("--memory", args.get("--memory"), &memory, &err)) ||
      (args.has("--budget-headroom") &&
       !parse_size("--budget-headroom", args.get("--budget-headroom"), &headroom, &err)) ||
      !args.get_double("--storage-gbs", 0.0, &storage_gbs, &err))
    return usage_error(err);
  if (storage_gbs < 0) return usage_error("--storage-gbs must be > 0");
  moelite_model* inspected = nullptr;
  if (!model) {
    moelite_status st = moelite_model_inspect(path.c_str(), &inspected);
    if (st != MOELITE_OK) return report(st, ("reading " + path).c_str());
  }
  std::unique_ptr<moelite_model, void (*)(moelite_model*)> inspected_guard(inspected, free_model);
  const moelite_model* subject = model ? model : inspected;
  const bool streams = !model || moelite_model_get(model, MOELITE_MODEL_EXPERT_BUDGET) > 0;
  if (streams && fixed_n > 0 && storage_gbs <= 0) storage_gbs = 1.0;  // the pools do not depend on it: no probe
  if (streams && storage_gbs <= 0) storage_gbs = measure_storage_bandwidth(path, kStorageProbeBytes, 2);
  if (streams && storage_gbs <= 0) return report(MOELITE_ERR_IO, ("measuring the read bandwidth of " + path).c_str());

  moelite_plan_params* pp = moelite_plan_params_create();
  moelite_context_params* cp = moelite_context_params_create();
  std::unique_ptr<moelite_plan_params, void (*)(moelite_plan_params*)> pp_guard(pp, moelite_plan_params_free);
  std::unique_ptr<moelite_context_params, void (*)(moelite_context_params*)> cp_guard(cp, moelite_context_params_free);
  if (!pp || !cp) return report(MOELITE_ERR_OUT_OF_MEMORY, "planning");
  const int32_t most =
      static_cast<int32_t>(fixed_n > 0 ? fixed_n : std::max<int64_t>(1, std::min(n_requests, kAutoMaxSequences)));
  moelite_status st = moelite_plan_params_set_max_sequences(pp, most);
  if (st == MOELITE_OK && fixed_n > 0) st = moelite_plan_params_set_min_sequences(pp, most);
  if (st == MOELITE_OK && args.has("--memory")) st = moelite_plan_params_set_memory(pp, memory);
  if (st == MOELITE_OK && args.has("--budget-headroom")) st = moelite_plan_params_set_headroom(pp, headroom);
  if (st == MOELITE_OK && !model && args.has("--budget") && args.get("--budget") != "auto") {
    // a budget given: plan the sequences and pools
    st = moelite_plan_params_set_expert_budget_text(pp, args.get("--budget").c_str());
    if (st != MOELITE_OK) return usage_error(std::string("--budget: ") + moelite_last_error());
  }
  if (st == MOELITE_OK) st = moelite_plan_params_set_bandwidths(pp, streams ? storage_gbs : 0.0, 0.0);
  // The pools: as the user set them (a profile's "auto" is its per-layer DP allocation), else the plan's.
  const bool pools_given = args.has("--allocation") || args.has("--per-layer") || args.has("--profile");
  if (st == MOELITE_OK && routing)  // replaces the profile's shares in the plan
    st = moelite_plan_params_set_routing(pp, routing->tokens, routing->layers, routing->k, routing->experts.data());
  else if (st == MOELITE_OK && args.has("--plan-trace"))
    st = moelite_plan_params_set_routing_trace(pp, args.get("--plan-trace").c_str());
  else if (st == MOELITE_OK && args.has("--profile"))
    st = moelite_plan_params_set_profile(pp, args.get("--profile").c_str());
  if (st == MOELITE_OK && pools_given)
    st = moelite_plan_params_set_cache_allocation(pp, args.has("--allocation") && args.get("--allocation") != "auto"
                                                          ? args.get("--allocation").c_str()
                                                          : "uniform");
  if (st == MOELITE_OK) st = moelite_context_params_set_n_ctx(cp, n_ctx);
  if (st == MOELITE_OK) st = moelite_context_params_set_n_batch(cp, n_batch);
  moelite_batch_plan* plan = nullptr;
  if (st == MOELITE_OK) st = moelite_plan_batch(subject, cp, pp, &plan);
  if (st != MOELITE_OK) return report(st, "planning the batch");
  std::unique_ptr<moelite_batch_plan, void (*)(moelite_batch_plan*)> plan_guard(plan, moelite_batch_plan_free);
  out->n_seq = moelite_batch_plan_get(plan, MOELITE_PLAN_N_SEQ);
  out->json = moelite_batch_plan_json(plan);
  const double mib = 1048576.0;
  if (!model) {  // planned before loading: the model loads with the plan's budget and pools
    args.set("--budget", std::to_string(moelite_batch_plan_get(plan, MOELITE_PLAN_EXPERT_BUDGET)));
    args.erase("--budget-headroom");
    if (!pools_given) args.set("--allocation", moelite_batch_plan_allocation(plan));
    // The plan's hit shares are LRU's (core/serve/batch_plan.h): run what was modelled.
    if (!args.has("--policy")) args.set("--policy", "lru");
  }
  if (fixed_n > 0) {
    fprintf(stderr, "moelite batch: %s expert pools for %" PRId64 " sequences: %s\n",
            moelite_batch_plan_allocation(plan), fixed_n, moelite_batch_plan_reason(plan));
    return 0;
  }
  const double tok_s = moelite_batch_plan_decode_tok_s(plan);
  char predicted[64] = "";
  if (tok_s > 0) snprintf(predicted, sizeof predicted, ", predicted %.1f tok/s", tok_s);
  fprintf(stderr,
          "moelite batch: %" PRId64 " sequence%s at once (of %" PRId64
          " requests; KV caches %.1f MiB, experts %.1f MiB, "
          "%s pools, within %.1f MiB%s%s): %s\n",
          out->n_seq, out->n_seq == 1 ? "" : "s", n_requests, moelite_batch_plan_get(plan, MOELITE_PLAN_KV_BYTES) / mib,
          moelite_batch_plan_get(plan, MOELITE_PLAN_EXPERT_BUDGET) / mib, moelite_batch_plan_allocation(plan),
          moelite_batch_plan_get(plan, MOELITE_PLAN_MEMORY) / mib, predicted,
          streams ? (", storage " + std::to_string(storage_gbs).substr(0, 5) + " GB/s").c_str() : "",
          moelite_batch_plan_reason(plan));
  return 0;
}

// Every request through the library's queue (moelite_queue_*), which admits them in input order
// into free sequences and batches their steps; results go to `emit` (one line each, with its
// newline) in input order as soon as every earlier one is out; a failing emit (a full disk, a
// closed pipe) stops the run with its status. A request that cannot run is answered at once with
// its error.
using Emit = std::function<moelite::Status(const std::string& line)>;
int serve_requests(const Args& args, moelite_context* ctx, const std::vector<Request>& requests,
                   moelite_generate_params* gp, int64_t seed, int64_t n_seq, const Emit& emit) {
  moelite_status st;
  moelite_queue* queue = nullptr;
  if ((st = moelite_queue_create(ctx, &queue)) != MOELITE_OK) return report(st, "creating the request queue");
  std::unique_ptr<moelite_queue, void (*)(moelite_queue*)> queue_guard(queue, moelite_queue_free);

  std::vector<Result> results(requests.size());
  size_t next_output = 0, finished = 0;
  uint64_t tokens_generated = 0;
  const bool show_progress = isatty(STDERR_FILENO) != 0;
  const double t_start = now();

  moelite::Status emitted = MOELITE_OK;  // the first failed emit: the run stops there
  auto finish = [&](int64_t index, const std::string& line) {
    results[static_cast<size_t>(index)] = {true, line};
    ++finished;
    // Results go out in input order, as soon as every earlier one is out.
    while (emitted == MOELITE_OK && next_output < results.size() && results[next_output].done) {
      emitted = emit(results[next_output].line + "\n");
      results[next_output].line.clear();
      ++next_output;
    }
  };
  auto error_line = [&](int64_t index, const std::string& why) {
    finish(index, "{\"id\": " + requests[static_cast<size_t>(index)].id_json + ", \"index\": " + std::to_string(index) +
                      ", \"error\": \"" + json_escape(why) + "\"}");
  };
  // Every request goes into the library's queue (moelite_queue_*), which admits them in input
  // order into free sequences and batches their steps; one that cannot run is answered at once.
  std::vector<int64_t> index_of;  // queue id -> request index
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    if (!r.error.empty()) {
      error_line(static_cast<int64_t>(i), r.error);
      if (emitted != MOELITE_OK) return report(emitted, "writing the results");
      continue;
    }
    // The run's settings with a seed of its own, from --seed and the request's line, and the
    // request's own sampling fields over them (its stop strings beside --stop's).
    int64_t id = -1;
    moelite_generate_params* rp = gp;
    std::unique_ptr<moelite_generate_params, void (*)(moelite_generate_params*)> own(nullptr,
                                                                                   moelite_generate_params_free);
    if (r.temperature || r.top_p || r.min_p || r.top_k || !r.stop.empty()) {
      own.reset(moelite_generate_params_create());
      if (!own) return report(MOELITE_ERR_OUT_OF_MEMORY, "request parameters");
      if (int rc = generate_params_from_args(args, own.get())) return rc;
      rp = own.get();
    }
    const uint64_t request_seed = r.seed ? static_cast<uint64_t>(*r.seed) : static_cast<uint64_t>(seed) + i;
    st = moelite_generate_params_set_seed(rp, request_seed);
    if (st == MOELITE_OK) st = moelite_generate_params_set_max_tokens(rp, r.max_tokens);
    if (st == MOELITE_OK && r.temperature)
      st = moelite_generate_params_set_temperature(rp, static_cast<float>(*r.temperature));
    if (st == MOELITE_OK && r.top_p) st = moelite_generate_params_set_top_p(rp, static_cast<float>(*r.top_p));
    if (st == MOELITE_OK && r.min_p) st = moelite_generate_params_set_min_p(rp, static_cast<float>(*r.min_p));
    if (st == MOELITE_OK && r.top_k)
      st = moelite_generate_params_set_top_k(rp, static_cast<int32_t>(std::min<int64_t>(*r.top_k, INT32_MAX)));
    for (const std::string& x : r.stop)
      if (st == MOELITE_OK) st = moelite_generate_params_add_stop(rp, x.c_str());
    if (st == MOELITE_OK)
      st = moelite_queue_add(queue, r.prompt.data(), static_cast<int32_t>(r.prompt.size()), rp, &id);
    if (st == MOELITE_ERR_OUT_OF_MEMORY) return report(st, "queueing the requests");
    if (st != MOELITE_OK) {
      error_line(static_cast<int64_t>(i), moelite_last_error());
      if (emitted != MOELITE_OK) return report(emitted, "writing the results");
      continue;
    }
    if (index_of.size() <= static_cast<size_t>(id)) index_of.resize(static_cast<size_t>(id) + 1, -1);
    index_of[static_cast<size_t>(id)] = static_cast<int64_t>(i);
  }
  const char* const stop_names[] = {"end", "length", "stop", "aborted", "context", "error"};
  std::vector<int32_t> generated;
  std::string text;
  while (moelite_queue_waiting(queue) + moelite_queue_running(queue) > 0) {
    int32_t n_events = 0;
    st = moelite_queue_step(queue, &n_events);
    if (st != MOELITE_OK) return report(st, "evaluating");
    for (int32_t e = 0; e < n_events; ++e) {
      int64_t id = -1;
      int32_t token = -1, state = MOELITE_REQUEST_RUNNING;
      if ((st = moelite_queue_event(queue, e, &id, &token, &state)) != MOELITE_OK)
        return report(st, "reading the queue");
      if (token >= 0) ++tokens_generated;
      if (state < 0) continue;
      // A finished request: its line, then the queue forgets it.
      int32_t n = 0;
      size_t len = 0;
      if (moelite_queue_request_tokens(queue, id, nullptr, 0, &n) == MOELITE_ERR_OUT_OF_MEMORY ||
          moelite_queue_request_text(queue, id, nullptr, 0, &len) == MOELITE_ERR_OUT_OF_MEMORY)
        return report(MOELITE_ERR_OUT_OF_MEMORY, "reading a result");
      text.assign(len, '\0');
      if ((st = moelite_queue_request_text(queue, id, text.empty() ? nullptr : &text[0], len, &len)) != MOELITE_OK)
        return report(st, "reading a result");
      const int64_t index = index_of[static_cast<size_t>(id)];
      const Request& r = requests[static_cast<size_t>(index)];
      finish(index, "{\"id\": " + r.id_json + ", \"index\": " + std::to_string(index) + ", \"text\": \"" +
                        json_escape(text) + "\", \"prompt_tokens\": " + std::to_string(r.prompt.size()) +
                        ", \"generated_tokens\": " + std::to_string(n) + ", \"stop\": \"" +
                        (state < 6 ? stop_names[state] : "error") + "\"}");
      (void)moelite_queue_remove(queue, id);
      if (emitted != MOELITE_OK) return report(emitted, "writing the results");
    }
    if (show_progress) {
      const double dt = now() - t_start;
      fprintf(stderr, "\r%zu/%zu requests, %" PRIu64 " tokens, %.1f tok/s   ", finished, requests.size(),
              tokens_generated, dt > 0 ? double(tokens_generated) / dt : 0.0);
    }
  }
  if (show_progress) fprintf(stderr, "\n");
  const double dt = now() - t_start;
  fprintf(stderr,
          "moelite batch: %zu requests, %" PRIu64 " tokens generated in %.2f s (%.2f tok/s, %" PRId64
          " sequences at once)\n",
          requests.size(), tokens_generated, dt, dt > 0 ? double(tokens_generated) / dt : 0.0, n_seq);
  return 0;
}

}  // namespace

int cmd_batch(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kBatchCommand, &args, &rc)) return rc;
  if (!args.has("-f")) return usage_error("missing -f REQUESTS.jsonl");
  std::string err;
  int64_t n_seq = 0, n_ctx, n_batch, max_tokens, seed;
  const bool auto_seq = args.get("--n-seq", "auto") == "auto";
  if ((!auto_seq && !args.get_int("--n-seq", 8, &n_seq, &err, 1, MOELITE_MAX_SEQUENCES)) ||
      !args.get_int("-c", 2048, &n_ctx, &err, 1, MOELITE_MAX_CONTEXT) ||
      !args.get_int("-b", 512, &n_batch, &err, 1, INT32_MAX) ||
      !args.get_int("-n", 256, &max_tokens, &err, 0, INT32_MAX) ||
      !args.get_int("--seed", 0x5eed, &seed, &err, INT64_MIN, INT64_MAX))
    return usage_error(err);
  std::string input;
  if (std::string why; !read_file(args.get("-f"), &input, &why)) return usage_error(why);
  if (args.has("--plan") && !auto_seq) return usage_error("--plan goes with --n-seq auto");
  // --memory sizes a plan: the planner's choice of sequences, or the budget for a given number.
  if (args.has("--memory") && !auto_seq && args.get("--budget") != "auto")
    return usage_error("--memory goes with --n-seq auto or --budget auto");
  if (args.has("--storage-gbs") && !auto_seq) return usage_error("--storage-gbs goes with --n-seq auto");
  int64_t record_tokens = 0;
  if (args.has("--plan-record")) {
    if (!auto_seq) return usage_error("--plan-record goes with --n-seq auto");
    if (args.has("--plan-trace")) return usage_error("--plan-record and --plan-trace: give one routing to plan from");
    if (!args.get_int("--plan-record", 0, &record_tokens, &err, 1, kMaxRecordedTokens)) return usage_error(err);
  }
  // --plan writes nothing but the plan, to standard output. An -o that cannot be written fails
  // now, before the model loads; the file is written by write_file_atomic's rule (a regular file
  // is replaced once every result is in it: a failed run leaves an old one as it was).
  const std::string out_path = args.has("-o") && !args.has("--plan") ? args.get("-o") : std::string();
  if (!out_path.empty() && moelite::platform::check_writable(out_path) != MOELITE_OK)
    return report(MOELITE_ERR_IO, "checking the output");
  // The request lines (blank lines are not requests), split before loading so that the planner
  // knows how many sequences could run; they are parsed once the tokenizer is loaded.
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < input.size();) {
    size_t end = input.find('\n', pos);
    if (end == std::string::npos) end = input.size();
    std::string line = input.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(std::move(line));
  }
  const int64_t n_lines = static_cast<int64_t>(lines.size());
  // More sequences than requests would only hold KV caches (and, under a budget, plan pools) for
  // sequences that never run.
  if (!auto_seq && n_seq > std::max<int64_t>(n_lines, 1)) {
    fprintf(stderr, "moelite batch: --n-seq %lld but %lld request%s: decoding %lld sequence%s\n", (long long)n_seq,
            (long long)n_lines, n_lines == 1 ? "" : "s", (long long)std::max<int64_t>(n_lines, 1),
            std::max<int64_t>(n_lines, 1) == 1 ? "" : "s");
    n_seq = std::max<int64_t>(n_lines, 1);
  }
  // Under a budget the plan comes before loading: with --budget auto it sizes the budget, and it
  // picks the pools (one global pool thrashes when a step's experts outnumber its slots).
  PlanChoice plan;
  const bool plan_budget = args.has("--budget");
  RecordedRouting recorded;
  if (plan_budget) {
    if (record_tokens > 0)
      if (int rc = record_prompt_routing(args, nullptr, lines, record_tokens, static_cast<int32_t>(n_ctx),
                                         static_cast<int32_t>(n_batch), &recorded))
        return rc;
    if (int rc = plan_batch(args, nullptr, static_cast<int32_t>(n_ctx), static_cast<int32_t>(n_batch), n_lines,
                            auto_seq ? 0 : n_seq, record_tokens > 0 ? &recorded : nullptr, &plan))
      return rc;
  }
  if (plan_budget && args.has("--plan")) {
    printf("%s\n", plan.json.c_str());
    return finish_output(0);
  }
  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  std::unique_ptr<moelite_model, void (*)(moelite_model*)> model_guard(model, free_model);
  moelite_generate_params* gp = moelite_generate_params_create();
  std::unique_ptr<moelite_generate_params, void (*)(moelite_generate_params*)> gp_guard(gp,
                                                                                        moelite_generate_params_free);
  if (int rc = generate_params_from_args(args, gp)) return rc;

  std::vector<Request> requests;
  for (const std::string& line : lines)
    requests.push_back(
        read_request(model, line, static_cast<int64_t>(requests.size()), static_cast<int32_t>(max_tokens)));

  if (auto_seq && !plan_budget) {
    if (record_tokens > 0)
      if (int rc = record_prompt_routing(args, model, lines, record_tokens, static_cast<int32_t>(n_ctx),
                                         static_cast<int32_t>(n_batch), &recorded))
        return rc;
    if (int rc = plan_batch(args, model, static_cast<int32_t>(n_ctx), static_cast<int32_t>(n_batch),
                            static_cast<int64_t>(requests.size()), 0, record_tokens > 0 ? &recorded : nullptr, &plan))
      return rc;
    if (args.has("--plan")) {
      printf("%s\n", plan.json.c_str());
      return finish_output(0);
    }
  }
  if (auto_seq) n_seq = plan.n_seq;
  moelite_context_params* cp = moelite_context_params_create();
  moelite_status st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(n_ctx));
  if (st == MOELITE_OK) st = moelite_context_params_set_n_batch(cp, static_cast<int32_t>(n_batch));
  if (st == MOELITE_OK) st = moelite_context_params_set_n_seq(cp, static_cast<int32_t>(n_seq));
  moelite_context* ctx = nullptr;
  if (st == MOELITE_OK) st = moelite_context_create(model, cp, &ctx);
  moelite_context_params_free(cp);
  if (st != MOELITE_OK) return report(st, "creating context");
  std::unique_ptr<moelite_context, void (*)(moelite_context*)> ctx_guard(ctx, moelite_context_free);

  if (out_path.empty()) {
    const int rc = serve_requests(args, ctx, requests, gp, seed, n_seq, [](const std::string& line) {
      if (fwrite(line.data(), 1, line.size(), stdout) != line.size() || fflush(stdout) != 0)
        return moelite::fail(MOELITE_ERR_IO, "writing the output failed: %s", strerror(errno ? errno : EIO));
      return moelite::Status(MOELITE_OK);
    });
    return rc ? rc : finish_output(0);
  }
  int rc = 0;
  const auto produce = [&](const moelite::platform::WriteFn& write) {
    rc = serve_requests(args, ctx, requests, gp, seed, n_seq,
                        [&](const std::string& line) { return write(line.data(), line.size()); });
    return moelite::Status(rc ? MOELITE_ERR_IO : MOELITE_OK);  // serve_requests has said why
  };
  const moelite::Status written = moelite::platform::write_streamed_file(out_path, produce);
  if (rc) return rc;
  return written == MOELITE_OK ? 0 : report(written, "writing the results");
}

}  // namespace cli
