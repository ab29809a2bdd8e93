// A context is used by one thread at a time, and the library checks it (include/moelite.h,
// Threads): while one thread is inside a call on a context, every call of another thread on that
// context, or on a queue over it, returns MOELITE_ERR_BUSY at once and changes nothing; the
// functions without a status do nothing (or give NULL). The first thread's call is not
// disturbed: its output equals a run without the intruder. A callback of the running call may
// still use the context on its own thread.
//
// Deterministic: the first thread parks inside its generation's piece callback (or a queue
// step's) until the second has made every call, so there is no timing window to hit or miss.
//
// Usage: moelite_context_busy MODEL.gguf   (exit 0 on success; prints what failed otherwise)
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "moelite.h"

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  fprintf(stderr, "FAIL: %s\n", what.c_str());
  g_failures++;
}

const char kPrompt[] = "def f(x):";

// One thread parks in a callback until the other lets it go.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool parked = false, released = false;

  void park() {
    std::unique_lock<std::mutex> lock(mu);
    parked = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  }
  void wait_parked() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return parked; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  }
};

struct Run {
  std::string text;
  Gate* gate = nullptr;  // parks at the first piece when set
  moelite_context* ctx = nullptr;
  moelite_status reentry = MOELITE_ERR_INTERNAL;  // a call on ctx from inside the callback
};

int on_piece(const char* piece, size_t len, void* user) {
  Run* r = static_cast<Run*>(user);
  const bool first = r->text.empty();
  r->text.append(piece, len);
  if (first && r->gate) {
    int32_t n = 0;
    r->reentry = moelite_context_get_tokens(r->ctx, nullptr, 0, &n);  // its own thread: allowed
    if (r->reentry == MOELITE_ERR_BUFFER_TOO_SMALL) r->reentry = MOELITE_OK;
    r->gate->park();
  }
  return 1;
}

moelite_generate_params* greedy(Run* run, int32_t max_tokens) {
  moelite_generate_params* p = moelite_generate_params_create();
  moelite_generate_params_set_temperature(p, 0.0f);
  moelite_generate_params_set_max_tokens(p, max_tokens);
  moelite_generate_params_set_callback(p, on_piece, run);
  return p;
}

moelite_context* new_context(moelite_model* m, int32_t n_seq) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_ctx(cp, 128);
  moelite_context_params_set_n_seq(cp, n_seq);
  moelite_context* c = nullptr;
  check(moelite_context_create(m, cp, &c) == MOELITE_OK, "context create");
  moelite_context_params_free(cp);
  return c;
}

bool busy(moelite_status st, const char* what) {
  const bool ok = st == MOELITE_ERR_BUSY && strstr(moelite_last_error(), "another thread") != nullptr;
  check(ok, std::string(what) + ": want MOELITE_ERR_BUSY, got " + moelite_status_name(st) + " (" + moelite_last_error() + ")");
  return ok;
}

int abort_never(void*) { return 0; }

// Every call of this thread on `c` while another thread is inside a call on it.
void intrude(moelite_context* c, moelite_model* m, const std::string& where) {
  const int32_t tok = 1, seq = 0;
  busy(moelite_eval(c, &tok, 1, 0), (where + " eval").c_str());
  busy(moelite_eval_batch(c, &tok, &seq, nullptr, 1), (where + " eval_batch").c_str());
  moelite_generate_stats stats;
  memset(&stats, 0x55, sizeof stats);
  stats.struct_size = sizeof stats;
  Run other;
  moelite_generate_params* p = greedy(&other, 4);
  busy(moelite_generate(c, kPrompt, strlen(kPrompt), p, &stats), (where + " generate").c_str());
  check(stats.n_generated_tokens == 0 && stats.n_prompt_tokens == 0 && stats.stop_reason == MOELITE_STOP_ERROR,
        where + ": a refused generation's stats say nothing was done");
  busy(moelite_generate_tokens(c, &tok, 1, p, nullptr), (where + " generate_tokens").c_str());
  check(other.text.empty(), where + ": a refused generation produced text");
  moelite_generate_params_free(p);
  int32_t n = -7;
  busy(moelite_context_get_tokens(c, nullptr, 0, &n), (where + " get_tokens").c_str());
  check(n == -7, where + ": a refused get_tokens wrote its count");
  char path[] = "/tmp/moelite-busy-XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  unlink(path);
  busy(moelite_context_save(c, path), (where + " save").c_str());
  check(access(path, F_OK) != 0, where + ": a refused save wrote a file");
  busy(moelite_context_load(c, path), (where + " load").c_str());
  busy(moelite_context_seq_truncate(c, 0, 0), (where + " seq_truncate").c_str());
  moelite_expert_stats es;
  memset(&es, 0, sizeof es);
  es.struct_size = sizeof es;
  busy(moelite_context_expert_stats(c, -1, &es), (where + " expert_stats").c_str());
  busy(moelite_context_set_abort_callback(c, abort_never, nullptr), (where + " set_abort_callback").c_str());
  moelite_sampler* s = nullptr;
  check(moelite_sampler_create(nullptr, &s) == MOELITE_OK, "sampler create");
  int32_t drawn = -7;
  busy(moelite_sampler_sample(s, c, -1, &drawn), (where + " sampler_sample").c_str());
  check(drawn == -7, where + ": a refused sample wrote a token");
  moelite_sampler_free(s);
  moelite_queue* q = nullptr;
  busy(moelite_queue_create(c, &q), (where + " queue_create").c_str());
  check(q == nullptr, where + ": a refused queue_create made a queue");
  check(moelite_get_logits(c, -1) == nullptr, where + ": get_logits while another thread evaluates");
  // No status to report: these do nothing (the running call's output, checked by the caller,
  // shows that they did not cut its cache).
  moelite_context_kv_reset(c);
  moelite_context_kv_truncate(c, 0);
  moelite_context_reset_expert_stats(c);
  // The model is not the context: its functions stay open to every thread.
  int32_t ids[8];
  check(moelite_tokenize(m, "x", 1, 0, ids, 8, &n) == MOELITE_OK, where + ": the model's tokenizer is refused");
}

