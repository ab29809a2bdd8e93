// GGUF reader + model load through the C API: the input is written to a file and loaded as a
// vocabulary (vocab_only) and as a full model on the CPU backend (header, metadata, tokenizer,
// chat template, hyperparameter validation, tensor binding, runtime creation). A model that loads
// is then used: a context, one evaluated token, tokenize/detokenize and chat formatting.
#include <cstring>
#include <vector>

#include "tests/fuzz/fuzz_common.h"

using namespace moelite_fuzz;

namespace {

void use_text(moelite_model* m) {
  const char text[] = "Hello, world <|im_end|> \xC3\xA9\xF0\x9F\x98\x80";
  int32_t toks[64];
  int32_t n = 0;
  moelite_status st = moelite_tokenize(m, text, sizeof text - 1,
                                       MOELITE_TOKENIZE_ADD_SPECIAL | MOELITE_TOKENIZE_PARSE_SPECIAL, toks, 64, &n);
  check(st, "tokenize");
  if (st == MOELITE_OK && n > 0) {
    char out[512];
    size_t len = 0;
    check(moelite_detokenize(m, toks, n < 64 ? n : 64, MOELITE_DETOKENIZE_RENDER_SPECIAL, out, sizeof out, &len),
          "detokenize");
  }
  moelite_chat_message msgs[2] = {{"system", "be brief"}, {"user", "hi"}};
  char out[512];
  size_t len = 0;
  check(moelite_chat_format(m, msgs, 2, 1, out, sizeof out, &len), "chat_format");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  quiet_logs();
  static const std::string path = scratch_path("model.gguf");
  if (!write_file(path, data, size)) return 0;
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_backend(p, MOELITE_BACKEND_CPU);
  moelite_model_params_set_threads(p, 1);

  moelite_model* m = nullptr;
  moelite_model_params_set_vocab_only(p, 1);
  moelite_status st = moelite_model_load(path.c_str(), p, &m);
  check(st, "vocab_only load");
  if (st == MOELITE_OK) use_text(m);
  moelite_model_free(m);

  m = nullptr;
  moelite_model_params_set_vocab_only(p, 0);
  st = moelite_model_load(path.c_str(), p, &m);
  check(st, "model load");
  if (st == MOELITE_OK) {
    moelite_context_params* cp = moelite_context_params_create();
    moelite_context_params_set_n_ctx(cp, 8);
    moelite_context* ctx = nullptr;
    st = moelite_context_create(m, cp, &ctx);
    check(st, "context_create");
    if (st == MOELITE_OK) {
      const int32_t n_vocab = static_cast<int32_t>(moelite_model_get(m, MOELITE_MODEL_N_VOCAB));
      const int32_t toks[2] = {0, n_vocab > 1 ? n_vocab - 1 : 0};
      check(moelite_eval(ctx, toks, 2, 1), "eval");
    }
    moelite_context_free(ctx);
    moelite_context_params_free(cp);
    use_text(m);
  }
  moelite_model_free(m);
  moelite_model_params_free(p);
  return 0;
}
