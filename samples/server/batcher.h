// The server's generation: one context of --parallel sequences and the library's request queue
// (moelite_queue_*), driven by one scheduler thread. Requests that arrive together decode
// together: each step evaluates the next token of every running request in one pass, so they share
// each layer's weight reads and, under an expert budget, each expert's load (one context's threads
// use every core, where contexts of their own would split them). A request's text is what it
// would be alone (the queue's promise), and a conversation's next turn is admitted into the
// sequence that holds its earlier turns, so only the new tokens are evaluated.
//
// HTTP threads call generate(), which hands the request to the scheduler and then delivers its text
// on the calling thread as the scheduler produces it; a request whose client has gone (its piece
// callback returned false) is cancelled at the next step.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moelite.h"

class Batcher {
 public:
  // The context's quality meter and governor, for lossy gating (--quality-sample, --quality-target):
  // an empty target and a negative sample rate leave the library's defaults.
  struct Quality {
    std::string target;
    double sample = -1;
  };
  // Creates the context (n_seq sequences of n_ctx positions) and the queue and starts the
  // scheduler; false with the reason in *error.
  bool create(moelite_model* model, int n_seq, int32_t n_ctx, const Quality& quality, std::string* error);
  ~Batcher();  // stops the scheduler (running requests end as aborted) and frees the context

  struct Outcome {
    moelite_status status = MOELITE_OK;  // not OK: the request could not be queued or its evaluation failed
    std::string error;
    moelite_generate_stats stats{};  // prompt and generated token counts, stop reason, timings
  };
  // Generates the continuation of `prompt` with `params` (max tokens, sampling, stops; the batcher
  // sets its text callback). `on_piece` receives the text on the calling thread and returns false to
  // stop (the client went away: stop reason MOELITE_STOP_ABORTED). Blocks until the request ends.
  Outcome generate(const std::vector<int32_t>& prompt, moelite_generate_params* params,
                   const std::function<bool(const char*, size_t)>& on_piece);

  int32_t n_ctx() const { return n_ctx_; }
  int n_seq() const { return n_seq_; }
  // What lossy gating cost the context, as of the last step. The scheduler reads it after each
  // step: the context is inside the library during one (moelite_context_quality_stats would
  // answer BUSY to another thread), and between steps only the scheduler may call it.
  moelite_quality_stats quality_stats();

 private:
  struct Job;
  void run();
  void finish(Job& job, moelite_status status, const std::string& error, int32_t stop);

  moelite_context* ctx_ = nullptr;
  moelite_queue* queue_ = nullptr;
  int32_t n_ctx_ = 0;
  int n_seq_ = 0;
  std::thread scheduler_;
  std::mutex mu_;                  // guards inbox_, stopping_ and each job's shared fields
  std::condition_variable wake_;   // the scheduler: a job arrived, one was cancelled, or stop
  std::deque<std::shared_ptr<Job>> inbox_;
  bool stopping_ = false;
  moelite_quality_stats quality_{};  // guarded by mu_; written by the scheduler
  void update_quality();
};
