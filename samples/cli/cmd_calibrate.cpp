// `moelite calibrate`: measures a model on a corpus and writes the calibration profile that
// adaptive gating (--gating sensitivity), the learned predictors and the per-layer cache
// allocation read (--profile).
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"

namespace cli {

namespace {
constexpr int64_t kDefaultMaxTokens = 100000;

// The progress bar with elapsed time and an estimate of the time left (the calibration reports
// progress in proportion to its work, so the rate is steady).
struct Eta {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

std::string clock_text(double s) {
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

int progress_with_eta(float p, void* user) {
  const Eta* eta = static_cast<const Eta*>(user);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - eta->start).count();
  const int width = 30, filled = static_cast<int>(p * width + 0.5f);
  std::string left = p > 0.002f ? clock_text(elapsed * (1.0 - p) / p) : "?";
  fprintf(stderr, "\r[%.*s%*s] %3d%%  %s elapsed, ETA %s   ", filled, "##############################", width - filled,
          "", static_cast<int>(p * 100 + 0.5f), clock_text(elapsed).c_str(), left.c_str());
  if (p >= 1.0f) fprintf(stderr, "\r%*s\r", width + 50, "");
  fflush(stderr);
  return 1;
}

const Command kCalibrateCommand = {"calibrate", "-m MODEL -f CORPUS -o PROFILE [options]",
                                   "Sensitivities, hit curves and predictors for adaptive gating, prefetch and "
                                   "cache allocation.",
                                   with_groups({{{"-f"}, "CORPUS", "text file to calibrate on (required)"},
                                                {{"-o"}, "PROFILE", "profile to write (required)"},
                                                {{"--ctx"}, "N", "window in tokens (default 256)"},
                                                {{"--max-tokens"}, "N",
                                                 "use at most the first N tokens (default 100000), 0 = all"},
                                                {{"--sensitivity-tokens"}, "N",
                                                 "tokens the sensitivity passes run on (default max(4096, 196608 / "
                                                 "layers)), 0 = all"},
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
  int64_t window, max_tokens, stride, sens_tokens;
  double holdout;
  if (!args.get_int("--ctx", 256, &window, &err) ||
      !args.get_int("--max-tokens", kDefaultMaxTokens, &max_tokens, &err) ||
      !args.get_int("--sensitivity-tokens", -1, &sens_tokens, &err) || !args.get_int("--stride", 1, &stride, &err) ||
      !args.get_double("--holdout", 0.25, &holdout, &err))
    return usage_error(err);
  if (max_tokens < 0) return usage_error("--max-tokens must be >= 0 (0: the whole corpus)");
  if (args.has("--sensitivity-tokens") && sens_tokens < 0)
    return usage_error("--sensitivity-tokens must be >= 0 (0: every window)");

  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model)) return rc;
  std::vector<int32_t> tokens;
  if (int rc = tokenize_file(model, args.get("-f"), &tokens)) {
    free_model(model);
    return rc;
  }
  const size_t corpus_tokens = tokens.size();
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens)
    tokens.resize(static_cast<size_t>(max_tokens));
  const int64_t n_layers = moelite_model_get(model, MOELITE_MODEL_N_LAYERS);
  {
    // Say what the defaults chose: the corpus cut, and the sensitivity sample (whole windows).
    const std::string cut = args.has("--max-tokens") ? "--max-tokens " + std::to_string(max_tokens)
                                                     : "--max-tokens default " + std::to_string(kDefaultMaxTokens);
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int64_t budget =
        sens_tokens >= 0 ? sens_tokens : std::max<int64_t>(4096, 196608 / std::max<int64_t>(1, n_layers));
    const int64_t sampled = budget == 0 || budget >= n ? n : std::min(n, (budget + window - 1) / window * window);
    const std::string why = sens_tokens >= 0 ? "--sensitivity-tokens " + std::to_string(sens_tokens)
                                             : "--sensitivity-tokens default max(4096, 196608 / " +
                                                   std::to_string(n_layers) + " layers)";
    fprintf(stderr, "moelite: calibrating on %zu of %zu tokens (%s%s); sensitivity passes on %" PRId64 " of them (%s)\n",
            tokens.size(), corpus_tokens, cut.c_str(), max_tokens == 0 ? ": all" : "", sampled, why.c_str());
  }

  moelite_calibrate_params* cp = moelite_calibrate_params_create();
  moelite_status st = cp ? MOELITE_OK : MOELITE_ERR_OUT_OF_MEMORY;
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_window(cp, static_cast<int32_t>(window));
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_stride(cp, static_cast<int32_t>(stride));
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_holdout(cp, holdout);
  if (st == MOELITE_OK) st = moelite_calibrate_params_set_sensitivity_tokens(cp, sens_tokens);
  Eta eta;
  if (st == MOELITE_OK && isatty(2)) st = moelite_calibrate_params_set_progress_callback(cp, progress_with_eta, &eta);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out = args.get("-o");
  if (st == MOELITE_OK)
    st = moelite_calibrate(model, tokens.data(), static_cast<int32_t>(tokens.size()), cp, out.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  moelite_calibrate_params_free(cp);
  const int64_t layers = n_layers;
  free_model(model);
  if (st != MOELITE_OK) return report(st, "calibrating");
  if (args.has("--json"))
    printf("{\"profile\": \"%s\", \"tokens\": %zu, \"layers\": %" PRId64 ", \"seconds\": %.3f}\n",
           json_escape(out).c_str(), tokens.size(), layers, seconds);
  else
    printf("wrote %s: %zu tokens, %" PRId64 " layers, %.1f s\n", out.c_str(), tokens.size(), layers, seconds);
  return 0;
}

}  // namespace cli
