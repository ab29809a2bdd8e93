/* End-to-end use of the public API from a program compiled as C99: loading, queries, evaluation,
 * error codes, state after errors, abort. Expectations come from the API contract in moelite.h
 * and from arithmetic identities (batch evaluation equals token-by-token evaluation), not from
 * earlier outputs of the engine.
 *
 *   test_c_api MODEL.gguf
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moelite.h"

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                       \
  do {                                                                    \
    ++g_checks;                                                           \
    if (!(cond)) {                                                        \
      ++g_failures;                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              moelite_last_error());                                      \
    }                                                                     \
  } while (0)

static int g_abort_after = -1;
static int abort_cb(void *user) {
  int *calls = (int *)user;
  return ++*calls > g_abort_after;
}

static int g_progress_calls = 0;
static float g_last_progress = -1.0f;
static int progress_cb(float p, void *user) {
  (void)user;
  ++g_progress_calls;
  if (p < g_last_progress) ++g_failures; /* progress must not go backwards */
  g_last_progress = p;
  return 1;
}
static int cancel_cb(float p, void *user) {
  (void)p;
  (void)user;
  return 0;
}

static int g_log_lines = 0;
static void log_cb(moelite_log_level level, const char *text, void *user) {
  (void)level;
  (void)user;
  if (text && strlen(text) > 0) ++g_log_lines;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];

  /* Version: header and library agree. */
  CHECK(moelite_version_number() == MOELITE_VERSION_NUMBER);
  CHECK(strlen(moelite_version_string()) >= 5);
  CHECK(strcmp(moelite_status_name(MOELITE_ERR_IO), "MOELITE_ERR_IO") == 0);
  CHECK(strstr(moelite_supported_archs(), "qwen3moe") != NULL);

  /* Errors with specific codes, output untouched. */
  moelite_model *model = (moelite_model *)0x1;
  CHECK(moelite_model_load("/nonexistent/dir/model.gguf", NULL, &model) == MOELITE_ERR_FILE_NOT_FOUND);
  CHECK(model == (moelite_model *)0x1);
  CHECK(strstr(moelite_last_error(), "/nonexistent/dir/model.gguf") != NULL);
  CHECK(moelite_model_load(NULL, NULL, &model) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_load(path, NULL, NULL) == MOELITE_ERR_INVALID_ARGUMENT);

  moelite_model_params *mp = moelite_model_params_create();
  CHECK(mp != NULL);
  CHECK(moelite_model_params_set_threads(mp, -1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_threads(mp, 2) == MOELITE_OK);
  CHECK(moelite_model_params_set_backend(mp, (moelite_backend)77) == MOELITE_ERR_INVALID_ARGUMENT);

  /* A cancelled load fails cleanly. */
  CHECK(moelite_model_params_set_progress_callback(mp, cancel_cb, NULL) == MOELITE_OK);
  CHECK(moelite_model_load(path, mp, &model) == MOELITE_ERR_CANCELLED);
  CHECK(moelite_model_params_set_progress_callback(mp, progress_cb, NULL) == MOELITE_OK);

  moelite_set_log_callback(log_cb, NULL, MOELITE_LOG_INFO);
  model = NULL;
  CHECK(moelite_model_load(path, mp, &model) == MOELITE_OK);
  moelite_set_log_callback(NULL, NULL, MOELITE_LOG_WARN);
  moelite_model_params_free(mp);
  if (!model) {
    fprintf(stderr, "cannot continue without a model\n");
    return 1;
  }
  CHECK(g_progress_calls >= 2 && g_last_progress == 1.0f);
  CHECK(g_log_lines >= 1);

  /* Queries agree with each other. */
  const int64_t n_vocab = moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  const int64_t n_exp = moelite_model_get(model, MOELITE_MODEL_N_EXPERTS);
  const int64_t k = moelite_model_get(model, MOELITE_MODEL_N_EXPERTS_USED);
  CHECK(n_vocab > 0 && n_exp > 0 && k >= 1 && k <= n_exp);
  CHECK(moelite_model_get(model, MOELITE_MODEL_N_LAYERS) > 0);
  CHECK(moelite_model_get(model, MOELITE_MODEL_EXPERT_BYTES) > 0);
  CHECK(moelite_model_get(model, MOELITE_MODEL_DENSE_BYTES) > 0);
  CHECK(moelite_model_get(model, MOELITE_MODEL_N_ACTIVE_PARAMS) < moelite_model_get(model, MOELITE_MODEL_N_PARAMS));
  CHECK(moelite_model_get(model, MOELITE_MODEL_THREADS) == 2);
  CHECK(moelite_model_get(NULL, MOELITE_MODEL_N_VOCAB) == -1);
  CHECK(moelite_model_get(model, (moelite_model_key)9999) == -1);
  CHECK(moelite_model_arch(model) != NULL && strlen(moelite_model_arch(model)) > 0);

  /* Context. */
  moelite_context_params *cp = moelite_context_params_create();
  CHECK(moelite_context_params_set_n_ctx(cp, 16) == MOELITE_OK);
  CHECK(moelite_context_params_set_n_batch(cp, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  moelite_context *ctx = NULL;
  CHECK(moelite_context_create(model, cp, &ctx) == MOELITE_OK);
  CHECK(moelite_context_n_ctx(ctx) == 16);
  CHECK(moelite_get_logits(ctx, -1) == NULL); /* nothing evaluated yet */

  int32_t prompt[6] = {1, 7, 3, 11, 5, 2};
  CHECK(moelite_eval(ctx, prompt, 6, 1) == MOELITE_OK);
  CHECK(moelite_kv_length(ctx) == 6);
  float *batch = (float *)malloc(sizeof(float) * 6 * (size_t)n_vocab);
  for (int i = 0; i < 6; ++i) {
    const float *row = moelite_get_logits(ctx, i);
    CHECK(row != NULL);
    if (row) memcpy(batch + (size_t)i * n_vocab, row, sizeof(float) * (size_t)n_vocab);
  }
  CHECK(moelite_get_logits(ctx, 6) == NULL);
  CHECK(moelite_get_logits(ctx, -1) == moelite_get_logits(ctx, 5));
  int finite = 1;
  for (int64_t i = 0; i < 6 * n_vocab; ++i) finite &= isfinite(batch[i]) ? 1 : 0;
  CHECK(finite);

  /* Token-by-token evaluation reproduces the batch: every row is computed by the same kernels
   * in the same order, so the results are bitwise equal. */
  moelite_kv_reset(ctx);
  CHECK(moelite_kv_length(ctx) == 0);
  int same = 1;
  for (int i = 0; i < 6; ++i) {
    CHECK(moelite_eval(ctx, &prompt[i], 1, 0) == MOELITE_OK);
    const float *row = moelite_get_logits(ctx, -1);
    if (!row || memcmp(row, batch + (size_t)i * n_vocab, sizeof(float) * (size_t)n_vocab) != 0) same = 0;
  }
  CHECK(same);

  /* Bad token and context overflow: rejected, state unchanged. */
  int32_t bad[2] = {1, (int32_t)n_vocab};
  CHECK(moelite_eval(ctx, bad, 2, 0) == MOELITE_ERR_BAD_TOKEN);
  bad[1] = -5;
  CHECK(moelite_eval(ctx, bad, 2, 0) == MOELITE_ERR_BAD_TOKEN);
  CHECK(moelite_kv_length(ctx) == 6);
  int32_t many[11] = {0};
  CHECK(moelite_eval(ctx, many, 11, 0) == MOELITE_ERR_CONTEXT_FULL);
  CHECK(moelite_kv_length(ctx) == 6);
  CHECK(moelite_eval(ctx, many, 0, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_eval(NULL, many, 1, 0) == MOELITE_ERR_INVALID_ARGUMENT);

  /* Truncate back to 3 tokens and re-evaluate token 3: same logits as the first time. */
  moelite_kv_truncate(ctx, 3);
  CHECK(moelite_kv_length(ctx) == 3);
  CHECK(moelite_eval(ctx, &prompt[3], 1, 0) == MOELITE_OK);
  const float *again = moelite_get_logits(ctx, -1);
  CHECK(again && memcmp(again, batch + 3 * (size_t)n_vocab, sizeof(float) * (size_t)n_vocab) == 0);
  moelite_context_free(ctx);

  /* Abort: the callback stops evaluation; the sequence is as before the call. */
  int calls = 0;
  g_abort_after = 1;
  CHECK(moelite_context_params_set_abort_callback(cp, abort_cb, &calls) == MOELITE_OK);
  CHECK(moelite_context_create(model, cp, &ctx) == MOELITE_OK);
  CHECK(moelite_eval(ctx, prompt, 3, 0) == MOELITE_ERR_ABORTED);
  CHECK(moelite_kv_length(ctx) == 0);
  g_abort_after = 1000000;
  CHECK(moelite_eval(ctx, prompt, 6, 0) == MOELITE_OK);
  const float *after = moelite_get_logits(ctx, -1);
  CHECK(after && memcmp(after, batch + 5 * (size_t)n_vocab, sizeof(float) * (size_t)n_vocab) == 0);
  moelite_context_free(ctx);
  moelite_context_params_free(cp);

  /* Unavailable backend: a specific error, not a crash. */
  mp = moelite_model_params_create();
  moelite_model_params_set_backend(mp, MOELITE_BACKEND_CUDA);
  moelite_model *m2 = NULL;
  CHECK(moelite_model_load(path, mp, &m2) == MOELITE_ERR_BACKEND_UNAVAILABLE);
  CHECK(m2 == NULL);
  moelite_model_params_free(mp);

  free(batch);
  moelite_model_free(model);
  moelite_model_free(NULL);
  moelite_context_free(NULL);
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