std::string generate_alone(moelite_model* m, int32_t max_tokens) {
  moelite_context* c = new_context(m, 1);
  Run run;
  moelite_generate_params* p = greedy(&run, max_tokens);
  check(moelite_generate(c, kPrompt, strlen(kPrompt), p, nullptr) == MOELITE_OK, "reference generation");
  moelite_generate_params_free(p);
  moelite_context_free(c);
  return run.text;
}

void generation_holds_its_context(moelite_model* m) {
  const std::string want = generate_alone(m, 16);
  check(!want.empty(), "the reference generation produced text");
  moelite_context* c = new_context(m, 1);
  Gate gate;
  Run run;
  run.gate = &gate;
  run.ctx = c;
  moelite_status st = MOELITE_ERR_INTERNAL;
  std::thread first([&] {
    moelite_generate_params* p = greedy(&run, 16);
    st = moelite_generate(c, kPrompt, strlen(kPrompt), p, nullptr);
    moelite_generate_params_free(p);
  });
  gate.wait_parked();
  intrude(c, m, "during a generation");
  gate.release();
  first.join();
  check(st == MOELITE_OK, std::string("the first thread's generation: ") + moelite_status_name(st));
  check(run.reentry == MOELITE_OK, "a callback's call on its own context was refused");
  check(run.text == want, "the first thread's text differs from a generation alone: '" + run.text + "' vs '" + want + "'");
  // Its turn is over: this thread may use the context now.
  const int32_t tok = 1;
  check(moelite_eval(c, &tok, 1, 0) == MOELITE_OK, "eval after the other thread's call returned");
  check(moelite_get_logits(c, -1) != nullptr, "logits after the other thread's call returned");
  moelite_context_free(c);
}

void queue_step_holds_its_context(moelite_model* m) {
  const std::string want = generate_alone(m, 8);
  moelite_context* c = new_context(m, 2);
  moelite_queue* q = nullptr;
  check(moelite_queue_create(c, &q) == MOELITE_OK, "queue create");
  int32_t ids[64], n = 0;
  check(moelite_tokenize(m, kPrompt, strlen(kPrompt), MOELITE_TOKENIZE_ADD_SPECIAL | MOELITE_TOKENIZE_PARSE_SPECIAL,
                         ids, 64, &n) == MOELITE_OK,
        "tokenize the prompt");
  Gate gate;
  Run run;
  run.gate = &gate;
  run.ctx = c;
  moelite_generate_params* p = greedy(&run, 8);
  int64_t id = -1;
  check(moelite_queue_add(q, ids, n, p, &id) == MOELITE_OK, "queue add");
  moelite_status st = MOELITE_ERR_INTERNAL;
  std::thread first([&] {
    st = MOELITE_OK;
    while (st == MOELITE_OK && moelite_queue_waiting(q) + moelite_queue_running(q) > 0) st = moelite_queue_step(q, nullptr);
  });
  gate.wait_parked();
  int64_t other = -1;
  busy(moelite_queue_add(q, ids, n, p, &other), "queue_add during a step");
  check(other == -1, "a refused queue_add gave an id");
  busy(moelite_queue_step(q, nullptr), "queue_step during a step");
  busy(moelite_queue_cancel(q, id), "queue_cancel during a step");
  busy(moelite_queue_remove(q, id), "queue_remove during a step");
  int32_t state = 0;
  busy(moelite_queue_request_state(q, id, &state), "queue_request_state during a step");
  size_t len = 0;
  busy(moelite_queue_request_text(q, id, nullptr, 0, &len), "queue_request_text during a step");
  intrude(c, m, "during a queue step");
  gate.release();
  first.join();
  check(st == MOELITE_OK, std::string("the first thread's steps: ") + moelite_status_name(st));
  check(run.text == want, "the queued request's text differs from a generation alone: '" + run.text + "' vs '" + want + "'");
  moelite_generate_params_free(p);
  moelite_queue_free(q);
  moelite_context_free(c);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  check(strcmp(moelite_status_name(MOELITE_ERR_BUSY), "MOELITE_ERR_BUSY") == 0, "the status's name");
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model_params_set_backend(mp, MOELITE_BACKEND_CPU);
  moelite_model_params_set_threads(mp, 1);
  moelite_model* m = nullptr;
  const moelite_status st = moelite_model_load(argv[1], mp, &m);
  moelite_model_params_free(mp);
  if (st != MOELITE_OK) {
    fprintf(stderr, "FAIL: load %s: %s\n", argv[1], moelite_last_error());
    return 1;
  }
  generation_holds_its_context(m);
  queue_step_holds_its_context(m);
  moelite_model_free(m);
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("context_busy: ok\n");
  return 0;
}
