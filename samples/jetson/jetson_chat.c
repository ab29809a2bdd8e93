/* jetson_chat.c — a voice-assistant-style chat loop for Jetson boards (and any other machine):
 * one line of text in (what a speech recogniser would hand over), the reply streamed out piece by
 * piece (what a speech synthesiser would consume), with the numbers that matter on a small board.
 *
 *   jetson_chat MODEL.gguf [options] < questions.txt       (or interactively: type, Enter)
 *
 * It shows the three things an embedded app has to get right with moelite:
 *   1. Let the SDK choose: backend AUTO (CUDA on a Jetson when built with it, a Vulkan GPU, else the
 *      CPU) and an expert budget sized from the memory available at load time
 *      (moelite_model_params_set_expert_budget_auto) rather than a number guessed for one board.
 *   2. Report what the user feels and what explains it: time to first token, tokens/s, and the
 *      expert store's hit rate (misses are reads from flash).
 *   3. Live with other apps: before every turn it reads the memory available now
 *      (moelite_platform_get); when that has fallen below --min-free, it reloads the model with a
 *      budget smaller by the shortfall (never below the model's minimum working set), keeping the
 *      conversation. Results do not change with the budget; only speed does.
 *
 * Commands: an empty line is ignored, "/reset" forgets the conversation, "/quit" (or end of input)
 * ends.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moelite.h"

#define MIB (1024.0 * 1024.0)

typedef struct options {
  const char* model_path;
  moelite_backend backend;
  uint64_t headroom_bytes; /* left free for the rest of the system at every load */
  uint64_t min_free_bytes; /* below this much available memory, shrink the budget */
  int32_t max_tokens;
  int32_t n_ctx;
  const char* system_prompt;
  /* --assume-available: MemAvailable readings to use in turn instead of the platform's, to
   * rehearse the memory-pressure path on a machine that has plenty. */
  int64_t assumed[16];
  int n_assumed, next_assumed;
} options;

typedef struct session {
  moelite_model* model;
  moelite_context* ctx;
  uint64_t budget; /* expert budget in use; the experts' total when all are resident */
} session;

/* The conversation so far, owned copies. */
typedef struct conversation {
  moelite_chat_message* messages;
  char** owned;
  size_t n, capacity;
} conversation;

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s MODEL.gguf [--backend auto|cpu|vulkan|cuda] [--headroom MiB] [--min-free MiB]\n"
          "          [--max-tokens N] [--ctx N] [--system TEXT] [--assume-available MiB,MiB,...]\n",
          argv0);
}

static int parse_mib(const char* text, uint64_t* out) {
  char* end = NULL;
  double v = strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= 0.0) || v > 1e9) return 0;
  *out = (uint64_t)(v * MIB);
  return 1;
}

static int parse_options(int argc, char** argv, options* o) {
  memset(o, 0, sizeof *o);
  o->backend = MOELITE_BACKEND_AUTO;
  o->headroom_bytes = 256ull << 20;
  o->min_free_bytes = 128ull << 20;
  o->max_tokens = 128;
  o->n_ctx = 2048;
  o->system_prompt = "You are a helpful assistant running on a small device. Answer briefly.";
  if (argc < 2 || argv[1][0] == '-') return 0;
  o->model_path = argv[1];
  for (int i = 2; i < argc; ++i) {
    const char* arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : NULL;
    if (!value) return 0;
    ++i;
    if (strcmp(arg, "--backend") == 0) {
      if (strcmp(value, "auto") == 0) o->backend = MOELITE_BACKEND_AUTO;
      else if (strcmp(value, "cpu") == 0) o->backend = MOELITE_BACKEND_CPU;
      else if (strcmp(value, "vulkan") == 0) o->backend = MOELITE_BACKEND_VULKAN;
      else if (strcmp(value, "cuda") == 0) o->backend = MOELITE_BACKEND_CUDA;
      else return 0;
    } else if (strcmp(arg, "--headroom") == 0) {
      if (!parse_mib(value, &o->headroom_bytes)) return 0;
    } else if (strcmp(arg, "--min-free") == 0) {
      if (!parse_mib(value, &o->min_free_bytes)) return 0;
    } else if (strcmp(arg, "--max-tokens") == 0) {
      o->max_tokens = atoi(value);
      if (o->max_tokens <= 0) return 0;
    } else if (strcmp(arg, "--ctx") == 0) {
      o->n_ctx = atoi(value);
      if (o->n_ctx <= 0) return 0;
    } else if (strcmp(arg, "--system") == 0) {
      o->system_prompt = value;
    } else if (strcmp(arg, "--assume-available") == 0) {
      char* copy = strdup(value);
      if (!copy) return 0;
      for (char* tok = strtok(copy, ","); tok && o->n_assumed < 16; tok = strtok(NULL, ",")) {
        uint64_t bytes = 0;
        if (!parse_mib(tok, &bytes)) {
          free(copy);
          return 0;
        }
        o->assumed[o->n_assumed++] = (int64_t)bytes;
      }
      free(copy);
    } else {
      return 0;
    }
  }
  return 1;
}

