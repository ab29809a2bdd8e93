#include "core/experts/expert_store.h"

#include "base/options.h"
#include "core/support/abort_scope.h"
#include "core/support/timeline.h"
#include "platforms/batch_read.h"
#include "platforms/system_info.h"

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>

namespace moelite {

namespace {

// One aligned block for the whole pool (direct I/O lands in it), allocated once, its whole huge
// pages advised for transparent huge pages (MOELITE_HUGE_PAGES): decode streams each slot it
// computes from, and 4 KiB pages miss the TLB every 4 KiB (bench model, Q8_0, 2 threads, AMD EPYC,
// 23 interleaved pairs against small pages: one sequence 0.96-1.37x at 25-100 % budgets, median
// 1.13x; both less computing time a step and the store's O_DIRECT reads landing faster).
uint8_t* pool_alloc(uint64_t bytes) {
  void* p = platform::aligned_alloc_bytes(static_cast<size_t>(bytes), platform::kDirectIoAlignment);
  bool huge = true;
  option_flag(Option::HugePages, &huge);
  if (p && huge) (void)platform::advise_huge_pages(p, static_cast<size_t>(bytes));
  return static_cast<uint8_t*>(p);
}

void pool_free(uint8_t* p) { platform::aligned_free(p); }

// One bounded, abortable wait for some slot to change state. Wakes at least every
// kAbortPollSeconds to poll the evaluation's abort callback (called with the store unlocked: it is
// user code and may read statistics), and fails once `since` lies further back than the I/O
// timeout, so a hung device cannot hang the caller. The caller re-checks its condition after an
// OK, as after any condition-variable wait.
Status wait_for_change(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, double since, int32_t layer,
                       int32_t expert) {
  cv.wait_for(lock, std::chrono::duration<double>(kAbortPollSeconds));
  lock.unlock();
  const bool abort = abort_requested();
  lock.lock();
  if (abort)
    return fail(MOELITE_ERR_ABORTED, "evaluation aborted by the abort callback while waiting for expert %d of layer %d",
                expert, layer);
  if (platform::now_seconds() - since > io_timeout_seconds())
    return fail(MOELITE_ERR_IO,
                "expert %d of layer %d was not read within the I/O timeout of %.0f s (MOELITE_IO_TIMEOUT): the "
                "storage is not answering",
                expert, layer, io_timeout_seconds());
  return MOELITE_OK;
}

}  // namespace

// A context's view of the store: the same protocol, under the context's client id.
class StoreClient final : public ExpertSource {
 public:
  StoreClient(ExpertStore& store, int32_t id) : store_(store), id_(id) {}
  ~StoreClient() override { store_.close_client(id_); }
  bool all_resident() const override { return false; }
  bool resident_or_loading(int32_t layer, int32_t expert) const override {
    return store_.resident_or_loading(layer, expert);
  }
  void residency(int32_t layer, int32_t n_expert, std::vector<uint8_t>* mask) const override {
    store_.residency(layer, n_expert, mask);
  }
  int32_t capacity(int32_t layer) const override { return store_.capacity(layer); }
  int64_t pool_slots() const override { return store_.pool_slots(); }
  void on_routing(int32_t layer, const Routing& routing) override { store_.on_routing_for(id_, layer, routing); }
  void hint(const std::vector<Prediction>& predictions, int32_t upcoming_layer) override {
    store_.hint_for(id_, predictions, upcoming_layer);
  }
  Status prepare(int32_t layer, const std::vector<int32_t>& experts) override {
    return store_.prepare_for(id_, layer, experts);
  }
  Status extend_round(int32_t layer, int32_t expert, bool* added) override {
    return store_.extend_round_for(id_, layer, expert, added);
  }
  void take_ready(int32_t layer, std::vector<int32_t>* pending, std::vector<ReadyExpert>* out) override {
    store_.take_ready(layer, pending, out);  // nothing of it is counted per client
  }
  Status acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert, ExpertWeights* out) override {
    return store_.acquire_next_for(id_, layer, pending, expert, out);
  }
  void release(int32_t layer, int32_t expert) override { store_.release_for(id_, layer, expert); }
  Status wait_down(int32_t layer, int32_t expert) override { return store_.wait_down_for(id_, layer, expert); }

 private:
  ExpertStore& store_;
  const int32_t id_;
};

std::unique_ptr<ExpertSource> ExpertStore::open_client(int32_t* id) {
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t client = next_client_++;
  clients_[client].resize(stats_.size());
  *id = client;
  try {
    return std::make_unique<StoreClient>(*this, client);
  } catch (...) {
    clients_.erase(client);
    throw;
  }
}

void ExpertStore::close_client(int32_t client) {
  std::lock_guard<std::mutex> lock(mu_);
  clients_.erase(client);
  client_pins_.erase(client);
  // Its guesses no longer hold slots, and those not started yet are not read.
  if (hints_.erase(client)) rebuild_future_locked();
  drop_queued_guesses_locked([&](const Slot& s) { return s.client == client; });
}

template <class Pick>
void ExpertStore::drop_queued_guesses_locked(Pick&& drop) {
  for (auto it = spec_q_.begin(); it != spec_q_.end();) {
    Slot& s = slots_[static_cast<size_t>(it->slot)];
    if (s.speculative && s.pins == 0 && drop(static_cast<const Slot&>(s))) {
      count_locked(s.client, s.layer, [](ExpertLayerStats& c) { c.prefetches_wasted++; });
      if (trace_) trace_->instant("prefetch dropped", "prefetch", "evaluation", {{"layer", s.layer}, {"expert", s.expert}});
      where_.erase(key(s.layer, s.expert));
      clear_slot(&s);
      it = spec_q_.erase(it);
    } else {
      ++it;
    }
  }
}

void ExpertStore::promote_queued_guess_locked(int32_t slot) {
  const auto it = std::find_if(spec_q_.begin(), spec_q_.end(), [&](const Request& r) { return r.slot == slot; });
  if (it == spec_q_.end()) {  // being read: its next reads need not wait for demand reads any more
    guess_cv_.notify_all();
    return;
  }
  demand_q_.push_back({slot, true});
  spec_q_.erase(it);
  work_cv_.notify_one();
  guess_cv_.notify_all();
}

std::vector<ExpertLayerStats> ExpertStore::client_stats(int32_t client) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = clients_.find(client);
  return it == clients_.end() ? std::vector<ExpertLayerStats>() : it->second;
}

