#include "batcher.h"

#include <map>

// One request between its HTTP thread and the scheduler. The fields below `shared` are guarded by
// the batcher's mutex; `id` is the scheduler's alone.
struct Batcher::Job {
  const std::vector<int32_t>* prompt = nullptr;
  moelite_generate_params* params = nullptr;  // the HTTP thread's; it waits in generate() until done
  Batcher* owner = nullptr;
  // shared
  std::string text;     // produced, not yet delivered
  bool done = false;    // outcome is final
  bool cancel = false;  // the client went away
  Outcome outcome;
  std::condition_variable changed;
  // scheduler
  int64_t id = -1;
};

bool Batcher::create(moelite_model* model, int n_seq, int32_t n_ctx, const Quality& quality, std::string* error) {
  moelite_context_params* cp = moelite_context_params_create();
  if (!cp) {
    *error = "out of memory";
    return false;
  }
  moelite_status st = moelite_context_params_set_n_ctx(cp, n_ctx);
  if (st == MOELITE_OK) st = moelite_context_params_set_n_seq(cp, n_seq);
  if (st == MOELITE_OK && quality.sample >= 0) st = moelite_context_params_set_quality_meter(cp, quality.sample);
  if (st == MOELITE_OK && !quality.target.empty())
    st = moelite_context_params_set_quality_target(cp, quality.target.c_str());
  if (st == MOELITE_OK) st = moelite_context_create(model, cp, &ctx_);
  moelite_context_params_free(cp);
  if (st == MOELITE_OK) st = moelite_queue_create(ctx_, &queue_);
  if (st != MOELITE_OK) {
    *error = std::string(moelite_status_name(st)) + ": " + moelite_last_error();
    return false;
  }
  n_ctx_ = moelite_context_n_ctx(ctx_);
  n_seq_ = n_seq;
  update_quality();  // the starting threshold and target, before any request
  scheduler_ = std::thread([this] { run(); });
  return true;
}

void Batcher::update_quality() {
  moelite_quality_stats q{};
  q.struct_size = sizeof q;
  if (moelite_context_quality_stats(ctx_, &q) != MOELITE_OK) return;
  std::lock_guard<std::mutex> lock(mu_);
  quality_ = q;
}

moelite_quality_stats Batcher::quality_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return quality_;
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
  moelite_queue_free(queue_);
  moelite_context_free(ctx_);
}

void Batcher::finish(Job& job, moelite_status status, const std::string& error, int32_t stop) {
  moelite_generate_stats stats{};
  stats.struct_size = sizeof stats;
  if (job.id >= 0) (void)moelite_queue_request_stats(queue_, job.id, &stats);
  stats.stop_reason = stop;
  std::lock_guard<std::mutex> lock(mu_);
  job.outcome.status = status;
  job.outcome.error = error;
  job.outcome.stats = stats;
  job.done = true;
  job.changed.notify_all();
}

Batcher::Outcome Batcher::generate(const std::vector<int32_t>& prompt, moelite_generate_params* params,
                                   const std::function<bool(const char*, size_t)>& on_piece) {
  auto job = std::make_shared<Job>();
  job->prompt = &prompt;
  job->params = params;
  job->owner = this;
  // Runs on the scheduler thread inside moelite_queue_step: hands the text over, never blocks on
  // the client (a slow reader must not hold up the other requests of the step).
  auto piece = [](const char* p, size_t n, void* user) -> int {
    Job* j = static_cast<Job*>(user);
    std::lock_guard<std::mutex> lock(j->owner->mu_);
    j->text.append(p, n);
    j->changed.notify_all();
    return j->cancel ? 0 : 1;
  };
  Outcome failed;
  failed.stats.struct_size = sizeof failed.stats;
  failed.stats.stop_reason = MOELITE_STOP_ERROR;
  moelite_status st = moelite_generate_params_set_callback(params, piece, job.get());
  if (st != MOELITE_OK) {
    failed.status = st;
    failed.error = moelite_last_error();
    return failed;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) {
    failed.status = MOELITE_ERR_ABORTED;
    failed.error = "the server is stopping";
    return failed;
  }
  inbox_.push_back(job);
  wake_.notify_all();
  for (;;) {
    job->changed.wait(lock, [&] { return job->done || !job->text.empty(); });
    if (!job->text.empty()) {
      std::string text;
      text.swap(job->text);
      lock.unlock();
      const bool go_on = on_piece(text.data(), text.size());
      lock.lock();
      if (!go_on && !job->cancel) {
        job->cancel = true;  // the scheduler cancels it at its next step
        wake_.notify_all();
      }
      continue;
    }
    return job->outcome;  // done, and every piece delivered
  }
}

