/* A C program built against an installed moelite (tests/install_consumer/run.sh builds it through
 * find_package(moelite) and through pkg-config, shared and static): loads the model, evaluates a
 * tokenized prompt and greedily extends it by a few tokens, checking every status.
 *   consumer MODEL.gguf [auto|cpu|vulkan]
 * Exit 0 when every step succeeded; with "vulkan", exit 3 when the load answers
 * MOELITE_ERR_BACKEND_UNAVAILABLE (the message is printed). */
#include <math.h>
#include <moelite.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    moelite_status st_ = (call);                                                                 \
    if (st_ != MOELITE_OK) {                                                                     \
      fprintf(stderr, "%s: %s: %s\n", #call, moelite_status_name(st_), moelite_last_error()); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

static int run(const char* path, moelite_backend backend) {
  moelite_model_params* mp = moelite_model_params_create();
  if (!mp) return 1;
  moelite_status st = moelite_model_params_set_backend(mp, backend);
  moelite_model* model = NULL;
  if (st == MOELITE_OK) st = moelite_model_load(path, mp, &model);
  moelite_model_params_free(mp);
  if (st == MOELITE_ERR_BACKEND_UNAVAILABLE) {
    printf("backend unavailable: %s\n", moelite_last_error());
    return 3;
  }
  CHECK(st);
  printf("backend: %s\n", moelite_model_backend_name(model));
  moelite_context* ctx = NULL;
  CHECK(moelite_context_create(model, NULL, &ctx));
  int32_t tokens[64];
  int32_t n = 0;
  const char* prompt = "Once upon a time";
  CHECK(moelite_tokenize(model, prompt, strlen(prompt), MOELITE_TOKENIZE_ADD_SPECIAL, tokens, 60, &n));
  if (n <= 0) return 1;
  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  CHECK(moelite_eval(ctx, tokens, n, 0));
  printf("tokens:");
  for (int step = 0; step < 4; ++step) {
    const float* logits = moelite_get_logits(ctx, -1);
    if (!logits) return 1;
    int32_t best = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      if (!isfinite(logits[i])) return 1;
      if (logits[i] > logits[best]) best = (int32_t)i;
    }
    printf(" %d", best);
    CHECK(moelite_eval(ctx, &best, 1, 0));
  }
  printf("\n");
  if (moelite_kv_length(ctx) != n + 4) return 1;
  moelite_context_free(ctx);
  moelite_model_free(model);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf [auto|cpu|vulkan]\n", argv[0]);
    return 2;
  }
  if (moelite_version_number() != MOELITE_VERSION_NUMBER) return 1;
  moelite_model* missing = NULL;
  if (moelite_model_load("/nonexistent.gguf", NULL, &missing) != MOELITE_ERR_FILE_NOT_FOUND) return 1;
  const char* b = argc > 2 ? argv[2] : "auto";
  moelite_backend backend = !strcmp(b, "cpu")      ? MOELITE_BACKEND_CPU
                            : !strcmp(b, "vulkan") ? MOELITE_BACKEND_VULKAN
                                                   : MOELITE_BACKEND_AUTO;
  int rc = run(argv[1], backend);
  if (rc == 0) printf("moelite %s: C consumer ok\n", moelite_version_string());
  return rc;
}