static int64_t available_now(options* o) {
  if (o->next_assumed < o->n_assumed) return o->assumed[o->next_assumed++];
  return moelite_platform_get(MOELITE_PLATFORM_MEM_AVAILABLE_BYTES);
}

static void close_session(session* s) {
  moelite_context_free(s->ctx);
  moelite_model_free(s->model);
  s->ctx = NULL;
  s->model = NULL;
}

/* Loads the model with backend `o->backend` and either an automatically sized budget
 * (explicit_budget 0) or the given one, then creates a context. */
static moelite_status open_session(const options* o, uint64_t explicit_budget, session* s) {
  moelite_model_params* params = moelite_model_params_create();
  moelite_context_params* cparams = moelite_context_params_create();
  moelite_status st = params && cparams ? MOELITE_OK : MOELITE_ERR_OUT_OF_MEMORY;
  if (st == MOELITE_OK) st = moelite_model_params_set_backend(params, o->backend);
  if (st == MOELITE_OK)
    st = explicit_budget ? moelite_model_params_set_expert_budget(params, explicit_budget)
                         : moelite_model_params_set_expert_budget_auto(params, o->headroom_bytes);
  if (st == MOELITE_OK) st = moelite_model_load(o->model_path, params, &s->model);
  if (st == MOELITE_OK) st = moelite_context_params_set_n_ctx(cparams, o->n_ctx);
  if (st == MOELITE_OK) st = moelite_context_create(s->model, cparams, &s->ctx);
  moelite_context_params_free(cparams);
  moelite_model_params_free(params);
  if (st != MOELITE_OK) {
    close_session(s);
    return st;
  }
  const int64_t budget = moelite_model_get(s->model, MOELITE_MODEL_EXPERT_BUDGET);
  const int64_t experts = moelite_model_get(s->model, MOELITE_MODEL_EXPERT_BYTES);
  s->budget = budget > 0 ? (uint64_t)budget : (uint64_t)experts;
  printf("[model %s | backend %s | experts %.1f MiB, budget %.1f MiB%s]\n", moelite_model_name(s->model),
         moelite_model_backend_name(s->model), experts / MIB, s->budget / MIB,
         moelite_model_get(s->model, MOELITE_MODEL_EXPERTS_ALL_FIT) > 0 ? " (every expert fits)" : "");
  return MOELITE_OK;
}

/* Shrinks the budget by the shortfall below --min-free and reloads; the conversation is kept (the
 * next turn re-reads it into the new context's cache). */
