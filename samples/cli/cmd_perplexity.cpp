// `moelite perplexity`: the standard windowed perplexity of a model on a text file.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"

namespace cli {

// The text is tokenized as given (no BOS/EOS, no special-token parsing), cut into consecutive
// windows of --ctx tokens, each evaluated from an empty cache; every token after a window's first
// is scored by the log-probability the model gave it. A last partial window counts when it holds
// at least two tokens. --batch N evaluates each window in passes of N tokens (--batch 1: token by
// token, as decoding does; what the expert store loads, and cache-aware gating, depend on it).
namespace {
const Command kPerplexityCommand = {"perplexity", "-m MODEL -f TEXT [--ctx 256] [--batch N] [--json] [options]",
                                    "Windowed perplexity of a text.",
                                    with_groups({{{"-f"}, "TEXT", "text file (required)"},
                                                 {{"--ctx"}, "N", "window in tokens (default 256)"},
                                                 {{"--batch"}, "N", "tokens per forward pass (default: --ctx)"},
                                                 {{"--json"}, "", "print JSON"}},
                                                {&quality_options(), &model_options()})};
}  // namespace

int cmd_perplexity(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kPerplexityCommand, &args, &rc)) return rc;
  std::string err;
  int64_t n_ctx;
  if (!args.get_int("--ctx", 256, &n_ctx, &err)) return usage_error(err);
  if (n_ctx < 2) return usage_error("--ctx must be at least 2");
  int64_t n_batch;
  if (!args.get_int("--batch", n_ctx, &n_batch, &err)) return usage_error(err);
  if (n_batch < 1 || n_batch > n_ctx) return usage_error("--batch must be between 1 and --ctx");
  if (!args.has("-f")) return usage_error("missing -f TEXT_FILE");

  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  std::vector<int32_t> tokens;
  if (int rc = tokenize_file(model, args.get("-f"), &tokens)) {
    free_model(model);
    return rc;
  }
  const int32_t n = static_cast<int32_t>(tokens.size());
  moelite_context* ctx = nullptr;
  moelite_context_params* cp = moelite_context_params_create();
  if (int rc = quality_params_from_args(args, cp)) {
    moelite_context_params_free(cp);
    free_model(model);
    return rc;
  }
  moelite_status st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(n_ctx));
  if (st == MOELITE_OK) st = moelite_context_params_set_n_batch(cp, static_cast<int32_t>(n_batch));
  if (st == MOELITE_OK) st = moelite_context_create(model, cp, &ctx);
  moelite_context_params_free(cp);

  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  double nll = 0.0;
  int64_t scored = 0, evaluated = 0;
  for (int64_t w0 = 0; st == MOELITE_OK && w0 + 1 < n; w0 += n_ctx) {
    const int32_t len = static_cast<int32_t>(std::min<int64_t>(n_ctx, n - w0));
    if (len < 2) break;
    moelite_context_kv_reset(ctx);
    st = moelite_eval(ctx, tokens.data() + w0, len, 1);
    evaluated += len;
    for (int32_t i = 0; st == MOELITE_OK && i + 1 < len; ++i) {
      const float* logits = moelite_get_logits(ctx, i);
      double mx = logits[0];
      for (int64_t v = 1; v < n_vocab; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
      double sum = 0.0;
      for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(logits[v] - mx);
      nll -= logits[tokens[static_cast<size_t>(w0 + i + 1)]] - mx - std::log(sum);
      ++scored;
    }
  }
  moelite_quality_stats q = {sizeof q};
  if (ctx) (void)moelite_context_quality_stats(ctx, &q);
  if (ctx && !args.has("--json")) print_quality(ctx);
  moelite_context_free(ctx);
  int rc = 0;
  if (st != MOELITE_OK) {
    rc = report(st, "perplexity");
  } else if (scored == 0) {
    rc = usage_error("the text has fewer than two tokens");
  } else {
    const double ppl = std::exp(nll / static_cast<double>(scored));
    // Experts computed per token and MoE layer (top-k in exact mode, fewer under adaptive gating).
    moelite_expert_stats es = {sizeof es};
    moelite_model_expert_stats(model, -1, &es);
    const double experts_per_token = es.routed_tokens ? double(es.routed_experts) / double(es.routed_tokens) : 0.0;
    // Expert reads from storage per evaluated token (budget only): demand loads plus speculative
    // loads started, each one expert read (a speculative load dropped from the queue before its
    // read began counts too; without a predictor there are none).
    const int64_t budget = moelite_model_get(model, MOELITE_MODEL_EXPERT_BUDGET);
    const double loads = double(es.misses + es.prefetches_issued) / double(evaluated);
    char loads_json[64] = "null";
    if (budget > 0) snprintf(loads_json, sizeof loads_json, "%.4f", loads);
    if (args.has("--json"))
      printf("{\"perplexity\": %.6f, \"tokens_scored\": %" PRId64 ", \"n_tokens\": %d, \"ctx\": %" PRId64
             ", \"batch\": %" PRId64 ", \"mean_nll\": %.6f, \"experts_per_token\": %.4f, \"top_k\": %" PRId64
             ", \"gating\": \"%s\", \"threshold\": %s, \"gating_penalty\": %s, \"gating_substitutes\": %s, \"expert_budget_bytes\": %" PRId64
             ", \"loads_per_token\": %s, \"misses_per_token\": %.4f, \"prefetches_per_token\": %.4f, \"quality\": "
             "{\"metered_tokens\": %" PRIu64 ", \"kl_mean\": %.6g, \"kl_stderr\": %.6g, \"top1_agreement\": %.6g, "
             "\"predicted_loss\": %.6g, \"predicted_loss_metered\": %.6g, \"threshold\": %.6g, \"target_kl\": %.6g, "
             "\"meter_seconds\": %.4f}}\n",
             ppl, scored, n, n_ctx, n_batch, nll / static_cast<double>(scored), experts_per_token,
             moelite_model_get(model, MOELITE_MODEL_N_EXPERTS_USED), json_escape(args.get("--gating", "exact")).c_str(),
             args.json_number("--threshold", 0).c_str(), args.json_number("--gating-penalty", 4).c_str(),
             args.json_number("--gating-substitutes", 0).c_str(), budget, loads_json,
             double(es.misses) / double(evaluated), double(es.prefetches_issued) / double(evaluated), q.metered_tokens,
             q.kl_mean, q.kl_stderr, q.top1_agreement, q.predicted_loss, q.predicted_loss_metered, q.threshold,
             q.target_kl, q.meter_seconds);
    else
      printf("perplexity %.4f over %" PRId64 " scored tokens (%d tokens, windows of %" PRId64 "), %.3f experts/token%s\n",
             ppl, scored, n, n_ctx, experts_per_token,
             budget > 0 ? (", " + std::string(loads_json) + " expert loads/token").c_str() : "");
  }
  free_model(model);
  return rc;
}

}  // namespace cli
