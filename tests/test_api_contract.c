/* The promises of include/moelite.h that issue 19 added or corrected, each checked from a plain
 * C99 program against the shipped model. Expectations come from the header's text and from
 * independent computations (the argmax of raw logits, counts of tokens, identities between two
 * API paths), never from earlier outputs of the engine.
 *
 *   test_api_contract MODEL.gguf
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moelite.h"

#include "c_check.h"

static const char* g_path;

static moelite_model* load(double budget_fraction) {
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model_params_set_threads(mp, 2);
  if (budget_fraction > 0) moelite_model_params_set_expert_budget_fraction(mp, budget_fraction);
  moelite_model* m = NULL;
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_OK);
  moelite_model_params_free(mp);
  return m;
}

static moelite_context* context(moelite_model* m, int32_t n_ctx) {
  moelite_context_params* cp = moelite_context_params_create();
  if (n_ctx) moelite_context_params_set_n_ctx(cp, n_ctx);
  moelite_context* c = NULL;
  CHECK(moelite_context_create(m, cp, &c) == MOELITE_OK);
  moelite_context_params_free(cp);
  return c;
}

static int32_t tokenize(const moelite_model* m, const char* text, uint32_t flags, int32_t* ids, int32_t cap) {
  int32_t n = 0;
  CHECK(moelite_tokenize(m, text, strlen(text), flags, ids, cap, &n) == MOELITE_OK);
  return n;
}

/* Bans every end-of-generation token, so generation lengths are set by the test alone. */
static void ban_end_tokens(const moelite_model* m, moelite_generate_params* g) {
  const int32_t n_vocab = (int32_t)moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
  for (int32_t t = 0; t < n_vocab; ++t)
    if (moelite_token_attrs(m, t) & MOELITE_TOKEN_ATTR_END) moelite_generate_params_set_logit_bias(g, t, -INFINITY);
}

/* ---- last error: only failing calls change it */
static void test_last_error_is_stable(void) {
  moelite_model* m = NULL;
  CHECK(moelite_model_load("/nonexistent/last-error.gguf", NULL, &m) == MOELITE_ERR_FILE_NOT_FOUND);
  char saved[2048];
  snprintf(saved, sizeof saved, "%s", moelite_last_error());
  CHECK(strstr(saved, "/nonexistent/last-error.gguf") != NULL);
  /* Successful calls whose insides fail and recover: the AUTO backend probes GPUs, a budgeted load
   * tries O_DIRECT, evaluation, generation, tokenizing, freeing. */
  m = load(0.5);
  moelite_context* c = context(m, 64);
  int32_t ids[64];
  const int32_t n = tokenize(m, "Hello world", MOELITE_TOKENIZE_ADD_SPECIAL, ids, 64);
  CHECK(moelite_eval(c, ids, n, 0) == MOELITE_OK);
  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_max_tokens(g, 3);
  CHECK(moelite_generate(c, "Hi", 2, g, NULL) == MOELITE_OK);
  moelite_generate_params_free(g);
  moelite_context_free(c);
  moelite_model_free(m);
  CHECK(strcmp(moelite_last_error(), saved) == 0);
  /* ... and status name and message may be read in either order. */
  const moelite_status st = moelite_model_load("/nonexistent/x.gguf", NULL, &m);
  char line[4096];
  snprintf(line, sizeof line, "%s %s", moelite_status_name(st), moelite_last_error());
  CHECK(strstr(line, "MOELITE_ERR_FILE_NOT_FOUND") && strstr(line, "/nonexistent/x.gguf"));
}

/* ---- lifetimes: a context keeps its model alive */
static void test_free_order(void) {
  moelite_model* m = load(0);
  moelite_context* c = context(m, 32);
  CHECK(moelite_context_model(c) == m && moelite_context_model(NULL) == NULL);
  moelite_model_free(m); /* the application's reference only */
  CHECK(moelite_model_get(moelite_context_model(c), MOELITE_MODEL_N_LAYERS) > 0); /* borrowed, still valid */
  int32_t ids[8] = {1, 2, 3, 4};
  CHECK(moelite_eval(c, ids, 4, 0) == MOELITE_OK);
  CHECK(moelite_get_logits(c, -1) != NULL);
  moelite_context_free(c); /* the model goes with its last context (ASan checks the order) */
}

/* ---- outputs untouched on failure (and the two documented exceptions) */
static void test_outputs_untouched(void) {
  moelite_model* const sentinel = (moelite_model*)0x1;
  moelite_model* m = sentinel;
  CHECK(moelite_model_inspect("/nonexistent/inspect.gguf", &m) == MOELITE_ERR_FILE_NOT_FOUND && m == sentinel);
  m = load(0);
  moelite_model_params* vp = moelite_model_params_create();
  moelite_model_params_set_vocab_only(vp, 1);
  moelite_model* vocab = NULL;
  CHECK(moelite_model_load(g_path, vp, &vocab) == MOELITE_OK);
  moelite_model_params_free(vp);
  moelite_context* c = (moelite_context*)0x2;
  CHECK(moelite_context_create(vocab, NULL, &c) == MOELITE_ERR_INVALID_ARGUMENT && c == (moelite_context*)0x2);

  int32_t ids[4] = {-7, -7, -7, -7}, n = -9;
  CHECK(moelite_tokenize(m, "Hello there world", 17, 0, ids, 1, &n) == MOELITE_ERR_BUFFER_TOO_SMALL);
  CHECK(n > 1 && ids[1] == -7); /* the size needed is written (documented), the rest untouched */

  char buf[8] = "XXXXXXX";
  size_t len = 12345;
  CHECK(moelite_model_meta_value(m, "no.such.key", buf, sizeof buf, &len) == MOELITE_ERR_MISSING_METADATA);
  CHECK(len == 12345 && strcmp(buf, "XXXXXXX") == 0);
  CHECK(moelite_model_meta_value(m, "general.architecture", buf, 3, &len) == MOELITE_ERR_BUFFER_TOO_SMALL);
  CHECK(len == strlen(moelite_model_arch(m)) && strcmp(buf, "XXXXXXX") == 0);

  moelite_expert_stats es;
  memset(&es, 0x5a, sizeof es);
  es.struct_size = sizeof es;
  CHECK(moelite_model_expert_stats(m, 9999, &es) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(es.activations == 0x5a5a5a5a5a5a5a5aull);

  moelite_sampler* s = NULL;
  moelite_generate_params* g = moelite_generate_params_create();
  const float banned[3] = {-INFINITY, -INFINITY, -INFINITY};
  CHECK(moelite_sampler_create(g, &s) == MOELITE_OK);
  int32_t tok = 77;
  CHECK(moelite_sampler_sample_logits(s, banned, 3, &tok) == MOELITE_ERR_INVALID_ARGUMENT && tok == 77);
  moelite_sampler_free(s);

  /* Setters: a value out of range leaves the object as it was (generation still greedy). */
  CHECK(moelite_generate_params_set_temperature(g, -1.0f) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_temperature(g, NAN) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_top_p(g, 0.0f) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_top_p(g, 1.5f) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_min_p(g, -0.1f) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_top_k(g, -1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_max_tokens(g, -1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_repeat_penalty(g, 0.0f, 64) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_repeat_penalty(g, INFINITY, 64) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_repeat_penalty(g, 1.1f, -2) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_logit_bias(g, -1, 1.0f) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_logit_bias(g, 3, INFINITY) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_logit_bias(g, 3, NAN) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_add_stop(g, "") == MOELITE_ERR_INVALID_ARGUMENT);
  moelite_model_params* mp = moelite_model_params_create();
  CHECK(moelite_model_params_set_expert_budget_fraction(mp, 0.0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_expert_budget_fraction(mp, 1.5) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_expert_budget_fraction(mp, NAN) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_chat_template(mp, "{{ no known markers }}") == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_cache_policy(mp, "nonsense") == MOELITE_ERR_INVALID_ARGUMENT);
  moelite_model_params_free(mp);
  moelite_generate_params_free(g);
  moelite_model_free(vocab);
  moelite_model_free(m);
}

/* ---- inspection: the facts of a load without loading */
static void test_inspect(void) {
  moelite_model* full = load(0);
  moelite_model* info = NULL;
  CHECK(moelite_model_inspect(g_path, &info) == MOELITE_OK);
  if (!info) return;
  const moelite_model_key same[] = {MOELITE_MODEL_N_LAYERS,      MOELITE_MODEL_N_EXPERTS,   MOELITE_MODEL_N_EXPERTS_USED,
                                    MOELITE_MODEL_N_VOCAB,       MOELITE_MODEL_N_EMBD,      MOELITE_MODEL_EXPERT_BYTES,
                                    MOELITE_MODEL_DENSE_BYTES,   MOELITE_MODEL_N_PARAMS,    MOELITE_MODEL_ACTIVE_BYTES,
                                    MOELITE_MODEL_EXPERT_MIN_BUDGET};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; ++i)
    CHECK(moelite_model_get(info, same[i]) == moelite_model_get(full, same[i]));
  CHECK(moelite_model_get(info, MOELITE_MODEL_EXPERT_MIN_BUDGET) > 0);
  CHECK(moelite_model_get(info, MOELITE_MODEL_THREADS) == 0);
  CHECK(strcmp(moelite_model_arch(info), moelite_model_arch(full)) == 0);
  CHECK(strcmp(moelite_chat_template_kind(info), moelite_chat_template_kind(full)) == 0);
  moelite_context* c = NULL;
  CHECK(moelite_context_create(info, NULL, &c) == MOELITE_ERR_INVALID_ARGUMENT && c == NULL);
  int32_t ids[16];
  CHECK(tokenize(info, "Hello", 0, ids, 16) > 0);

  /* The minimum it reports is the minimum a budgeted load accepts. */
  const int64_t min_budget = moelite_model_get(info, MOELITE_MODEL_EXPERT_MIN_BUDGET);
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model* m = NULL;
  moelite_model_params_set_expert_budget(mp, (uint64_t)min_budget - 1);
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_ERR_BUDGET_TOO_SMALL && m == NULL);
  moelite_model_params_set_expert_budget(mp, (uint64_t)min_budget);
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_OK);
  moelite_model_free(m);
  moelite_model_params_free(mp);
  moelite_model_free(info);
  moelite_model_free(full);
}

/* ---- budget as a fraction: the budget is the share of the expert bytes, results unchanged */
static void test_budget_fraction(void) {
  moelite_model* resident = load(0);
  moelite_model* half = load(0.5);
  const int64_t expert_bytes = moelite_model_get(resident, MOELITE_MODEL_EXPERT_BYTES);
  /* Half of what every expert takes: the expert bytes plus at most a slot's alignment each and
   * one reserve slot. */
  const int64_t budget = moelite_model_get(half, MOELITE_MODEL_EXPERT_BUDGET);
  const int64_t n_experts = moelite_model_get(resident, MOELITE_MODEL_N_EXPERTS) * moelite_model_get(resident, MOELITE_MODEL_N_LAYERS);
  const int64_t slot = moelite_model_get(half, MOELITE_MODEL_EXPERT_POOL_BYTES) / moelite_model_get(half, MOELITE_MODEL_EXPERT_SLOTS);
  CHECK(budget >= expert_bytes / 2 && budget <= (expert_bytes + (n_experts + 1) * slot) / 2 + 1);
  CHECK(moelite_model_get(half, MOELITE_MODEL_EXPERTS_ALL_FIT) == 0);
  moelite_context *a = context(resident, 64), *b = context(half, 64);
  int32_t ids[64];
  const int32_t n = tokenize(resident, "The quick brown fox jumps over the lazy dog", MOELITE_TOKENIZE_ADD_SPECIAL, ids, 64);
  CHECK(moelite_eval(a, ids, n, 0) == MOELITE_OK && moelite_eval(b, ids, n, 0) == MOELITE_OK);
  const int64_t n_vocab = moelite_model_get(resident, MOELITE_MODEL_N_VOCAB);
  CHECK(memcmp(moelite_get_logits(a, -1), moelite_get_logits(b, -1), sizeof(float) * (size_t)n_vocab) == 0);
  moelite_context_free(a);
  moelite_context_free(b);
  moelite_model_free(half);
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model* m = NULL;
  CHECK(moelite_model_params_set_expert_budget_fraction(mp, 1e-9) == MOELITE_OK);
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_ERR_BUDGET_TOO_SMALL);
  CHECK(moelite_model_params_set_expert_budget_fraction(mp, 1.0) == MOELITE_OK);
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_OK);
  CHECK(moelite_model_get(m, MOELITE_MODEL_EXPERTS_ALL_FIT) == 1);
  moelite_model_free(m);
  moelite_model_params_free(mp);
  moelite_model_free(resident);
}

