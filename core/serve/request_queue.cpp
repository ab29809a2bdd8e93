#include "core/serve/request_queue.h"

#include <algorithm>
#include <new>

#include "base/status.h"
#include "platforms/platform.h"

namespace moelite {

RequestQueue::RequestQueue(Context& ctx)
    : ctx_(ctx),
      seq_request_(static_cast<size_t>(ctx.n_seq()), -1),
      seq_expected_(static_cast<size_t>(ctx.n_seq()), 0) {
  for (int32_t q = 0; q < ctx.n_seq(); ++q) seq_expected_[static_cast<size_t>(q)] = ctx.length(q);
}

Status RequestQueue::add(const std::vector<int32_t>& prompt, const GenerateOptions& opts, int64_t* id) {
  MOELITE_TRY(check_prompt(ctx_.model(), prompt, ctx_.n_ctx()));
  Request r;
  r.prompt = prompt;
  r.opts = opts;
  r.history = prompt;
  r.sampler = std::make_unique<Sampler>(opts.sampler);
  r.filter = std::make_unique<StreamFilter>(opts.stops);
  r.t_added = platform::now_seconds();
  const int64_t rid = next_id_;
  waiting_.push_back(rid);  // first: if the map insertion throws, the id is popped below
  try {
    requests_.emplace(rid, std::move(r));
  } catch (...) {
    waiting_.pop_back();
    throw;
  }
  ++next_id_;
  *id = rid;
  return MOELITE_OK;
}

int64_t RequestQueue::running() const {
  return std::count_if(seq_request_.begin(), seq_request_.end(), [](int64_t r) { return r >= 0; });
}

const RequestQueue::Request* RequestQueue::find(int64_t id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

// The head of the queue goes into the free sequence whose cached tokens share the longest prefix
// with its prompt (one token at least is evaluated, for the logits to sample from), so a request
// that continues an earlier one, or shares its system prompt, evaluates only what is new.
void RequestQueue::admit() {
  while (!waiting_.empty()) {
    int32_t best = -1;
    size_t best_shared = 0;
    const Request& head = requests_.at(waiting_.front());
    for (int32_t q = 0; q < ctx_.n_seq(); ++q) {
      if (seq_request_[static_cast<size_t>(q)] >= 0) continue;
      const std::vector<int32_t>& cached = ctx_.tokens(q);
      size_t shared = 0;
      while (shared < cached.size() && shared + 1 < head.prompt.size() && cached[shared] == head.prompt[shared]) ++shared;
      if (best < 0 || shared > best_shared) {
        best = q;
        best_shared = shared;
      }
    }
    if (best < 0) return;  // every sequence is busy
    const int64_t id = waiting_.front();
    waiting_.pop_front();
    Request& r = requests_.at(id);
    ctx_.truncate(static_cast<int32_t>(best_shared), best);
    r.fed = static_cast<size_t>(ctx_.length(best));  // a sliding-window cache may keep less than asked
    r.cached = static_cast<int32_t>(r.fed);
    r.t_admitted = platform::now_seconds();
    r.seq = best;
    r.state = kRunning;
    seq_request_[static_cast<size_t>(best)] = id;
    seq_expected_[static_cast<size_t>(best)] = ctx_.length(best);
  }
}

void RequestQueue::finish(int64_t id, Request& r, int32_t stop) {
  r.state = stop;
  r.t_finished = platform::now_seconds();
  if (r.seq >= 0 && seq_request_[static_cast<size_t>(r.seq)] == id) seq_request_[static_cast<size_t>(r.seq)] = -1;
  r.seq = -1;
  r.sampler.reset();
}

bool RequestQueue::take_token(int64_t id, Request& r, int32_t token) {
  const Tokenizer& tok = *ctx_.model().tokenizer;
  // The same rules, in the same order, as generate_tokens().
  auto emit = [&](int32_t t, const std::string& text) { return emit_text(r.opts, t, text, &r.text); };
  auto flush_and_finish = [&](int32_t stop) {
    const std::string rest = r.filter->flush();
    if (!rest.empty()) emit(-1, rest);
    finish(id, r, stop);
  };
  if (tok.is_end_of_generation(token)) {
    flush_and_finish(MOELITE_STOP_END_TOKEN);
    return false;
  }
  r.history.push_back(token);
  r.generated.push_back(token);
  bool stopped = false;
  const std::string text = r.filter->push(tok.token_to_piece(token, false), &stopped);
  if (!emit(token, text)) finish(id, r, MOELITE_STOP_ABORTED);
  else if (stopped) finish(id, r, MOELITE_STOP_STRING);
  else if (r.generated.size() >= static_cast<size_t>(r.opts.max_tokens)) flush_and_finish(MOELITE_STOP_MAX_TOKENS);
  else if (ctx_.length(r.seq) >= ctx_.n_ctx()) flush_and_finish(MOELITE_STOP_CONTEXT_FULL);
  return true;
}

Status RequestQueue::step() {
  events_.clear();
  // Room for every event a step can have (a sequence ends at most once and samples at most once),
  // taken before anything changes: after the evaluation nothing may fail on the way to an event.
  events_.reserve(2 * static_cast<size_t>(ctx_.n_seq()));
  // A sequence changed behind the queue's back cannot continue its request exactly.
  for (int32_t q = 0; q < ctx_.n_seq(); ++q) {
    const int64_t id = seq_request_[static_cast<size_t>(q)];
    if (id >= 0 && ctx_.length(q) != seq_expected_[static_cast<size_t>(q)]) {
      finish(id, requests_.at(id), MOELITE_STOP_ERROR);
      events_.push_back({id, -1, MOELITE_STOP_ERROR});
    }
  }
  admit();
  // The next token of every decoding request first (they never wait), then prompt chunks in the
  // room n_batch leaves, in sequence order.
  std::vector<int32_t> tokens, seqs;
  std::vector<uint8_t> want;
  std::vector<int64_t> owner;
  std::vector<size_t> fed(static_cast<size_t>(ctx_.n_seq()));  // prompt tokens fed after this step
  for (int32_t q = 0; q < ctx_.n_seq(); ++q) {
    const int64_t id = seq_request_[static_cast<size_t>(q)];
    if (id < 0) continue;
    const Request& r = requests_.at(id);
    fed[static_cast<size_t>(q)] = r.fed;
    if (r.generated.empty()) continue;
    tokens.push_back(r.generated.back());
    seqs.push_back(q);
    want.push_back(1);
    owner.push_back(id);
  }
  const size_t room = static_cast<size_t>(std::max(1, ctx_.n_batch()));
  for (int32_t q = 0; q < ctx_.n_seq() && tokens.size() < room; ++q) {
    const int64_t id = seq_request_[static_cast<size_t>(q)];
    if (id < 0) continue;
    const Request& r = requests_.at(id);
    if (!r.generated.empty()) continue;
    size_t& f = fed[static_cast<size_t>(q)];
    while (f < r.prompt.size() && tokens.size() < room) {
      tokens.push_back(r.prompt[f++]);
      seqs.push_back(q);
      want.push_back(f == r.prompt.size() ? 1 : 0);
      owner.push_back(id);
    }
  }
  if (tokens.empty()) return MOELITE_OK;
  MOELITE_TRY(ctx_.eval_seqs(tokens.data(), seqs.data(), want.data(), static_cast<int32_t>(tokens.size())));
  for (int32_t q = 0; q < ctx_.n_seq(); ++q) {
    seq_expected_[static_cast<size_t>(q)] = ctx_.length(q);
    const int64_t id = seq_request_[static_cast<size_t>(q)];
    if (id >= 0) requests_.at(id).fed = fed[static_cast<size_t>(q)];
  }
  const int32_t n_vocab = ctx_.model().hp.n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!want[i]) continue;
    const int64_t id = owner[i];
    Request& r = requests_.at(id);
    if (r.opts.max_tokens == 0) {  // the prompt only, as generate_tokens() with max_tokens 0
      finish(id, r, MOELITE_STOP_MAX_TOKENS);
      events_.push_back({id, -1, r.state});
      continue;
    }
    if (r.t_first == 0) r.t_first = platform::now_seconds();
    int32_t next = -1;
    bool generated = false;
    // The sequence already holds this step's token: a request that cannot take its sample (memory
    // ran out in the sampler, its history or its text) cannot go on exactly, so it ends here with
    // an error instead of failing the step, which the others completed.
    try {
      switch (r.sampler->pick(ctx_.logits(static_cast<int32_t>(i)), n_vocab, r.history, &next)) {
        case Sampler::Outcome::Stopped:
          finish(id, r, MOELITE_STOP_ABORTED);
          break;
        case Sampler::Outcome::NoCandidate:  // every token banned: generate_tokens() fails the call
          finish(id, r, MOELITE_STOP_ERROR);
          break;
        case Sampler::Outcome::Token:
          generated = take_token(id, r, next);
          break;
      }
    } catch (const std::bad_alloc&) {
      finish(id, r, MOELITE_STOP_ERROR);
    }
    events_.push_back({id, generated ? next : -1, r.state});
  }
  return MOELITE_OK;
}

Status RequestQueue::cancel(int64_t id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return fail(MOELITE_ERR_INVALID_ARGUMENT, "no request %lld in the queue", (long long)id);
  Request& r = it->second;
  if (r.state == kWaiting) waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  if (r.state == kWaiting || r.state == kRunning) finish(id, r, MOELITE_STOP_ABORTED);
  return MOELITE_OK;
}

Status RequestQueue::remove(int64_t id) {
  MOELITE_TRY(cancel(id));
  requests_.erase(id);
  return MOELITE_OK;
}

}  // namespace moelite
