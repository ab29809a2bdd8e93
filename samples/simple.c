/* simple.c — the smallest complete moelite program: load a model, evaluate a prompt of token ids,
 * then greedily extend it, printing each chosen token id as it is produced.
 *
 *   simple MODEL.gguf [N_TOKENS]
 */
#include <stdio.h>
#include <stdlib.h>

#include "moelite.h"

static int32_t argmax(const float* v, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = (int32_t)i;
  return best;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf [N_TOKENS]\n", argv[0]);
    return 2;
  }
  int n_new = argc > 2 ? atoi(argv[2]) : 16;

  moelite_model* model = NULL;
  moelite_status st = moelite_model_load(argv[1], NULL, &model); /* NULL: default parameters */
  if (st != MOELITE_OK) {
    fprintf(stderr, "load failed: %s: %s\n", moelite_status_name(st), moelite_last_error());
    return 1;
  }
  moelite_context* ctx = NULL;
  st = moelite_context_create(model, NULL, &ctx);
  if (st != MOELITE_OK) {
    fprintf(stderr, "context failed: %s: %s\n", moelite_status_name(st), moelite_last_error());
    moelite_model_free(model);
    return 1;
  }

  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  int32_t prompt[] = {1, 2, 3, 4};
  st = moelite_eval(ctx, prompt, 4, 0);
  for (int i = 0; i < n_new && st == MOELITE_OK; ++i) {
    int32_t next = argmax(moelite_get_logits(ctx, -1), n_vocab);
    printf("%d%s", next, i + 1 < n_new ? " " : "\n");
    fflush(stdout);
    st = moelite_eval(ctx, &next, 1, 0);
  }
  if (st != MOELITE_OK) fprintf(stderr, "eval failed: %s: %s\n", moelite_status_name(st), moelite_last_error());

  moelite_context_free(ctx);
  moelite_model_free(model);
  return st == MOELITE_OK ? 0 : 1;
}
