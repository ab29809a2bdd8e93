// The request queue through the public API on the shipped trained model. The reference for every
// request is moelite_generate_tokens on a context of its own with the same prompt and parameters:
// the queue must give exactly its tokens, text and stop reason whatever it runs beside, however
// many sequences, chunk sizes and budgets, and with cancellations and failed steps in between.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moelite.h"

namespace {

const std::string kModel = std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf";
const std::string kText = std::string(MOELITE_SOURCE_DIR) + "/tools/train/data/heldout.txt";

using ModelPtr = std::unique_ptr<moelite_model, void (*)(moelite_model*)>;
using ContextPtr = std::unique_ptr<moelite_context, void (*)(moelite_context*)>;
using QueuePtr = std::unique_ptr<moelite_queue, void (*)(moelite_queue*)>;
using ParamsPtr = std::unique_ptr<moelite_generate_params, void (*)(moelite_generate_params*)>;

ModelPtr load_model(uint64_t budget = 0) {
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model_params_set_threads(mp, 2);
  moelite_model_params_set_expert_budget(mp, budget);
  moelite_model* m = nullptr;
  EXPECT_EQ(moelite_model_load(kModel.c_str(), mp, &m), MOELITE_OK) << moelite_last_error();
  moelite_model_params_free(mp);
  return ModelPtr(m, moelite_model_free);
}

ContextPtr make_context(moelite_model* m, int32_t n_seq, int32_t n_ctx = 256, int32_t n_batch = 512) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_seq(cp, n_seq);
  moelite_context_params_set_n_ctx(cp, n_ctx);
  moelite_context_params_set_n_batch(cp, n_batch);
  moelite_context* c = nullptr;
  EXPECT_EQ(moelite_context_create(m, cp, &c), MOELITE_OK) << moelite_last_error();
  moelite_context_params_free(cp);
  return ContextPtr(c, moelite_context_free);
}