void Batcher::run() {
  std::map<int64_t, std::shared_ptr<Job>> active;  // by queue id
  for (;;) {
    std::deque<std::shared_ptr<Job>> arrivals;
    std::vector<int64_t> cancelled;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: sleep until a request comes; busy: take what came and step on.
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !active.empty(); });
      if (stopping_) break;
      arrivals.swap(inbox_);
      for (const auto& [id, job] : active)
        if (job->cancel) cancelled.push_back(id);
    }
    for (const std::shared_ptr<Job>& job : arrivals) {
      int64_t id = -1;
      const moelite_status st = moelite_queue_add(queue_, job->prompt->data(), static_cast<int32_t>(job->prompt->size()),
                                                  job->params, &id);
      if (st != MOELITE_OK) {
        finish(*job, st, std::string(moelite_status_name(st)) + ": " + moelite_last_error(), MOELITE_STOP_ERROR);
        continue;
      }
      job->id = id;
      active.emplace(id, job);
    }
    for (int64_t id : cancelled) {
      (void)moelite_queue_cancel(queue_, id);
      finish(*active.at(id), MOELITE_OK, "", MOELITE_STOP_ABORTED);
      (void)moelite_queue_remove(queue_, id);
      active.erase(id);
    }
    if (moelite_queue_running(queue_) + moelite_queue_waiting(queue_) == 0) continue;
    int32_t n_events = 0;
    const moelite_status st = moelite_queue_step(queue_, &n_events);
    update_quality();
    if (st != MOELITE_OK) {
      // The step evaluated nothing; every request in it fails with its error (a request alone on
      // a context of its own would have failed the same way), and the server goes on.
      const std::string error = std::string(moelite_status_name(st)) + ": " + moelite_last_error();
      for (const auto& [id, job] : active) {
        (void)moelite_queue_cancel(queue_, id);
        finish(*job, st, error, MOELITE_STOP_ERROR);
        (void)moelite_queue_remove(queue_, id);
      }
      active.clear();
      continue;
    }
    for (int32_t e = 0; e < n_events; ++e) {
      int64_t id = -1;
      int32_t state = MOELITE_REQUEST_RUNNING;
      if (moelite_queue_event(queue_, e, &id, nullptr, &state) != MOELITE_OK || state < 0) continue;
      const auto it = active.find(id);
      if (it == active.end()) continue;
      // What ended a generation early, as moelite_generate reports it. Reaching the end of the
      // context is not an error for a server: the answer so far goes out with finish_reason "length".
      moelite_status status = MOELITE_OK;
      std::string error;
      if (state == MOELITE_STOP_ERROR) {
        status = MOELITE_ERR_INVALID_ARGUMENT;
        error = "MOELITE_ERR_INVALID_ARGUMENT: no token can be sampled";
      }
      finish(*it->second, status, error, state);
      (void)moelite_queue_remove(queue_, id);
      active.erase(it);
    }
  }
  // Stopping: whoever still waits gets an answer.
  for (auto& [id, job] : active) finish(*job, MOELITE_ERR_ABORTED, "the server is stopping", MOELITE_STOP_ABORTED);
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::shared_ptr<Job>& job : inbox_) {
    job->outcome.status = MOELITE_ERR_ABORTED;
    job->outcome.error = "the server is stopping";
    job->outcome.stats.stop_reason = MOELITE_STOP_ABORTED;
    job->done = true;
    job->changed.notify_all();
  }
}