/* ---- metadata and token attributes */
static void test_metadata_and_tokens(void) {
  moelite_model* m = load(0);
  const int32_t count = moelite_model_meta_count(m);
  CHECK(count > 5);
  CHECK(moelite_model_meta_key(m, count) == NULL && moelite_model_meta_key(m, -1) == NULL);
  int found_arch = 0;
  for (int32_t i = 0; i < count; ++i) found_arch |= strcmp(moelite_model_meta_key(m, i), "general.architecture") == 0;
  CHECK(found_arch);
  char buf[256];
  size_t len = 0;
  CHECK(moelite_model_meta_value(m, "general.architecture", buf, sizeof buf, &len) == MOELITE_OK);
  CHECK(strcmp(buf, moelite_model_arch(m)) == 0 && len == strlen(buf));
  char key[128];
  snprintf(key, sizeof key, "%s.block_count", moelite_model_arch(m));
  CHECK(moelite_model_meta_value(m, key, buf, sizeof buf, &len) == MOELITE_OK);
  CHECK(atoll(buf) == moelite_model_get(m, MOELITE_MODEL_N_LAYERS));
  /* Size query, then the token list as a JSON array whose first entry is token 0's text. */
  CHECK(moelite_model_meta_value(m, "tokenizer.ggml.tokens", NULL, 0, &len) == MOELITE_ERR_BUFFER_TOO_SMALL);
  char* tokens = malloc(len + 1);
  CHECK(moelite_model_meta_value(m, "tokenizer.ggml.tokens", tokens, len + 1, &len) == MOELITE_OK);
  CHECK(tokens[0] == '[' && tokens[len - 1] == ']' && strlen(tokens) == len);
  free(tokens);

  const int32_t n_vocab = (int32_t)moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
  int agree = 1, n_control = 0;
  for (int32_t t = 0; t < n_vocab; ++t) {
    const uint32_t a = moelite_token_attrs(m, t);
    agree &= ((a & MOELITE_TOKEN_ATTR_END) != 0) == (moelite_token_is_end(m, t) != 0);
    agree &= moelite_token_text(m, t) != NULL;
    n_control += (a & MOELITE_TOKEN_ATTR_CONTROL) != 0;
  }
  CHECK(agree && n_control > 0);
  CHECK(moelite_token_attrs(m, n_vocab) == 0 && moelite_token_attrs(m, -1) == 0 && moelite_token_text(m, n_vocab) == NULL);
  const int32_t eos = moelite_token_eos(m);
  if (eos >= 0) CHECK(moelite_token_attrs(m, eos) & MOELITE_TOKEN_ATTR_END);
  /* <|im_end|> of the shipped ChatML model: one control token, spelled as stored. */
  int32_t ids[8];
  if (tokenize(m, "<|im_end|>", MOELITE_TOKENIZE_PARSE_SPECIAL, ids, 8) == 1) {
    CHECK(strcmp(moelite_token_text(m, ids[0]), "<|im_end|>") == 0);
    CHECK(moelite_token_attrs(m, ids[0]) & MOELITE_TOKEN_ATTR_CONTROL);
  }
  moelite_model_free(m);
}

/* ---- context: tokens held, per-context stats, abort callback after creation */
static int g_abort_calls = 0;
static int abort_always(void* user) {
  (void)user;
  ++g_abort_calls;
  return 1;
}

static void test_context_queries(void) {
  moelite_model* m = load(0.25);
  moelite_context *a = context(m, 128), *b = context(m, 128);
  int32_t ids[128], held[128], n_held = 0;
  const int32_t n = tokenize(m, "Functions are objects in Python", MOELITE_TOKENIZE_ADD_SPECIAL, ids, 128);
  moelite_model_reset_expert_stats(m);
  CHECK(moelite_eval(a, ids, n, 0) == MOELITE_OK);
  CHECK(moelite_eval(b, ids, 3, 0) == MOELITE_OK);
  CHECK(moelite_eval(a, ids, 2, 0) == MOELITE_OK);
  /* A failed evaluation leaves the previous logits readable (and unchanged). */
  const int64_t n_vocab = moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
  float* last = malloc(sizeof(float) * (size_t)n_vocab);
  memcpy(last, moelite_get_logits(a, -1), sizeof(float) * (size_t)n_vocab);
  int32_t bad = (int32_t)n_vocab;
  CHECK(moelite_eval(a, &bad, 1, 0) == MOELITE_ERR_BAD_TOKEN);
  CHECK(moelite_get_logits(a, -1) && memcmp(moelite_get_logits(a, -1), last, sizeof(float) * (size_t)n_vocab) == 0);
  free(last);
  CHECK(moelite_context_get_tokens(a, held, 128, &n_held) == MOELITE_OK && n_held == n + 2);
  CHECK(memcmp(held, ids, (size_t)n * sizeof *ids) == 0 && held[n] == ids[0] && held[n + 1] == ids[1]);
  int32_t small[2] = {-3, -3};
  CHECK(moelite_context_get_tokens(a, small, 2, &n_held) == MOELITE_ERR_BUFFER_TOO_SMALL && n_held == n + 2);
  CHECK(small[0] == -3);

  moelite_expert_stats sa, sb, sm;
  memset(&sa, 0, sizeof sa);
  sa.struct_size = sb.struct_size = sm.struct_size = sizeof sa;
  CHECK(moelite_context_expert_stats(a, -1, &sa) == MOELITE_OK);
  CHECK(moelite_context_expert_stats(b, -1, &sb) == MOELITE_OK);
  CHECK(moelite_model_expert_stats(m, -1, &sm) == MOELITE_OK);
  CHECK(sa.activations > 0 && sb.activations > 0);
  CHECK(sa.activations + sb.activations == sm.activations); /* one after the other: nothing lost */
  CHECK(sa.hits + sa.misses == sa.activations && sb.hits + sb.misses == sb.activations);
  const int64_t layers = moelite_model_get(m, MOELITE_MODEL_N_LAYERS), k = moelite_model_get(m, MOELITE_MODEL_N_EXPERTS_USED);
  CHECK(sa.routed_tokens == (uint64_t)((n + 2) * layers) && sa.routed_experts == sa.routed_tokens * (uint64_t)k);
  uint64_t per_layer = 0;
  for (int32_t l = 0; l < layers; ++l) {
    moelite_expert_stats s;
    s.struct_size = sizeof s;
    CHECK(moelite_context_expert_stats(a, l, &s) == MOELITE_OK);
    per_layer += s.activations;
  }
  CHECK(per_layer == sa.activations);
  CHECK(moelite_context_expert_stats(a, (int32_t)layers, &sa) == MOELITE_ERR_INVALID_ARGUMENT);
  moelite_context_reset_expert_stats(a);
  CHECK(moelite_context_expert_stats(a, -1, &sa) == MOELITE_OK && sa.activations == 0 && sa.routed_tokens == 0);

  /* The abort callback, set after creation: the evaluation stops, the sequence is unchanged. */
  const int32_t before = moelite_context_kv_length(a);
  CHECK(moelite_context_set_abort_callback(a, abort_always, NULL) == MOELITE_OK);
  CHECK(moelite_eval(a, ids, 2, 0) == MOELITE_ERR_ABORTED && g_abort_calls > 0);
  CHECK(moelite_context_kv_length(a) == before);
  CHECK(moelite_context_set_abort_callback(a, NULL, NULL) == MOELITE_OK);
  CHECK(moelite_eval(a, ids, 2, 0) == MOELITE_OK && moelite_context_kv_length(a) == before + 2);
  moelite_context_free(a);
  moelite_context_free(b);
  moelite_model_free(m);
}

