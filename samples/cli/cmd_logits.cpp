#include <cstdio>
#include <vector>

#include "cli.h"
#include "platforms/platform.h"

namespace cli {

// Evaluates --tokens as one prompt from an empty cache and writes every token's logits.
namespace {
const Command kLogitsCommand = {"logits", "-m MODEL --tokens 1,2,3 --out FILE [options]",
                                "Writes float32 logits, n_tokens x n_vocab, row-major.",
                                with_groups({{{"--tokens"}, "IDS", "comma-separated token ids (required)"},
                                             {{"--out"}, "FILE", "output file (required)"},
                                             {{"-b"}, "N", "batch size (default 512)"},
                                             {{"-c"}, "CTX",
                                              "context length (default: the tokens'; it matters for LongRoPE models, "
                                              "whose rotation depends on it)"}},
                                            {&model_options()})};
}  // namespace

int cmd_logits(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kLogitsCommand, &args, &rc)) return rc;
  std::string err;
  std::vector<int32_t> tokens;
  if (!args.has("--tokens")) return usage_error("missing --tokens 1,2,3");
  if (!parse_tokens(args.get("--tokens"), &tokens, &err)) return usage_error(err);
  std::string out_path = args.get("--out");
  if (out_path.empty()) return usage_error("missing --out FILE");
  int64_t n_batch, n_ctx;
  if (!args.get_int("-b", 512, &n_batch, &err)) return usage_error(err);
  if (!args.get_int("-c", static_cast<int64_t>(tokens.size()), &n_ctx, &err)) return usage_error(err);

  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  int rc = 0;
  moelite_context* ctx = nullptr;
  moelite_context_params* cp = moelite_context_params_create();
  moelite_status st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(n_ctx));
  if (st == MOELITE_OK) st = moelite_context_params_set_n_batch(cp, static_cast<int32_t>(n_batch));
  if (st == MOELITE_OK) st = moelite_context_create(model, cp, &ctx);
  moelite_context_params_free(cp);
  if (st == MOELITE_OK) st = moelite_eval(ctx, tokens.data(), static_cast<int32_t>(tokens.size()), 1);
  if (st != MOELITE_OK) {
    rc = report(st, "evaluating");
  } else {
    // The file the rest of moelite writes by (platform::write_file_atomic): an existing file is
    // replaced only once the new one is whole, and /dev/stdout or a pipe is written into.
    const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
    std::vector<moelite::platform::WritePiece> rows;
    for (size_t i = 0; i < tokens.size(); ++i)
      rows.push_back({moelite_get_logits(ctx, static_cast<int32_t>(i)), static_cast<size_t>(n_vocab) * sizeof(float)});
    if (moelite::platform::write_file_atomic(out_path, rows.data(), rows.size()) != MOELITE_OK) {
      fprintf(stderr, "moelite: error: %s\n", moelite_last_error());
      rc = 1;
    }
  }
  moelite_context_free(ctx);
  free_model(model);
  return rc;
}

}  // namespace cli
