// moelite-server's request parser (samples/server/openai.cpp), which reads what any local process
// sends to the server: the input's first byte picks the endpoint (even: chat completions, odd:
// completions), the rest is the request body. A body that is JSON goes through
// parse_completion_request with the shipped model and a 64-token context. It must never throw
// (a field read with the wrong type), and what it accepts must be what the server can run: a
// prompt of 1..n_ctx-1 tokens in the vocabulary, max_tokens in 1..n_ctx, temperature in [0, 2],
// top_p in (0, 1], at most 4 non-empty stop strings without U+0000, logit_bias on tokens of the
// vocabulary with biases in [-100, 100] or -infinity (a ban); what it refuses has a 4xx status and a message.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "samples/server/openai.h"
#include "tests/fuzz/fuzz_common.h"

using namespace moelite_fuzz;

namespace {

constexpr int32_t kContext = 64;

moelite_model* model() {
  static moelite_model* m = load_shipped_model(/*vocab_only=*/true);  // the parser only tokenizes
  return m;
}

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "parse_completion_request: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  quiet_logs();
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) == 0;
  const nlohmann::json body = nlohmann::json::parse(data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;  // the server answers 400 before the parser
  CompletionRequest r;
  RequestError e;
  bool ok = false;
  try {
    ok = parse_completion_request(body, chat, model(), kContext, &r, &e);
  } catch (const std::exception& x) {
    std::fprintf(stderr, "exception: %s\n", x.what());
    broken("threw");
  }
  if (!ok) {
    if (e.http_status < 400 || e.http_status > 499 || e.message.empty())
      broken("a refusal without a 4xx status and a message");
    return 0;
  }
  const int64_t n_vocab = moelite_model_get(model(), MOELITE_MODEL_N_VOCAB);
  if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) >= kContext)
    broken("accepted a prompt outside 1..n_ctx-1");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= n_vocab) broken("a prompt token outside the vocabulary");
  if (r.max_tokens < 1 || r.max_tokens > kContext) broken("accepted max_tokens outside 1..n_ctx");
  if (r.temperature && !(*r.temperature >= 0.0f && *r.temperature <= 2.0f))
    broken("accepted a temperature outside [0, 2]");
  if (r.top_p && !(*r.top_p > 0.0f && *r.top_p <= 1.0f)) broken("accepted top_p outside (0, 1]");
  if (r.stop.size() > 4) broken("accepted more than 4 stop strings");
  for (const std::string& s : r.stop) {
    if (s.empty()) broken("accepted an empty stop string");
    if (s.find('\0') != std::string::npos) broken("accepted a stop string holding U+0000");
  }
  for (const auto& [token, bias] : r.logit_bias) {
    if (token < 0 || token >= n_vocab) broken("accepted a logit_bias token outside the vocabulary");
    if (!(std::isfinite(bias) && bias >= -100.0f && bias <= 100.0f) && bias != -INFINITY)
      broken("accepted a logit_bias outside [-100, 100]");
  }
  return 0;
}
