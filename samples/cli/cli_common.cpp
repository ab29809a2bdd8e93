#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli.h"

namespace cli {

int tokenize_file(moelite_model* model, const std::string& path, std::vector<int32_t>* out) {
  std::string text;
  if (std::string why; !read_file(path, &text, &why)) return usage_error(why);
  int32_t n = 0;
  moelite_status st = moelite_tokenize(model, text.data(), text.size(), 0, nullptr, 0, &n);
  out->assign(static_cast<size_t>(n), 0);
  if (st == MOELITE_ERR_BUFFER_TOO_SMALL || st == MOELITE_OK)
    st = moelite_tokenize(model, text.data(), text.size(), 0, out->data(), n, &n);
  return st == MOELITE_OK ? 0 : report(st, ("tokenizing " + path).c_str());
}

namespace {
moelite_model* g_traced_model = nullptr;  // the model whose --trace-events timeline is recording
bool g_output_failed = false;             // an output other than stdout could not be written
}  // namespace

int report(moelite_status status, const char* what) {
  fprintf(stderr, "moelite: error: %s: %s: %s\n", what, moelite_status_name(status), moelite_last_error());
  return 1;
}

int usage_error(const std::string& message) {
  fprintf(stderr, "moelite: error: %s (see 'moelite help')\n", message.c_str());
  return 2;
}

int finish_output(int exit_code) {
  if (g_output_failed && exit_code == 0) exit_code = 1;  // said already (free_model)
  const bool failed = fflush(stdout) != 0 || ferror(stdout);
  if (failed && exit_code == 0) {  // a failing command has said what went wrong already
    fprintf(stderr, "moelite: error: writing the output failed: %s\n", strerror(errno ? errno : EIO));
    return 1;
  }
  return exit_code;
}

int progress_bar(float p, void*) {
  const int width = 30, filled = static_cast<int>(p * width + 0.5f);
  fprintf(stderr, "\r[%.*s%*s] %3d%%", filled, "##############################", width - filled, "",
          static_cast<int>(p * 100 + 0.5f));
  if (p >= 1.0f) fprintf(stderr, "\r%*s\r", width + 20, "");
  fflush(stderr);
  return 1;
}

namespace {
void log_to_stderr(moelite_log_level, const char* text, void*) { fprintf(stderr, "moelite: %s\n", text); }
}  // namespace

int load_model(const Args& args, moelite_model** out, bool vocab_only) {
  if (args.has("--verbose")) moelite_set_log_callback(log_to_stderr, nullptr, MOELITE_LOG_INFO);
  std::string path = args.has("-m") ? args.get("-m") : args.get("--model");
  if (path.empty()) return usage_error("missing -m MODEL");
  std::string err;
  int64_t threads = 0;
  if (!args.get_int(args.has("-t") ? "-t" : "--threads", 0, &threads, &err)) return usage_error(err);
  moelite_model_params* p = moelite_model_params_create();
  if (!p) return report(MOELITE_ERR_OUT_OF_MEMORY, "params");
  moelite_status st = moelite_model_params_set_threads(p, static_cast<int32_t>(threads));
  std::string backend = args.get("--backend", "auto");
  moelite_backend kind = MOELITE_BACKEND_AUTO;
  if (backend == "cpu")
    kind = MOELITE_BACKEND_CPU;
  else if (backend == "vulkan")
    kind = MOELITE_BACKEND_VULKAN;
  else if (backend == "cuda")
    kind = MOELITE_BACKEND_CUDA;
  else if (backend != "auto") {
    moelite_model_params_free(p);
    return usage_error("--backend must be auto, cpu, vulkan or cuda");
  }
  if (st == MOELITE_OK) st = moelite_model_params_set_backend(p, kind);
  if (st == MOELITE_OK && args.has("--no-mmap")) st = moelite_model_params_set_use_mmap(p, 0);
  if (st == MOELITE_OK && vocab_only) st = moelite_model_params_set_vocab_only(p, 1);
  if (args.has("--budget-headroom") && args.get("--budget") != "auto") {
    moelite_model_params_free(p);
    return usage_error("--budget-headroom goes with --budget auto");
  }
  // The library parses --budget, so it means the same here as in the server and the bindings.
  if (st == MOELITE_OK && args.has("--budget")) {
    st = moelite_model_params_set_expert_budget_text(p, args.get("--budget").c_str());
    if (st != MOELITE_OK) {
      const std::string why = moelite_last_error();
      moelite_model_params_free(p);
      return usage_error("--budget: " + why);
    }
  }
  if (st == MOELITE_OK && args.has("--budget-headroom")) {
    uint64_t headroom = 0;
    if (!parse_size("--budget-headroom", args.get("--budget-headroom"), &headroom, &err)) {
      moelite_model_params_free(p);
      return usage_error(err);
    }
    st = moelite_model_params_set_expert_budget_auto(p, headroom);
  }
  if (st == MOELITE_OK && args.has("--predictor"))
    st = moelite_model_params_set_predictor(p, args.get("--predictor").c_str());
  int64_t depth = 1, substitutes = 0;
  double threshold = 0.0, penalty = 4.0;
  if (!args.get_int("--predict-depth", 1, &depth, &err) || !args.get_double("--threshold", 0.0, &threshold, &err) ||
      !args.get_double("--gating-penalty", 4.0, &penalty, &err) ||
      !args.get_int("--gating-substitutes", 0, &substitutes, &err, 0, 65536)) {
    moelite_model_params_free(p);
    return usage_error(err);
  }
  if (st == MOELITE_OK && args.has("--predict-depth"))
    st = moelite_model_params_set_predictor_depth(p, static_cast<int32_t>(depth));
  if (st == MOELITE_OK && args.has("--allocation"))
    st = moelite_model_params_set_cache_allocation(p, args.get("--allocation").c_str());
  if (st == MOELITE_OK && args.has("--profile"))
    st = moelite_model_params_set_profile(p, args.get("--profile").c_str());
  if (st == MOELITE_OK && (args.has("--gating") || args.has("--threshold")))
    st = moelite_model_params_set_gating(p, args.get("--gating", "exact").c_str(), static_cast<float>(threshold));
  if (st == MOELITE_OK && args.has("--gating-penalty"))
    st = moelite_model_params_set_gating_penalty(p, static_cast<float>(penalty));
  if (st == MOELITE_OK && args.has("--gating-substitutes"))
    st = moelite_model_params_set_gating_substitutes(p, static_cast<int32_t>(substitutes));
  if (st == MOELITE_OK && args.has("--per-layer") && !args.has("--allocation"))
    st = moelite_model_params_set_cache_allocation(p, "uniform");
  if (st == MOELITE_OK && args.has("--policy"))
    st = moelite_model_params_set_cache_policy(p, args.get("--policy").c_str());
  if (st == MOELITE_OK && args.has("--template"))
    st = moelite_model_params_set_chat_template(p, args.get("--template").c_str());
  if (st == MOELITE_OK && isatty(STDERR_FILENO) && !vocab_only)
    st = moelite_model_params_set_progress_callback(p, progress_bar, nullptr);
  if (st == MOELITE_OK) st = moelite_model_load(path.c_str(), p, out);
  moelite_model_params_free(p);
  if (st != MOELITE_OK) return report(st, ("loading " + path).c_str());
  // The timeline of the whole command; written when the command frees the model (free_model).
  if (args.has("--trace-events") && !vocab_only) {
    st = moelite_model_trace_begin(*out, args.get("--trace-events").c_str());
    if (st != MOELITE_OK) {
      moelite_model_free(*out);
      *out = nullptr;
      return report(st, "--trace-events");
    }
    g_traced_model = *out;
  }
  return 0;
}

int quality_params_from_args(const Args& args, moelite_context_params* cp) {
  std::string err;
  double sample = 0.0;
  if (!args.get_double("--quality-sample", 0.0, &sample, &err)) return usage_error(err);
  if (args.has("--quality-sample") && moelite_context_params_set_quality_meter(cp, sample) != MOELITE_OK)
    return usage_error(std::string("--quality-sample: ") + moelite_last_error());
  if (args.has("--quality-target") &&
      moelite_context_params_set_quality_target(cp, args.get("--quality-target").c_str()) != MOELITE_OK)
    return usage_error(std::string("--quality-target: ") + moelite_last_error());
  return 0;
}

void print_quality(moelite_context* ctx) {
  moelite_quality_stats q = {sizeof q};
  if (moelite_context_quality_stats(ctx, &q) != MOELITE_OK || q.meter_evaluations == 0) return;
  fprintf(stderr,
          "[quality vs exact routing, %" PRIu64 " tokens compared: KL %.4f +- %.4f nats/token, top-1 agreement "
          "%.3f +- %.3f | predicted loss %.4f/token | meter %.0f ms",
          q.metered_tokens, q.kl_mean, q.kl_stderr, q.top1_agreement, q.top1_stderr, q.predicted_loss_metered,
          1000.0 * q.meter_seconds);
  if (q.target_kl > 0) fprintf(stderr, " | target %.4f, threshold now %.3g", q.target_kl, q.threshold);
  fprintf(stderr, "]\n");
}

void free_model(moelite_model* model) {
  if (model && model == g_traced_model) {
    g_traced_model = nullptr;
    if (const moelite_status st = moelite_model_trace_end(model); st != MOELITE_OK) {
      report(st, "--trace-events");
      g_output_failed = true;
    }
  }
  moelite_model_free(model);
}

std::string budget_summary(const moelite_model* model) {
  const int64_t budget = moelite_model_get(model, MOELITE_MODEL_EXPERT_BUDGET);
  const bool all = moelite_model_get(model, MOELITE_MODEL_EXPERTS_ALL_FIT) == 1;
  char buf[512];
  if (budget == 0) return "none: every expert resident (file mapping)";
  if (moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO) != 1) {
    snprintf(buf, sizeof buf, "%.1f MiB%s", budget / 1048576.0, all ? " (every expert fits)" : "");
    return buf;
  }
  const double mib = 1048576.0;
  const int64_t room = moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO_ROOM),
                dense = moelite_model_get(model, MOELITE_MODEL_DENSE_BYTES),
                context = moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO_CONTEXT_BYTES),
                headroom = moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO_HEADROOM);
  snprintf(buf, sizeof buf,
           "auto: %.1f MiB, %s (%.1f MiB available - %.1f dense - %.1f KV cache and scratch - %.1f headroom = %.1f MiB)",
           budget / mib, all ? "every expert resident" : "experts stream", room / mib, dense / mib, context / mib,
           headroom / mib, (room - dense - context - headroom) / mib);
  return buf;
}

