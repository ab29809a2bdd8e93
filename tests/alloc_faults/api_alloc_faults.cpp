// Allocation failures through the public C API. This program replaces the global operator new so
// that the Nth allocation made by the calling thread after arming throws std::bad_alloc, and sweeps
// N over every allocation of each API call: load (mapped and budgeted), context creation, eval,
// generate, a batch of two sequences, saving and loading a session, a sampler driven by hand, a
// request queue run to its end, a trace, chat tokens, inspect, the platform report, a batch plan,
// generate_tokens, tokenize, detokenize, chat formatting and calibration. Each call must return a status
// (never let the exception through the C ABI, never crash), name the problem, and leave what it
// was given usable: the same call without the fault afterwards gives the clean run's results
// bitwise. Worker threads are not armed (the counters are thread-local), so the faults land on the
// API's own thread, where an escaping exception would cross into C.
//
// Usage: api_alloc_faults MODEL [WORK_DIR]. Prints one line per operation: allocations, faults
// injected, statuses seen. MOELITE_ALLOC_FAULTS_ALL=1 fails every allocation index instead of a
// sample; MOELITE_ALLOC_FAULTS_TRACE=N prints the stack of the failed allocation N;
// MOELITE_ALLOC_FAULTS_ONLY=NAME sweeps only the operation of that name.
#include <execinfo.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "moelite.h"

namespace {
thread_local long t_countdown = -1;  // allocations left before the fault; -1: unarmed
thread_local bool t_fired = false;
thread_local long t_count = 0;  // allocations since arming (for sizing the sweep)

// MOELITE_ALLOC_FAULTS_TRACE=N prints the stack of allocation N when it is failed (for addr2line).
void print_stack_if_asked(long n) {
  const char* want = getenv("MOELITE_ALLOC_FAULTS_TRACE");
  if (!want || atol(want) != n) return;
  void* frames[40];
  backtrace_symbols_fd(frames, backtrace(frames, 40), 2);
}

// True when this allocation is the one to fail (and records that it was).
bool fault_now() {
  if (t_countdown < 0) return false;
  ++t_count;
  if (t_countdown-- != 0) return false;
  t_fired = true;
  print_stack_if_asked(t_count - 1);
  return true;
}

void* checked(void* p, bool nothrow) {
  if (!p && !nothrow) throw std::bad_alloc();
  return p;
}

void* allocate(size_t n, bool nothrow) {
  if (fault_now()) return checked(nullptr, nothrow);
  return checked(malloc(n ? n : 1), nothrow);
}
void* allocate_aligned(size_t n, std::align_val_t al, bool nothrow) {
  if (fault_now()) return checked(nullptr, nothrow);
  const size_t a = static_cast<size_t>(al);
  return checked(aligned_alloc(a, (n + a - 1) / a * a), nothrow);
}
}  // namespace

void* operator new(size_t n) { return allocate(n, false); }
void* operator new[](size_t n) { return allocate(n, false); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate(n, true); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate(n, true); }
void* operator new(size_t n, std::align_val_t a) { return allocate_aligned(n, a, false); }
void* operator new[](size_t n, std::align_val_t a) { return allocate_aligned(n, a, false); }
void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }
void operator delete[](void* p, size_t) noexcept { free(p); }
void operator delete(void* p, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { free(p); }

namespace {

int g_failures = 0;
#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      ++g_failures;                                                   \
    }                                                                 \
  } while (0)

// The allocation indices to fail: all of the first 100, then every ~12 % further, to the end.
// MOELITE_ALLOC_FAULTS_ALL=1: every allocation (slow; for a thorough run by hand).
// In the ASan + UBSan build (MOELITE_TEST_SANITIZED), where each run of an operation costs several
// times as much: of the first 100 only every other one, the even indices for one operation and the
// odd ones for the next, so both kinds of index are failed in the sweep as a whole.
std::vector<long> sweep_points(long total) {
  static int operations = 0;
  constexpr long step = MOELITE_TEST_SANITIZED ? 2 : 1;
  const long first = step == 2 ? operations++ % 2 : 0;
  std::vector<long> points;
  if (getenv("MOELITE_ALLOC_FAULTS_ALL")) {
    for (long n = 0; n < total; ++n) points.push_back(n);
    return points;
  }
  for (long n = first; n < total; n = n < 100 ? n + step : n + std::max(1L, n / 8)) points.push_back(n);
  return points;
}

