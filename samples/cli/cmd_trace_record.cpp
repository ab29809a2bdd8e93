// `moelite trace record`: the routing of a real run as JSON lines, one per (token, layer), in the
// format `moelite trace replay` (and other engines' tools) read.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "platforms/platform.h"

namespace cli {

namespace {

struct Entry {
  int64_t token;
  int32_t layer;
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

struct Recorder {
  int64_t base = 0;  // token index of sequence position 0 in the current window
  std::vector<Entry> entries;
};

void on_route(int32_t layer, int32_t pos0, int32_t n_tokens, int32_t k, const int32_t* experts, const float* weights,
              void* user) {
  auto* r = static_cast<Recorder*>(user);
  for (int32_t t = 0; t < n_tokens; ++t) {
    Entry e{r->base + pos0 + t, layer, {}, {}};
    for (int32_t j = t * k; j < (t + 1) * k; ++j) {
      if (experts[j] < 0) continue;  // dropped by adaptive gating
      e.experts.push_back(experts[j]);
      e.weights.push_back(weights[j]);
    }
    r->entries.push_back(std::move(e));
  }
}

}  // namespace

// Either a text file evaluated in consecutive windows of --ctx tokens (like `perplexity`), or a
// prompt followed by -n generated tokens (prefill and decode routing both recorded).
namespace {
const Command kTraceRecordCommand = {"trace record", "-m MODEL (-f TEXT | -p PROMPT [-n N]) -o TRACE [options]",
                                     "Records the routing (layer, token, experts, weights) as JSON lines.",
                                     with_groups({{{"-o"}, "TRACE", "trace file to write (required)"},
                                                  {{"-f"}, "TEXT", "text file to evaluate"},
                                                  {{"-p"}, "PROMPT", "prompt to generate from"},
                                                  {{"--ctx"}, "N", "window for -f in tokens (default 256)"}},
                                                 {&model_options(), &generate_options()})};
}  // namespace

int cmd_trace_record(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kTraceRecordCommand, &args, &rc)) return rc;
  std::string err;
  const std::string out_path = args.get("-o");
  if (out_path.empty()) return usage_error("missing -o TRACE.jsonl");
  if (args.has("-f") == args.has("-p")) return usage_error("give exactly one of -f TEXT_FILE or -p PROMPT");
  int64_t n_ctx;
  if (!args.get_int("--ctx", 256, &n_ctx, &err)) return usage_error(err);
  if (n_ctx < 1) return usage_error("--ctx must be positive");

  // An -o that cannot be written fails now, not after the recording; the file is written by
  // write_file_atomic's rule (an old trace stays as it was if writing fails).
  if (moelite::platform::check_writable(out_path) != MOELITE_OK) return report(MOELITE_ERR_IO, "checking the output");
  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  Recorder rec;
  moelite_context* ctx = nullptr;
  moelite_context_params* cp = moelite_context_params_create();
  moelite_status st = moelite_context_params_set_routing_callback(cp, on_route, &rec);
  if (st == MOELITE_OK && args.has("-f")) st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(n_ctx));
  if (st == MOELITE_OK) st = moelite_context_create(model, cp, &ctx);
  moelite_context_params_free(cp);

  if (st == MOELITE_OK && args.has("-f")) {
    std::vector<int32_t> tokens;
    if (int rc = tokenize_file(model, args.get("-f"), &tokens)) {
      moelite_context_free(ctx);
      free_model(model);
      return rc;
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (int64_t w0 = 0; st == MOELITE_OK && w0 < n; w0 += n_ctx) {
      moelite_context_kv_reset(ctx);
      rec.base = w0;
      st = moelite_eval(ctx, tokens.data() + w0, static_cast<int32_t>(std::min<int64_t>(n_ctx, n - w0)), 0);
    }
  } else if (st == MOELITE_OK) {
    moelite_generate_params* gen = moelite_generate_params_create();
    if (int rc = generate_params_from_args(args, gen)) {
      moelite_generate_params_free(gen);
      moelite_context_free(ctx);
      free_model(model);
      return rc;
    }
    const std::string prompt = args.get("-p");
    st = moelite_generate(ctx, prompt.data(), prompt.size(), gen, nullptr);
    moelite_generate_params_free(gen);
  }
  moelite_context_free(ctx);
  if (st != MOELITE_OK) {
    free_model(model);
    return report(st, "recording");
  }

  std::stable_sort(rec.entries.begin(), rec.entries.end(), [](const Entry& a, const Entry& b) {
    return a.token != b.token ? a.token < b.token : a.layer < b.layer;
  });
  std::string text;
  char line[160];
  snprintf(line, sizeof line, "{\"n_layers\":%" PRId64 ",\"n_experts\":%" PRId64 ",\"top_k\":%" PRId64 "}\n",
           moelite_model_get(model, MOELITE_MODEL_N_LAYERS), moelite_model_get(model, MOELITE_MODEL_N_EXPERTS),
           moelite_model_get(model, MOELITE_MODEL_N_EXPERTS_USED));
  text += line;
  for (const Entry& e : rec.entries) {
    snprintf(line, sizeof line, "{\"token\":%" PRId64 ",\"layer\":%d,\"experts\":[", e.token, e.layer);
    text += line;
    for (size_t j = 0; j < e.experts.size(); ++j) {
      snprintf(line, sizeof line, "%s%d", j ? "," : "", e.experts[j]);
      text += line;
    }
    text += "],\"weights\":[";
    for (size_t j = 0; j < e.weights.size(); ++j) {
      snprintf(line, sizeof line, "%s%.6g", j ? "," : "", e.weights[j]);
      text += line;
    }
    text += "]}\n";
  }
  free_model(model);
  const moelite::platform::WritePiece piece{text.data(), text.size()};
  if (moelite::platform::write_file_atomic(out_path, &piece, 1) != MOELITE_OK)
    return report(MOELITE_ERR_IO, "writing the trace");
  fprintf(stderr, "wrote %zu routing entries to %s\n", rec.entries.size(), out_path.c_str());
  return 0;
}

}  // namespace cli