bool parse_tokens(const std::string& text, std::vector<int32_t>* out, std::string* error) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    errno = 0;
    long v = strtol(item.c_str(), &end, 10);
    if (item.empty() || errno || *end != '\0' || v < INT32_MIN || v > INT32_MAX) {
      *error = "bad token id '" + item + "' in --tokens";
      return false;
    }
    out->push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return !out->empty();
}

bool read_file(const std::string& path, std::string* out, std::string* why) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) {
    *why = "cannot read '" + path + "': " + strerror(errno);
    return false;
  }
  char buf[65536];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
    if (out->size() + got > kMaxInputFileBytes) {
      fclose(f);
      *why = "'" + path + "' holds more than " + std::to_string(kMaxInputFileBytes >> 20) + " MiB";
      return false;
    }
    out->append(buf, got);
  }
  const bool ok = !ferror(f);
  fclose(f);
  if (!ok) *why = "reading '" + path + "' failed";
  return ok;
}

void open_standard_descriptors() {
  for (int fd = 0; fd < 3; ++fd)
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int got = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);  // the lowest free number: fd
      if (got >= 0 && got != fd) close(got);
    }
}

// Length of the well-formed UTF-8 character at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
static size_t utf8_char_length(const std::string& s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (i + n > s.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// A JSON string body. Generated text need not be valid UTF-8 (byte tokens that form no
// character, or a character cut by max_tokens): each byte that does not start a well-formed
// character becomes U+FFFD, so every line stays valid JSON.
std::string json_escape(const std::string& s) {
  std::string o;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_char_length(s, i);
    if (n == 0) {
      o += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
      ++i;
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
      ++i;
    } else {
      o.append(s, i, n);
      i += n;
    }
  }
  return o;
}

}  // namespace cli