long g_current_n = -1;

// The harness's own allocations in an armed operation (its bookkeeping, not the library's) are
// not counted or failed while one of these lives.
struct Unarmed {
  long saved = t_countdown;
  Unarmed() { t_countdown = -1; }
  ~Unarmed() { t_countdown = saved; }
};

// What an operation returns when a *_params_create gave NULL (it has no status of its own).
constexpr moelite_status kNullHandle = static_cast<moelite_status>(-1);  // the allocation being failed, for messages

// Runs `op` with the Nth allocation failing for every N of the sweep; `op` returns its status and
// must undo its own effects (free what it created). `check_clean` then runs it unarmed.
void sweep(const char* name, const std::function<moelite_status()>& op, const std::function<void()>& check_clean) {
  if (const char* only = getenv("MOELITE_ALLOC_FAULTS_ONLY"); only && strcmp(only, name) != 0) return;
  t_countdown = 1L << 40, t_count = 0, t_fired = false;  // count a clean run's allocations
  moelite_status clean = op();
  t_countdown = -1;
  const long total = t_count;
  CHECK(clean == MOELITE_OK, "%s: clean run failed: %s", name, moelite_last_error());
  std::map<std::string, int> seen;
  int injected = 0;
  for (long n : sweep_points(total)) {
    t_countdown = n, t_count = 0, t_fired = false, g_current_n = n;
    moelite_status st = op();
    t_countdown = -1;
    if (!t_fired) continue;
    ++injected;
    if (st == kNullHandle) {  // a create function returned NULL, as documented: nothing to check
      seen["NULL from *_create"]++;
      continue;
    }
    seen[moelite_status_name(st)]++;
    // A fault may be absorbed (a fallback path) and give OK; if not, it must be reported as such.
    if (st != MOELITE_OK) {
      CHECK(st == MOELITE_ERR_OUT_OF_MEMORY || st == MOELITE_ERR_SYSTEM_LIMIT, "%s: allocation %ld failed -> %s (%s)",
            name, n, moelite_status_name(st), moelite_last_error());
      CHECK(moelite_last_error()[0] != '\0', "%s: no message for allocation %ld", name, n);
    }
    check_clean();
  }
  std::string statuses;
  for (const auto& kv : seen) statuses += " " + kv.first + "=" + std::to_string(kv.second);
  printf("%-28s %6ld allocations, %4d faults injected:%s\n", name, total, injected, statuses.c_str());
  fflush(stdout);
}

moelite_model* load(const char* path, uint64_t budget) {
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_threads(p, 2);
  if (budget) {
    moelite_model_params_set_expert_budget(p, budget);
    moelite_model_params_set_predictor(p, "next-gate");
  }
  moelite_model* m = nullptr;
  moelite_status st = moelite_model_load(path, p, &m);
  moelite_model_params_free(p);
  return st == MOELITE_OK ? m : nullptr;
}

// A context of two sequences of 64 positions (unarmed; NULL and a failed check if it cannot be made).
moelite_context* two_sequence_context(moelite_model* model, const char* what) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_seq(cp, 2);
  moelite_context_params_set_n_ctx(cp, 64);
  moelite_context* c = nullptr;
  CHECK(moelite_context_create(model, cp, &c) == MOELITE_OK, "%s context: %s", what, moelite_last_error());
  moelite_context_params_free(cp);
  return c;
}