static moelite_status relieve_pressure(const options* o, int64_t available, session* s) {
  const uint64_t shortfall = o->min_free_bytes - (uint64_t)available;
  int64_t minimum = moelite_model_get(s->model, MOELITE_MODEL_EXPERT_MIN_BUDGET);
  if (minimum <= 0) minimum = 1;
  const uint64_t target = s->budget > shortfall + (uint64_t)minimum ? s->budget - shortfall : (uint64_t)minimum;
  printf("[memory pressure: %.1f MiB available < %.1f MiB; expert budget %.1f -> %.1f MiB]\n", available / MIB,
         o->min_free_bytes / MIB, s->budget / MIB, target / MIB);
  if (target >= s->budget) {
    printf("[already at the minimum working set; continuing]\n");
    return MOELITE_OK;
  }
  close_session(s);  /* free first: the point is to give memory back */
  return open_session(o, target, s);
}

static moelite_status add_message(conversation* c, const char* role, const char* content) {
  if (c->n == c->capacity) {
    size_t capacity = c->capacity ? 2 * c->capacity : 8;
    moelite_chat_message* m = realloc(c->messages, capacity * sizeof *m);
    if (!m) return MOELITE_ERR_OUT_OF_MEMORY;
    c->messages = m;
    char** owned = realloc(c->owned, capacity * sizeof *owned);
    if (!owned) return MOELITE_ERR_OUT_OF_MEMORY;
    c->owned = owned;
    c->capacity = capacity;
  }
  char* copy = strdup(content);
  if (!copy) return MOELITE_ERR_OUT_OF_MEMORY;
  c->owned[c->n] = copy;
  c->messages[c->n].role = role; /* string literals */
  c->messages[c->n].content = copy;
  c->n++;
  return MOELITE_OK;
}

static void truncate_conversation(conversation* c, size_t keep) {
  while (c->n > keep) free(c->owned[--c->n]);
}

/* The reply as it streams: printed at once and kept for the conversation. */
typedef struct reply {
  char* text;
  size_t len, capacity;
} reply;

static int on_piece(const char* piece, size_t len, void* user_data) {
  reply* r = (reply*)user_data;
  fwrite(piece, 1, len, stdout);
  fflush(stdout);
  if (r->len + len + 1 > r->capacity) {
    size_t capacity = (r->len + len + 1) * 2;
    char* text = realloc(r->text, capacity);
    if (!text) return 0; /* stop generating rather than lose track of the reply */
    r->text = text;
    r->capacity = capacity;
  }
  memcpy(r->text + r->len, piece, len);
  r->len += len;
  r->text[r->len] = '\0';
  return 1;
}

/* The conversation as tokens. moelite_chat_tokenize keeps what the user typed as text: a message
 * that spells a template marker ("<|im_end|>") cannot start a turn of its own. */
static moelite_status tokenize_prompt(const moelite_model* model, const conversation* c, int32_t** out, int32_t* n) {
  int32_t capacity = 1024;
  for (;;) {
    int32_t* ids = malloc((size_t)capacity * sizeof *ids);
    if (!ids) return MOELITE_ERR_OUT_OF_MEMORY;
    moelite_status st = moelite_chat_tokenize(model, c->messages, c->n, 1, ids, capacity, n);
    if (st == MOELITE_OK) {
      *out = ids;
      return MOELITE_OK;
    }
    free(ids);
    if (st != MOELITE_ERR_BUFFER_TOO_SMALL) return st;
    capacity = *n;
  }
}