/* ---- sampling: a sampler loop draws what generate draws */
typedef struct {
  int32_t ids[512];
  int n;
  char text[8192];
  size_t len;
  int final_calls;
} token_log;

static int log_token(int32_t token, const char* text, size_t len, void* user) {
  token_log* l = (token_log*)user;
  if (token < 0) {
    ++l->final_calls;
  } else if (l->n < 512) {
    l->ids[l->n++] = token;
  }
  if (l->len + len < sizeof l->text) {
    memcpy(l->text + l->len, text, len);
    l->len += len;
  }
  return 1;
}

typedef struct {
  char text[8192];
  size_t len;
} text_log;
static int log_piece(const char* piece, size_t len, void* user) {
  text_log* l = (text_log*)user;
  if (l->len + len < sizeof l->text) {
    memcpy(l->text + l->len, piece, len);
    l->len += len;
  }
  return 1;
}

static void test_sampler_matches_generate(void) {
  moelite_model* m = load(0);
  moelite_context* c = context(m, 256);
  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_temperature(g, 0.9f);
  moelite_generate_params_set_top_k(g, 20);
  moelite_generate_params_set_repeat_penalty(g, 1.1f, 32);
  moelite_generate_params_set_seed(g, 1234);
  moelite_generate_params_set_max_tokens(g, 24);
  ban_end_tokens(m, g);
  static token_log tl;
  static text_log pl;
  memset(&tl, 0, sizeof tl);
  memset(&pl, 0, sizeof pl);
  moelite_generate_params_set_token_callback(g, log_token, &tl);
  moelite_generate_params_set_callback(g, log_piece, &pl);
  int32_t prompt[64];
  const int32_t n = tokenize(m, "The module", MOELITE_TOKENIZE_ADD_SPECIAL, prompt, 64);
  moelite_generate_stats st;
  st.struct_size = sizeof st;
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_OK);
  CHECK(st.n_generated_tokens == 24 && tl.n == 24 && st.stop_reason == MOELITE_STOP_MAX_TOKENS);
  /* The token callback's texts are the piece callback's stream, byte for byte. */
  CHECK(tl.len == pl.len && memcmp(tl.text, pl.text, tl.len) == 0);
  CHECK(moelite_get_logits(c, -1) != NULL); /* those of generation's last evaluation */
  /* The cache holds the prompt and the generated tokens but the last (sampled, not evaluated). */
  int32_t held[256], n_held = 0;
  CHECK(moelite_context_get_tokens(c, held, 256, &n_held) == MOELITE_OK && n_held == n + 23);
  CHECK(memcmp(held + n, tl.ids, 23 * sizeof(int32_t)) == 0);

  moelite_context_kv_reset(c);
  moelite_sampler* s = NULL;
  CHECK(moelite_sampler_create(g, &s) == MOELITE_OK);
  CHECK(moelite_sampler_accept(s, prompt, n) == MOELITE_OK);
  CHECK(moelite_eval(c, prompt, n, 0) == MOELITE_OK);
  int same = 1;
  for (int i = 0; i < 24; ++i) {
    int32_t t = -1;
    CHECK(moelite_sampler_sample(s, c, -1, &t) == MOELITE_OK);
    same &= t == tl.ids[i];
    if (i + 1 < 24) CHECK(moelite_eval(c, &t, 1, 0) == MOELITE_OK);
  }
  CHECK(same);
  /* After a reset the sampler draws the same again from the same logits. */
  moelite_sampler_reset(s);
  moelite_sampler_free(s);
  moelite_generate_params_free(g);
  moelite_context_free(c);
  moelite_model_free(m);
}

/* ---- logit bias and the logits callback, against the raw logits */
typedef struct {
  int32_t allowed[4];
  int n_allowed;
  int calls;
  int32_t last_history;
  int stop_at;
} mask_state;

static int mask_logits(float* logits, int32_t n_vocab, const int32_t* history, int32_t n_history, void* user) {
  mask_state* s = (mask_state*)user;
  ++s->calls;
  s->last_history = n_history;
  (void)history;
  for (int32_t t = 0; t < n_vocab; ++t) {
    int ok = 0;
    for (int i = 0; i < s->n_allowed; ++i) ok |= t == s->allowed[i];
    if (!ok) logits[t] = -INFINITY;
  }
  return s->stop_at == 0 || s->calls < s->stop_at;
}

static int32_t argmax_except(const float* l, int32_t n, int32_t skip) {
  int32_t best = -1;
  for (int32_t t = 0; t < n; ++t)
    if (t != skip && (best < 0 || l[t] > l[best])) best = t;
  return best;
}

static void test_bias_and_logits_callback(void) {
  moelite_model* m = load(0);
  const int32_t n_vocab = (int32_t)moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
  moelite_context* c = context(m, 256);
  int32_t prompt[64];
  const int32_t n = tokenize(m, "Lists are", MOELITE_TOKENIZE_ADD_SPECIAL, prompt, 64);
  CHECK(moelite_eval(c, prompt, n, 0) == MOELITE_OK);
  float* raw = malloc(sizeof(float) * (size_t)n_vocab);
  memcpy(raw, moelite_get_logits(c, -1), sizeof(float) * (size_t)n_vocab);
  const int32_t first = argmax_except(raw, n_vocab, -1), second = argmax_except(raw, n_vocab, first);

  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_temperature(g, 0.0f);
  moelite_generate_params_set_max_tokens(g, 1);
  static token_log tl;
  memset(&tl, 0, sizeof tl);
  moelite_generate_params_set_token_callback(g, log_token, &tl);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  if (!moelite_token_is_end(m, first)) CHECK(tl.n == 1 && tl.ids[0] == first);
  moelite_generate_params_set_logit_bias(g, first, -INFINITY);
  memset(&tl, 0, sizeof tl);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  if (!moelite_token_is_end(m, second)) CHECK(tl.n == 1 && tl.ids[0] == second);
  /* A positive bias lifts a chosen token to the top. */
  const int32_t lifted = argmax_except(raw, n_vocab, first) == 5 ? 6 : 5;
  moelite_generate_params_clear_logit_bias(g);
  moelite_generate_params_set_logit_bias(g, lifted, raw[first] - raw[lifted] + 1.0f);
  memset(&tl, 0, sizeof tl);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  if (!moelite_token_is_end(m, lifted)) CHECK(tl.n == 1 && tl.ids[0] == lifted);
  /* Bias 0 removes it again. */
  moelite_generate_params_set_logit_bias(g, lifted, 0.0f);
  memset(&tl, 0, sizeof tl);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  if (!moelite_token_is_end(m, first)) CHECK(tl.n == 1 && tl.ids[0] == first);

  /* The logits callback masks all but a few tokens; sampling with a temperature stays inside. */
  mask_state ms = {{11, 42, 97, 300}, 4, 0, 0, 0};
  moelite_generate_params_set_temperature(g, 1.5f);
  moelite_generate_params_set_top_k(g, 0);
  moelite_generate_params_set_min_p(g, 0.0f);
  moelite_generate_params_set_max_tokens(g, 12);
  moelite_generate_params_set_logits_callback(g, mask_logits, &ms);
  memset(&tl, 0, sizeof tl);
  moelite_generate_stats st;
  st.struct_size = sizeof st;
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_OK);
  int inside = tl.n == 12;
  for (int i = 0; i < tl.n; ++i) inside &= tl.ids[i] == 11 || tl.ids[i] == 42 || tl.ids[i] == 97 || tl.ids[i] == 300;
  CHECK(inside && ms.calls == 12 && ms.last_history == n + 11);
  /* Returning 0 stops generation (OK, stop reason ABORTED). */
  ms.calls = 0;
  ms.stop_at = 3;
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_OK);
  CHECK(st.stop_reason == MOELITE_STOP_ABORTED && st.n_generated_tokens == 2);
  /* Everything masked: no token to draw, an error with the stats filled. */
  ms.n_allowed = 0;
  ms.stop_at = 0;
  st.n_prompt_tokens = -1;
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(st.stop_reason == MOELITE_STOP_ERROR && st.n_generated_tokens == 0 && st.n_prompt_tokens >= 0);
  free(raw);
  moelite_generate_params_free(g);
  moelite_context_free(c);
  moelite_model_free(m);
}

/* ---- generation's end states: a full context, an abort, bad ids, parse_special */
static int g_abort_after_polls = 0;
static int abort_later(void* user) {
  int* polls = (int*)user;
  return ++*polls > g_abort_after_polls;
}