ExpertLayerStats* ExpertStore::client_layer_locked(int32_t client, int32_t layer) {
  if (client == kNoClient) return nullptr;
  const auto it = clients_.find(client);
  return it == clients_.end() ? nullptr : &it->second[static_cast<size_t>(layer)];
}

Status ExpertStore::admit_locked(std::unique_lock<std::mutex>& lock, int32_t client, int32_t layer, int32_t n) {
  const size_t pool = pool_of(layer);
  int32_t& pins = admitted_pins_[pool];
  std::deque<uint64_t>& queue = admission_queue_[pool];
  // A pool with no pins out admits any round (one larger than capacity() then fails as before,
  // for want of a slot, rather than waiting for ever).
  auto fits = [&] { return pins == 0 || pins + n <= capacity(layer); };
  if (client == kNoClient) {
    pins += n;
    return MOELITE_OK;
  }
  int32_t& own = client_pins_[client];
  if (own > 0)
    return fail(MOELITE_ERR_INTERNAL,
                "expert store: a context asked for %d experts of layer %d while it still held %d from an earlier "
                "round (pins leaked on an error path)",
                n, layer, own);
  if (queue.empty() && fits()) {
    pins += n;
    own += n;
    return MOELITE_OK;
  }
  const uint64_t ticket = next_ticket_++;
  queue.push_back(ticket);
  for (;;) {
    if (queue.front() == ticket && fits()) {
      queue.pop_front();
      pins += n;
      client_pins_[client] += n;
      admit_cv_.notify_all();  // the next in line may fit too
      return MOELITE_OK;
    }
    admit_cv_.wait_for(lock, std::chrono::duration<double>(kAbortPollSeconds));
    lock.unlock();
    const bool abort = abort_requested();
    lock.lock();
    if (abort) {
      queue.erase(std::find(queue.begin(), queue.end(), ticket));
      admit_cv_.notify_all();
      return fail(MOELITE_ERR_ABORTED,
                  "evaluation aborted by the abort callback while layer %d waited for other contexts' experts", layer);
    }
  }
}

void ExpertStore::return_admission_locked(int32_t layer, int32_t client, int32_t n) {
  if (n <= 0) return;
  admitted_pins_[pool_of(layer)] -= n;
  if (client != kNoClient) {
    const auto it = client_pins_.find(client);
    if (it != client_pins_.end()) it->second -= n;
  }
  admit_cv_.notify_all();
}

void ExpertStore::unpin_locked(Slot& s, int32_t layer, int32_t client) {
  if (s.pins == 0) return;
  s.pins--;
  return_admission_locked(layer, client, 1);
}

void ExpertStore::clear_slot(Slot* s) {
  uint8_t* mem = s->mem;
  const int32_t owner = s->owner;
  *s = Slot();
  s->mem = mem;
  s->owner = owner;
}

Status ExpertStore::create(const Model& model, Backend& backend, const ExpertMemoryPlan& plan,
                           const ExpertStoreOptions& opts, std::unique_ptr<ExpertStore>* out) {
  if (!plan.streams || plan.n_slots < 1 || plan.layout.slot_bytes == 0)
    return fail(MOELITE_ERR_INTERNAL, "the expert store needs a plan with slots");
  std::unique_ptr<ExpertStore> s(new ExpertStore(model, backend));
  MOELITE_TRY(make_policy(opts.policy, &s->policy_));
  s->policy_name_ = opts.policy;
  s->gate_ = GuessGate(opts.guess_min_precision);
  s->per_layer_ = plan.per_layer();
  s->slot_bytes_ = plan.layout.slot_bytes;
  s->quota_ = plan.layer_slots;
  const uint64_t n_slots = static_cast<uint64_t>(plan.n_slots);

  // Storage tier: the model file itself or its packed expert file, bypassing the page cache where
  // the file system allows.
  const std::string& path = s->reads_.path();
  if (plan.layout.slot_bytes < s->reads_.slot_bytes())
    return fail(MOELITE_ERR_INTERNAL, "the plan's slots (%" PRIu64 " bytes) are smaller than an expert's reads (%" PRIu64 ")",
                plan.layout.slot_bytes, s->reads_.slot_bytes());
  if (platform::File::open_direct(path, &s->file_) != MOELITE_OK) {
    clear_error();
    MOELITE_TRY(platform::File::open(path, &s->file_));
  }

  // Slots in memory the backend computes on in place when it has such (unified-memory GPUs).
  s->pool_ = static_cast<uint8_t*>(backend.alloc_shared(n_slots * s->slot_bytes_));
  s->pool_shared_ = s->pool_ != nullptr;
  if (!s->pool_) s->pool_ = pool_alloc(n_slots * s->slot_bytes_);
  if (!s->pool_)
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "cannot allocate the expert pool of %" PRIu64 " bytes",
                n_slots * s->slot_bytes_);
  s->slots_.resize(static_cast<size_t>(n_slots));
  for (size_t i = 0, layer = 0, used = 0; i < s->slots_.size(); ++i) {
    s->slots_[i].mem = s->pool_ + i * s->slot_bytes_;
    if (!s->per_layer_) continue;
    while (used == static_cast<size_t>(s->quota_[layer])) {  // the next layer with slots left
      ++layer;
      used = 0;
    }
    s->slots_[i].owner = static_cast<int32_t>(layer);
    ++used;
  }
  s->capacity_ = static_cast<int32_t>(s->slots_.size()) - kReserveSlots;
  s->admitted_pins_.assign(s->per_layer_ ? model.layers.size() : 1, 0);
  s->admission_queue_.resize(s->admitted_pins_.size());
  if (!plan.expert_counts.empty()) s->policy_->set_frequencies(plan.expert_counts, model.hp.n_expert);
  s->slot_ever_used_.assign(s->slots_.size(), false);
  s->stats_.resize(model.layers.size());
  // What a loader needs is made here, where running out of memory is an error to return: an
  // exception escaping a loader thread would terminate the process.
  const int32_t n_loaders = std::max(1, opts.io_threads);
  s->few_misses_ = 2 * static_cast<size_t>(std::max(1, model.hp.n_expert_used));
  s->guesses_in_flight_max_ = std::max(1, n_loaders - 1);
  try {
    (void)platform::little_cores();  // computed once; a loader only reads it
    s->loader_state_.resize(static_cast<size_t>(n_loaders));
    for (Loader& l : s->loader_state_) {
      l.reader = ExpertReads::loader_reader();
      l.batch.reserve(s->reads_.most_experts_per_submission());  // neither grows after this
      l.served.reserve(s->reads_.most_experts_per_submission());
    }
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory preparing %d expert loader(s)", n_loaders);
  }
  s->reader_name_ = s->loader_state_[0].reader->name();
  try {
    for (Loader& l : s->loader_state_)
      s->loaders_.emplace_back([p = s.get(), loader = &l] { p->loader_main(*loader); });
  } catch (const std::exception& e) {  // the store's destructor stops and joins those started
    return fail(MOELITE_ERR_SYSTEM_LIMIT, "the system refused expert loader thread %zu of %d (%s)",
                s->loaders_.size() + 1, n_loaders, e.what());
  }
  log_msg(MOELITE_LOG_INFO,
          "expert store: %zu slots of %" PRIu64 " bytes (%.1f MiB of a %.1f MiB budget), %s, policy %s, %s",
          s->slots_.size(), s->slot_bytes_, s->pool_bytes() / 1048576.0, plan.budget_bytes / 1048576.0,
          s->io_mode().c_str(), s->policy_name_.c_str(), s->per_layer_ ? "per-layer quotas" : "global pool");
  *out = std::move(s);
  return MOELITE_OK;
}