/* One turn: tokenize the conversation, stream the reply, print the turn's numbers. */
static moelite_status answer(const options* o, session* s, conversation* c) {
  int32_t* prompt = NULL;
  int32_t n_prompt = 0;
  moelite_status st = tokenize_prompt(s->model, c, &prompt, &n_prompt);
  if (st != MOELITE_OK) return st;
  moelite_generate_params* gen = moelite_generate_params_create();
  reply r = {0};
  moelite_generate_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  moelite_expert_stats before, after;
  memset(&before, 0, sizeof before);
  memset(&after, 0, sizeof after);
  before.struct_size = after.struct_size = sizeof before;
  /* This context's own counters: other contexts of the model would not disturb them. */
  moelite_context_expert_stats(s->ctx, -1, &before);

  st = gen ? MOELITE_OK : MOELITE_ERR_OUT_OF_MEMORY;
  if (st == MOELITE_OK) st = moelite_generate_params_set_max_tokens(gen, o->max_tokens);
  if (st == MOELITE_OK) st = moelite_generate_params_set_temperature(gen, 0.0f); /* greedy: reproducible */
  if (st == MOELITE_OK) st = moelite_generate_params_set_callback(gen, on_piece, &r);
  printf("assistant: ");
  if (st == MOELITE_OK) st = moelite_generate_tokens(s->ctx, prompt, n_prompt, gen, &stats);
  printf("\n");
  moelite_context_expert_stats(s->ctx, -1, &after);
  /* A full context ends the answer early; what was said stands, and the next turn starts over. */
  const int context_full = st == MOELITE_ERR_CONTEXT_FULL && stats.stop_reason == MOELITE_STOP_CONTEXT_FULL;
  if (context_full) st = MOELITE_OK;
  if (st == MOELITE_OK) {
    const uint64_t asked = after.activations - before.activations;
    const uint64_t hits = after.hits - before.hits;
    printf("[ttft %.3f s | %d tokens at %.1f tok/s | prompt %d tokens at %.1f tok/s", stats.time_to_first_token_seconds,
           stats.n_generated_tokens, stats.generated_tokens_per_second, stats.n_prompt_tokens,
           stats.prompt_tokens_per_second);
    if (asked > 0)
      printf(" | experts hit %.1f%% (%" PRIu64 "/%" PRIu64 "), %.2f MiB read", 100.0 * (double)hits / (double)asked,
             hits, asked, (double)(after.bytes_read - before.bytes_read) / MIB);
    else
      printf(" | experts all resident");
    printf("]\n");
    if (context_full) {
      printf("[context full: forgetting the conversation]\n");
      truncate_conversation(c, 1);
      moelite_context_kv_reset(s->ctx);
    } else {
      st = add_message(c, "assistant", r.text ? r.text : "");
    }
  }
  free(r.text);
  free(prompt);
  moelite_generate_params_free(gen);
  return st;
}

int main(int argc, char** argv) {
  options o;
  if (!parse_options(argc, argv, &o)) {
    usage(argv[0]);
    return 2;
  }
  printf("[platform: %s, %.1f MiB available now%s]\n",
         moelite_platform_get(MOELITE_PLATFORM_IS_JETSON) > 0 ? "Jetson" : "not a Jetson",
         (double)moelite_platform_get(MOELITE_PLATFORM_MEM_AVAILABLE_BYTES) / MIB,
         moelite_platform_get(MOELITE_PLATFORM_UNIFIED_MEMORY) > 0 ? ", unified CPU/GPU memory" : "");
  session s = {0};
  conversation c = {0};
  moelite_status st = open_session(&o, 0, &s);
  if (st == MOELITE_OK) st = add_message(&c, "system", o.system_prompt);
  char line[4096];
  while (st == MOELITE_OK) {
    printf("> ");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) break;
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0') continue;
    if (strcmp(line, "/quit") == 0) break;
    if (strcmp(line, "/reset") == 0) {
      truncate_conversation(&c, 1);
      moelite_context_kv_reset(s.ctx);
      continue;
    }
    const int64_t available = available_now(&o);
    if (available >= 0 && (uint64_t)available < o.min_free_bytes) st = relieve_pressure(&o, available, &s);
    if (st == MOELITE_OK) st = add_message(&c, "user", line);
    if (st == MOELITE_OK) st = answer(&o, &s, &c);
  }
  if (st != MOELITE_OK) fprintf(stderr, "error: %s: %s\n", moelite_status_name(st), moelite_last_error());
  truncate_conversation(&c, 0);
  free(c.messages);
  free(c.owned);
  close_session(&s);
  return st == MOELITE_OK ? 0 : 1;
}
