// A queue of generation requests served by the sequences of one context (continuous batching):
// each step admits waiting requests into free sequences, evaluates the next token of every
// decoding request and prompt chunks of admitted ones in one eval_seqs pass (so they share each
// layer's weight reads and each expert's load), and samples each request that got logits.
//
// A request's tokens are those generate_tokens() gives on a context of its own with the same
// options: batching changes when its tokens come, never which (eval_seqs is bitwise per
// sequence; each request has its own sampler, stream filter and history). A sequence keeps a
// finished request's tokens, so a later request that starts with them (a shared system prompt,
// the next turn of a conversation) is admitted into that sequence and evaluates only the rest.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/exec/context.h"
#include "core/serve/generate.h"
#include "core/text/sampling.h"

namespace moelite {

class RequestQueue {
 public:
  // Not yet admitted, or being evaluated; a finished request's state is its moelite_stop_reason (>= 0).
  static constexpr int32_t kWaiting = -2, kRunning = -1;

  // One request's change in a step: the token it generated (-1: none) and its state after it.
  struct Event {
    int64_t request = 0;
    int32_t token = -1;
    int32_t state = kRunning;
  };

  // The queue evaluates `ctx`, which must outlive it; nothing else may evaluate or truncate the
  // context's sequences while the queue lives (step() refuses to go on when one changed).
  explicit RequestQueue(Context& ctx);

  // Queues a request (copied): MOELITE_ERR_INVALID_ARGUMENT for no tokens, MOELITE_ERR_BAD_TOKEN
  // for an id outside the vocabulary, MOELITE_ERR_CONTEXT_FULL for a prompt longer than n_ctx.
  // Ids count from 0 in order of addition.
  Status add(const std::vector<int32_t>& prompt, const GenerateOptions& opts, int64_t* id);

  // One step (see above). Events of the step replace the last step's. A failed evaluation
  // changes no request (the sequences are as before it) and returns its status; the next step
  // tries again. A step with nothing to do returns MOELITE_OK with no events.
  Status step();
  const std::vector<Event>& events() const { return events_; }

  // A waiting or running request ends at once with MOELITE_STOP_ABORTED (what it emitted stays,
  // nothing held back is flushed) and frees its sequence; a finished one is left as it is.
  // remove() also forgets it. MOELITE_ERR_INVALID_ARGUMENT for an unknown id.
  Status cancel(int64_t id);
  Status remove(int64_t id);

  struct Request {
    std::vector<int32_t> prompt;
    GenerateOptions opts;
    int32_t state = kWaiting;
    int32_t seq = -1;             // while running
    size_t fed = 0;               // prompt tokens in the sequence's cache
    std::vector<int32_t> history;  // prompt + generated, what the sampler's penalty reads
    std::vector<int32_t> generated;
    std::string text;             // emitted (stop strings cut, nothing held back once finished)
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<StreamFilter> filter;
    int32_t cached = 0;  // prompt tokens its sequence already held at admission
    // Seconds (platform::now_seconds): added, admitted, its first sampled token, finished (0: not yet).
    double t_added = 0, t_admitted = 0, t_first = 0, t_finished = 0;
  };
  // Null for an unknown (or removed) id.
  const Request* find(int64_t id) const;

  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t running() const;
  int64_t finished() const { return static_cast<int64_t>(requests_.size()) - waiting() - running(); }

 private:
  Context& ctx_;
  std::map<int64_t, Request> requests_;
  std::deque<int64_t> waiting_;        // in order of addition
  std::vector<int64_t> seq_request_;   // per sequence: the running request, or -1
  std::vector<int32_t> seq_expected_;  // per sequence: its length as the queue left it
  std::vector<Event> events_;
  int64_t next_id_ = 0;

  void admit();
  void finish(int64_t id, Request& r, int32_t stop);
  // Hands a sampled token to the request: its stream, callbacks and stop conditions. False for an
  // end token, which ends the request without becoming one of its tokens.
  bool take_token(int64_t id, Request& r, int32_t token);
};

}  // namespace moelite