ExpertStore::~ExpertStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  guess_cv_.notify_all();
  for (auto& t : loaders_) t.join();
  if (pool_shared_)
    backend_.free_shared(pool_);
  else
    pool_free(pool_);
}

size_t ExpertStore::pinned_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Slot& s : slots_) n += s.pins > 0 ? 1 : 0;
  return n;
}

ExpertWeights ExpertStore::view(const Slot& s) const {
  ExpertWeights w = model_.layers[static_cast<size_t>(s.layer)].experts.expert(s.expert);
  for (int c = 0; c < 3; ++c) {
    w.matrix(c).data = s.mem + reads_.matrix_offset(s.layer, w, c, file_.is_direct());
    w.matrix(c).mapped = false;  // a slot: refilled with other experts
  }
  return w;
}

int32_t ExpertStore::take_slot_locked(int32_t layer, bool speculative) {
  std::vector<int32_t> spare, used;  // evictable slots: unused speculative loads, then the rest
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.owner >= 0 && s.owner != layer) continue;     // another layer's quota
    if (s.state == SlotState::Failed && s.pins == 0) {  // a failed load nobody waits for any more
      where_.erase(key(s.layer, s.expert));
      clear_slot(&s);
    }
    if (s.state == SlotState::Free) return static_cast<int32_t>(i);
    if (s.state != SlotState::Ready || s.pins > 0) continue;
    if (speculative && future_.count(key(s.layer, s.expert))) continue;
    (s.speculative ? spare : used).push_back(static_cast<int32_t>(i));
  }
  // Unused speculative loads go first; among the others the policy decides.
  const std::vector<int32_t>& pool = spare.empty() ? used : spare;
  if (pool.empty()) return -1;
  std::vector<ExpertKey> candidates;
  for (int32_t i : pool)
    candidates.push_back({slots_[static_cast<size_t>(i)].layer, slots_[static_cast<size_t>(i)].expert});
  const int32_t victim = pool[policy_->choose_victim(candidates, clock_)];
  Slot& v = slots_[static_cast<size_t>(victim)];
  if (v.speculative) {
    count_locked(v.client, v.layer, [](ExpertLayerStats& c) { c.prefetches_wasted++; });
    if (trace_) trace_->instant("prefetch wasted", "prefetch", nullptr, {{"layer", v.layer}, {"expert", v.expert}});
  }
  policy_->on_evict({v.layer, v.expert});
  where_.erase(key(v.layer, v.expert));
  clear_slot(&v);
  return victim;
}

int32_t ExpertStore::start_load_locked(int32_t layer, int32_t expert, bool demand, int32_t client) {
  const int32_t i = take_slot_locked(layer, !demand);
  if (i < 0) return -1;
  // The map and queue insertions can throw (bad_alloc). They come before the slot changes state,
  // and the first is undone if the second throws: a failure must not leave a slot 'Loading' that
  // no loader will ever read (its waiters would wait for ever).
  where_[key(layer, expert)] = i;
  try {
    (demand ? demand_q_ : spec_q_).push_back({i, demand});
  } catch (...) {
    where_.erase(key(layer, expert));
    throw;
  }
  Slot& s = slots_[static_cast<size_t>(i)];
  s.layer = layer;
  s.expert = expert;
  s.state = SlotState::Loading;
  s.pins = demand ? 1 : 0;
  s.speculative = !demand;
  s.orphaned = false;
  s.error = MOELITE_OK;
  s.client = client;
  if (trace_) s.queued_us = TimelineRecorder::now_us();
  slot_ever_used_[static_cast<size_t>(i)] = true;
  work_cv_.notify_one();
  if (demand) guess_cv_.notify_all();  // a loader whose guess waits reads demand itself
  return i;
}

bool ExpertStore::present_locked(int32_t layer, int32_t expert) const {
  const auto it = where_.find(key(layer, expert));
  if (it == where_.end()) return false;
  const SlotState st = slots_[static_cast<size_t>(it->second)].state;
  return st == SlotState::Ready || st == SlotState::Loading;
}

bool ExpertStore::resident_or_loading(int32_t layer, int32_t expert) const {
  std::lock_guard<std::mutex> lock(mu_);
  return present_locked(layer, expert);
}

bool ExpertStore::ready(int32_t layer, int32_t expert) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = where_.find(key(layer, expert));
  return it != where_.end() && slots_[static_cast<size_t>(it->second)].state == SlotState::Ready;
}

void ExpertStore::residency(int32_t layer, int32_t n_expert, std::vector<uint8_t>* mask) const {
  mask->assign(static_cast<size_t>(std::max(0, n_expert)), 0);
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t e = 0; e < n_expert; ++e) (*mask)[static_cast<size_t>(e)] = present_locked(layer, e) ? 1 : 0;
}

void ExpertStore::on_routing(int32_t layer, const Routing& routing) { on_routing_for(kNoClient, layer, routing); }