std::vector<float> eval_logits(moelite_context* c, const std::vector<int32_t>& tokens, int32_t n_vocab) {
  moelite_context_kv_reset(c);
  if (moelite_eval(c, tokens.data(), static_cast<int32_t>(tokens.size()), 0) != MOELITE_OK) return {};
  const float* l = moelite_get_logits(c, -1);
  return std::vector<float>(l, l + n_vocab);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL [WORK_DIR]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  const std::string work = argc > 2 ? argv[2] : "/tmp";
  moelite_model* model = load(path, 0);
  if (!model) {
    fprintf(stderr, "cannot load %s: %s\n", path, moelite_last_error());
    return 1;
  }
  const int32_t n_vocab = static_cast<int32_t>(moelite_model_get(model, MOELITE_MODEL_N_VOCAB));
  const uint64_t budget = static_cast<uint64_t>(moelite_model_get(model, MOELITE_MODEL_EXPERT_BYTES)) / 2;
  const std::vector<int32_t> tokens = {1, 17, 42, 99, 5, 250, 7, 3};
  moelite_context* ctx = nullptr;
  moelite_context_create(model, nullptr, &ctx);
  const std::vector<float> reference = eval_logits(ctx, tokens, n_vocab);
  if (reference.empty()) {
    fprintf(stderr, "clean eval failed: %s\n", moelite_last_error());
    return 1;
  }

  for (uint64_t b : {uint64_t{0}, budget}) {
    sweep(
        b ? "load (budget)" : "load",
        [&] {
          moelite_model_params* p = moelite_model_params_create();
          if (!p) return kNullHandle;
          moelite_status st = moelite_model_params_set_threads(p, 2);
          if (st == MOELITE_OK && b) st = moelite_model_params_set_expert_budget(p, b);
          if (st == MOELITE_OK && b) st = moelite_model_params_set_predictor(p, "next-gate");
          moelite_model* m = nullptr;
          if (st == MOELITE_OK) st = moelite_model_load(path, p, &m);
          moelite_model_params_free(p);
          moelite_model_free(m);
          return st;
        },
        [] {});
  }

  sweep(
      "context_create",
      [&] {
        moelite_context* c = nullptr;
        moelite_status st = moelite_context_create(model, nullptr, &c);
        moelite_context_free(c);
        return st;
      },
      [] {});

  for (uint64_t b : {uint64_t{0}, budget}) {
    moelite_model* m = b ? load(path, b) : model;
    moelite_context* c = nullptr;
    CHECK(m && moelite_context_create(m, nullptr, &c) == MOELITE_OK, "setup: %s", moelite_last_error());
    if (!c) continue;
    sweep(
        b ? "eval (budget)" : "eval",
        [&] {
          moelite_context_kv_reset(c);
          return moelite_eval(c, tokens.data(), static_cast<int32_t>(tokens.size()), 0);
        },
        [&] {
          const std::vector<float> again = eval_logits(c, tokens, n_vocab);
          CHECK(again == reference, "eval after a fault at allocation %ld differs from the clean run", g_current_n);
        });
    moelite_context_free(c);
    if (b) moelite_model_free(m);
  }

  {
    moelite_generate_params* gp = moelite_generate_params_create();
    moelite_generate_params_set_max_tokens(gp, 6);
    moelite_generate_params_set_temperature(gp, 0.0f);
    std::string out;
    moelite_generate_params_set_callback(
        gp,
        [](const char* piece, size_t n, void* user) {
          static_cast<std::string*>(user)->append(piece, n);
          return 1;
        },
        &out);
    auto gen = [&] {
      out.clear();
      moelite_context_kv_reset(ctx);
      return moelite_generate(ctx, "The open() function returns", 27, gp, nullptr);
    };
    gen();
    const std::string clean = out;
    sweep("generate", gen, [&] {
      gen();
      CHECK(out == clean, "generate after a fault gave '%s', clean '%s'", out.c_str(), clean.c_str());
    });
    moelite_generate_params_free(gp);
  }

  {
    // Several sequences in one batch, and a saved session: a failed call leaves every sequence as
    // it was (the header's promise), a failed save leaves the file that was there, a failed load
    // the context.
    moelite_context* bc = two_sequence_context(model, "batch");
    const std::vector<int32_t> start = {1, 17, 42, 99, 1, 5};  // 4 tokens of sequence 0, 2 of 1
    const std::vector<int32_t> start_seqs = {0, 0, 0, 0, 1, 1};
    const std::vector<int32_t> more = {7, 3, 250, 8};
    const std::vector<int32_t> more_seqs = {1, 0, 1, 1};
    // Empties both sequences and evaluates `toks` into them (unarmed).
    auto set_state = [&](const std::vector<int32_t>& toks, const std::vector<int32_t>& seqs, const char* what) {
      Unarmed u;
      for (int32_t s = 0; s < 2; ++s) moelite_context_seq_truncate(bc, s, 0);
      const moelite_status st =
          moelite_eval_batch(bc, toks.data(), seqs.data(), nullptr, static_cast<int32_t>(toks.size()));
      CHECK(st == MOELITE_OK, "%s after allocation %ld: %s", what, g_current_n, moelite_last_error());
    };
    auto reset_to_start = [&] { set_state(start, start_seqs, "start"); };
    auto logits_of = [&](int32_t row) {
      Unarmed u;
      const float* l = moelite_get_logits(bc, row);
      return l ? std::vector<float>(l, l + n_vocab) : std::vector<float>();
    };
    reset_to_start();
    CHECK(moelite_eval_batch(bc, more.data(), more_seqs.data(), nullptr, 4) == MOELITE_OK, "clean batch");
    const std::vector<float> clean0 = logits_of(1), clean1 = logits_of(3);
    sweep(
        "eval_batch",
        [&] {
          reset_to_start();
          return moelite_eval_batch(bc, more.data(), more_seqs.data(), nullptr, 4);
        },
        [&] {
          if (moelite_context_seq_length(bc, 0) == 5) return;  // it succeeded (the fault was absorbed)
          CHECK(moelite_context_seq_length(bc, 0) == 4 && moelite_context_seq_length(bc, 1) == 2,
                "sequences changed by a failed batch (allocation %ld): %d, %d", g_current_n,
                moelite_context_seq_length(bc, 0), moelite_context_seq_length(bc, 1));
          CHECK(moelite_eval_batch(bc, more.data(), more_seqs.data(), nullptr, 4) == MOELITE_OK, "batch again");
          CHECK(logits_of(1) == clean0 && logits_of(3) == clean1,
                "the batch after a fault at allocation %ld differs from the clean run", g_current_n);
        });

    const std::string session = work + "/alloc-faults.session";
    auto save_start_state = [&] {
      reset_to_start();
      Unarmed u;
      CHECK(moelite_context_save(bc, session.c_str()) == MOELITE_OK, "save: %s", moelite_last_error());
    };
    // State B: other tokens (sequence 0 holds 1, sequence 1 holds 3); its continuation by one token.
    const int32_t next_tok = 5, next_seq = 0;
    auto go_to_state_b = [&] { set_state(more, more_seqs, "state B"); };
    go_to_state_b();
    CHECK(moelite_eval_batch(bc, &next_tok, &next_seq, nullptr, 1) == MOELITE_OK, "B continued");
    const std::vector<float> clean_b = logits_of(0);
    // The next batch from the saved start state equals the uninterrupted run's.
    auto check_start_state = [&](const char* what) {
      Unarmed u;
      CHECK(moelite_context_seq_length(bc, 0) == 4 && moelite_context_seq_length(bc, 1) == 2, "%s: lengths %d, %d",
            what, moelite_context_seq_length(bc, 0), moelite_context_seq_length(bc, 1));
      CHECK(moelite_eval_batch(bc, more.data(), more_seqs.data(), nullptr, 4) == MOELITE_OK, "%s: batch", what);
      CHECK(logits_of(1) == clean0 && logits_of(3) == clean1, "%s differs (allocation %ld)", what, g_current_n);
    };
    moelite_status last = MOELITE_OK;
    save_start_state();
    sweep(
        "session_save",
        [&] {
          save_start_state();  // the file a failed save must leave whole
          go_to_state_b();
          return last = moelite_context_save(bc, session.c_str());
        },
        [&] {
          if (last != MOELITE_OK) {  // the file there before is whole: it loads and continues exactly
            CHECK(moelite_context_load(bc, session.c_str()) == MOELITE_OK, "the old session after a failed save "
                  "(allocation %ld): %s", g_current_n, moelite_last_error());
            check_start_state("the old session after a failed save");
          }
        });
    save_start_state();
    sweep(
        "session_load",
        [&] {
          go_to_state_b();
          return last = moelite_context_load(bc, session.c_str());
        },
        [&] {
          if (last == MOELITE_OK) {
            check_start_state("a load that absorbed a fault");
            return;
          }
          Unarmed u;
          CHECK(moelite_context_seq_length(bc, 0) == 1 && moelite_context_seq_length(bc, 1) == 3,
                "a failed load (allocation %ld) changed the context: %d, %d", g_current_n,
                moelite_context_seq_length(bc, 0), moelite_context_seq_length(bc, 1));
          CHECK(moelite_eval_batch(bc, &next_tok, &next_seq, nullptr, 1) == MOELITE_OK, "B after a failed load");
          const std::vector<float> got = logits_of(0);
          CHECK(got == clean_b, "the context after a failed load (allocation %ld) continues differently", g_current_n);
        });
    moelite_context_free(bc);
    remove(session.c_str());
  }

  {
    // A sampler driven by hand: a failed accept or draw changes nothing (no token half-accepted into
    // the history, no random number spent), so trying again draws what the clean run drew.
    moelite_generate_params* gp = moelite_generate_params_create();
    moelite_generate_params_set_temperature(gp, 0.9f);
    moelite_generate_params_set_top_k(gp, 40);
    moelite_generate_params_set_repeat_penalty(gp, 1.5f, 8);
    moelite_generate_params_set_seed(gp, 3);
    std::vector<float> fixed(static_cast<size_t>(n_vocab));
    for (int32_t v = 0; v < n_vocab; ++v) fixed[static_cast<size_t>(v)] = static_cast<float>((v * 7919) % 101) / 25.0f;
    const int32_t prompt[] = {1, 17, 42, 99};
    std::vector<int32_t> drawn;
    auto run_sampler = [&]() -> moelite_status {
      moelite_sampler* sp = nullptr;
      {
        Unarmed u;
        drawn.clear();
        drawn.reserve(8);
        CHECK(moelite_sampler_create(gp, &sp) == MOELITE_OK, "sampler_create");
      }
      moelite_status first = MOELITE_OK;
      auto again = [&](auto&& call) {
        moelite_status st = call();
        if (st != MOELITE_OK) {
          if (first == MOELITE_OK) first = st;
          st = call();  // one fault per run: this one is clean
        }
        CHECK(st == MOELITE_OK, "sampler call after a fault: %s", moelite_last_error());
      };
      again([&] { return moelite_sampler_accept(sp, prompt, 4); });
      for (int k = 0; k < 6; ++k) {
        int32_t t = -1;
        again([&] { return moelite_sampler_sample_logits(sp, fixed.data(), n_vocab, &t); });
        drawn.push_back(t);
      }
      moelite_sampler_free(sp);
      return first;
    };
    run_sampler();
    const std::vector<int32_t> clean_drawn = drawn;
    sweep("sampler", run_sampler, [&] {
      CHECK(drawn == clean_drawn, "a sampler that failed at allocation %ld and went on drew other tokens", g_current_n);
    });
    moelite_generate_params_free(gp);
  }

  {
    // A timeline: a failed begin leaves no trace running; after a failed end the trace is stopped
    // and the file holds a whole trace (the empty one begin wrote, or the full one), never half.
    const std::string trace = work + "/alloc-faults.trace.json";
    auto whole_json_object = [&] {
      Unarmed u;
      FILE* f = fopen(trace.c_str(), "rb");
      if (!f) return false;
      std::string text;
      char buf[4096];
      for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
      fclose(f);
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      return text.size() > 2 && text.front() == '{' && text.back() == '}' && text.find("traceEvents") != std::string::npos;
    };
    moelite_status begin_st = MOELITE_OK;
    sweep(
        "trace",
        [&] {
          begin_st = moelite_model_trace_begin(model, trace.c_str());
          if (begin_st != MOELITE_OK) return begin_st;
          const moelite_status eval_st = moelite_eval(ctx, tokens.data(), 3, 0);
          const moelite_status end_st = moelite_model_trace_end(model);
          return eval_st != MOELITE_OK ? eval_st : end_st;
        },
        [&] {
          // No trace left running either way: ending one now has nothing to end.
          CHECK(moelite_model_trace_end(model) == MOELITE_ERR_INVALID_ARGUMENT,
                "a trace still runs after a fault at allocation %ld", g_current_n);
          if (begin_st == MOELITE_OK)
            CHECK(whole_json_object(), "the trace file after a fault at allocation %ld is not a whole trace", g_current_n);
          moelite_context_kv_reset(ctx);
        });
    remove(trace.c_str());

    // Pure calls: a fault gives a status, and the same call afterwards the clean answer.
    const moelite_chat_message msgs[] = {{"system", "Be brief."}, {"user", "What does open() return?"}};
    std::vector<int32_t> chat_ids(512), clean_chat;
    int32_t n_chat = 0;
    CHECK(moelite_chat_tokenize(model, msgs, 2, 1, chat_ids.data(), 512, &n_chat) == MOELITE_OK, "chat_tokenize");
    clean_chat.assign(chat_ids.begin(), chat_ids.begin() + n_chat);
    sweep(
        "chat_tokenize", [&] { return moelite_chat_tokenize(model, msgs, 2, 1, chat_ids.data(), 512, &n_chat); },
        [&] {
          CHECK(moelite_chat_tokenize(model, msgs, 2, 1, chat_ids.data(), 512, &n_chat) == MOELITE_OK &&
                    std::vector<int32_t>(chat_ids.begin(), chat_ids.begin() + n_chat) == clean_chat,
                "chat_tokenize after a fault");
        });
    sweep(
        "inspect",
        [&] {
          moelite_model* m = nullptr;
          const moelite_status st = moelite_model_inspect(path, &m);
          moelite_model_free(m);
          return st;
        },
        [] {});
    sweep(
        "platform_describe_json",
        [&] {
          char json[16384];
          size_t needed = 0;
          return moelite_platform_describe_json(json, sizeof json, &needed);
        },
        [] {});
    sweep(
        "plan_batch",
        [&] {
          moelite_plan_params* pp = moelite_plan_params_create();
          if (!pp) return kNullHandle;
          moelite_status st = moelite_plan_params_set_max_sequences(pp, 4);
          if (st == MOELITE_OK) st = moelite_plan_params_set_memory(pp, uint64_t{1} << 30);
          moelite_batch_plan* plan = nullptr;
          if (st == MOELITE_OK) st = moelite_plan_batch(model, nullptr, pp, &plan);
          moelite_batch_plan_free(plan);
          moelite_plan_params_free(pp);
          return st;
        },
        [] {});

    // The generation loop from token ids, with a stop string and a logit bias.
    moelite_generate_params* gp = moelite_generate_params_create();
    moelite_generate_params_set_max_tokens(gp, 8);
    moelite_generate_params_set_seed(gp, 5);
    moelite_generate_params_add_stop(gp, "zq");
    moelite_generate_params_set_logit_bias(gp, 42, -5.0f);
    std::string out;
    moelite_generate_params_set_callback(
        gp,
        [](const char* piece, size_t n, void* user) {
          Unarmed u;
          static_cast<std::string*>(user)->append(piece, n);
          return 1;
        },
        &out);
    auto gen = [&] {
      {
        Unarmed u;
        out.clear();
      }
      moelite_context_kv_reset(ctx);
      return moelite_generate_tokens(ctx, clean_chat.data(), static_cast<int32_t>(clean_chat.size()), gp, nullptr);
    };
    CHECK(gen() == MOELITE_OK, "generate_tokens: %s", moelite_last_error());
    const std::string clean_out = out;
    sweep("generate_tokens", gen, [&] {
      gen();
      CHECK(out == clean_out, "generate_tokens after a fault gave '%s', clean '%s'", out.c_str(), clean_out.c_str());
    });
    moelite_generate_params_free(gp);
  }

  {
    // A request queue: three requests (greedy, sampled, a repetition penalty) on two sequences,
    // stepped to the end. Whatever allocation fails (in an add, an admission, a step's evaluation
    // or its sampling), every request must end either exactly as in the clean run or with
    // MOELITE_STOP_ERROR having generated a prefix of the clean run's tokens: never a different
    // token (a request whose sequence and sampler fell out of step would continue wrongly).
    moelite_context* qc = two_sequence_context(model, "queue");
    moelite_generate_params* gps[3] = {moelite_generate_params_create(), moelite_generate_params_create(),
                                       moelite_generate_params_create()};
    for (moelite_generate_params* g : gps) moelite_generate_params_set_max_tokens(g, 5);
    moelite_generate_params_set_temperature(gps[0], 0.0f);
    moelite_generate_params_set_seed(gps[1], 11);
    moelite_generate_params_set_repeat_penalty(gps[2], 1.3f, 16);
    const std::vector<std::vector<int32_t>> prompts = {{1, 17, 42, 99}, {1, 5, 250}, {1, 17, 42, 7, 3}};
    struct Outcome {
      int32_t state = 0;
      std::vector<int32_t> tokens;
      std::string text;
    };
    std::vector<Outcome> outcome;
    auto run_queue = [&]() -> moelite_status {
      outcome.clear();
      std::vector<int64_t> ids;
      {
        Unarmed u;
        ids.reserve(prompts.size());
        outcome.reserve(prompts.size());
      }
      for (int32_t s = 0; s < 2; ++s) moelite_context_seq_truncate(qc, s, 0);
      moelite_queue* q = nullptr;
      moelite_status first = moelite_queue_create(qc, &q);
      if (first != MOELITE_OK) return first;
      auto note = [&](moelite_status st) {
        if (first == MOELITE_OK) first = st;
      };
      for (size_t i = 0; i < prompts.size(); ++i) {
        int64_t id = -1;
        moelite_status st = moelite_queue_add(q, prompts[i].data(), static_cast<int32_t>(prompts[i].size()), gps[i], &id);
        if (st != MOELITE_OK) {  // nothing was added: add it again (one fault per run)
          note(st);
          st = moelite_queue_add(q, prompts[i].data(), static_cast<int32_t>(prompts[i].size()), gps[i], &id);
        }
        CHECK(st == MOELITE_OK && id == static_cast<int64_t>(ids.size()), "queue add after a fault: %s",
              moelite_last_error());
        ids.push_back(id);
      }
      for (int guard = 0; moelite_queue_waiting(q) + moelite_queue_running(q) > 0; ++guard) {
        if (guard > 100) {
          CHECK(false, "the queue did not finish after a fault at allocation %ld", g_current_n);
          break;
        }
        int32_t n_events = 0;
        const moelite_status st = moelite_queue_step(q, &n_events);
        if (st != MOELITE_OK) note(st);  // nothing changed: the next step tries again
      }
      for (int64_t id : ids) {
        Unarmed u;
        Outcome o;
        CHECK(moelite_queue_request_state(q, id, &o.state) == MOELITE_OK, "state");
        int32_t n = 0;
        o.tokens.resize(64);
        CHECK(moelite_queue_request_tokens(q, id, o.tokens.data(), 64, &n) == MOELITE_OK, "tokens");
        o.tokens.resize(static_cast<size_t>(n));
        size_t len = 0;
        char text[1024];
        CHECK(moelite_queue_request_text(q, id, text, sizeof text, &len) == MOELITE_OK, "text");
        o.text.assign(text, len);
        outcome.push_back(o);
      }
      moelite_queue_free(q);
      return first;
    };
    CHECK(run_queue() == MOELITE_OK, "clean queue run: %s", moelite_last_error());
    const std::vector<Outcome> clean = outcome;
    sweep("queue", run_queue, [&] {
      for (size_t i = 0; i < outcome.size() && i < clean.size(); ++i) {
        const Outcome& o = outcome[i];
        const Outcome& c = clean[i];
        const bool exact = o.state == c.state && o.tokens == c.tokens && o.text == c.text;
        const bool prefix = o.tokens.size() <= c.tokens.size() &&
                            std::equal(o.tokens.begin(), o.tokens.end(), c.tokens.begin());
        CHECK(exact || (o.state == MOELITE_STOP_ERROR && prefix),
              "request %zu after a fault at allocation %ld: state %d with %zu tokens (clean: %d, %zu tokens)%s", i,
              g_current_n, o.state, o.tokens.size(), c.state, c.tokens.size(), prefix ? "" : ", not a prefix");
      }
      // Unarmed, the same run is exact again.
      run_queue();
      for (size_t i = 0; i < outcome.size() && i < clean.size(); ++i)
        CHECK(outcome[i].tokens == clean[i].tokens && outcome[i].text == clean[i].text,
              "queue run after a fault differs (request %zu)", i);
    });
    for (moelite_generate_params* g : gps) moelite_generate_params_free(g);
    moelite_context_free(qc);
  }

  {
    const char* text = "def main():\n    return open('x').read()  # héllo";
    std::vector<int32_t> ids(256);
    int32_t n = 0;
    moelite_tokenize(model, text, strlen(text), MOELITE_TOKENIZE_ADD_SPECIAL, ids.data(), 256, &n);
    const std::vector<int32_t> clean_ids(ids.begin(), ids.begin() + n);
    sweep(
        "tokenize",
        [&] {
          int32_t k = 0;
          return moelite_tokenize(model, text, strlen(text), MOELITE_TOKENIZE_ADD_SPECIAL, ids.data(), 256, &k);
        },
        [&] {
          int32_t k = 0;
          moelite_tokenize(model, text, strlen(text), MOELITE_TOKENIZE_ADD_SPECIAL, ids.data(), 256, &k);
          CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + k) == clean_ids, "tokenize differs after a fault");
        });
    char buf[1024];
    size_t len = 0;
    sweep(
        "detokenize", [&] { return moelite_detokenize(model, clean_ids.data(), n, 0, buf, sizeof buf, &len); },
        [&] {
          CHECK(moelite_detokenize(model, clean_ids.data(), n, 0, buf, sizeof buf, &len) == MOELITE_OK,
                "detokenize after a fault");
        });
    const moelite_chat_message msgs[] = {{"system", "Be brief."}, {"user", "What does open() return?"}};
    sweep(
        "chat_format", [&] { return moelite_chat_format(model, msgs, 2, 1, buf, sizeof buf, &len); },
        [&] { CHECK(moelite_chat_format(model, msgs, 2, 1, buf, sizeof buf, &len) == MOELITE_OK, "chat_format"); });
  }

  {
    std::vector<int32_t> corpus;
    for (int i = 0; i < 24; ++i) corpus.push_back((i * 37 + 11) % n_vocab);
    moelite_calibrate_params* cp = moelite_calibrate_params_create();
    moelite_calibrate_params_set_window(cp, 8);
    const std::string profile = work + "/alloc-faults.profile";
    sweep(
        "calibrate",
        [&] {
          return moelite_calibrate(model, corpus.data(), static_cast<int32_t>(corpus.size()), cp, profile.c_str());
        },
        [&] {
          const std::vector<float> again = eval_logits(ctx, tokens, n_vocab);
          CHECK(again == reference, "the model's results changed after a failed calibration");
        });
    moelite_calibrate_params_free(cp);
    remove(profile.c_str());
  }

  moelite_context_free(ctx);
  moelite_model_free(model);
  printf("%s\n", g_failures ? "FAILED" : "all allocation faults handled");
  return g_failures ? 1 : 0;
}
