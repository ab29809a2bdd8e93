// A C++ program built against an installed moelite (see main.c, its C twin, and run.sh): loads the
// model with the automatic backend, evaluates a tokenized prompt, greedily extends it by a few
// tokens, and checks every status.
//   consumer MODEL.gguf
#include <moelite.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

struct ModelFree {
  void operator()(moelite_model* m) const { moelite_model_free(m); }
};
struct ContextFree {
  void operator()(moelite_context* c) const { moelite_context_free(c); }
};

bool ok(moelite_status st, const char* what) {
  if (st == MOELITE_OK) return true;
  std::fprintf(stderr, "%s: %s: %s\n", what, moelite_status_name(st), moelite_last_error());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  if (moelite_version_number() != MOELITE_VERSION_NUMBER) return 1;
  moelite_model* raw_model = nullptr;
  if (!ok(moelite_model_load(argv[1], nullptr, &raw_model), "moelite_model_load")) return 1;
  std::unique_ptr<moelite_model, ModelFree> model(raw_model);
  std::printf("backend: %s\n", moelite_model_backend_name(model.get()));
  moelite_context* raw_ctx = nullptr;
  if (!ok(moelite_context_create(model.get(), nullptr, &raw_ctx), "moelite_context_create")) return 1;
  std::unique_ptr<moelite_context, ContextFree> ctx(raw_ctx);

  const std::string prompt = "Once upon a time";
  int32_t n = 0;
  std::vector<int32_t> tokens(64);
  if (!ok(moelite_tokenize(model.get(), prompt.data(), prompt.size(), MOELITE_TOKENIZE_ADD_SPECIAL, tokens.data(),
                           static_cast<int32_t>(tokens.size()), &n),
          "moelite_tokenize"))
    return 1;
  tokens.resize(static_cast<size_t>(n));
  if (!ok(moelite_eval(ctx.get(), tokens.data(), n, 0), "moelite_eval")) return 1;
  const int64_t n_vocab = moelite_model_get(model.get(), MOELITE_MODEL_N_VOCAB);
  std::printf("tokens:");
  for (int step = 0; step < 4; ++step) {
    const float* logits = moelite_get_logits(ctx.get(), -1);
    if (!logits || !std::all_of(logits, logits + n_vocab, [](float v) { return std::isfinite(v); })) return 1;
    int32_t best = static_cast<int32_t>(std::max_element(logits, logits + n_vocab) - logits);
    std::printf(" %d", best);
    if (!ok(moelite_eval(ctx.get(), &best, 1, 0), "moelite_eval")) return 1;
  }
  std::printf("\n");
  if (moelite_kv_length(ctx.get()) != n + 4) return 1;
  std::printf("moelite %s: C++ consumer ok\n", moelite_version_string());
  return 0;
}