void ExpertStore::on_routing_for(int32_t client, int32_t layer, const Routing& routing) {
  std::lock_guard<std::mutex> lock(mu_);
  // What was predicted for this layer is final now: score it in prepare().
  Hints& h = hints_locked(client);
  std::vector<int32_t>& guessed = h.predicted[static_cast<size_t>(layer)];
  count_locked(client, layer, [&](ExpertLayerStats& c) { c.predictions += guessed.size(); });
  h.scored_layer = layer;
  h.scored.swap(guessed);
  guessed.clear();
  std::vector<Prediction>& absent = h.absent[static_cast<size_t>(layer)];
  for (const Prediction& p : absent)
    gate_.score(p.confidence, std::find(routing.ids.begin(), routing.ids.end(), p.key.expert) != routing.ids.end());
  absent.clear();
  h.waiting.erase(
      std::remove_if(h.waiting.begin(), h.waiting.end(), [&](const Prediction& p) { return p.key.layer <= layer; }),
      h.waiting.end());
  // Early preemption: queued speculative loads of this layer that this client guessed and its
  // routing does not use. Another client's guesses are for its own evaluation of the layer (also
  // where it named an expert this client's guess is already loading), and a queued load some
  // client has pinned since (prepare) is no longer a guess.
  drop_queued_guesses_locked([&](const Slot& s) {
    return s.layer == layer && s.client == client &&
           std::find(routing.ids.begin(), routing.ids.end(), s.expert) == routing.ids.end() &&
           !named_by_another_locked(client, s.layer, s.expert);
  });
  // Guesses of this layer being read that the routing refuted: their reads stop where they are.
  bool refuted = false;
  for (Slot& s : slots_) {
    if (s.state != SlotState::Loading || !s.speculative || s.pins > 0 || s.layer != layer || s.client != client ||
        std::find(routing.ids.begin(), routing.ids.end(), s.expert) != routing.ids.end() ||
        named_by_another_locked(client, s.layer, s.expert))
      continue;
    s.refuted = true;
    refuted = true;
  }
  if (refuted) guess_cv_.notify_all();
}

void ExpertStore::prefetch_locked(int32_t layer, int32_t expert, int32_t client) {
  if (const auto it = where_.find(key(layer, expert)); it != where_.end()) {
    // Resident or on its way. A guess a routing refuted while it was read, named again by a later
    // hint, is a live guess again: its reads go on instead of stopping.
    slots_[static_cast<size_t>(it->second)].refuted = false;
    return;
  }
  if (start_load_locked(layer, expert, false, client) >= 0) {
    count_locked(client, layer, [](ExpertLayerStats& c) { c.prefetches_issued++; });
    if (trace_) trace_->instant("prefetch issued", "prefetch", nullptr, {{"layer", layer}, {"expert", expert}});
  }
}

void ExpertStore::hint(const std::vector<Prediction>& predictions, int32_t upcoming_layer) {
  hint_for(kNoClient, predictions, upcoming_layer);
}

ExpertStore::Hints& ExpertStore::hints_locked(int32_t client) {
  Hints& h = hints_[client];
  if (h.predicted.empty()) {
    h.predicted.resize(model_.layers.size());
    h.absent.resize(model_.layers.size());
  }
  return h;
}

void ExpertStore::rebuild_future_locked() noexcept {
  future_.clear();
  try {
    for (const auto& [client, h] : hints_)
      for (const ExpertKey& k : h.named) future_[k.packed()] = {clock_ + 1};
  } catch (...) {  // out of memory: no guess is kept from eviction (speculation is best effort)
    future_.clear();
  }
  policy_->set_future(&future_);
}

bool ExpertStore::named_by_another_locked(int32_t client, int32_t layer, int32_t expert) const {
  const ExpertKey k{layer, expert};
  for (const auto& [other, h] : hints_)
    if (other != client && std::find(h.named.begin(), h.named.end(), k) != h.named.end()) return true;
  return false;
}

void ExpertStore::hint_for(int32_t client, const std::vector<Prediction>& predictions, int32_t upcoming_layer) {
  std::lock_guard<std::mutex> lock(mu_);
  Hints& h = hints_locked(client);
  // Newer guesses replace the client's older ones: they were made from a later hidden state.
  h.waiting.clear();
  h.issued.clear();
  for (const Prediction& p : predictions) {
    if (p.key.layer < 0 || p.key.layer >= static_cast<int32_t>(h.predicted.size()) || p.key.expert < 0) continue;
    // Accuracy counts what was ever predicted for the layer; the queue holds this hint's guesses.
    std::vector<int32_t>& guessed = h.predicted[static_cast<size_t>(p.key.layer)];
    if (std::find(guessed.begin(), guessed.end(), p.key.expert) == guessed.end()) guessed.push_back(p.key.expert);
    // A guess of an absent expert costs a read: the gate scores it at the routing, and reads it
    // only where guesses of its confidence have been right often enough.
    if (p.confidence < kCertain && !present_locked(p.key.layer, p.key.expert)) {
      std::vector<Prediction>& absent = h.absent[static_cast<size_t>(p.key.layer)];
      const auto seen = std::find_if(absent.begin(), absent.end(), [&](const Prediction& a) { return a.key == p.key; });
      if (seen == absent.end())
        absent.push_back(p);
      else
        seen->confidence = p.confidence;
      if (!gate_.worth_reading(p.confidence)) continue;
    }
    if (std::none_of(h.waiting.begin(), h.waiting.end(), [&](const Prediction& w) { return w.key == p.key; }))
      h.waiting.push_back(p);
  }
  std::stable_sort(h.waiting.begin(), h.waiting.end(), [](const Prediction& a, const Prediction& b) {
    return a.key.layer != b.key.layer ? a.key.layer < b.key.layer : a.confidence > b.confidence;
  });
  // What the store knows of the future is the predictions: these experts are needed next.
  h.named.clear();
  for (const Prediction& p : h.waiting) h.named.push_back(p.key);
  rebuild_future_locked();
  h.waiting_for = upcoming_layer;
  if (h.waiting_for < 0) issue_predictions_locked(client, h);
}

