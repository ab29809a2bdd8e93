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

#include "c_check.h"

static int g_abort_after = -1;
static int abort_cb(void* user) {
  int* calls = (int*)user;
  return ++*calls > g_abort_after;
}

static int g_progress_calls = 0;
static float g_last_progress = -1.0f;
static int progress_cb(float p, void* user) {
  (void)user;
  ++g_progress_calls;
  if (p < g_last_progress) ++g_failures; /* progress must not go backwards */
  g_last_progress = p;
  return 1;
}
static int cancel_cb(float p, void* user) {
  (void)p;
  (void)user;
  return 0;
}

typedef struct {
  char text[4096];
  size_t len;
  int pieces;
  int stop_after; /* stop when this many pieces arrived (0: never) */
} capture;

static int capture_cb(const char* piece, size_t len, void* user) {
  capture* c = (capture*)user;
  if (c->len + len < sizeof c->text) {
    memcpy(c->text + c->len, piece, len);
    c->len += len;
  }
  ++c->pieces;
  return c->stop_after == 0 || c->pieces < c->stop_after;
}

static int g_log_lines = 0;
static void log_cb(moelite_log_level level, const char* text, void* user) {
  (void)level;
  (void)user;
  if (text && strlen(text) > 0) ++g_log_lines;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];

  /* Version: header and library agree. */
  CHECK(moelite_version_number() == MOELITE_VERSION_NUMBER);
  CHECK(strlen(moelite_version_string()) >= 5);
  CHECK(strcmp(moelite_status_name(MOELITE_ERR_IO), "MOELITE_ERR_IO") == 0);
  CHECK(strstr(moelite_supported_archs(), "qwen3moe") != NULL);

  /* Errors with specific codes, output untouched. */
  moelite_model* model = (moelite_model*)0x1;
  CHECK(moelite_model_load("/nonexistent/dir/model.gguf", NULL, &model) == MOELITE_ERR_FILE_NOT_FOUND);
  CHECK(model == (moelite_model*)0x1);
  CHECK(strstr(moelite_last_error(), "/nonexistent/dir/model.gguf") != NULL);
  CHECK(moelite_model_load(NULL, NULL, &model) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_load(path, NULL, NULL) == MOELITE_ERR_INVALID_ARGUMENT);

  moelite_model_params* mp = moelite_model_params_create();
  CHECK(mp != NULL);
  CHECK(moelite_model_params_set_threads(mp, -1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_threads(mp, 2) == MOELITE_OK);
  CHECK(moelite_model_params_set_backend(mp, (moelite_backend)77) == MOELITE_ERR_INVALID_ARGUMENT);

  /* A cancelled load fails cleanly. */
  CHECK(moelite_model_params_set_progress_callback(mp, cancel_cb, NULL) == MOELITE_OK);
  CHECK(moelite_model_load(path, mp, &model) == MOELITE_ERR_PROGRESS_ABORTED);
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
  /* The CPU backend computes in host memory: no device bandwidth to measure. */
  double gbs = -1.0;
  if (strncmp(moelite_model_backend_name(model), "cpu", 3) == 0) {
    CHECK(moelite_model_measure_device_bandwidth(model, &gbs) == MOELITE_ERR_NOT_IMPLEMENTED);
    CHECK(gbs == -1.0 && strstr(moelite_last_error(), "DRAM") != NULL);
  }
  CHECK(moelite_model_measure_device_bandwidth(model, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_measure_device_bandwidth(NULL, &gbs) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_get(NULL, MOELITE_MODEL_N_VOCAB) == -1);
  CHECK(moelite_model_get(model, (moelite_model_key)9999) == -1);
  CHECK(moelite_model_arch(model) != NULL && strlen(moelite_model_arch(model)) > 0);

  /* Context. */
  moelite_context_params* cp = moelite_context_params_create();
  CHECK(moelite_context_params_set_n_ctx(cp, 16) == MOELITE_OK);
  CHECK(moelite_context_params_set_n_batch(cp, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  moelite_context* ctx = NULL;
  CHECK(moelite_context_create(model, cp, &ctx) == MOELITE_OK);
  CHECK(moelite_context_n_ctx(ctx) == 16);
  CHECK(moelite_get_logits(ctx, -1) == NULL); /* nothing evaluated yet */

  int32_t prompt[6] = {1, 7, 3, 11, 5, 2};
  CHECK(moelite_eval(ctx, prompt, 6, 1) == MOELITE_OK);
  CHECK(moelite_context_kv_length(ctx) == 6);
  float* batch = (float*)malloc(sizeof(float) * 6 * (size_t)n_vocab);
  for (int i = 0; i < 6; ++i) {
    const float* row = moelite_get_logits(ctx, i);
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
  moelite_context_kv_reset(ctx);
  CHECK(moelite_context_kv_length(ctx) == 0);
  int same = 1;
  for (int i = 0; i < 6; ++i) {
    CHECK(moelite_eval(ctx, &prompt[i], 1, 0) == MOELITE_OK);
    const float* row = moelite_get_logits(ctx, -1);
    if (!row || memcmp(row, batch + (size_t)i * n_vocab, sizeof(float) * (size_t)n_vocab) != 0) same = 0;
  }
  CHECK(same);

  /* Bad token and context overflow: rejected, state unchanged. */
  int32_t bad[2] = {1, (int32_t)n_vocab};
  CHECK(moelite_eval(ctx, bad, 2, 0) == MOELITE_ERR_BAD_TOKEN);
  bad[1] = -5;
  CHECK(moelite_eval(ctx, bad, 2, 0) == MOELITE_ERR_BAD_TOKEN);
  CHECK(moelite_context_kv_length(ctx) == 6);
  int32_t many[11] = {0};
  CHECK(moelite_eval(ctx, many, 11, 0) == MOELITE_ERR_CONTEXT_FULL);
  CHECK(moelite_context_kv_length(ctx) == 6);
  CHECK(moelite_eval(ctx, many, 0, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_eval(NULL, many, 1, 0) == MOELITE_ERR_INVALID_ARGUMENT);

  /* Truncate back to 3 tokens and re-evaluate token 3: same logits as the first time. */
  moelite_context_kv_truncate(ctx, 3);
  CHECK(moelite_context_kv_length(ctx) == 3);
  CHECK(moelite_eval(ctx, &prompt[3], 1, 0) == MOELITE_OK);
  const float* again = moelite_get_logits(ctx, -1);
  CHECK(again && memcmp(again, batch + 3 * (size_t)n_vocab, sizeof(float) * (size_t)n_vocab) == 0);
  moelite_context_free(ctx);

  /* Abort: the callback stops evaluation; the sequence is as before the call. */
  int calls = 0;
  g_abort_after = 1;
  CHECK(moelite_context_params_set_abort_callback(cp, abort_cb, &calls) == MOELITE_OK);
  CHECK(moelite_context_create(model, cp, &ctx) == MOELITE_OK);
  CHECK(moelite_eval(ctx, prompt, 3, 0) == MOELITE_ERR_ABORTED);
  CHECK(moelite_context_kv_length(ctx) == 0);
  g_abort_after = 1000000;
  CHECK(moelite_eval(ctx, prompt, 6, 0) == MOELITE_OK);
  const float* after = moelite_get_logits(ctx, -1);
  CHECK(after && memcmp(after, batch + 5 * (size_t)n_vocab, sizeof(float) * (size_t)n_vocab) == 0);
  moelite_context_free(ctx);
  moelite_context_params_free(cp);

  /* Text: tokenization with the two-call buffer convention, exact detokenization. */
  {
    const char* text = "Hello world, the end.";
    int32_t n = 0;
    CHECK(moelite_tokenize(model, text, strlen(text), 0, NULL, 0, &n) == MOELITE_ERR_BUFFER_TOO_SMALL);
    CHECK(n > 0 && n <= (int32_t)strlen(text));
    int32_t ids[64];
    int32_t n2 = 0;
    CHECK(moelite_tokenize(model, text, strlen(text), 0, ids, 64, &n2) == MOELITE_OK && n2 == n);
    char back[128];
    size_t blen = 0;
    CHECK(moelite_detokenize(model, ids, n2, 0, back, sizeof back, &blen) == MOELITE_OK);
    CHECK(blen == strlen(text) && memcmp(back, text, blen) == 0);
    ids[0] = (int32_t)n_vocab;
    CHECK(moelite_detokenize(model, ids, 1, 0, back, sizeof back, &blen) == MOELITE_ERR_BAD_TOKEN);
    /* Control-token text is one token only when special parsing is asked for. */
    const char* im = "<|im_start|>";
    CHECK(moelite_tokenize(model, im, strlen(im), MOELITE_TOKENIZE_PARSE_SPECIAL, ids, 64, &n2) == MOELITE_OK &&
          n2 == 1);
    CHECK(moelite_token_is_end(model, moelite_token_eos(model)) == 1);
    CHECK(moelite_tokenize(model, im, strlen(im), 0, ids, 64, &n2) == MOELITE_OK && n2 > 1);
    CHECK(strcmp(moelite_chat_template_kind(model), "chatml") == 0);
    moelite_chat_message msgs[2] = {{"system", "S"}, {"user", "U"}};
    char chat[256];
    size_t clen = 0;
    CHECK(moelite_chat_format(model, msgs, 2, 1, chat, sizeof chat, &clen) == MOELITE_OK);
    const char* expect = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n";
    CHECK(clen == strlen(expect) && memcmp(chat, expect, clen) == 0);
  }

  /* Generation: seeded reproducibility, stats, the callback stopping it, prefix reuse. */
  {
    moelite_context* g = NULL;
    CHECK(moelite_context_create(model, NULL, &g) == MOELITE_OK);
    moelite_generate_params* gp = moelite_generate_params_create();
    capture a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    CHECK(moelite_generate_params_set_max_tokens(gp, 12) == MOELITE_OK);
    CHECK(moelite_generate_params_set_seed(gp, 1234) == MOELITE_OK);
    CHECK(moelite_generate_params_set_temperature(gp, -1.0f) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_generate_params_set_callback(gp, capture_cb, &a) == MOELITE_OK);
    moelite_generate_stats st1;
    memset(&st1, 0, sizeof st1);
    st1.struct_size = sizeof st1;
    const char* prompt = "Once upon a time";
    CHECK(moelite_generate(g, prompt, strlen(prompt), gp, &st1) == MOELITE_OK);
    CHECK(st1.n_generated_tokens >= 1 && st1.n_generated_tokens <= 12);
    CHECK(st1.n_prompt_tokens > 0 && st1.n_cached_tokens == 0);
    CHECK(st1.stop_reason == MOELITE_STOP_MAX_TOKENS || st1.stop_reason == MOELITE_STOP_END_TOKEN);
    CHECK(moelite_context_kv_length(g) == st1.n_prompt_tokens + st1.n_generated_tokens - 1 ||
          moelite_context_kv_length(g) == st1.n_prompt_tokens + st1.n_generated_tokens);
    /* Same prompt again: the prompt's tokens come from the cache except the last one. */
    moelite_generate_params_set_callback(gp, capture_cb, &b);
    moelite_generate_stats st2;
    memset(&st2, 0, sizeof st2);
    st2.struct_size = sizeof st2;
    CHECK(moelite_generate(g, prompt, strlen(prompt), gp, &st2) == MOELITE_OK);
    CHECK(st2.n_prompt_tokens == 1 && st2.n_cached_tokens == st1.n_prompt_tokens - 1);
    CHECK(a.len > 0 && a.len == b.len && memcmp(a.text, b.text, a.len) == 0);
    /* The callback asks to stop after its first piece. */
    c.stop_after = 1;
    moelite_generate_params_set_callback(gp, capture_cb, &c);
    st2.struct_size = sizeof st2;
    CHECK(moelite_generate(g, prompt, strlen(prompt), gp, &st2) == MOELITE_OK);
    CHECK(c.pieces == 1 && st2.stop_reason == MOELITE_STOP_ABORTED);
    /* An old caller whose stats struct is shorter gets only what fits. */
    unsigned char small[sizeof(size_t) + 2 * sizeof(int32_t) + 8];
    memset(small, 0xAB, sizeof small);
    moelite_generate_stats* old = (moelite_generate_stats*)(void*)small;
    old->struct_size = sizeof(size_t) + 2 * sizeof(int32_t);
    moelite_generate_params_set_callback(gp, NULL, NULL);
    CHECK(moelite_generate(g, prompt, strlen(prompt), gp, old) == MOELITE_OK);
    CHECK(small[sizeof small - 1] == 0xAB);
    moelite_generate_params_free(gp);
    moelite_context_free(g);
  }

  /* Vocabulary-only loading: tokenizer yes, contexts no. */
  {
    moelite_model_params* vp = moelite_model_params_create();
    moelite_model_params_set_vocab_only(vp, 1);
    moelite_model* vm = NULL;
    CHECK(moelite_model_load(path, vp, &vm) == MOELITE_OK);
    moelite_model_params_free(vp);
    int32_t ids[8], n3 = 0;
    CHECK(moelite_tokenize(vm, "Hi", 2, 0, ids, 8, &n3) == MOELITE_OK && n3 >= 1);
    moelite_context* vc = NULL;
    CHECK(moelite_context_create(vm, NULL, &vc) == MOELITE_ERR_INVALID_ARGUMENT && vc == NULL);
    moelite_model_free(vm);
  }

  /* Budget auto: argument errors, an impossible headroom, the chosen budget and its terms, the
   * last of the two budget setters winning, and logits bitwise equal to the resident model's. */
  CHECK(moelite_model_params_set_expert_budget_auto(NULL, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  mp = moelite_model_params_create();
  moelite_model_params_set_threads(mp, 2);
  CHECK(moelite_model_params_set_expert_budget_auto(mp, MOELITE_MAX_BUDGET_HEADROOM + 1) ==
        MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_expert_budget_auto(mp, UINT64_MAX) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_expert_budget_auto(mp, MOELITE_MAX_BUDGET_HEADROOM) == MOELITE_OK);
  {
    moelite_model* am = NULL;
    CHECK(moelite_model_load(path, mp, &am) == MOELITE_ERR_BUDGET_TOO_SMALL && am == NULL);
    CHECK(strstr(moelite_last_error(), "minimum working set") != NULL);
    CHECK(strstr(moelite_last_error(), "headroom") != NULL);
  }
  CHECK(moelite_model_params_set_expert_budget_auto(mp, 0) == MOELITE_OK);
  {
    moelite_model* am = NULL;
    CHECK(moelite_model_load(path, mp, &am) == MOELITE_OK);
    if (am) {
      const int64_t budget = moelite_model_get(am, MOELITE_MODEL_EXPERT_BUDGET);
      const int64_t room = moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO_ROOM);
      const int64_t headroom = moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO_HEADROOM);
      CHECK(moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO) == 1);
      CHECK(budget > 0 && room > budget);
      CHECK(headroom >= ((int64_t)64 << 20) && headroom >= room / 10 - 1);
      CHECK(moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO_CONTEXT_BYTES) > 0);
      /* A tiny model on any machine that runs the tests: every expert fits. */
      CHECK(moelite_model_get(am, MOELITE_MODEL_EXPERTS_ALL_FIT) == 1);
      CHECK(moelite_model_get(am, MOELITE_MODEL_EXPERT_SLOTS) >=
            moelite_model_get(am, MOELITE_MODEL_N_LAYERS) * moelite_model_get(am, MOELITE_MODEL_N_EXPERTS));
      /* Same logits as the resident model, bit for bit. */
      moelite_context *ra = NULL, *rb = NULL;
      const int32_t toks[4] = {1, 2, 3, 4};
      CHECK(moelite_context_create(model, NULL, &ra) == MOELITE_OK);
      CHECK(moelite_context_create(am, NULL, &rb) == MOELITE_OK);
      if (ra && rb) {
        CHECK(moelite_eval(ra, toks, 4, 1) == MOELITE_OK);
        CHECK(moelite_eval(rb, toks, 4, 1) == MOELITE_OK);
        for (int32_t i = 0; i < 4; ++i) {
          const float *la = moelite_get_logits(ra, i), *lb = moelite_get_logits(rb, i);
          CHECK(la && lb && memcmp(la, lb, (size_t)n_vocab * sizeof(float)) == 0);
        }
      }
      moelite_context_free(ra);
      moelite_context_free(rb);
    }
    moelite_model_free(am);
  }
  /* The minimum working set: loads at exactly that budget, not one byte below. */
  {
    const int64_t minimum = moelite_model_get(model, MOELITE_MODEL_EXPERT_MIN_BUDGET);
    CHECK(minimum > 0);
    moelite_model* am = NULL;
    CHECK(moelite_model_params_set_expert_budget(mp, (uint64_t)minimum - 1) == MOELITE_OK);
    CHECK(moelite_model_load(path, mp, &am) == MOELITE_ERR_BUDGET_TOO_SMALL && am == NULL);
    CHECK(moelite_model_params_set_expert_budget(mp, (uint64_t)minimum) == MOELITE_OK);
    CHECK(moelite_model_load(path, mp, &am) == MOELITE_OK);
    CHECK(moelite_model_get(am, MOELITE_MODEL_EXPERT_MIN_BUDGET) == minimum);
    CHECK(moelite_model_get(am, MOELITE_MODEL_EXPERTS_ALL_FIT) == 0);
    moelite_model_free(am);
  }
  /* A share of the experts: a quarter of the routed experts (rounded up) and the store's reserve
   * slot, the same whether given as a fraction or as the text every tool and binding passes through;
   * "0" is not a way to say "no budget". */
  {
    const int64_t routed = (moelite_model_get(model, MOELITE_MODEL_N_LAYERS) -
                            moelite_model_get(model, MOELITE_MODEL_N_DENSE_LAYERS)) *
                           moelite_model_get(model, MOELITE_MODEL_N_EXPERTS);
    const int64_t want = 1 + (int64_t)ceil(0.25 * (double)routed);
    moelite_model *a = NULL, *b = NULL;
    CHECK(moelite_model_params_set_expert_budget_fraction(mp, 0.25) == MOELITE_OK);
    CHECK(moelite_model_load(path, mp, &a) == MOELITE_OK);
    CHECK(moelite_model_params_set_expert_budget_text(mp, "25%") == MOELITE_OK);
    CHECK(moelite_model_load(path, mp, &b) == MOELITE_OK);
    CHECK(moelite_model_get(a, MOELITE_MODEL_EXPERT_SLOTS) == want);
    CHECK(moelite_model_get(b, MOELITE_MODEL_EXPERT_SLOTS) == want);
    CHECK(moelite_model_get(a, MOELITE_MODEL_EXPERT_BUDGET) == moelite_model_get(b, MOELITE_MODEL_EXPERT_BUDGET));
    moelite_model_free(a);
    moelite_model_free(b);
    CHECK(moelite_model_params_set_expert_budget_text(mp, "100%") == MOELITE_OK);
    CHECK(moelite_model_load(path, mp, &a) == MOELITE_OK);
    CHECK(moelite_model_get(a, MOELITE_MODEL_EXPERTS_ALL_FIT) == 1);
    CHECK(moelite_model_get(a, MOELITE_MODEL_EXPERT_SLOTS) == routed + 1);
    moelite_model_free(a);
    CHECK(moelite_model_params_set_expert_budget_text(mp, "0") == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_model_params_set_expert_budget_text(mp, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_model_params_set_expert_budget_text(NULL, "1G") == MOELITE_ERR_INVALID_ARGUMENT);
    uint64_t bytes = 0;
    CHECK(moelite_parse_size("1.5GiB", &bytes) == MOELITE_OK && bytes == ((uint64_t)3 << 29));
    CHECK(moelite_parse_size("12XB", &bytes) == MOELITE_ERR_INVALID_ARGUMENT);
  }
  /* The last budget setter wins: a fixed budget replaces auto... */
  CHECK(moelite_model_params_set_expert_budget(mp, 1 << 20) == MOELITE_OK);
  {
    moelite_model* am = NULL;
    CHECK(moelite_model_load(path, mp, &am) == MOELITE_OK);
    CHECK(moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO) == 0);
    CHECK(moelite_model_get(am, MOELITE_MODEL_EXPERT_BUDGET) == (1 << 20));
    CHECK(moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO_ROOM) == 0);
    moelite_model_free(am);
  }
  /* ... and auto replaces a fixed budget. */
  CHECK(moelite_model_params_set_expert_budget_auto(mp, (uint64_t)100 << 20) == MOELITE_OK);
  {
    moelite_model* am = NULL;
    CHECK(moelite_model_load(path, mp, &am) == MOELITE_OK);
    CHECK(moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO) == 1);
    CHECK(moelite_model_get(am, MOELITE_MODEL_BUDGET_AUTO_HEADROOM) == ((int64_t)100 << 20));
    CHECK(moelite_model_get(am, MOELITE_MODEL_EXPERT_BUDGET) != (1 << 20));
    moelite_model_free(am);
  }
  moelite_model_params_free(mp);
  CHECK(moelite_model_get(model, MOELITE_MODEL_BUDGET_AUTO) == 0);
  CHECK(moelite_model_get(model, MOELITE_MODEL_EXPERTS_ALL_FIT) == 1); /* resident */

  /* Platform queries. */
  {
    const int64_t total = moelite_platform_get(MOELITE_PLATFORM_MEM_TOTAL_BYTES);
    const int64_t avail = moelite_platform_get(MOELITE_PLATFORM_MEM_AVAILABLE_BYTES);
    CHECK(total > 0 && avail > 0 && avail <= total);
    const int64_t limit = moelite_platform_get(MOELITE_PLATFORM_CGROUP_LIMIT_BYTES);
    CHECK(limit >= 0);
    if (limit > 0) CHECK(avail <= limit);
    const int64_t jetson = moelite_platform_get(MOELITE_PLATFORM_IS_JETSON);
    CHECK(jetson == 0 || jetson == 1);
    CHECK(moelite_platform_get(MOELITE_PLATFORM_UNIFIED_MEMORY) == jetson);
    const int64_t online = moelite_platform_get(MOELITE_PLATFORM_CPUS_ONLINE);
    const int64_t allowed = moelite_platform_get(MOELITE_PLATFORM_CPUS_ALLOWED);
    const int64_t big = moelite_platform_get(MOELITE_PLATFORM_BIG_CORES);
    CHECK(online >= 1 && allowed >= 1 && big >= 0 && big < allowed);
    CHECK(moelite_platform_get(MOELITE_PLATFORM_DEFAULT_THREADS) >= 1);
    const int64_t be = moelite_platform_get(MOELITE_PLATFORM_AUTO_BACKEND);
    CHECK(be >= MOELITE_BACKEND_CPU && be <= MOELITE_BACKEND_CUDA);
    if (moelite_platform_get(MOELITE_PLATFORM_HAS_CUDA) == 0 && moelite_platform_get(MOELITE_PLATFORM_HAS_VULKAN) == 0)
      CHECK(be == MOELITE_BACKEND_CPU);
    CHECK(moelite_platform_get((moelite_platform_field)999) == -1);

    size_t needed = 0;
    CHECK(moelite_platform_describe_json(NULL, 0, &needed) == MOELITE_ERR_BUFFER_TOO_SMALL && needed > 2);
    CHECK(moelite_platform_describe_json(NULL, 16, &needed) == MOELITE_ERR_INVALID_ARGUMENT);
    char small[8];
    memset(small, 'x', sizeof small);
    CHECK(moelite_platform_describe_json(small, sizeof small, NULL) == MOELITE_ERR_BUFFER_TOO_SMALL);
    CHECK(small[0] == 'x' && small[7] == 'x'); /* untouched */
    char* text = (char*)malloc(needed + 4096);
    size_t got = 0;
    CHECK(text && moelite_platform_describe_json(text, needed + 4096, &got) == MOELITE_OK);
    if (text) {
      CHECK(text[0] == '{' && strlen(text) + 1 == got && text[got - 2] == '}');
      CHECK(strstr(text, "\"kind\"") && strstr(text, "\"auto_backend\"") && strstr(text, "\"room\""));
    }
    free(text);
  }

  /* Unavailable backend: a specific error, not a crash. */
  mp = moelite_model_params_create();
  moelite_model_params_set_backend(mp, MOELITE_BACKEND_CUDA);
  moelite_model* m2 = NULL;
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