static void test_generation_end_states(void) {
  moelite_model* m = load(0);
  const int32_t layers = (int32_t)moelite_model_get(m, MOELITE_MODEL_N_LAYERS);
  int32_t prompt[64];
  const int32_t n = tokenize(m, "A dictionary", MOELITE_TOKENIZE_ADD_SPECIAL, prompt, 64);
  moelite_context* c = context(m, n + 3);
  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_max_tokens(g, 50);
  ban_end_tokens(m, g);
  moelite_generate_stats st;
  st.struct_size = sizeof st;
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_ERR_CONTEXT_FULL);
  CHECK(st.stop_reason == MOELITE_STOP_CONTEXT_FULL && st.n_generated_tokens == 4);
  CHECK(moelite_context_kv_length(c) == n + 3);
  moelite_context_free(c);

  /* Abort during the third generated token's evaluation: the cache keeps the prompt and the two
   * generated tokens evaluated before; the stats say three were generated. Polls: one per layer. */
  c = context(m, 256);
  int polls = 0;
  g_abort_after_polls = layers * 3 + layers / 2; /* the prompt (one batch) + 2 tokens, then mid-token */
  moelite_context_set_abort_callback(c, abort_later, &polls);
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_ERR_ABORTED);
  CHECK(st.stop_reason == MOELITE_STOP_ERROR && st.n_generated_tokens == 3 && st.n_prompt_tokens == n);
  CHECK(moelite_context_kv_length(c) == n + 2);
  moelite_context_set_abort_callback(c, NULL, NULL);

  int32_t bad[2] = {prompt[0], (int32_t)moelite_model_get(m, MOELITE_MODEL_N_VOCAB)};
  const int32_t len_before = moelite_context_kv_length(c);
  CHECK(moelite_generate_tokens(c, bad, 2, g, &st) == MOELITE_ERR_BAD_TOKEN);
  CHECK(moelite_context_kv_length(c) == len_before && st.stop_reason == MOELITE_STOP_ERROR);
  CHECK(moelite_generate_tokens(c, prompt, 0, g, &st) == MOELITE_ERR_INVALID_ARGUMENT);

  /* parse_special: the same text is one control token, or the characters that spell it. */
  moelite_generate_params_set_max_tokens(g, 0);
  moelite_context_kv_reset(c);
  CHECK(moelite_generate(c, "<|im_start|>", 12, g, &st) == MOELITE_OK);
  const int32_t parsed = st.n_prompt_tokens;
  moelite_context_kv_reset(c);
  CHECK(moelite_generate_params_set_parse_special(g, 0) == MOELITE_OK);
  CHECK(moelite_generate(c, "<|im_start|>", 12, g, &st) == MOELITE_OK);
  int32_t as_text[32];
  const int32_t n_text = tokenize(m, "<|im_start|>", MOELITE_TOKENIZE_ADD_SPECIAL, as_text, 32);
  const int32_t n_parsed = tokenize(m, "<|im_start|>", MOELITE_TOKENIZE_ADD_SPECIAL | MOELITE_TOKENIZE_PARSE_SPECIAL, as_text, 32);
  CHECK(parsed == n_parsed && st.n_prompt_tokens == n_text && n_text > n_parsed);
  moelite_generate_params_free(g);
  moelite_context_free(c);
  moelite_model_free(m);
}


/* ---- gaps found by listing every promise against the tests */
static int g_abort_polls = 0, g_abort_at = 0;
static int abort_at_poll(void* user) {
  (void)user;
  return ++g_abort_polls > g_abort_at;
}

typedef struct {
  const char* path;
  char message[512];
} thread_error;

static void* fail_on_thread(void* arg) {
  thread_error* t = (thread_error*)arg;
  moelite_model* m = NULL;
  for (int i = 0; i < 50; ++i) {
    (void)moelite_model_load(t->path, NULL, &m);
    snprintf(t->message, sizeof t->message, "%s", moelite_last_error());
    if (!strstr(t->message, t->path)) break; /* another thread's message leaked in */
  }
  return NULL;
}

typedef struct {
  int calls;
  int32_t biased;
  float raw_biased, seen_biased;
} bias_probe;
static int probe_bias(float* logits, int32_t n_vocab, const int32_t* history, int32_t n_history, void* user) {
  (void)n_vocab;
  (void)history;
  (void)n_history;
  bias_probe* p = (bias_probe*)user;
  if (p->calls++ == 0) p->seen_biased = logits[p->biased];
  return 1;
}

static int stop_at_second(int32_t token, const char* text, size_t len, void* user) {
  (void)text;
  (void)len;
  int* seen = (int*)user;
  if (token >= 0) ++*seen;
  return *seen < 2;
}

static int g_log_lines = 0, g_log_newlines = 0, g_log_below = 0;
static moelite_log_level g_log_min = MOELITE_LOG_DEBUG;
static void count_log(moelite_log_level level, const char* text, void* user) {
  (void)user;
  ++g_log_lines;
  g_log_newlines += strchr(text, '\n') != NULL;
  g_log_below += level < g_log_min;
}