void ExpertStore::issue_predictions_locked(int32_t client, Hints& h) {
  while (!h.waiting.empty()) {
    const int32_t layer = h.waiting.front().key.layer;
    for (const ExpertKey& k : h.issued) {
      if (k.layer >= layer) continue;
      auto it = where_.find(key(k.layer, k.expert));
      if (it == where_.end() || slots_[static_cast<size_t>(it->second)].state != SlotState::Ready) return;
    }
    size_t n = 0;
    while (n < h.waiting.size() && h.waiting[n].key.layer == layer) {
      prefetch_locked(layer, h.waiting[n].key.expert, client);
      h.issued.push_back(h.waiting[n].key);
      ++n;
    }
    h.waiting.erase(h.waiting.begin(), h.waiting.begin() + static_cast<std::ptrdiff_t>(n));
  }
}

void ExpertStore::issue_all_predictions_locked() {
  for (auto& [client, h] : hints_)
    if (h.waiting_for < 0 && !h.waiting.empty()) issue_predictions_locked(client, h);
}

Status ExpertStore::prepare(int32_t layer, const std::vector<int32_t>& experts) {
  return prepare_for(kNoClient, layer, experts);
}

Status ExpertStore::prepare_for(int32_t client, int32_t layer, const std::vector<int32_t>& experts) {
  std::unique_lock<std::mutex> lock(mu_);
  MOELITE_TRY(admit_locked(lock, client, layer, static_cast<int32_t>(experts.size())));
  return pin_admitted_locked(lock, client, layer, experts);
}

Status ExpertStore::extend_round(int32_t layer, int32_t expert, bool* added) {
  return extend_round_for(kNoClient, layer, expert, added);
}

Status ExpertStore::extend_round_for(int32_t client, int32_t layer, int32_t expert, bool* added) {
  *added = false;
  const std::vector<int32_t> one{expert};  // allocated before the admission, which nothing may leak
  std::unique_lock<std::mutex> lock(mu_);
  // Never a wait for other contexts: the caller holds pins, and waiting while holding them could
  // deadlock with a context waiting for those. Nor a pass ahead of one already waiting (fairness).
  const size_t pool = pool_of(layer);
  if (!admission_queue_[pool].empty() || admitted_pins_[pool] + 1 > capacity(layer)) return MOELITE_OK;
  if (client != kNoClient) client_pins_[client] += 1;  // may allocate: before the pool's count
  admitted_pins_[pool] += 1;
  MOELITE_TRY(pin_admitted_locked(lock, client, layer, one));
  *added = true;
  return MOELITE_OK;
}

Status ExpertStore::pin_admitted_locked(std::unique_lock<std::mutex>& lock, int32_t client, int32_t layer,
                                        const std::vector<int32_t>& experts) {
  // What this call counts, added to the store's and the client's counters on every way out
  // (while the lock is held: declared after it).
  struct Tally {
    ExpertStore* store;
    int32_t client, layer;
    ExpertLayerStats delta;
    ~Tally() {
      store->count_locked(client, layer, [&](ExpertLayerStats& c) { c += delta; });
    }
  } tally{this, client, layer, {}};
  // On every way out but success (an error, or an exception such as bad_alloc from a container),
  // the pins this call took are given back: the caller releases nothing it was not handed.
  size_t pinned = 0;
  struct Unpin {
    ExpertStore* store;
    int32_t layer, client;
    const std::vector<int32_t>& experts;
    const size_t& pinned;
    bool done = false;
    ~Unpin() {  // runs before `lock` is released
      if (done) return;
      for (size_t i = 0; i < pinned; ++i) {
        auto it = store->where_.find(key(layer, experts[i]));
        if (it != store->where_.end())
          store->unpin_locked(store->slots_[static_cast<size_t>(it->second)], layer, client);
      }
      // The admission of the experts never pinned goes back too.
      store->return_admission_locked(layer, client, static_cast<int32_t>(experts.size() - pinned));
      store->ready_cv_.notify_all();
    }
  } unpin{this, layer, client, experts, pinned};
  policy_->on_serve(layer);  // the victims chosen below make room for this layer
  ExpertLayerStats& st = tally.delta;
  Hints& hints = hints_locked(client);
  for (int32_t e : experts) {
    st.activations++;
    if (hints.scored_layer == layer && std::find(hints.scored.begin(), hints.scored.end(), e) != hints.scored.end())
      st.predicted++;
    // Pins the expert's slot if it has one; a failed read nobody waits for any more is dropped, to
    // be read again. Asked at the routing, and again after waiting for a free slot (the lock
    // released), when another client's demand or guess may have started the same read meanwhile:
    // a second slot under the same key would hide the first from where_, whose pins could then
    // never be given back. `ready`: whether the whole expert was in memory.
    auto pin_present = [&](bool* ready) {
      const auto it = where_.find(key(layer, e));
      if (it == where_.end()) return false;
      Slot& s = slots_[static_cast<size_t>(it->second)];
      if (s.state == SlotState::Failed && s.pins == 0) {
        clear_slot(&s);
        where_.erase(it);
        return false;
      }
      if (ready) *ready = s.state == SlotState::Ready;
      if (s.speculative && s.state == SlotState::Loading) promote_queued_guess_locked(it->second);
      s.pins++;
      if (s.speculative) {
        s.speculative = false;
        st.prefetches_used++;
        if (trace_) trace_->instant("prefetch used", "prefetch", "evaluation", {{"layer", layer}, {"expert", e}});
      }
      return true;
    };
    bool ready = false;
    if (pin_present(&ready)) {
      if (ready) st.ready_when_needed++;
      st.hits++;
      ++pinned;
      continue;
    }
    st.misses++;
    const double since = platform::now_seconds();
    while (!pin_present(nullptr) && start_load_locked(layer, e, true, client) < 0) {
      // Every slot this layer may use is pinned or still loading a guess: wait for a load to land.
      const bool loading = std::any_of(slots_.begin(), slots_.end(), [&](const Slot& sl) {
        return sl.state == SlotState::Loading && sl.pins == 0 && (sl.owner < 0 || sl.owner == layer);
      });
      Status waited = MOELITE_OK;
      if (!loading) {
        waited = fail(MOELITE_ERR_INTERNAL, "expert store: no slot free for layer %d expert %d", layer, e);
      } else {
        const double t0 = platform::now_seconds();
        waited = wait_for_change(ready_cv_, lock, since, layer, e);
        st.wait_seconds += platform::now_seconds() - t0;
      }
      // The caller learns of no expert of this call: `unpin` gives back those pinned so far (their
      // loads go on and land as unpinned, evictable slots).
      if (waited != MOELITE_OK) return waited;
    }
    ++pinned;
  }
  unpin.done = true;
  // The policy sees the accesses here, in the caller's (routing) order, not at release: experts
  // are released in the order their loads land, which varies from run to run, and the cache's
  // state (hence misses, and cache-aware gating) must be a function of the evaluations alone. The
  // clock ticks once per access and nowhere else, for the same reason. Pinned experts cannot be
  // evicted, so recording the access before the computation changes no victim choice otherwise.
  // A policy that could not record an access (out of memory) only ranks the expert worse.
  for (int32_t e : experts) {
    ++clock_;
    try {
      policy_->on_access({layer, e}, clock_);
    } catch (...) {
    }
  }
  // This layer's experts are pinned now, so speculative loads for later ones cannot evict them.
  // Speculation is best effort: out of memory here drops the guesses, never the pins the caller
  // now owns (an exception from here would leave them with nobody to give them back).
  if (hints.waiting_for == layer) {
    hints.waiting_for = -1;
    try {
      issue_predictions_locked(client, hints);
    } catch (...) {
      hints.waiting.clear();
    }
  }
  return MOELITE_OK;
}