std::vector<int32_t> tokens_of(moelite_model* m, size_t offset, size_t bytes) {
  std::ifstream in(kText, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string text(bytes, '\0');
  in.read(&text[0], static_cast<std::streamsize>(bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<int32_t> t(text.size() + 8);
  int32_t n = 0;
  EXPECT_EQ(moelite_tokenize(m, text.data(), text.size(), 0, t.data(), static_cast<int32_t>(t.size()), &n), MOELITE_OK);
  t.resize(static_cast<size_t>(n));
  return t;
}

struct Spec {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 8;
  float temperature = 0.0f;
  uint64_t seed = 1;
  const char* stop = nullptr;
  float repeat_penalty = 1.0f;
};

ParamsPtr params_of(const Spec& s) {
  ParamsPtr p(moelite_generate_params_create(), moelite_generate_params_free);
  moelite_generate_params_set_max_tokens(p.get(), s.max_tokens);
  moelite_generate_params_set_temperature(p.get(), s.temperature);
  moelite_generate_params_set_seed(p.get(), s.seed);
  moelite_generate_params_set_repeat_penalty(p.get(), s.repeat_penalty, 16);
  if (s.stop) moelite_generate_params_add_stop(p.get(), s.stop);
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  int32_t stop = -1;
};

int collect_token(int32_t token, const char* text, size_t len, void* user) {
  auto* o = static_cast<Outcome*>(user);
  if (token >= 0) o->tokens.push_back(token);
  o->text.append(text, len);
  return 1;
}

// The reference: the request alone on a fresh one-sequence context of a resident model.
Outcome alone(moelite_model* m, const Spec& s, int32_t n_ctx = 256) {
  ContextPtr ctx = make_context(m, 1, n_ctx);
  ParamsPtr p = params_of(s);
  Outcome o;
  moelite_generate_params_set_token_callback(p.get(), collect_token, &o);
  moelite_generate_stats stats;
  stats.struct_size = sizeof stats;
  const moelite_status st = moelite_generate_tokens(ctx.get(), s.prompt.data(), static_cast<int32_t>(s.prompt.size()),
                                                    p.get(), &stats);
  EXPECT_TRUE(st == MOELITE_OK || st == MOELITE_ERR_CONTEXT_FULL) << moelite_last_error();
  o.stop = stats.stop_reason;
  return o;
}

Outcome result_of(moelite_queue* q, int64_t id) {
  Outcome o;
  int32_t n = 0;
  const moelite_status count_st = moelite_queue_request_tokens(q, id, nullptr, 0, &n);
  EXPECT_EQ(count_st, n ? MOELITE_ERR_BUFFER_TOO_SMALL : MOELITE_OK);
  o.tokens.resize(static_cast<size_t>(n));
  EXPECT_EQ(moelite_queue_request_tokens(q, id, o.tokens.data(), n, &n), MOELITE_OK);
  size_t len = 0;
  (void)moelite_queue_request_text(q, id, nullptr, 0, &len);
  o.text.resize(len);
  EXPECT_EQ(moelite_queue_request_text(q, id, &o.text[0], len, &len), MOELITE_OK);
  EXPECT_EQ(moelite_queue_request_state(q, id, &o.stop), MOELITE_OK);
  return o;
}

// Steps until the queue is idle, checking each step's events against the requests' states.
void drain(moelite_queue* q, std::map<int64_t, std::vector<int32_t>>* streamed = nullptr) {
  for (int guard = 0; moelite_queue_waiting(q) + moelite_queue_running(q) > 0; ++guard) {
    ASSERT_LT(guard, 10000);
    int32_t n = -1;
    ASSERT_EQ(moelite_queue_step(q, &n), MOELITE_OK) << moelite_last_error();
    for (int32_t i = 0; i < n; ++i) {
      int64_t id = -1;
      int32_t token = -2, state = -3;
      ASSERT_EQ(moelite_queue_event(q, i, &id, &token, &state), MOELITE_OK);
      int32_t now = -3;
      ASSERT_EQ(moelite_queue_request_state(q, id, &now), MOELITE_OK);
      EXPECT_EQ(state, now);
      if (streamed && token >= 0) (*streamed)[id].push_back(token);
    }
  }
}

// A queue over ctx, and every request of `specs` added to it in order (their ids).
QueuePtr queue_of(moelite_context* ctx) {
  moelite_queue* raw = nullptr;
  EXPECT_EQ(moelite_queue_create(ctx, &raw), MOELITE_OK) << moelite_last_error();
  return QueuePtr(raw, moelite_queue_free);
}

std::vector<int64_t> add_all(moelite_queue* q, const std::vector<Spec>& specs) {
  std::vector<int64_t> ids;
  for (const Spec& s : specs) {
    int64_t id = -1;
    EXPECT_EQ(moelite_queue_add(q, s.prompt.data(), static_cast<int32_t>(s.prompt.size()), params_of(s).get(), &id),
              MOELITE_OK);
    ids.push_back(id);
  }
  return ids;
}

std::vector<Spec> mixed_requests(moelite_model* m) {
  std::vector<Spec> s;
  const std::vector<int32_t> base = tokens_of(m, 0, 160);
  s.push_back({base, 12});
  s.push_back({tokens_of(m, 900, 40), 0});                      // the prompt only
  s.push_back({tokens_of(m, 2000, 300), 9, 0.8f, 7});           // sampled
  s.push_back({tokens_of(m, 3100, 12), 1});
  s.push_back({tokens_of(m, 4000, 90), 20, 0.9f, 99, nullptr, 1.3f});
  s.push_back({tokens_of(m, 5000, 60), 24, 0.0f, 1, " the"});   // a stop string
  std::vector<int32_t> longer = base;                            // continues the first request's prompt
  longer.insert(longer.end(), {base[3], base[4], base[5]});
  s.push_back({longer, 6, 0.7f, 3});
  s.push_back({tokens_of(m, 7000, 25), 15, 1.0f, 5});
  return s;
}

void expect_same(const Outcome& got, const Outcome& want, size_t i) {
  EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
  EXPECT_EQ(got.text, want.text) << "request " << i;
  EXPECT_EQ(got.stop, want.stop) << "request " << i;
}

TEST(RequestQueue, EachRequestGeneratesWhatItGeneratesAlone) {
  ModelPtr resident = load_model();
  const std::vector<Spec> specs = mixed_requests(resident.get());
  std::vector<Outcome> want;
  for (const Spec& s : specs) want.push_back(alone(resident.get(), s));
  bool some_stop_string = false;
  for (const Outcome& w : want) some_stop_string |= w.stop == MOELITE_STOP_STRING;
  EXPECT_TRUE(some_stop_string);  // the cases exercise what they claim to
  // Sequences, chunk sizes and (exact mode) budgets change when tokens come, never which.
  struct Setup {
    int32_t n_seq, n_batch;
    uint64_t budget;
  };
  const uint64_t quarter = static_cast<uint64_t>(
      0.25 * static_cast<double>(moelite_model_get(resident.get(), MOELITE_MODEL_EXPERT_BYTES)));
  for (const Setup& setup : {Setup{1, 512, 0}, Setup{3, 512, 0}, Setup{8, 7, 0}, Setup{3, 64, quarter}}) {
    SCOPED_TRACE("n_seq " + std::to_string(setup.n_seq) + ", n_batch " + std::to_string(setup.n_batch) + ", budget " +
                 std::to_string(setup.budget));
    ModelPtr budgeted = setup.budget ? load_model(setup.budget) : ModelPtr(nullptr, moelite_model_free);
    moelite_model* m = budgeted ? budgeted.get() : resident.get();
    ContextPtr ctx = make_context(m, setup.n_seq, 256, setup.n_batch);
    QueuePtr q = queue_of(ctx.get());
    const std::vector<int64_t> ids = add_all(q.get(), specs);
    EXPECT_EQ(ids.front(), 0);
    EXPECT_EQ(ids.back(), static_cast<int64_t>(specs.size()) - 1);
    std::map<int64_t, std::vector<int32_t>> streamed;
    drain(q.get(), &streamed);
    EXPECT_EQ(moelite_queue_finished(q.get()), static_cast<int64_t>(specs.size()));
    for (size_t i = 0; i < specs.size(); ++i) {
      const Outcome got = result_of(q.get(), ids[i]);
      expect_same(got, want[i], i);
      EXPECT_EQ(streamed[ids[i]], got.tokens) << "the events carry each generated token once, in order";
    }
  }
}

int64_t g_routed_rows = 0;
void count_rows(int32_t layer, int32_t, int32_t n_tokens, int32_t, const int32_t*, const float*, void*) {
  if (layer == 0) g_routed_rows += n_tokens;
}

TEST(RequestQueue, ARequestReusesTheSequenceThatHoldsItsPrefix) {
  ModelPtr m = load_model();
  const std::vector<int32_t> system = tokens_of(m.get(), 100, 200);
  std::vector<int32_t> other = tokens_of(m.get(), 6000, 30);
  Spec first{system, 4}, unrelated{other, 4};
  Spec next{system, 5, 0.5f, 11};
  const std::vector<int32_t> turn = tokens_of(m.get(), 8000, 20);
  next.prompt.insert(next.prompt.end(), turn.begin(), turn.end());

  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_seq(cp, 2);
  moelite_context_params_set_n_ctx(cp, 512);
  moelite_context_params_set_routing_callback(cp, count_rows, nullptr);
  moelite_context* c = nullptr;
  ASSERT_EQ(moelite_context_create(m.get(), cp, &c), MOELITE_OK);
  moelite_context_params_free(cp);
  ContextPtr ctx(c, moelite_context_free);
  QueuePtr q = queue_of(ctx.get());
  add_all(q.get(), {first, unrelated});
  drain(q.get());
  // Both sequences are free now; the next request shares 200 tokens with the first one's.
  g_routed_rows = 0;
  const int64_t n = add_all(q.get(), {next}).front();
  drain(q.get());
  // Its new prompt tokens and its decode steps (all but the last sampled token) were evaluated; the
  // shared system prompt was not.
  const Outcome got = result_of(q.get(), n), want = alone(m.get(), next, 512);
  expect_same(got, want, 0);
  EXPECT_EQ(g_routed_rows, static_cast<int64_t>(turn.size() + got.tokens.size() - (got.stop == MOELITE_STOP_END_TOKEN ? 0 : 1)));
  moelite_generate_stats stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(moelite_queue_request_stats(q.get(), n, &stats), MOELITE_OK);
  EXPECT_EQ(stats.n_cached_tokens, static_cast<int32_t>(system.size()));
  EXPECT_EQ(stats.n_prompt_tokens, static_cast<int32_t>(turn.size()));
  EXPECT_EQ(stats.n_generated_tokens, static_cast<int32_t>(got.tokens.size()));
  EXPECT_EQ(stats.stop_reason, got.stop);
  EXPECT_GT(stats.time_to_first_token_seconds, 0.0);
  EXPECT_GE(stats.time_to_first_token_seconds, stats.prompt_seconds);
  // A smaller struct (an older caller) gets only the fields that fit.
  moelite_generate_stats old;
  memset(&old, 0x5a, sizeof old);
  old.struct_size = offsetof(moelite_generate_stats, n_generated_tokens);
  ASSERT_EQ(moelite_queue_request_stats(q.get(), n, &old), MOELITE_OK);
  EXPECT_EQ(old.n_cached_tokens, static_cast<int32_t>(system.size()));
  int32_t untouched;
  memset(&untouched, 0x5a, sizeof untouched);
  EXPECT_EQ(old.n_generated_tokens, untouched);
  EXPECT_EQ(moelite_queue_request_stats(q.get(), 999, &stats), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_request_stats(q.get(), n, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(RequestQueue, CancelledRequestsFreeTheirSequenceAndLeaveTheOthersExact) {
  ModelPtr m = load_model();
  std::vector<Spec> specs = mixed_requests(m.get());
  ContextPtr ctx = make_context(m.get(), 2);
  QueuePtr q = queue_of(ctx.get());
  const std::vector<int64_t> ids = add_all(q.get(), specs);
  // Request 7 is cancelled while it waits, request 0 after three steps (while it runs), request 3
  // is removed while it waits.
  ASSERT_EQ(moelite_queue_cancel(q.get(), ids[7]), MOELITE_OK);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(moelite_queue_step(q.get(), nullptr), MOELITE_OK);
  int32_t state = 0;
  ASSERT_EQ(moelite_queue_request_state(q.get(), ids[0], &state), MOELITE_OK);
  EXPECT_EQ(state, MOELITE_REQUEST_RUNNING);
  EXPECT_EQ(moelite_queue_running(q.get()), 2);
  ASSERT_EQ(moelite_queue_cancel(q.get(), ids[0]), MOELITE_OK);
  EXPECT_EQ(moelite_queue_running(q.get()), 1);
  ASSERT_EQ(moelite_queue_remove(q.get(), ids[3]), MOELITE_OK);
  EXPECT_EQ(moelite_queue_request_state(q.get(), ids[3], &state), MOELITE_ERR_INVALID_ARGUMENT);
  drain(q.get());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (i == 3) continue;
    const Outcome got = result_of(q.get(), ids[i]);
    if (i == 7) {
      EXPECT_EQ(got.stop, MOELITE_STOP_ABORTED);
      EXPECT_TRUE(got.tokens.empty());
    } else if (i == 0) {
      EXPECT_EQ(got.stop, MOELITE_STOP_ABORTED);
      const Outcome full = alone(m.get(), specs[0]);  // what it generated before the cancel is a prefix of that
      ASSERT_LE(got.tokens.size(), full.tokens.size());
      EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), full.tokens.begin()));
    } else {
      expect_same(got, alone(m.get(), specs[i]), i);
    }
  }
  // Cancelling a finished request changes nothing; removing it forgets it.
  ASSERT_EQ(moelite_queue_cancel(q.get(), ids[1]), MOELITE_OK);
  ASSERT_EQ(moelite_queue_request_state(q.get(), ids[1], &state), MOELITE_OK);
  EXPECT_EQ(state, MOELITE_STOP_MAX_TOKENS);
  const int64_t finished = moelite_queue_finished(q.get());
  ASSERT_EQ(moelite_queue_remove(q.get(), ids[1]), MOELITE_OK);
  EXPECT_EQ(moelite_queue_finished(q.get()), finished - 1);
  int32_t n = 0;
  EXPECT_EQ(moelite_queue_step(q.get(), &n), MOELITE_OK);  // idle
  EXPECT_EQ(n, 0);
}

int g_abort_calls = 0;
int abort_first_calls(void*) { return ++g_abort_calls <= 3 ? 1 : 0; }

TEST(RequestQueue, AFailedStepChangesNoRequestAndTheNextStepGoesOn) {
  ModelPtr m = load_model();
  std::vector<Spec> specs = mixed_requests(m.get());
  specs.resize(4);
  ContextPtr ctx = make_context(m.get(), 2, 256, 32);
  QueuePtr q = queue_of(ctx.get());
  const std::vector<int64_t> ids = add_all(q.get(), specs);
  ASSERT_EQ(moelite_queue_step(q.get(), nullptr), MOELITE_OK);
  ASSERT_EQ(moelite_queue_step(q.get(), nullptr), MOELITE_OK);
  // Three steps abort (the context's callback); each changes nothing.
  g_abort_calls = 0;
  ASSERT_EQ(moelite_context_set_abort_callback(ctx.get(), abort_first_calls, nullptr), MOELITE_OK);
  for (int i = 0; i < 3; ++i) {
    int32_t n = -1;
    EXPECT_EQ(moelite_queue_step(q.get(), &n), MOELITE_ERR_ABORTED);
    EXPECT_EQ(n, -1);  // a failed call leaves its outputs untouched
  }
  drain(q.get());
  for (size_t i = 0; i < specs.size(); ++i) expect_same(result_of(q.get(), ids[i]), alone(m.get(), specs[i]), i);
}

TEST(RequestQueue, ARequestEndsWhereItsSequenceIsFull) {
  ModelPtr m = load_model();
  Spec s{tokens_of(m.get(), 300, 60), 100};
  s.prompt.resize(20);
  const int32_t n_ctx = 28;
  const Outcome want = alone(m.get(), s, n_ctx);
  ASSERT_EQ(want.stop, MOELITE_STOP_CONTEXT_FULL);
  ContextPtr ctx = make_context(m.get(), 2, n_ctx);
  QueuePtr q = queue_of(ctx.get());
  const int64_t id = add_all(q.get(), {s}).front();
  drain(q.get());
  expect_same(result_of(q.get(), id), want, 0);
}

moelite_queue* g_queue = nullptr;
moelite_status g_inner = MOELITE_OK;
int reenter(int32_t, const char*, size_t, void*) {
  g_inner = moelite_queue_cancel(g_queue, 0);
  return 1;
}

TEST(RequestQueue, BadInputGetsASpecificStatus) {
  ModelPtr m = load_model();
  ContextPtr ctx = make_context(m.get(), 2, 32);
  moelite_queue* q = nullptr;
  EXPECT_EQ(moelite_queue_create(nullptr, &q), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_create(ctx.get(), nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(moelite_queue_create(ctx.get(), &q), MOELITE_OK);
  QueuePtr guard(q, moelite_queue_free);
  const int32_t ok[2] = {1, 2}, bad[2] = {1, -5};
  const int32_t huge = static_cast<int32_t>(moelite_model_get(m.get(), MOELITE_MODEL_N_VOCAB));
  const int32_t outside[1] = {huge};
  std::vector<int32_t> too_long(33, 1);
  int64_t id = -1;
  EXPECT_EQ(moelite_queue_add(nullptr, ok, 2, nullptr, &id), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_add(q, nullptr, 2, nullptr, &id), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_add(q, ok, 0, nullptr, &id), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_add(q, ok, 2, nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_add(q, bad, 2, nullptr, &id), MOELITE_ERR_BAD_TOKEN);
  EXPECT_EQ(moelite_queue_add(q, outside, 1, nullptr, &id), MOELITE_ERR_BAD_TOKEN);
  EXPECT_EQ(moelite_queue_add(q, too_long.data(), 33, nullptr, &id), MOELITE_ERR_CONTEXT_FULL);
  EXPECT_EQ(moelite_queue_waiting(q), 0);  // nothing was added
  EXPECT_EQ(moelite_queue_cancel(q, 0), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_remove(q, 0), MOELITE_ERR_INVALID_ARGUMENT);
  int32_t state = 0, n = 0;
  EXPECT_EQ(moelite_queue_request_state(q, 0, &state), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_event(q, 0, nullptr, nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_step(nullptr, &n), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_queue_waiting(nullptr), 0);

  // A request whose callback calls back into the queue: refused there, the step itself goes on.
  ParamsPtr p(moelite_generate_params_create(), moelite_generate_params_free);
  moelite_generate_params_set_max_tokens(p.get(), 3);
  moelite_generate_params_set_token_callback(p.get(), reenter, nullptr);
  g_queue = q;
  ASSERT_EQ(moelite_queue_add(q, ok, 2, p.get(), &id), MOELITE_OK);
  EXPECT_EQ(id, 0);
  ASSERT_EQ(moelite_queue_step(q, &n), MOELITE_OK);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(g_inner, MOELITE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(moelite_queue_request_state(q, 0, &state), MOELITE_OK);
  EXPECT_EQ(state, MOELITE_REQUEST_RUNNING);
  // Output buffers too small.
  int32_t one = 0;
  ASSERT_EQ(moelite_queue_step(q, &n), MOELITE_OK);
  EXPECT_EQ(moelite_queue_request_tokens(q, 0, &one, 1, &n), MOELITE_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(moelite_queue_request_tokens(q, 0, nullptr, 1, &n), MOELITE_ERR_INVALID_ARGUMENT);
  size_t len = 0;
  char c = 0;
  const moelite_status text_st = moelite_queue_request_text(q, 0, &c, 0, &len);
  EXPECT_TRUE(len == 0 ? text_st == MOELITE_OK : text_st == MOELITE_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(moelite_queue_request_text(q, 0, &c, 1, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  // The running request's sequence changed outside the queue: it ends with an error.
  ASSERT_EQ(moelite_context_seq_truncate(ctx.get(), 0, 1), MOELITE_OK);
  ASSERT_EQ(moelite_queue_step(q, &n), MOELITE_OK);
  ASSERT_EQ(moelite_queue_request_state(q, 0, &state), MOELITE_OK);
  EXPECT_EQ(state, MOELITE_STOP_ERROR);
}

}  // namespace