static void test_gaps(void) {
  moelite_model* m = load(0);
  const int32_t n_vocab = (int32_t)moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
  const int32_t layers = (int32_t)moelite_model_get(m, MOELITE_MODEL_N_LAYERS);
  int32_t prompt[64];
  const int32_t n = tokenize(m, "Tuples are immutable", MOELITE_TOKENIZE_ADD_SPECIAL, prompt, 64);

  /* A failure in the middle of an evaluation (the abort fires in its second batch, after the
   * first has run) leaves the previous logits readable and unchanged. */
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_batch(cp, 2);
  moelite_context_params_set_abort_callback(cp, abort_at_poll, NULL);
  moelite_context* c = NULL;
  g_abort_at = 1 << 30;
  CHECK(moelite_context_create(m, cp, &c) == MOELITE_OK);
  CHECK(moelite_eval(c, prompt, 2, 0) == MOELITE_OK);
  float* before = malloc(sizeof(float) * (size_t)n_vocab);
  memcpy(before, moelite_get_logits(c, -1), sizeof(float) * (size_t)n_vocab);
  g_abort_polls = 0;
  g_abort_at = layers + 1; /* one batch of 2 tokens, then a layer into the next */
  CHECK(moelite_eval(c, prompt + 2, 4, 1) == MOELITE_ERR_ABORTED);
  CHECK(moelite_context_kv_length(c) == 2);
  CHECK(memcmp(moelite_get_logits(c, -1), before, sizeof(float) * (size_t)n_vocab) == 0);
  CHECK(moelite_get_logits(c, 1) == NULL); /* the previous call kept one row */
  g_abort_at = 1 << 30;
  free(before);

  /* A prompt that does not fit: CONTEXT_FULL and nothing evaluated (the cache keeps what it had). */
  moelite_context_free(c);
  moelite_context_params_set_n_ctx(cp, 8);
  CHECK(moelite_context_create(m, cp, &c) == MOELITE_OK);
  /* The cache holds tokens the long prompt does not start with: a prompt that was looked at
   * (prefix reuse truncates the cache) would have changed them. */
  const int32_t held_before[3] = {prompt[2], prompt[1], prompt[0]};
  CHECK(moelite_eval(c, held_before, 3, 0) == MOELITE_OK);
  int32_t long_prompt[9] = {0};
  for (int i = 0; i < 9; ++i) long_prompt[i] = prompt[i % n];
  moelite_generate_stats st;
  st.struct_size = sizeof st;
  CHECK(moelite_generate_tokens(c, long_prompt, 9, NULL, &st) == MOELITE_ERR_CONTEXT_FULL);
  CHECK(st.stop_reason == MOELITE_STOP_CONTEXT_FULL && st.n_prompt_tokens == 0 && moelite_context_kv_length(c) == 3);
  int32_t held_after[8], n_held_after = 0;
  CHECK(moelite_context_get_tokens(c, held_after, 8, &n_held_after) == MOELITE_OK && n_held_after == 3 &&
        memcmp(held_after, held_before, sizeof held_before) == 0);
  moelite_context_free(c);
  moelite_context_params_free(cp);

  /* moelite_last_error is per thread: two threads failing at once each read their own text. */
  pthread_t ta, tb;
  thread_error ea = {"/nonexistent/thread-a.gguf", ""}, eb = {"/nonexistent/thread-b.gguf", ""};
  CHECK(pthread_create(&ta, NULL, fail_on_thread, &ea) == 0);
  CHECK(pthread_create(&tb, NULL, fail_on_thread, &eb) == 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  CHECK(strstr(ea.message, ea.path) && !strstr(ea.message, eb.path));
  CHECK(strstr(eb.message, eb.path) && !strstr(eb.message, ea.path));

  /* A failed setter leaves the object as it was: still greedy, twice the same tokens. */
  c = context(m, 128);
  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_temperature(g, 0.0f);
  moelite_generate_params_set_max_tokens(g, 8);
  ban_end_tokens(m, g);
  CHECK(moelite_generate_params_set_temperature(g, -3.0f) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_max_tokens(g, -3) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_generate_params_set_temperature(NULL, 0.5f) == MOELITE_ERR_INVALID_ARGUMENT);
  static token_log first_run, second_run;
  memset(&first_run, 0, sizeof first_run);
  memset(&second_run, 0, sizeof second_run);
  moelite_generate_params_set_token_callback(g, log_token, &first_run);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  moelite_generate_params_set_seed(g, 999); /* greedy: the seed must not matter */
  moelite_generate_params_set_token_callback(g, log_token, &second_run);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  CHECK(first_run.n == 8 && second_run.n == 8 && memcmp(first_run.ids, second_run.ids, sizeof(int32_t) * 8) == 0);

  /* The logits callback sees the bias already added; a bias for a token past the vocabulary is
   * ignored (same tokens as without it). */
  moelite_context_kv_reset(c);
  CHECK(moelite_eval(c, prompt, n, 0) == MOELITE_OK);
  bias_probe probe = {0, 17, moelite_get_logits(c, -1)[17], 0};
  moelite_generate_params_set_logit_bias(g, 17, 5.0f);
  moelite_generate_params_set_logits_callback(g, probe_bias, &probe);
  moelite_generate_params_set_max_tokens(g, 1);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  CHECK(probe.calls == 1 && probe.seen_biased == probe.raw_biased + 5.0f);
  moelite_generate_params_set_logits_callback(g, NULL, NULL);
  moelite_generate_params_set_logit_bias(g, 17, 0.0f);
  moelite_generate_params_set_max_tokens(g, 8);
  CHECK(moelite_generate_params_set_logit_bias(g, n_vocab + 5, 10.0f) == MOELITE_OK);
  memset(&second_run, 0, sizeof second_run);
  CHECK(moelite_generate_tokens(c, prompt, n, g, NULL) == MOELITE_OK);
  CHECK(second_run.n == 8 && memcmp(first_run.ids, second_run.ids, sizeof(int32_t) * 8) == 0);

  /* The token callback stops generation by returning 0; the end token is never reported. */
  int seen = 0;
  moelite_generate_params_set_token_callback(g, stop_at_second, &seen);
  CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_OK);
  CHECK(st.stop_reason == MOELITE_STOP_ABORTED && seen == 2 && st.n_generated_tokens == 2);
  moelite_generate_params_clear_logit_bias(g);
  const int32_t eos = moelite_token_eos(m);
  if (eos >= 0) {
    seen = 0;
    moelite_generate_params_set_logit_bias(g, eos, 1000.0f);
    CHECK(moelite_generate_tokens(c, prompt, n, g, &st) == MOELITE_OK);
    CHECK(st.stop_reason == MOELITE_STOP_END_TOKEN && st.n_generated_tokens == 0 && seen == 0);
  }
  moelite_generate_params_free(g);
  moelite_context_free(c);

  /* BUFFER_TOO_SMALL gives the exact size the next call needs, and leaves the buffer alone. */
  char tiny[2] = {'#', '#'};
  size_t need = 0, got = 0;
  CHECK(moelite_detokenize(m, prompt, n, 0, tiny, 1, &need) == MOELITE_ERR_BUFFER_TOO_SMALL && tiny[0] == '#');
  char* text = malloc(need);
  CHECK(moelite_detokenize(m, prompt, n, 0, text, need, &got) == MOELITE_OK && got == need);
  free(text);
  const moelite_chat_message msgs[] = {{"user", "How are sets hashed?"}};
  CHECK(moelite_chat_format(m, msgs, 1, 1, NULL, 0, &need) == MOELITE_ERR_BUFFER_TOO_SMALL && need > 0);
  text = malloc(need);
  CHECK(moelite_chat_format(m, msgs, 1, 1, text, need, &got) == MOELITE_OK && got == need);
  free(text);
  int32_t n_chat = 0, one[1] = {-4};
  CHECK(moelite_chat_tokenize(m, msgs, 1, 1, one, 1, &n_chat) == MOELITE_ERR_BUFFER_TOO_SMALL && one[0] == -4);
  int32_t* ids = malloc(sizeof(int32_t) * (size_t)n_chat);
  int32_t n_again = 0;
  CHECK(moelite_chat_tokenize(m, msgs, 1, 1, ids, n_chat, &n_again) == MOELITE_OK && n_again == n_chat);
  free(ids);

  /* Ranges and limits of the other setters. */
  moelite_context_params* bad = moelite_context_params_create();
  CHECK(moelite_context_params_set_n_ctx(bad, -1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_context_params_set_n_ctx(bad, MOELITE_MAX_CONTEXT + 1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_context_params_set_n_ctx(bad, 0) == MOELITE_OK);
  moelite_context_params_free(bad);
  moelite_model_params* mp = moelite_model_params_create();
  CHECK(moelite_model_params_set_expert_budget(mp, ((uint64_t)1 << 62) + 1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_cache_allocation(mp, "random") == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_predictor(mp, "psychic") == MOELITE_ERR_INVALID_ARGUMENT);
  /* A chat template given as source is recognised; NULL restores the file's. */
  CHECK(moelite_model_params_set_chat_template(mp, "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}") ==
        MOELITE_OK);
  moelite_model* mistral = NULL;
  CHECK(moelite_model_load(g_path, mp, &mistral) == MOELITE_OK);
  CHECK(mistral && strcmp(moelite_chat_template_kind(mistral), "mistral") == 0);
  moelite_model_free(mistral);
  CHECK(moelite_model_params_set_chat_template(mp, NULL) == MOELITE_OK);
  moelite_model* file_template = NULL;
  CHECK(moelite_model_load(g_path, mp, &file_template) == MOELITE_OK);
  CHECK(file_template && strcmp(moelite_chat_template_kind(file_template), moelite_chat_template_kind(m)) == 0);
  moelite_model_free(file_template);
  moelite_model_params_free(mp);

  /* Inspection: a bad file gets its load status; the runtime keys are empty. */
  moelite_model* info = (moelite_model*)0x3;
  CHECK(moelite_model_inspect("/etc/passwd", &info) == MOELITE_ERR_GGUF_BAD_MAGIC && info == (moelite_model*)0x3);
  CHECK(moelite_model_inspect(g_path, &info) == MOELITE_OK);
  CHECK(moelite_model_get(info, MOELITE_MODEL_BACKEND) == -1 && moelite_model_get(info, MOELITE_MODEL_EXPERT_POOL_BYTES) == 0);
  moelite_model_free(info);

  /* Expert stats: a struct_size that holds only the first counter gets only that one. */
  moelite_model* budgeted = load(0.5);
  c = context(budgeted, 64);
  CHECK(moelite_eval(c, prompt, n, 0) == MOELITE_OK);
  moelite_expert_stats partial;
  memset(&partial, 0x5a, sizeof partial);
  partial.struct_size = offsetof(moelite_expert_stats, hits);
  CHECK(moelite_model_expert_stats(budgeted, -1, &partial) == MOELITE_OK);
  CHECK(partial.activations > 0 && partial.activations != 0x5a5a5a5a5a5a5a5aull && partial.hits == 0x5a5a5a5a5a5a5a5aull);
  memset(&partial, 0x5a, sizeof partial);
  partial.struct_size = offsetof(moelite_expert_stats, hits);
  CHECK(moelite_context_expert_stats(c, -1, &partial) == MOELITE_OK && partial.hits == 0x5a5a5a5a5a5a5a5aull);
  /* A struct_size inside a field: that field is not written at all (no half field). */
  memset(&partial, 0x5a, sizeof partial);
  partial.struct_size = offsetof(moelite_expert_stats, hits) + 3;
  CHECK(moelite_model_expert_stats(budgeted, -1, &partial) == MOELITE_OK && partial.hits == 0x5a5a5a5a5a5a5a5aull);
  moelite_generate_stats gs;
  memset(&gs, 0x5a, sizeof gs);
  gs.struct_size = offsetof(moelite_generate_stats, n_cached_tokens) + 2;
  moelite_generate_params* two = moelite_generate_params_create();
  moelite_generate_params_set_max_tokens(two, 2);
  CHECK(moelite_generate_tokens(c, prompt, n, two, &gs) == MOELITE_OK);
  moelite_generate_params_free(two);
  CHECK(gs.n_prompt_tokens >= 0 && gs.n_prompt_tokens < 1000 && gs.n_cached_tokens == 0x5a5a5a5a);
  gs.struct_size = 0;
  CHECK(moelite_generate_tokens(c, prompt, n, NULL, &gs) == MOELITE_ERR_INVALID_ARGUMENT);
  partial.struct_size = 0;
  CHECK(moelite_model_expert_stats(budgeted, -1, &partial) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_expert_stats(budgeted, -1, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
  moelite_context_free(c);
  moelite_model_free(budgeted);

  /* Logging: whole lines without a newline; nothing below the minimum level arrives. */
  g_log_min = MOELITE_LOG_DEBUG;
  moelite_set_log_callback(count_log, NULL, MOELITE_LOG_DEBUG);
  moelite_model* logged = load(0);
  CHECK(g_log_lines > 0 && g_log_newlines == 0);
  moelite_model_free(logged);
  g_log_lines = 0;
  g_log_min = MOELITE_LOG_ERROR;
  moelite_set_log_callback(count_log, NULL, MOELITE_LOG_ERROR);
  logged = load(0);
  CHECK(g_log_below == 0);
  moelite_model_free(logged);
  moelite_set_log_callback(NULL, NULL, MOELITE_LOG_ERROR);

  /* Documented defaults. Context: n_ctx = min(training context, 4096). Generation: a sampler
   * made from NULL params draws what one with the documented values draws. */
  c = context(m, 0);
  const int64_t train = moelite_model_get(m, MOELITE_MODEL_N_CTX_TRAIN);
  CHECK(moelite_context_n_ctx(c) == (train < 4096 ? train : 4096));
  moelite_context_free(c);
  moelite_generate_params* documented = moelite_generate_params_create();
  moelite_generate_params_set_max_tokens(documented, 256);
  moelite_generate_params_set_temperature(documented, 0.8f);
  moelite_generate_params_set_top_k(documented, 40);
  moelite_generate_params_set_top_p(documented, 0.95f);
  moelite_generate_params_set_min_p(documented, 0.05f);
  moelite_generate_params_set_repeat_penalty(documented, 1.0f, 64);
  moelite_generate_params_set_seed(documented, 0x5eed);
  moelite_sampler *by_default = NULL, *by_value = NULL;
  CHECK(moelite_sampler_create(NULL, &by_default) == MOELITE_OK);
  CHECK(moelite_sampler_create(documented, &by_value) == MOELITE_OK);
  float* flat = malloc(sizeof(float) * 64);
  int same_draws = 1;
  for (int i = 0; i < 200; ++i) {
    for (int t = 0; t < 64; ++t) flat[t] = (float)((t * 37 + i * 11) % 64) / 16.0f; /* varied, smooth */
    int32_t a = -1, b = -2;
    moelite_sampler_sample_logits(by_default, flat, 64, &a);
    moelite_sampler_sample_logits(by_value, flat, 64, &b);
    same_draws &= a == b;
  }
  CHECK(same_draws);
  int32_t out = -9;
  CHECK(moelite_sampler_sample_logits(by_value, flat, 0, &out) == MOELITE_ERR_INVALID_ARGUMENT && out == -9);
  free(flat);
  moelite_sampler_free(by_default);
  moelite_sampler_free(by_value);
  moelite_generate_params_free(documented);

  /* The logits callback runs before the repetition penalty: a token already in the history is
   * seen unpenalised (raw + bias). */
  {
    moelite_context* pc = context(m, 128);
    CHECK(moelite_eval(pc, prompt, n, 0) == MOELITE_OK);
    const int32_t repeated = prompt[n - 1];
    bias_probe pen = {0, repeated, moelite_get_logits(pc, -1)[repeated], 0};
    moelite_generate_params* pg = moelite_generate_params_create();
    moelite_generate_params_set_repeat_penalty(pg, 3.0f, -1);
    moelite_generate_params_set_max_tokens(pg, 1);
    moelite_generate_params_set_logits_callback(pg, probe_bias, &pen);
    CHECK(moelite_generate_tokens(pc, prompt, n, pg, NULL) == MOELITE_OK);
    CHECK(pen.calls == 1 && pen.seen_biased == pen.raw_biased);
    /* After a generation call, the logits are those of its last evaluation: the same as
     * evaluating that cached sequence again. */
    moelite_generate_params_set_logits_callback(pg, NULL, NULL);
    moelite_generate_params_set_max_tokens(pg, 4);
    ban_end_tokens(m, pg);
    CHECK(moelite_generate_tokens(pc, prompt, n, pg, NULL) == MOELITE_OK);
    float* after_gen = malloc(sizeof(float) * (size_t)n_vocab);
    memcpy(after_gen, moelite_get_logits(pc, -1), sizeof(float) * (size_t)n_vocab);
    int32_t seq[128], n_seq = 0;
    CHECK(moelite_context_get_tokens(pc, seq, 128, &n_seq) == MOELITE_OK && n_seq == n + 3);
    moelite_context_kv_reset(pc);
    CHECK(moelite_eval(pc, seq, n_seq, 0) == MOELITE_OK);
    CHECK(memcmp(after_gen, moelite_get_logits(pc, -1), sizeof(float) * (size_t)n_vocab) == 0);
    free(after_gen);
    moelite_expert_stats es0;
    es0.struct_size = 0;
    CHECK(moelite_context_expert_stats(pc, -1, &es0) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_context_expert_stats(pc, -1, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
    moelite_generate_params_free(pg);
    moelite_context_free(pc);
  }

  /* NULL handles: frees are no-ops, getters answer their documented empty values. */
  moelite_model_params_free(NULL);
  moelite_context_params_free(NULL);
  moelite_generate_params_free(NULL);
  moelite_sampler_free(NULL);
  moelite_sampler_reset(NULL);
  moelite_model_free(NULL);
  moelite_context_free(NULL);
  moelite_context_kv_reset(NULL);
  moelite_context_kv_truncate(NULL, 3);
  moelite_context_reset_expert_stats(NULL);
  CHECK(moelite_context_kv_length(NULL) == 0 && moelite_context_n_ctx(NULL) == 0);
  CHECK(moelite_model_arch(NULL) == NULL && moelite_model_get(NULL, MOELITE_MODEL_N_LAYERS) == -1);
  CHECK(moelite_model_meta_count(NULL) == 0 && moelite_model_meta_key(NULL, 0) == NULL);
  CHECK(moelite_token_attrs(NULL, 0) == 0 && moelite_token_text(NULL, 0) == NULL);
  CHECK(moelite_get_logits(NULL, -1) == NULL && moelite_context_model(NULL) == NULL);
  CHECK(strcmp(moelite_status_name((moelite_status)999), "MOELITE_ERR_UNKNOWN") == 0);
  CHECK(moelite_context_set_abort_callback(NULL, NULL, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
  /* Several sequences and sessions: NULL handles and arguments. */
  const int32_t one_token = 1, seq0 = 0;
  CHECK(moelite_eval_batch(NULL, &one_token, &seq0, NULL, 1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_context_params_set_n_seq(NULL, 2) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_context_n_seq(NULL) == 0 && moelite_context_seq_length(NULL, 0) == 0);
  CHECK(moelite_context_seq_truncate(NULL, 0, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_context_save(NULL, "x.session") == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_context_load(NULL, "x.session") == MOELITE_ERR_INVALID_ARGUMENT);
  {
    moelite_context* sc = NULL;
    CHECK(moelite_context_create(m, NULL, &sc) == MOELITE_OK);
    CHECK(moelite_eval_batch(sc, NULL, &seq0, NULL, 1) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_eval_batch(sc, &one_token, &seq0, NULL, 0) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_context_n_seq(sc) == 1 && moelite_context_seq_length(sc, 5) == 0);
    CHECK(moelite_context_save(sc, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_context_load(sc, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
    CHECK(moelite_context_load(sc, "/nonexistent/dir/x.session") == MOELITE_ERR_FILE_NOT_FOUND);
    CHECK(moelite_context_save(sc, "/nonexistent/dir/x.session") == MOELITE_ERR_IO);
    /* A round trip through a file (under the sanitizers too): the restored context goes on exactly
       as the saved one, and a second sequence decodes beside it. */
    const int32_t toks[6] = {3, 17, 99, 5, 42, 7}, seq_ids[2] = {0, 1}, two[2] = {7, 7};
    char session_path[512];
    const char* tmpdir = getenv("TMPDIR");
    snprintf(session_path, sizeof session_path, "%s/moelite-api-contract-%ld.session", tmpdir ? tmpdir : "/tmp",
             (long)getpid());
    CHECK(moelite_eval(sc, toks, 5, 0) == MOELITE_OK);
    CHECK(moelite_context_save(sc, session_path) == MOELITE_OK);
    moelite_context_params* two_seq = moelite_context_params_create();
    CHECK(moelite_context_params_set_n_seq(two_seq, 2) == MOELITE_OK);
    CHECK(moelite_context_params_set_n_seq(two_seq, 0) == MOELITE_ERR_INVALID_ARGUMENT);
    moelite_context* rc = NULL;
    CHECK(moelite_context_create(m, two_seq, &rc) == MOELITE_OK && moelite_context_n_seq(rc) == 2);
    moelite_context_params_free(two_seq);
    CHECK(moelite_context_load(rc, session_path) == MOELITE_OK && moelite_context_seq_length(rc, 0) == 5);
    CHECK(moelite_eval(sc, toks + 5, 1, 0) == MOELITE_OK);
    CHECK(moelite_eval_batch(rc, two, seq_ids, NULL, 2) == MOELITE_OK);
    const int64_t nv = moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
    CHECK(memcmp(moelite_get_logits(sc, -1), moelite_get_logits(rc, 0), (size_t)nv * sizeof(float)) == 0);
    CHECK(moelite_context_seq_length(rc, 1) == 1 && moelite_context_seq_truncate(rc, 2, 0) == MOELITE_ERR_INVALID_ARGUMENT);
    remove(session_path);
    moelite_context_free(rc);
    moelite_context_free(sc);
  }
  moelite_model_free(m);
}

/* ---- enum values are part of the ABI: pinned here, so a renumbering fails */
static void test_enum_values_are_pinned(void) {
  const struct {
    long value, pinned;
  } v[] = {{MOELITE_OK, 0}, {MOELITE_ERR_INVALID_ARGUMENT, 1}, {MOELITE_ERR_OUT_OF_MEMORY, 2},
           {MOELITE_ERR_FILE_NOT_FOUND, 3}, {MOELITE_ERR_IO, 4}, {MOELITE_ERR_BUFFER_TOO_SMALL, 5},
           {MOELITE_ERR_SYSTEM_LIMIT, 6}, {MOELITE_ERR_GGUF_BAD_MAGIC, 10}, {MOELITE_ERR_GGUF_BAD_VERSION, 11},
           {MOELITE_ERR_GGUF_TRUNCATED, 12}, {MOELITE_ERR_GGUF_CORRUPT, 13}, {MOELITE_ERR_GGUF_UNKNOWN_TYPE, 14},
           {MOELITE_ERR_GGUF_OUT_OF_BOUNDS, 15}, {MOELITE_ERR_GGUF_OVERLAP, 16}, {MOELITE_ERR_UNSUPPORTED_ARCH, 20},
           {MOELITE_ERR_UNSUPPORTED_TYPE, 21}, {MOELITE_ERR_MISSING_TENSOR, 22}, {MOELITE_ERR_BAD_SHAPE, 23},
           {MOELITE_ERR_MISSING_METADATA, 24}, {MOELITE_ERR_BAD_METADATA, 25}, {MOELITE_ERR_BACKEND_UNAVAILABLE, 30},
           {MOELITE_ERR_BUDGET_TOO_SMALL, 31}, {MOELITE_ERR_NOT_IMPLEMENTED, 32}, {MOELITE_ERR_BAD_PROFILE, 33},
           {MOELITE_ERR_BACKEND, 34}, {MOELITE_ERR_CONTEXT_FULL, 40}, {MOELITE_ERR_BAD_TOKEN, 41},
           {MOELITE_ERR_ABORTED, 42}, {MOELITE_ERR_PROGRESS_ABORTED, 43}, {MOELITE_ERR_BUSY, 44},
           {MOELITE_ERR_BAD_SESSION, 50},
           {MOELITE_ERR_SESSION_MISMATCH, 51}, {MOELITE_ERR_INTERNAL, 99},
           {MOELITE_STOP_END_TOKEN, 0}, {MOELITE_STOP_MAX_TOKENS, 1}, {MOELITE_STOP_STRING, 2},
           {MOELITE_STOP_ABORTED, 3}, {MOELITE_STOP_CONTEXT_FULL, 4}, {MOELITE_STOP_ERROR, 5},
           {MOELITE_BACKEND_AUTO, 0}, {MOELITE_BACKEND_CPU, 1}, {MOELITE_BACKEND_VULKAN, 2}, {MOELITE_BACKEND_CUDA, 3},
           {MOELITE_LOG_DEBUG, 0}, {MOELITE_LOG_NONE, 4}, {MOELITE_TOKENIZE_ADD_SPECIAL, 1},
           {MOELITE_TOKENIZE_PARSE_SPECIAL, 2}, {MOELITE_DETOKENIZE_RENDER_SPECIAL, 1},
           {MOELITE_TOKEN_ATTR_NORMAL, 1}, {MOELITE_TOKEN_ATTR_UNKNOWN, 2}, {MOELITE_TOKEN_ATTR_CONTROL, 4},
           {MOELITE_TOKEN_ATTR_USER_DEFINED, 8}, {MOELITE_TOKEN_ATTR_UNUSED, 16}, {MOELITE_TOKEN_ATTR_BYTE, 32},
           {MOELITE_TOKEN_ATTR_END, 64}, {MOELITE_MODEL_N_LAYERS, 0}, {MOELITE_MODEL_EXPERT_BYTES, 12},
           {MOELITE_MODEL_EXPERT_BUDGET, 19}, {MOELITE_MODEL_EXPERT_MIN_BUDGET, 28},
           {MOELITE_PLATFORM_MEM_TOTAL_BYTES, 0}, {MOELITE_PLATFORM_HAS_VULKAN, 12},
           {MOELITE_REQUEST_WAITING, -2}, {MOELITE_REQUEST_RUNNING, -1}};
  int pinned = 1;
  for (size_t i = 0; i < sizeof v / sizeof v[0]; ++i) pinned &= v[i].value == v[i].pinned;
  CHECK(pinned);
}

/* ---- store options and the repetition penalty's window */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static void test_store_options_and_penalty_window(void) {
  moelite_model* info = NULL;
  CHECK(moelite_model_inspect(g_path, &info) == MOELITE_OK);
  const uint64_t min_global = (uint64_t)moelite_model_get(info, MOELITE_MODEL_EXPERT_MIN_BUDGET);
  const uint64_t big = (uint64_t)moelite_model_get(info, MOELITE_MODEL_EXPERT_BYTES) / 2;
  moelite_model_free(info);
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model* m = NULL;
  /* Needs a profile: "dp" allocation and the fitted predictors fail at load with BAD_PROFILE. */
  moelite_model_params_set_expert_budget(mp, big);
  CHECK(moelite_model_params_set_cache_allocation(mp, "dp") == MOELITE_OK);
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_ERR_BAD_PROFILE && m == NULL);
  CHECK(moelite_model_params_set_cache_allocation(mp, "auto") == MOELITE_OK);
  CHECK(moelite_model_params_set_predictor(mp, "first-layer") == MOELITE_OK);
  CHECK(moelite_model_load(g_path, mp, &m) == MOELITE_ERR_BAD_PROFILE && m == NULL);
  CHECK(moelite_model_params_set_predictor(mp, "none") == MOELITE_OK);
  /* The deprecated per-layer switch is the "uniform" allocation: the global minimum is too
   * small for per-layer quotas, and both refuse it alike; with room, both give the same slots. */
  moelite_model_params_set_expert_budget(mp, min_global);
  CHECK(moelite_model_params_set_cache_allocation(mp, "uniform") == MOELITE_OK);
  const moelite_status uniform_min = moelite_model_load(g_path, mp, &m);
  if (uniform_min == MOELITE_OK) moelite_model_free(m);
  m = NULL;
  moelite_model_params_set_cache_allocation(mp, "auto");
  CHECK(moelite_model_params_set_expert_per_layer(mp, 1) == MOELITE_OK);
  const moelite_status per_layer_min = moelite_model_load(g_path, mp, &m);
  if (per_layer_min == MOELITE_OK) moelite_model_free(m);
  CHECK(uniform_min == per_layer_min);
  moelite_model_params_set_expert_budget(mp, big);
  moelite_model *a = NULL, *b = NULL;
  CHECK(moelite_model_load(g_path, mp, &a) == MOELITE_OK);
  moelite_model_params_set_expert_per_layer(mp, 0);
  moelite_model_params_set_cache_allocation(mp, "uniform");
  CHECK(moelite_model_load(g_path, mp, &b) == MOELITE_OK);
  CHECK(a && b && moelite_model_get(a, MOELITE_MODEL_EXPERT_SLOTS) == moelite_model_get(b, MOELITE_MODEL_EXPERT_SLOTS));
  CHECK(a && b && moelite_model_get(a, MOELITE_MODEL_EXPERT_MIN_BUDGET) == moelite_model_get(b, MOELITE_MODEL_EXPERT_MIN_BUDGET));
  CHECK(b && moelite_model_get(b, MOELITE_MODEL_EXPERT_MIN_BUDGET) > (int64_t)min_global); /* quotas in every layer */
  moelite_model_free(a);
  moelite_model_free(b);
  moelite_model_params_free(mp);

  /* The repetition penalty's window: last_n 0 looks at nothing (draws like no penalty); -1
   * looks at the whole history, so a token accepted long ago is still penalised. */
  float logits[8] = {3.0f, 2.9f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_temperature(g, 0.0f);
  moelite_sampler* s = NULL;
  int32_t t = -1;
  const int32_t old_then_recent[6] = {0, 5, 6, 7, 5, 6}; /* token 0 six tokens back */
  moelite_generate_params_set_repeat_penalty(g, 2.0f, 0);
  CHECK(moelite_sampler_create(g, &s) == MOELITE_OK && moelite_sampler_accept(s, old_then_recent, 6) == MOELITE_OK);
  CHECK(moelite_sampler_sample_logits(s, logits, 8, &t) == MOELITE_OK && t == 0); /* unpenalised */
  moelite_sampler_free(s);
  moelite_generate_params_set_repeat_penalty(g, 2.0f, 3);
  CHECK(moelite_sampler_create(g, &s) == MOELITE_OK && moelite_sampler_accept(s, old_then_recent, 6) == MOELITE_OK);
  CHECK(moelite_sampler_sample_logits(s, logits, 8, &t) == MOELITE_OK && t == 0); /* token 0 outside the window */
  moelite_sampler_free(s);
  moelite_generate_params_set_repeat_penalty(g, 2.0f, -1);
  CHECK(moelite_sampler_create(g, &s) == MOELITE_OK && moelite_sampler_accept(s, old_then_recent, 6) == MOELITE_OK);
  CHECK(moelite_sampler_sample_logits(s, logits, 8, &t) == MOELITE_OK && t == 1); /* 3 / 2 < 2.9 */
  moelite_sampler_free(s);
  moelite_generate_params_free(g);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* ---- the names replaced in this release still work */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static void test_deprecated_aliases(void) {
  moelite_model_params* mp = moelite_model_params_create();
  CHECK(moelite_model_params_set_expert_policy(mp, "lfu") == MOELITE_OK);
  CHECK(moelite_model_params_set_expert_policy(mp, "nope") == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_model_params_set_expert_predictor(mp, "none") == MOELITE_OK);
  CHECK(moelite_model_params_set_expert_per_layer(mp, 0) == MOELITE_OK);
  moelite_model_params_free(mp);
  CHECK(MOELITE_ERR_CANCELLED == MOELITE_ERR_PROGRESS_ABORTED && MOELITE_STOP_CALLBACK == MOELITE_STOP_ABORTED);
  moelite_model* m = load(0);
  moelite_context* c = context(m, 32);
  int32_t ids[3] = {1, 2, 3};
  CHECK(moelite_eval(c, ids, 3, 0) == MOELITE_OK);
  CHECK(moelite_kv_length(c) == 3);
  moelite_kv_truncate(c, 1);
  CHECK(moelite_context_kv_length(c) == 1);
  moelite_kv_reset(c);
  CHECK(moelite_context_kv_length(c) == 0);
  moelite_context_free(c);
  moelite_model_free(m);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* The batch planner's C surface: refusals leave *out NULL, NULL handles answer the documented
 * sentinels, and the getters agree with the plan's JSON. */
static void test_batch_plan(void) {
  moelite_batch_plan* plan = (moelite_batch_plan*)&g_failures; /* a sentinel the refusal must clear */
  CHECK(moelite_plan_batch(NULL, NULL, NULL, &plan) == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK(moelite_batch_plan_get(NULL, MOELITE_PLAN_N_SEQ) == -1);
  CHECK(moelite_batch_plan_decode_tok_s(NULL) == 0.0);
  CHECK(strcmp(moelite_batch_plan_json(NULL), "") == 0 && strcmp(moelite_batch_plan_reason(NULL), "") == 0);
  CHECK(strcmp(moelite_batch_plan_allocation(NULL), "") == 0);
  moelite_batch_plan_free(NULL);
  moelite_plan_params_free(NULL);

  moelite_plan_params* pp = moelite_plan_params_create();
  CHECK(pp != NULL);
  if (!pp) return;
  CHECK(moelite_plan_params_set_cache_allocation(pp, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_cache_allocation(pp, "lru") == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_memory(pp, ((uint64_t)1 << 62) + 1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_headroom(pp, ((uint64_t)1 << 62) + 1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_expert_budget(pp, ((uint64_t)1 << 62) + 1) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_bandwidths(pp, 2e6, 0.0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_routing_trace(NULL, "t.jsonl") == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_routing_trace(pp, NULL) == MOELITE_OK);
  CHECK(moelite_plan_params_set_max_sequences(pp, 0) == MOELITE_ERR_INVALID_ARGUMENT);

  moelite_model* info = NULL;
  CHECK(moelite_model_inspect(g_path, &info) == MOELITE_OK);
  if (!info) {
    moelite_plan_params_free(pp);
    return;
  }
  /* Streaming without a storage bandwidth: refused, out cleared. */
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK(moelite_plan_params_set_bandwidths(pp, 2.0, 0.0) == MOELITE_OK);
  CHECK(moelite_plan_params_set_min_sequences(pp, 5) == MOELITE_OK);
  CHECK(moelite_plan_params_set_max_sequences(pp, 4) == MOELITE_OK);
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL); /* 5..4 */
  CHECK(moelite_plan_params_set_min_sequences(pp, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_min_sequences(pp, 1) == MOELITE_OK);
  CHECK(moelite_plan_params_set_memory(pp, (uint64_t)256 << 20) == MOELITE_OK);
  CHECK(moelite_plan_params_set_cache_allocation(pp, "uniform") == MOELITE_OK);
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_OK && plan != NULL);
  if (plan) {
    const int64_t n = moelite_batch_plan_get(plan, MOELITE_PLAN_N_SEQ);
    CHECK(n >= 1 && n <= 4);
    CHECK(moelite_batch_plan_get(plan, MOELITE_PLAN_MEMORY) == (int64_t)256 << 20);
    CHECK(moelite_batch_plan_get(plan, MOELITE_PLAN_HEADROOM) == (int64_t)64 << 20); /* max(64 MiB, 10 %) */
    CHECK(moelite_batch_plan_get(plan, (moelite_batch_plan_key)99) == -1);
    CHECK(strcmp(moelite_batch_plan_allocation(plan), "uniform") == 0);
    char head[64];
    snprintf(head, sizeof head, "{\"n_seq\": %lld, ", (long long)n);
    CHECK(strncmp(moelite_batch_plan_json(plan), head, strlen(head)) == 0);
    CHECK(strstr(moelite_batch_plan_json(plan), "\"allocation\": \"uniform\"") != NULL);
    moelite_batch_plan_free(plan);
  }
  /* A routing trace, read and checked by moelite_plan_batch; refusals leave *out NULL. */
  char trace_path[512];
  const char* tmpdir = getenv("TMPDIR");
  snprintf(trace_path, sizeof trace_path, "%s/moelite-api-contract-%ld.trace", tmpdir ? tmpdir : "/tmp", (long)getpid());
  const long n_layers = (long)moelite_model_get(info, MOELITE_MODEL_N_LAYERS);
  const long n_experts = (long)moelite_model_get(info, MOELITE_MODEL_N_EXPERTS);
  char* file_plan = NULL; /* variant 0's plan, which the same routing from memory must equal */
  for (int variant = 0; variant < 4; ++variant) {
    FILE* f = fopen(trace_path, "w");
    CHECK(f != NULL);
    if (!f) break;
    /* 0: this model's shape; 1: one expert more; 2: malformed; 3: an expert id past the model's. */
    if (variant == 2) fprintf(f, "{\"token\": 0, \"layer\": 0}\n");
    else fprintf(f, "{\"n_layers\":%ld,\"n_experts\":%ld,\"top_k\":2}\n", n_layers, n_experts + (variant == 1));
    for (long t = 0; t < 8 && variant != 2; ++t)
      for (long l = 0; l < n_layers; ++l)
        fprintf(f, "{\"token\":%ld,\"layer\":%ld,\"experts\":[%ld,%ld]}\n", t, l, t % 2,
                variant == 3 && t == 7 ? n_experts : 2 + t % 2);
    fclose(f);
    CHECK(moelite_plan_params_set_routing_trace(pp, trace_path) == MOELITE_OK);
    plan = (moelite_batch_plan*)&g_failures;
    const moelite_status st = moelite_plan_batch(info, NULL, pp, &plan);
    if (variant == 0) {
      CHECK(st == MOELITE_OK && plan != NULL);
      if (plan) CHECK(strstr(moelite_batch_plan_json(plan), "\"routing\": \"trace\"") != NULL);
      if (plan && (file_plan = malloc(strlen(moelite_batch_plan_json(plan)) + 1)) != NULL)
        strcpy(file_plan, moelite_batch_plan_json(plan));
      moelite_batch_plan_free(plan);
    } else {
      CHECK(st == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL);
      CHECK(strstr(moelite_last_error(), "routing trace") != NULL);
    }
  }
  CHECK(moelite_plan_params_set_profile(pp, trace_path) == MOELITE_OK); /* both: refused */
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK(moelite_plan_params_set_profile(pp, NULL) == MOELITE_OK);
  remove(trace_path);
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_FILE_NOT_FOUND && plan == NULL);

  /* The same routing from memory (moelite_plan_params_set_routing) plans as the file did; it
   * replaces the trace path, and a path set after it replaces it. */
  /* The shipped model has no dense layers: every layer has experts, as the trace above assumed. */
  CHECK(moelite_model_get(info, MOELITE_MODEL_N_DENSE_LAYERS) == 0);
  int32_t* routing = malloc(sizeof(int32_t) * 8 * 3 * (size_t)n_layers);
  CHECK(routing != NULL);
  if (!routing) return;
  for (long t = 0; t < 8; ++t)
    for (long l = 0; l < n_layers; ++l) {
      int32_t* slot = routing + (t * n_layers + l) * 3;
      slot[0] = (int32_t)(t % 2);
      slot[1] = -1; /* an empty slot (dropped by adaptive gating) reads nothing */
      slot[2] = (int32_t)(2 + t % 2);
    }
  CHECK(moelite_plan_params_set_routing(NULL, 8, (int32_t)n_layers, 3, routing) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers, 3, NULL) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_routing(pp, 0, (int32_t)n_layers, 3, routing) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers, 1025, routing) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_plan_params_set_routing(pp, 1 << 20, 1 << 10, 1, routing) == MOELITE_ERR_INVALID_ARGUMENT);
  routing[4] = -2;
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers, 3, routing) == MOELITE_ERR_INVALID_ARGUMENT);
  routing[4] = -1;
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers, 3, routing) == MOELITE_OK);
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_OK && plan != NULL);
  if (plan && file_plan) CHECK(strcmp(moelite_batch_plan_json(plan), file_plan) == 0);
  moelite_batch_plan_free(plan);
  /* Another shape (one layer fewer), then an expert id past the model's: refused, *out NULL. */
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers - 1, 3, routing) == MOELITE_OK);
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL);
  routing[5] = (int32_t)n_experts;
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers, 3, routing) == MOELITE_OK);
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_INVALID_ARGUMENT && plan == NULL);
  CHECK(strstr(moelite_last_error(), "names expert") != NULL);
  CHECK(moelite_plan_params_set_routing_trace(pp, trace_path) == MOELITE_OK); /* the missing file again */
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_ERR_FILE_NOT_FOUND && plan == NULL);
  CHECK(moelite_plan_params_set_routing(pp, 8, (int32_t)n_layers, 3, routing) == MOELITE_OK);
  CHECK(moelite_plan_params_set_routing(pp, 0, 0, 0, NULL) == MOELITE_OK); /* cleared: the path is gone too */
  CHECK(moelite_plan_params_set_routing_trace(pp, NULL) == MOELITE_OK);
  plan = (moelite_batch_plan*)&g_failures;
  CHECK(moelite_plan_batch(info, NULL, pp, &plan) == MOELITE_OK && plan != NULL);
  if (plan) CHECK(strstr(moelite_batch_plan_json(plan), "\"routing\": \"trace\"") == NULL);
  moelite_batch_plan_free(plan);
  free(file_plan);
  free(routing);
  moelite_model_free(info);
  moelite_plan_params_free(pp);
}

/* ---- request queue: from C, a queued request generates what moelite_generate_tokens does, and
 * failing calls leave their outputs untouched (tests/test_request_queue.cpp covers the rest) */
static void test_request_queue(void) {
  moelite_model* m = load(0);
  moelite_context* solo = context(m, 64);
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_ctx(cp, 64);
  moelite_context_params_set_n_seq(cp, 2);
  moelite_context* c = NULL;
  CHECK(moelite_context_create(m, cp, &c) == MOELITE_OK);
  moelite_context_params_free(cp);
  moelite_queue* const sentinel = (moelite_queue*)0x3;
  moelite_queue* q = sentinel;
  CHECK(moelite_queue_create(NULL, &q) == MOELITE_ERR_INVALID_ARGUMENT && q == sentinel);
  CHECK(moelite_queue_create(c, &q) == MOELITE_OK && q != sentinel);
  int32_t prompt[32];
  const int32_t n = tokenize(m, "def add(a, b):", MOELITE_TOKENIZE_ADD_SPECIAL, prompt, 32);
  moelite_generate_params* g = moelite_generate_params_create();
  moelite_generate_params_set_max_tokens(g, 6);
  moelite_generate_params_set_temperature(g, 0.7f);
  ban_end_tokens(m, g);
  int64_t id = -5;
  const int32_t bad[2] = {1, -1};
  CHECK(moelite_queue_add(q, bad, 2, g, &id) == MOELITE_ERR_BAD_TOKEN && id == -5);
  CHECK(moelite_queue_add(q, prompt, n, g, &id) == MOELITE_OK && id == 0);
  CHECK(moelite_queue_add(q, prompt, 3, NULL, &id) == MOELITE_OK && id == 1);
  int32_t events = -7, state = 99;
  CHECK(moelite_queue_step(NULL, &events) == MOELITE_ERR_INVALID_ARGUMENT && events == -7);
  while (moelite_queue_waiting(q) + moelite_queue_running(q) > 0) CHECK(moelite_queue_step(q, &events) == MOELITE_OK);
  CHECK(moelite_queue_request_state(q, 0, &state) == MOELITE_OK && state == MOELITE_STOP_MAX_TOKENS);
  int32_t got[8], want[8], n_got = 0, n_want = 0;
  CHECK(moelite_queue_request_tokens(q, 0, got, 8, &n_got) == MOELITE_OK && n_got == 6);
  CHECK(moelite_generate_tokens(solo, prompt, n, g, NULL) == MOELITE_OK);
  CHECK(moelite_context_get_tokens(solo, NULL, 0, &n_want) == MOELITE_ERR_BUFFER_TOO_SMALL);
  int32_t all[64];
  CHECK(moelite_context_get_tokens(solo, all, 64, &n_want) == MOELITE_OK && n_want == n + 5);
  memcpy(want, all + n, 5 * sizeof(int32_t));
  CHECK(memcmp(got, want, 5 * sizeof(int32_t)) == 0); /* the sixth was sampled, not evaluated */
  int32_t tok = -3;
  int64_t rid = -3;
  CHECK(moelite_queue_event(q, 99, &rid, &tok, &state) == MOELITE_ERR_INVALID_ARGUMENT && rid == -3 && tok == -3);
  CHECK(moelite_queue_remove(q, 0) == MOELITE_OK && moelite_queue_remove(q, 0) == MOELITE_ERR_INVALID_ARGUMENT);
  CHECK(moelite_queue_finished(q) == 1 && moelite_queue_finished(NULL) == 0);
  moelite_generate_params_free(g);
  moelite_queue_free(q);
  moelite_queue_free(NULL);
  moelite_context_free(c);
  moelite_context_free(solo);
  moelite_model_free(m);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  g_path = argv[1];
  moelite_set_log_callback(NULL, NULL, MOELITE_LOG_ERROR);
  test_last_error_is_stable();
  test_free_order();
  test_outputs_untouched();
  test_inspect();
  test_budget_fraction();
  test_metadata_and_tokens();
  test_context_queries();
  test_sampler_matches_generate();
  test_bias_and_logits_callback();
  test_generation_end_states();
  test_gaps();
  test_enum_values_are_pinned();
  test_store_options_and_penalty_window();
  test_deprecated_aliases();
  test_batch_plan();
  test_request_queue();
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