void ExpertStore::take_ready(int32_t layer, std::vector<int32_t>* pending, std::vector<ReadyExpert>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t kept = 0;
  for (int32_t e : *pending) {
    const Slot& s = slots_[static_cast<size_t>(where_.at(key(layer, e)))];
    if (s.state == SlotState::Ready)
      out->push_back({e, view(s)});  // no reallocation: the caller reserved room
    else
      (*pending)[kept++] = e;
  }
  pending->resize(kept);
}

Status ExpertStore::acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert, ExpertWeights* out) {
  return acquire_next_for(kNoClient, layer, pending, expert, out);
}

Status ExpertStore::acquire_next_for(int32_t client, int32_t layer, std::vector<int32_t>* pending, int32_t* expert,
                                     ExpertWeights* out) {
  std::unique_lock<std::mutex> lock(mu_);
  double waited = 0;
  const double since = platform::now_seconds();
  for (;;) {
    for (size_t i = 0; i < pending->size(); ++i) {
      const int32_t e = (*pending)[i];
      Slot& s = slots_[static_cast<size_t>(where_.at(key(layer, e)))];
      // Computation can start once gate and up are in; down is waited for by wait_down().
      if (s.state == SlotState::Ready || (s.state == SlotState::Loading && s.chunks_ready >= 2)) {
        pending->erase(pending->begin() + static_cast<std::ptrdiff_t>(i));
        count_locked(client, layer, [&](ExpertLayerStats& c) { c.wait_seconds += waited; });
        *expert = e;
        *out = view(s);
        return MOELITE_OK;
      }
      if (s.state == SlotState::Failed) {
        const Status err = fail_with_slot_error(s);  // before the slot can be reused
        release_pending_for_locked(client, layer, pending);
        return err;
      }
    }
    const double t0 = platform::now_seconds();
    const Status st = wait_for_change(ready_cv_, lock, since, layer, pending->empty() ? -1 : pending->front());
    waited += platform::now_seconds() - t0;
    if (st != MOELITE_OK) {
      count_locked(client, layer, [&](ExpertLayerStats& c) { c.wait_seconds += waited; });
      const std::string msg = last_error_message();
      release_pending_for_locked(client, layer, pending);
      return fail(st, "%s", msg.c_str());
    }
  }
}

// Unpins every expert still pending (an acquire that ends in an error hands none of them out);
// failed slots become free again for a retry, slots still loading finish as unpinned slots.
void ExpertStore::release_pending_for_locked(int32_t client, int32_t layer, std::vector<int32_t>* pending) {
  for (int32_t p : *pending) {
    const int32_t idx = where_.at(key(layer, p));
    Slot& ps = slots_[static_cast<size_t>(idx)];
    unpin_locked(ps, layer, client);
    if (ps.state == SlotState::Loading) ps.orphaned = true;
    if (ps.pins == 0 && ps.state == SlotState::Failed) {
      where_.erase(key(layer, p));
      clear_slot(&ps);
    }
  }
  pending->clear();
  ready_cv_.notify_all();
}

Status ExpertStore::wait_down(int32_t layer, int32_t expert) { return wait_down_for(kNoClient, layer, expert); }

Status ExpertStore::wait_down_for(int32_t client, int32_t layer, int32_t expert) {
  std::unique_lock<std::mutex> lock(mu_);
  Slot& s = slots_[static_cast<size_t>(where_.at(key(layer, expert)))];
  double waited = 0;
  const double since = platform::now_seconds();
  while (s.state == SlotState::Loading) {
    const double t0 = platform::now_seconds();
    const Status st = wait_for_change(ready_cv_, lock, since, layer, expert);
    waited += platform::now_seconds() - t0;
    if (st != MOELITE_OK) {
      // The caller still holds the expert and releases it; its load lands in an unpinned slot.
      count_locked(client, layer, [&](ExpertLayerStats& c) { c.wait_seconds += waited; });
      return st;
    }
  }
  count_locked(client, layer, [&](ExpertLayerStats& c) { c.wait_seconds += waited; });
  if (s.state == SlotState::Failed) return fail_with_slot_error(s);
  return MOELITE_OK;
}

Status ExpertStore::fail_with_slot_error(const Slot& s) {
  // The loader could not always afford the message (it failed for want of memory).
  return fail(s.error, "%s", s.error_msg.empty() ? "out of memory starting an expert read" : s.error_msg.c_str());
}

void ExpertStore::release(int32_t layer, int32_t expert) { release_for(kNoClient, layer, expert); }

void ExpertStore::release_for(int32_t client, int32_t layer, int32_t expert) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = where_.find(key(layer, expert));
  if (it == where_.end()) return;
  Slot& s = slots_[static_cast<size_t>(it->second)];
  unpin_locked(s, layer, client);
  // Only an evaluation that failed gives back an expert still loading (its down chunk).
  if (s.state == SlotState::Loading) s.orphaned = true;
  s.last_use = clock_;
}

