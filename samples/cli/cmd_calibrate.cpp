// `moelite calibrate`: measures a model on a corpus and writes the calibration profile that
// adaptive gating (--gating sensitivity), the learned predictors and the per-layer cache
// allocation read (--profile).
#include <unistd.h>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"

namespace cli {

namespace {
const Command kCalibrateCommand = {"calibrate", "-m MODEL -f CORPUS -o PROFILE [options]",
                                   "Sensitivities, hit curves and predictors for adaptive gating, prefetch and "
                                   "cache allocation.",
                                   with_groups({{{"-f"}, "CORPUS", "text file to calibrate on (required)"},
                                                {{"-o"}, "PROFILE", "profile to write (required)"},
                                                {{"--ctx"}, "N", "window in tokens (default 256)"},
                                                {{"--max-tokens"}, "N", "use at most N tokens, 0 = all"},
                                                {{"--stride"}, "S", "predictor training stride (default 1)"},
                                                {{"--holdout"}, "H", "held-out share (default 0.25)"},
                                                {{"--json"}, "", "print JSON"}},
                                               {&model_options()})};
}  // namespace

int cmd_calibrate(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kCalibrateCommand, &args, &rc)) return rc;
  std::string err;
  if (!args.has("-f")) return usage_error("missing -f CORPUS (a text file)");
  if (!args.has("-o")) return usage_error("missing -o PROFILE");
  int64_t window, max_tokens, stride;
  double holdout;
  if (!args.get_int("--ctx", 256, &window, &err) || !args.get_int("--max-tokens", 0, &max_tokens, &err) ||
      !args.get_int("--stride", 1, &stride, &err) || !args.get_double("--holdout", 0.25, &holdout, &err))
    return usage_error(err);
  if (max_tokens < 0) return usage_error("--max-tokens must be >= 0 (0: the whole corpus)");

  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  std::vector<int32_t> tokens;
  if (int rc = tokenize_file(model, args.get("-f"), &tokens)) {
    moelite_model_free(model);
    return rc;
  }
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens)
    tokens.resize(static_cast<size_t>(max_tokens));

  moelite_calibrate_params* cp = moelite_calibrate_params_create();
  moelite_status st = cp ? MOELITE_OK : MOELITE_ERR_OUT_OF_MEMORY;
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_window(cp, static_cast<int32_t>(window));
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_stride(cp, static_cast<int32_t>(stride));
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_holdout(cp, holdout);
  if (st == MOELITE_OK && isatty(2)) st = moelite_calibrate_params_set_progress_callback(cp, progress_bar, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out = args.get("-o");
  if (st == MOELITE_OK)
    st = moelite_calibrate(model, tokens.data(), static_cast<int32_t>(tokens.size()), cp, out.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  moelite_calibrate_params_free(cp);
  const int64_t layers = moelite_model_get(model, MOELITE_MODEL_N_LAYERS);
  moelite_model_free(model);
  if (st != MOELITE_OK) return report(st, "calibrating");
  if (args.has("--json"))
    printf("{\"profile\": \"%s\", \"tokens\": %zu, \"layers\": %" PRId64 ", \"seconds\": %.3f}\n",
           json_escape(out).c_str(), tokens.size(), layers, seconds);
  else
    printf("wrote %s: %zu tokens, %" PRId64 " layers, %.1f s\n", out.c_str(), tokens.size(), layers, seconds);
  return 0;
}

}  // namespace cli
