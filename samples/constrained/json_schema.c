/* Constrained generation: the model's answer is forced to match a small JSON schema,
 *
 *     {"name": <1-16 letters or spaces>, "age": <integer of 1-3 digits>}
 *
 * using only the public API: a logits callback masks every token whose text would leave the
 * schema, a token callback advances the schema's state with each token drawn, and the end token
 * is allowed once the object is complete. The result is then checked by an independent validator.
 *
 *   json_schema MODEL.gguf [SEED]
 *
 * Exit status 0 when the output matches the schema, 1 otherwise (or on an error).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moelite.h"

/* ---- the schema as a sequence of segments: fixed text, or a run of characters of one class */
typedef enum { SEG_LITERAL, SEG_NAME, SEG_DIGITS } segment_kind;
typedef struct {
  segment_kind kind;
  const char* text; /* SEG_LITERAL */
  int min, max;     /* SEG_NAME / SEG_DIGITS: characters allowed */
} segment;

static const segment kSchema[] = {
    {SEG_LITERAL, "{\"name\": \"", 0, 0}, {SEG_NAME, NULL, 1, 16}, {SEG_LITERAL, "\", \"age\": ", 0, 0},
    {SEG_DIGITS, NULL, 1, 3},           {SEG_LITERAL, "}", 0, 0},
};
enum { kSegments = sizeof kSchema / sizeof kSchema[0] };

typedef struct {
  int seg;   /* current segment; kSegments when the object is complete */
  int count; /* characters consumed within it */
} schema_state;

static int in_class(segment_kind k, char c) {
  return k == SEG_NAME ? (isalpha((unsigned char)c) || c == ' ') : isdigit((unsigned char)c) != 0;
}

/* Consumes one character; 0 when the schema does not allow it here. */
static int step(schema_state* s, char c) {
  while (s->seg < kSegments) {
    const segment* g = &kSchema[s->seg];
    if (g->kind == SEG_LITERAL) {
      if (g->text[s->count] != c) return 0;
      if (g->text[++s->count] == '\0') {
        ++s->seg;
        s->count = 0;
      }
      return 1;
    }
    if (s->count < g->max && in_class(g->kind, c)) {
      ++s->count;
      return 1;
    }
    if (s->count < g->min) return 0;
    ++s->seg; /* the run may end here: the character must start the next segment */
    s->count = 0;
  }
  return 0; /* complete: nothing more */
}

static int accepts(schema_state s, const char* text, size_t len) {
  for (size_t i = 0; i < len; ++i)
    if (!step(&s, text[i])) return 0;
  return 1;
}

/* ---- decoding state shared by the callbacks */
typedef struct {
  const moelite_model* model;
  int32_t n_vocab;
  char** piece;    /* the bytes of each token */
  size_t* len;
  schema_state state;
  char out[256];
  size_t out_len;
} decoder;

static int mask_logits(float* logits, int32_t n_vocab, const int32_t* history, int32_t n_history, void* user) {
  (void)history;
  (void)n_history;
  decoder* d = (decoder*)user;
  const int complete = d->state.seg == kSegments;
  for (int32_t t = 0; t < n_vocab; ++t) {
    int ok;
    if (moelite_token_attrs(d->model, t) & MOELITE_TOKEN_ATTR_END) {
      ok = complete; /* the answer may end only once the object is closed */
    } else {
      ok = !complete && d->len[t] > 0 && accepts(d->state, d->piece[t], d->len[t]);
    }
    if (!ok) logits[t] = -INFINITY;
  }
  return 1;
}

static int on_token(int32_t token, const char* text, size_t len, void* user) {
  (void)text;
  (void)len;
  decoder* d = (decoder*)user;
  if (token < 0) return 1;
  for (size_t i = 0; i < d->len[token]; ++i) step(&d->state, d->piece[token][i]);
  if (d->out_len + d->len[token] < sizeof d->out) {
    memcpy(d->out + d->out_len, d->piece[token], d->len[token]);
    d->out_len += d->len[token];
    d->out[d->out_len] = '\0';
  }
  return 1;
}

/* ---- an independent check of the result: parse it with the C library, not with the automaton */
static int valid_json(const char* s) {
  char name[64];
  int age = -1, consumed = 0;
  if (sscanf(s, "{\"name\": \"%16[A-Za-z ]\", \"age\": %3d}%n", name, &age, &consumed) != 2) return 0;
  return consumed == (int)strlen(s) && strlen(name) >= 1 && age >= 0 && s[consumed - 1] == '}';
}

static int fail_with(moelite_status st, const char* what) {
  fprintf(stderr, "%s: %s: %s\n", what, moelite_status_name(st), moelite_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf [SEED]\n", argv[0]);
    return 2;
  }
  const uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 7;
  moelite_model* model = NULL;
  moelite_status st = moelite_model_load(argv[1], NULL, &model);
  if (st != MOELITE_OK) return fail_with(st, "loading");

  decoder d;
  memset(&d, 0, sizeof d);
  d.model = model;
  d.n_vocab = (int32_t)moelite_model_get(model, MOELITE_MODEL_N_VOCAB);
  d.piece = calloc((size_t)d.n_vocab, sizeof *d.piece);
  d.len = calloc((size_t)d.n_vocab, sizeof *d.len);
  for (int32_t t = 0; t < d.n_vocab && st == MOELITE_OK; ++t) {
    char buf[256];
    st = moelite_detokenize(model, &t, 1, 0, buf, sizeof buf, &d.len[t]);
    if (st == MOELITE_ERR_BUFFER_TOO_SMALL) { /* a token this long is never needed here */
      d.len[t] = 0;
      st = MOELITE_OK;
      continue;
    }
    d.piece[t] = malloc(d.len[t] + 1);
    memcpy(d.piece[t], buf, d.len[t]);
  }

  moelite_context* ctx = NULL;
  if (st == MOELITE_OK) st = moelite_context_create(model, NULL, &ctx);
  moelite_generate_params* gen = moelite_generate_params_create();
  if (st == MOELITE_OK) st = moelite_generate_params_set_temperature(gen, 0.8f);
  if (st == MOELITE_OK) st = moelite_generate_params_set_seed(gen, seed);
  if (st == MOELITE_OK) st = moelite_generate_params_set_max_tokens(gen, 64);
  if (st == MOELITE_OK) st = moelite_generate_params_set_logits_callback(gen, mask_logits, &d);
  if (st == MOELITE_OK) st = moelite_generate_params_set_token_callback(gen, on_token, &d);
  const moelite_chat_message msgs[] = {{"user", "Describe a person as JSON with a name and an age."}};
  int32_t prompt[512], n_prompt = 0;
  if (st == MOELITE_OK) st = moelite_chat_tokenize(model, msgs, 1, 1, prompt, 512, &n_prompt);
  moelite_generate_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  if (st == MOELITE_OK) st = moelite_generate_tokens(ctx, prompt, n_prompt, gen, &stats);
  int rc = 0;
  if (st != MOELITE_OK) {
    rc = fail_with(st, "generating");
  } else {
    const int ok = stats.stop_reason == MOELITE_STOP_END_TOKEN && valid_json(d.out);
    printf("%s\n", d.out);
    fprintf(stderr, "%d tokens, %s\n", stats.n_generated_tokens, ok ? "matches the schema" : "DOES NOT match the schema");
    rc = ok ? 0 : 1;
  }
  for (int32_t t = 0; t < d.n_vocab; ++t) free(d.piece[t]);
  free(d.piece);
  free(d.len);
  moelite_generate_params_free(gen);
  moelite_context_free(ctx);
  moelite_model_free(model);
  return rc;
}