void ExpertStore::loader_main(Loader& loader) noexcept {
  // On big.LITTLE the compute workers own the big cores; a loader mostly waits for its reads, so
  // it lives on the little ones (a refusal, e.g. by a cpuset, just leaves it unpinned).
  platform::pin_current_thread(platform::little_cores());
  // A loader with few reads in flight must start the next as soon as one lands, or the storage
  // idles until the scheduler gets round to it: where the compute workers hold every core, a short
  // slice lets the waking loader preempt one at once (expert_reads.h has the measurements).
  platform::prefer_short_slice(kLoaderSliceNs);
  for (;;) {
    BatchKind kind = BatchKind::kGuess;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Guesses never take the last free loader (at most loaders - 1 of them are read at once,
      // one with the default two loaders): a demand read always finds a loader, the best guess
      // goes first, and those still queued when their layer's routing comes are dropped unread
      // (on_routing) instead of read in vain. Measured on the bench-shaped model (64 experts of
      // 6.7 MB, 2 cores, 2 loaders): next-gate read 10-30 % fewer bytes and went from slower than
      // no predictor to faster at 50 % (one sequence) and 50-75 % (four).
      auto may_guess = [&] { return speculative_in_flight_ < guesses_in_flight_max_; };
      work_cv_.wait(lock, [&] { return stop_ || !demand_q_.empty() || (may_guess() && !spec_q_.empty()); });
      if (stop_) return;
      take_batch_locked(loader.batch, may_guess(), &kind);
    }
    read_batch(loader, loader.batch, kind);
  }
}

bool ExpertStore::take_batch_locked(std::vector<Load>& batch, bool may_guess, BatchKind* kind) {
  batch.clear();
  if (demand_q_.empty() && (!may_guess || spec_q_.empty())) return false;
  // Demand before speculation. A few misses (up to two tokens' routing) are read in order within
  // the bytes in flight, as many experts as those hold: the first lands early and computes while
  // the rest are read. More (a prompt, several sequences) are read for throughput: the whole
  // submission's worth at once, whose reads keep the storage busy while the loader waits for a
  // CPU (bench model, 25 % budget, a 128-token prompt: 0.84-0.95x the speed in order). A routing
  // queues its misses together and wakes every loader, but on a machine whose cores all compute,
  // the first loader to get a CPU can be the only one for a few milliseconds (a trace of a 2-core
  // decode at a 50 % budget: the second of two misses started 1-2 ms after the first), so a batch
  // takes every miss it may.
  std::deque<Request>& q = demand_q_.empty() ? spec_q_ : demand_q_;
  *kind = &q == &spec_q_ ? BatchKind::kGuess : q.size() <= few_misses_ ? BatchKind::kFewMisses : BatchKind::kManyMisses;
  const size_t take = *kind == BatchKind::kGuess       ? 1
                      : *kind == BatchKind::kFewMisses ? reads_.experts_per_submission()
                                                       : reads_.most_experts_per_submission();
  while (!q.empty() && batch.size() < take) {
    const Slot& s = slots_[static_cast<size_t>(q.front().slot)];
    batch.push_back({q.front().slot, s.layer, s.expert, s.client, s.queued_us, s.speculative, false});  // reserved
    q.pop_front();
  }
  if (batches_in_flight_++ == 0) busy_since_ = platform::now_seconds();
  ++(*kind == BatchKind::kGuess ? speculative_in_flight_ : demand_in_flight_);
  return true;
}

void ExpertStore::read_batch(Loader& loader, std::vector<Load>& batch, BatchKind kind) noexcept {
  const bool guess = kind == BatchKind::kGuess;
  bool busy = true;
  try {
    load_batch(loader, batch, kind, &busy);
  } catch (...) {  // out of memory for the batch's bookkeeping: its experts fail, the loader lives
    std::lock_guard<std::mutex> lock(mu_);
    for (const Load& l : batch) {
      if (l.settled) continue;  // landed, and may hold another expert by now
      Slot& s = slots_[static_cast<size_t>(l.slot)];
      s.state = SlotState::Failed;
      s.chunks_ready = 0;
      s.error = MOELITE_ERR_OUT_OF_MEMORY;
      s.error_msg.clear();  // fail_with_slot_error() says "out of memory" without allocating
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_busy_locked(&busy);
    --(guess ? speculative_in_flight_ : demand_in_flight_);
  }
  ready_cv_.notify_all();
  if (guess)
    work_cv_.notify_one();  // the next guess may start
  else
    guess_cv_.notify_all();  // a guess waiting for the demand reads may go on
}

void ExpertStore::end_busy_locked(bool* busy) {
  if (!*busy) return;
  *busy = false;
  if (--batches_in_flight_ == 0) busy_seconds_ += platform::now_seconds() - busy_since_;
}

double ExpertStore::read_busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_seconds_ + (batches_in_flight_ > 0 ? platform::now_seconds() - busy_since_ : 0.0);
}

Status ExpertStore::read_guess(Loader& loader, Load& load, const std::vector<platform::ReadRange>& ranges,
                               const std::function<void(size_t)>& on_done, uint64_t* total, double* started_us) {
  Slot& s = slots_[static_cast<size_t>(load.slot)];
  const uint64_t bytes_in_flight = reads_.bytes_in_flight();
  *total = 0;
  std::vector<platform::ReadRange> step;
  // Under mu_: the store stops, or the routing refuted the guess and nobody has pinned it since.
  const auto abandoned = [&] { return stop_ || (s.refuted && s.pins == 0); };
  for (size_t next = 0; next < ranges.size();) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Demand reads first (what an evaluation waits for), unless this guess is now needed itself:
      // read those queued, wait for those in flight on other loaders. A guess reads in steps of
      // the bytes in flight, so a demand read waits for one step at most instead of sharing the
      // storage with the whole guess (which made a 50 % decode's demand reads take 2-3x as long).
      for (;;) {
        if (abandoned() || s.pins > 0 || (demand_in_flight_ == 0 && demand_q_.empty())) break;
        BatchKind kind = BatchKind::kFewMisses;
        if (take_batch_locked(loader.served, false, &kind)) {
          lock.unlock();
          read_batch(loader, loader.served, kind);
          lock.lock();
        } else {
          guess_cv_.wait(lock);
        }
      }
      if (abandoned()) {
        // Its slot is free again at once: the reads so far are all the wrong guess cost (the
        // rest is not read; a guess read whole before its routing is evicted first instead).
        count_locked(load.client, load.layer, [](ExpertLayerStats& c) { c.prefetches_wasted++; });
        if (trace_)
          trace_->instant("prefetch abandoned", "prefetch", "expert loader",
                          {{"layer", load.layer},
                           {"expert", load.expert},
                           {"reads_left", static_cast<int64_t>(ranges.size() - next)}});
        where_.erase(key(load.layer, load.expert));
        clear_slot(&s);
        load.settled = true;
        return MOELITE_OK;
      }
    }
    if (next == 0) *started_us = TimelineRecorder::now_us();
    // The next reads: as many as fit within the bytes in flight, at least one.
    size_t end = next + 1;
    uint64_t bytes = ranges[next].len;
    while (end < ranges.size() && bytes + ranges[end].len <= bytes_in_flight) bytes += ranges[end++].len;
    step.assign(ranges.begin() + static_cast<std::ptrdiff_t>(next), ranges.begin() + static_cast<std::ptrdiff_t>(end));
    uint64_t got = 0;
    const Status st = loader.reader->read_all(
        step, [&](size_t j) { on_done(next + j); }, &got);
    *total += got;
    if (st != MOELITE_OK) return st;
    next = end;
  }
  return MOELITE_OK;
}

