/* stream.c — stream a completion of a text prompt, piece by piece, then print timing.
 *
 *   stream MODEL.gguf "Once upon a time" [MAX_TOKENS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moelite.h"

static int on_piece(const char* piece, size_t len, void* user_data) {
  size_t* total = (size_t*)user_data;
  fwrite(piece, 1, len, stdout);
  fflush(stdout);
  *total += len;
  return 1; /* 0 would stop generation here */
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL.gguf PROMPT [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  moelite_model* model = NULL;
  moelite_context* ctx = NULL;
  moelite_generate_params* gen = NULL;
  size_t streamed = 0;
  moelite_status st = moelite_model_load(argv[1], NULL, &model);
  if (st == MOELITE_OK) st = moelite_context_create(model, NULL, &ctx);
  if (st == MOELITE_OK) {
    gen = moelite_generate_params_create();
    st = gen ? MOELITE_OK : MOELITE_ERR_OUT_OF_MEMORY;
  }
  if (st == MOELITE_OK) st = moelite_generate_params_set_max_tokens(gen, argc > 3 ? atoi(argv[3]) : 32);
  if (st == MOELITE_OK) st = moelite_generate_params_set_seed(gen, 42);
  if (st == MOELITE_OK) st = moelite_generate_params_set_callback(gen, on_piece, &streamed);

  moelite_generate_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats; /* lets newer libraries know which fields this program has */
  if (st == MOELITE_OK) st = moelite_generate(ctx, argv[2], strlen(argv[2]), gen, &stats);

  if (st == MOELITE_OK) {
    fprintf(stderr, "\n%d prompt tokens at %.1f tok/s, %d generated at %.1f tok/s, %zu bytes streamed\n",
            stats.n_prompt_tokens, stats.prompt_tokens_per_second, stats.n_generated_tokens,
            stats.generated_tokens_per_second, streamed);
  } else {
    fprintf(stderr, "error: %s: %s\n", moelite_status_name(st), moelite_last_error());
  }
  moelite_generate_params_free(gen);
  moelite_context_free(ctx);
  moelite_model_free(model);
  return st == MOELITE_OK ? 0 : 1;
}