void ExpertStore::load_batch(Loader& loader, std::vector<Load>& loads, BatchKind kind, bool* busy) {
  const size_t n = loads.size();
  double started_us = TimelineRecorder::now_us();
  // Every expert's reads go out together (three from the model file, each widened to aligned
  // blocks with direct I/O; one or three from a packed file). owner[i] is the expert read i belongs
  // to, in_after[i] how many of its leading matrices are whole once it and the expert's earlier
  // reads have landed.
  std::vector<platform::ReadRange> ranges;
  std::vector<uint8_t> in_after;
  std::vector<size_t> owner, first(n + 1, 0);
  ranges.reserve(3 * n);
  in_after.reserve(3 * n);
  for (size_t k = 0; k < n; ++k) {
    first[k] = ranges.size();
    reads_.append_reads(loads[k].layer, loads[k].expert, file_.native_handle(), file_.is_direct(),
                        slots_[static_cast<size_t>(loads[k].slot)].mem, &ranges, &in_after);
    owner.resize(ranges.size(), k);
  }
  first[n] = ranges.size();
  // gate/up are usable before down arrives: publish how many leading matrices of an expert are in.
  std::vector<uint8_t> done(ranges.size(), 0);
  auto chunks_in = [&](size_t k) {
    int32_t in = 0;
    for (size_t i = first[k]; i < first[k + 1] && done[i]; ++i) in = in_after[i];
    return in;
  };
  size_t reads_left = ranges.size();
  auto on_done = [&](size_t i) {
    done[i] = 1;
    if (!file_.is_direct()) file_.drop_cache(ranges[i].offset, ranges[i].len);
    const size_t k = owner[i];
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--reads_left == 0) end_busy_locked(busy);
      // A landed read counts now, before its expert can be seen Ready: an evaluation that returns
      // has its reads in the counters (the per-context stats take their difference).
      count_locked(loads[k].client, loads[k].layer, [&](ExpertLayerStats& c) {
        c.bytes_read += ranges[i].len;
        c.reads += 1;
      });
      Slot& s = slots_[static_cast<size_t>(loads[k].slot)];
      const int32_t in = chunks_in(k);
      if (in < 3) {
        s.chunks_ready = in;
      } else {  // the whole expert is in: Ready now, whatever the rest of the batch does
        s.state = SlotState::Ready;
        s.chunks_ready = 3;
        s.error = MOELITE_OK;
        s.orphaned = false;
        s.last_use = clock_;
        loads[k].settled = true;
        if (trace_) {
          int64_t bytes = 0;
          for (size_t r = first[k]; r < first[k + 1]; ++r) bytes += static_cast<int64_t>(ranges[r].len);
          const double queued = loads[k].queued_us > 0 ? started_us - loads[k].queued_us : 0.0;
          trace_->complete("read", "io", "expert loader", started_us, TimelineRecorder::now_us(),
                           {{"layer", loads[k].layer},
                            {"expert", loads[k].expert},
                            {"bytes", bytes},
                            {"queued_us", static_cast<int64_t>(queued)},
                            {"speculative", loads[k].speculative ? 1 : 0},
                            {"batch", static_cast<int64_t>(n)}});
        }
      }
    }
    ready_cv_.notify_all();
  };
  uint64_t total = 0;  // what the reader got; the counters count requested bytes of landed reads
  const Status st =
      kind == BatchKind::kGuess && n == 1
          ? read_guess(loader, loads[0], ranges, on_done, &total, &started_us)
          : loader.reader->read_all(ranges, on_done, &total,
                                    kind == BatchKind::kFewMisses ? reads_.bytes_in_flight() : UINT64_MAX);
  const std::string why = st == MOELITE_OK ? std::string() : last_error_message();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = 0; k < n; ++k) {
    // An expert whose three reads all landed was settled Ready as they did (even when another read
    // of the batch failed), and its slot may have been evicted and reused since. The others fail
    // with the batch's error (and are read again at their next use).
    if (loads[k].settled) continue;
    Slot& s = slots_[static_cast<size_t>(loads[k].slot)];
    if (s.orphaned && s.pins > 0) {
      // The read was started for an evaluation that has failed since, and a later one now waits
      // for it: that one gets a read of its own (the file may have been mended in between)
      // instead of the old read's error.
      s.orphaned = false;
      s.chunks_ready = 0;
      demand_q_.push_back({loads[k].slot, true});
      loads[k].settled = true;
      work_cv_.notify_one();
      guess_cv_.notify_all();
      continue;
    }
    s.state = SlotState::Failed;
    s.chunks_ready = 0;
    s.error = st != MOELITE_OK ? st : MOELITE_ERR_IO;
    s.last_use = clock_;
    loads[k].settled = true;
    s.error_msg = "reading expert " + std::to_string(loads[k].expert) + " of layer " + std::to_string(loads[k].layer) +
                  " from '" + file_.path() + "': " + why;
  }
  // A deeper layer's guesses may have been waiting for these loads.
  issue_all_predictions_locked();
}

uint64_t ExpertStore::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t used = 0;
  for (bool u : slot_ever_used_) used += u ? 1 : 0;
  return used * slot_bytes_;
}

std::vector<ExpertLayerStats> ExpertStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void ExpertStore::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : stats_) s = ExpertLayerStats{};
  busy_seconds_ = 0.0;
  busy_since_ = platform::now_seconds();
}

}  // namespace moelite
