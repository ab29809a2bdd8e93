// The memory-budgeted expert store: routed experts live in a fixed pool of slots that never
// exceeds the budget; missing experts are read from the model file (the storage tier) by loader
// threads, demand loads before speculative ones (which never hold the last free loader), each
// expert in one read or three (gate, up, down: expert_reads.h).
//
// Tiers: storage (the GGUF file) -> host slots (this class). On a unified-memory GPU the slot pool
// is the backend's device-visible memory (zero copy); a discrete GPU backend keeps a device tier
// of its own, filled from these slots.
//
// Exactness: a slot holds the expert's bytes exactly as stored in the file, and core/moe/ adds
// expert outputs in top-k order, so results are bitwise identical whatever the budget.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "core/experts/cache_policy.h"
#include "core/experts/expert_reads.h"
#include "core/experts/expert_source.h"
#include "core/experts/guess_gate.h"
#include "core/experts/memory_plan.h"
#include "core/model/model.h"
#include "platforms/batch_read.h"
#include "platforms/platform.h"

namespace moelite {
class StoreClient;
class TimelineRecorder;

// How the store runs, beside the memory plan that sizes it.
struct ExpertStoreOptions {
  std::string policy = "cyclic";  // cache_policy.h
  int32_t io_threads = 2;      // loader threads (MOELITE_IO_THREADS)
  // Guesses read only where guesses of their confidence have been right this often
  // (MOELITE_PREDICT_MIN_PRECISION; guess_gate.h).
  double guess_min_precision = 0.6;
};

// Cumulative counters of one layer (all layers: sum them).
struct ExpertLayerStats {
  uint64_t activations = 0;  // expert uses by tokens' routing
  uint64_t hits = 0;         // experts already resident (or arriving) when asked for
  uint64_t misses = 0;       // demand loads
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;
  uint64_t prefetches_wasted = 0;  // evicted or dropped before use
  uint64_t bytes_read = 0;
  uint64_t reads = 0;              // read requests landed (an expert is 1 or 3: expert_reads.h)
  double wait_seconds = 0;         // time compute waited for loads
  uint64_t predicted = 0;          // activations a predictor had named beforehand (accuracy)
  uint64_t predictions = 0;        // distinct experts predicted for this layer
  uint64_t ready_when_needed = 0;  // activations whose expert was fully loaded when asked for (timeliness)

  // Calls f(&ExpertLayerStats::c) for every counter c: the one list that sums and differences of
  // counters go through.
  template <class F>
  static void for_each_counter(F&& f) {
    f(&ExpertLayerStats::activations);
    f(&ExpertLayerStats::hits);
    f(&ExpertLayerStats::misses);
    f(&ExpertLayerStats::prefetches_issued);
    f(&ExpertLayerStats::prefetches_used);
    f(&ExpertLayerStats::prefetches_wasted);
    f(&ExpertLayerStats::bytes_read);
    f(&ExpertLayerStats::reads);
    f(&ExpertLayerStats::wait_seconds);
    f(&ExpertLayerStats::predicted);
    f(&ExpertLayerStats::predictions);
    f(&ExpertLayerStats::ready_when_needed);
  }
  ExpertLayerStats& operator+=(const ExpertLayerStats& o) {
    for_each_counter([&](auto counter) { this->*counter += o.*counter; });
    return *this;
  }
};

class ExpertStore final : public ExpertSource {
 public:
  ~ExpertStore() override;
  // A store of the plan's slots (plan.streams must be true: memory_plan.h decides every size).
  // Experts are read from model.path; the slot pool lives in `backend`'s shared memory where it
  // offers some (the backend must outlive the store).
  static Status create(const Model& model, Backend& backend, const ExpertMemoryPlan& plan,
                       const ExpertStoreOptions& opts, std::unique_ptr<ExpertStore>* out);

  bool all_resident() const override { return false; }
  int32_t capacity(int32_t layer) const override {
    return per_layer_ ? quota_[static_cast<size_t>(layer)] - kReserveSlots : capacity_;
  }
  int64_t pool_slots() const override { return static_cast<int64_t>(slots_.size()); }
  // Resident or loading: the expert has a slot that is Ready or Loading (a failed read is not).
  // Without a predictor the state at routing time is a function of the evaluations so far
  // (every demand load has landed by then); speculative loads land asynchronously.
  bool resident_or_loading(int32_t layer, int32_t expert) const override;
  // Whole in memory now (its reads have landed): for tests and tools that wait for a load.
  bool ready(int32_t layer, int32_t expert) const;
  void residency(int32_t layer, int32_t n_expert, std::vector<uint8_t>* mask) const override;
  void on_routing(int32_t layer, const Routing& routing) override;
  Status prepare(int32_t layer, const std::vector<int32_t>& experts) override;
  Status extend_round(int32_t layer, int32_t expert, bool* added) override;
  void take_ready(int32_t layer, std::vector<int32_t>* pending, std::vector<ReadyExpert>* out) override;
  Status acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert, ExpertWeights* out) override;
  void release(int32_t layer, int32_t expert) override;
  Status wait_down(int32_t layer, int32_t expert) override;
  void hint(const std::vector<Prediction>& predictions, int32_t upcoming_layer) override;

  // Clients: one per context. A client is an ExpertSource of its own whose calls go to this store
  // under its id, so that (1) its counters are kept apart (client_stats: what its evaluations
  // asked for, hit, missed, waited for and read, even while other clients evaluate at the same
  // time) and (2) several clients may run the load protocol at once from different threads:
  // prepare() admits a client's round only when the pins it asks for fit beside those already
  // handed out in the same pool (the global pool, or the layer's quota), first come first served.
  // Then every admitted round can get its slots (a pinned slot is one of at most capacity()
  // pins, so one slot is always unpinned), so clients wait for one another but never deadlock
  // (extend_round never waits for admission: it adds a pin only while the pool has room and
  // nobody waits);
  // a waiting client honours its abort callback. Calls made on the store itself (no client) are
  // not admitted: they are the single-caller protocol of before.
  // The store must outlive its clients.
  // *id names the client for client_stats().
  std::unique_ptr<ExpertSource> open_client(int32_t* id);
  std::vector<ExpertLayerStats> client_stats(int32_t client) const;
  // While set, every read (queued, started, landed, bytes) and every prefetch issued, used or
  // wasted goes on this timeline; null stops it.
  void set_trace(std::shared_ptr<TimelineRecorder> trace) {
    std::lock_guard<std::mutex> lock(mu_);
    trace_ = std::move(trace);
  }

  uint64_t slot_bytes() const { return slot_bytes_; }
  // Slots lent out now (pinned by a layer being computed): 0 whenever no evaluation runs.
  size_t pinned_slots() const;
  // Clients waiting now for admission to `layer`'s pool (tests).
  size_t waiting_clients(int32_t layer) const {
    std::lock_guard<std::mutex> lock(mu_);
    return admission_queue_[pool_of(layer)].size();
  }
  uint64_t pool_bytes() const { return slot_bytes_ * slots_.size(); }
  size_t n_slots() const { return slots_.size(); }
  // Bytes of slot memory holding an expert at some point (the store's peak footprint).
  uint64_t peak_bytes() const;
  // "O_DIRECT, io_uring" and the like: how experts are read.
  std::string io_mode() const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::string(reads_.packed() ? "packed expert file, " : "") +
           (file_.is_direct() ? "O_DIRECT" : "buffered + fadvise(DONTNEED)") + ", " + reader_name_ +
           (pool_shared_ ? ", slots in device-visible memory" : "");
  }
  std::vector<ExpertLayerStats> stats() const;
  // Wall time with at least one batch of reads in flight since the last reset_stats().
  double read_busy_seconds() const;
  void reset_stats();
  const std::string& policy_name() const { return policy_name_; }
  bool per_layer() const { return per_layer_; }
  // Slots of each layer's quota (per-layer mode; empty otherwise).
  const std::vector<int32_t>& layer_slots() const { return quota_; }

 private:
  friend class StoreClient;
  static constexpr int32_t kNoClient = -1;
  enum class SlotState { Free, Loading, Ready, Failed };
  struct Slot {
    uint8_t* mem = nullptr;
    int32_t layer = -1, expert = -1;
    SlotState state = SlotState::Free;
    int32_t pins = 0;
    bool speculative = false;  // loaded by prefetch and not used yet
    bool orphaned = false;     // still loading for an evaluation that failed and let it go
    bool refuted = false;      // a guess its client's routing of the layer did not use (on_routing)
    int32_t chunks_ready = 0;  // gate, up, down arrive in that order
    int32_t owner = -1;        // the layer whose quota the slot belongs to (-1: global pool)
    Status error = MOELITE_OK;
    std::string error_msg;
    uint64_t last_use = 0;
    int32_t client = kNoClient;  // whose demand or hint started the load: its reads count to it
    double queued_us = 0;        // when its load was queued (traces)
  };
  struct Request {
    int32_t slot;
    bool demand;
  };

  ExpertStore(const Model& model, Backend& backend) : model_(model), backend_(backend), reads_(model) {}
  // The load protocol on behalf of `client` (kNoClient: the store's own callers).
  void on_routing_for(int32_t client, int32_t layer, const Routing& routing);
  Status prepare_for(int32_t client, int32_t layer, const std::vector<int32_t>& experts);
  Status extend_round_for(int32_t client, int32_t layer, int32_t expert, bool* added);
  // Under mu_, after the admission: pins `experts` (starting their loads, waiting for a slot
  // where every one is pinned or loading) and records the accesses; on failure gives back the
  // pins and the admission this call took.
  Status pin_admitted_locked(std::unique_lock<std::mutex>& lock, int32_t client, int32_t layer,
                             const std::vector<int32_t>& experts);
  Status acquire_next_for(int32_t client, int32_t layer, std::vector<int32_t>* pending, int32_t* expert,
                          ExpertWeights* out);
  Status wait_down_for(int32_t client, int32_t layer, int32_t expert);
  void hint_for(int32_t client, const std::vector<Prediction>& predictions, int32_t upcoming_layer);
  void close_client(int32_t client);
  // Under mu_: the client's counters of `layer`, null for kNoClient or a closed client.
  ExpertLayerStats* client_layer_locked(int32_t client, int32_t layer);
  // Under mu_: adds `f` of a layer's counters to the store's and to the client's.
  template <class F>
  void count_locked(int32_t client, int32_t layer, F&& f) {
    f(stats_[static_cast<size_t>(layer)]);
    if (ExpertLayerStats* c = client_layer_locked(client, layer)) f(*c);
  }
  // Admission (clients only): waits until `n` more pins fit in `layer`'s pool beside those
  // handed out, in arrival order. Takes them on success.
  Status admit_locked(std::unique_lock<std::mutex>& lock, int32_t client, int32_t layer, int32_t n);
  size_t pool_of(int32_t layer) const { return per_layer_ ? static_cast<size_t>(layer) : 0; }
  // Under mu_: one pin of a slot of `layer` given back by `client` (and its admission).
  void unpin_locked(Slot& s, int32_t layer, int32_t client);
  // Under mu_: `n` admitted pins of `layer`'s pool given back by `client` (kNoClient too).
  void return_admission_locked(int32_t layer, int32_t client, int32_t n);
  void release_for(int32_t client, int32_t layer, int32_t expert);
  void release_pending_for_locked(int32_t client, int32_t layer, std::vector<int32_t>* pending);
  static uint64_t key(int32_t layer, int32_t expert) { return (uint64_t(uint32_t(layer)) << 32) | uint32_t(expert); }
  // Under mu_: a slot to load into (free, or the policy's victim among unpinned ready slots);
  // -1 if none. A speculative load never evicts an expert the current prediction names: with
  // more guesses than the pool holds (a batch of several sequences guesses the union of their
  // experts) each guess would otherwise evict an earlier, more confident one, and the reads of
  // the guesses that cannot all stay would be wasted.
  int32_t take_slot_locked(int32_t layer, bool speculative);
  bool present_locked(int32_t layer, int32_t expert) const;
  int32_t start_load_locked(int32_t layer, int32_t expert, bool demand, int32_t client);
  void prefetch_locked(int32_t layer, int32_t expert, int32_t client);
  // One client's predictions (kNoClient: the store's own callers). Each client's evaluation
  // follows its own layers, so each has its own guesses waiting, issued and scored; clients that
  // evaluate at the same time hint and are scored independently.
  struct Hints {
    std::vector<Prediction> waiting;  // not issued yet, by layer then confidence
    int32_t waiting_for = -1;         // the layer whose prepare() they wait for (-1: none)
    std::vector<ExpertKey> issued;    // of the current hint, already issued
    std::vector<ExpertKey> named;     // every expert the current hint names (kept from eviction)
    int32_t scored_layer = -1;        // the layer being computed and what was predicted for it
    std::vector<int32_t> scored;
    std::vector<std::vector<int32_t>> predicted;  // per layer: experts predicted since its last prepare
    // Per layer: the guesses of experts absent when guessed, since the layer's last routing, with
    // their latest confidence: what the routing scores the gate with.
    std::vector<std::vector<Prediction>> absent;
  };
  // Under mu_: the client's hints, made on first use.
  Hints& hints_locked(int32_t client);
  // Under mu_: the experts some client's current hint names, as the policy's future (Belady) and
  // the set speculative loads never evict. Never throws: out of memory leaves no future.
  void rebuild_future_locked() noexcept;
  // Under mu_: whether a client other than `client` names the expert in its current hint.
  bool named_by_another_locked(int32_t client, int32_t layer, int32_t expert) const;
  // Under mu_: drops the queued speculative loads `drop` picks (unpinned guesses, not started):
  // counted as wasted for the client whose guess each was.
  template <class Pick>
  void drop_queued_guesses_locked(Pick&& drop);
  // Under mu_: a guess an evaluation now needs, still queued, moves to the demand reads: a guess
  // waits for the loaders guesses may take, which are busy with other guesses while the one kept
  // for demand reads can be idle. May throw (bad_alloc) before anything has changed.
  void promote_queued_guess_locked(int32_t slot);
  // Issues a client's waiting predictions nearest layer first; a deeper layer's only once every
  // nearer predicted expert is resident (loaded), so deep guesses never delay near ones.
  void issue_predictions_locked(int32_t client, Hints& h);
  // Every client's whose hint waits for no layer (a load landed: deeper guesses may go now).
  void issue_all_predictions_locked();
  // One loader's batch: the experts of `loads` read in one submission; each slot's state is
  // settled on its own (Ready, or Failed with the error).
  struct Load {
    int32_t slot, layer, expert, client;
    double queued_us;
    bool speculative;
    bool settled;  // its slot's state is final (Ready, Failed or requeued); the slot may be reused since
  };
  // What a loader thread owns: its reader, and room for a batch and for the demand batch it reads
  // while a guess of its waits (both reserved, never growing).
  struct Loader {
    std::unique_ptr<platform::BatchReader> reader;
    std::vector<Load> batch, served;
  };
  // How a batch is read: one guess (in steps, giving way to demand reads: read_guess), a layer's
  // few misses (in order within the bytes in flight), or many misses (all of a submission at once).
  enum class BatchKind { kGuess, kFewMisses, kManyMisses };
  // Each expert is settled as soon as its three reads land, not when the whole batch has: the
  // backend computes it while the batch's later experts are still read.
  // `busy` is the batch's share of the read-busy time, open until its last read lands: ended
  // there (under the lock that makes that expert Ready), so an evaluation that has all it needs
  // never sees its reads as still in flight.
  void load_batch(Loader& loader, std::vector<Load>& loads, BatchKind kind, bool* busy);
  // Under mu_: takes the next batch from the demand queue (or, if `may_guess` and there is no
  // demand, one guess) into `batch`, counting it in flight; false where there is nothing to take.
  bool take_batch_locked(std::vector<Load>& batch, bool may_guess, BatchKind* kind);
  // Reads a batch taken by take_batch_locked, then settles what the reads left unsettled.
  void read_batch(Loader& loader, std::vector<Load>& batch, BatchKind kind) noexcept;
  // A guess's reads, in order within the bytes in flight. Demand reads go first: before each step
  // the guess waits while they are in flight and reads those queued itself (into loader.served);
  // where its routing refuted the guess, it stops and frees its slot. Returns what the reads
  // returned (MOELITE_OK also when stopped); `started_us`: when the first read started (traces).
  Status read_guess(Loader& loader, Load& load, const std::vector<platform::ReadRange>& ranges,
                    const std::function<void(size_t)>& on_done, uint64_t* total, double* started_us);
  // fail() with a Failed slot's status and message.
  Status fail_with_slot_error(const Slot& s);
  // A loader thread: takes queued loads and reads them.
  void loader_main(Loader& loader) noexcept;
  void end_busy_locked(bool* busy);
  ExpertWeights view(const Slot& s) const;
  static void clear_slot(Slot* s);  // back to Free, keeping its memory

  const Model& model_;
  Backend& backend_;
  platform::File file_;
  std::string policy_name_;
  std::unique_ptr<CachePolicy> policy_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> future_;  // predicted next uses (Belady)
  uint64_t slot_bytes_ = 0;
  bool per_layer_ = false;
  std::string reader_name_ = "pread";
  int32_t capacity_ = 0;  // experts one layer may hold at once
  ExpertReads reads_;  // where an expert is read from and how it lands in a slot
  std::vector<Slot> slots_;
  uint8_t* pool_ = nullptr;
  bool pool_shared_ = false;                     // the backend's device-visible memory (zero-copy slots)
  std::unordered_map<uint64_t, int32_t> where_;  // (layer, expert) -> slot

  mutable std::mutex mu_;
  std::condition_variable ready_cv_;  // a slot changed state
  std::condition_variable work_cv_;   // a request was queued
  std::condition_variable guess_cv_;  // a guess being read may go on (read_guess)
  std::deque<Request> demand_q_, spec_q_;
  int32_t batches_in_flight_ = 0;  // read-busy time: batches being read, since when, how long
  // Speculative loads being read, at most guesses_in_flight_max_ = loaders - 1 (at least 1;
  // loader_main says why), and demand batches being read (a guess waits for those: read_guess).
  int32_t speculative_in_flight_ = 0, guesses_in_flight_max_ = 1;
  int32_t demand_in_flight_ = 0;
  // Demand loads queued up to this many (two tokens' routing) are few misses (take_batch_locked).
  size_t few_misses_ = 16;
  double busy_since_ = 0.0, busy_seconds_ = 0.0;
  // One per loader thread, made before the threads.
  std::vector<Loader> loader_state_;
  std::vector<std::thread> loaders_;
  bool stop_ = false;
  uint64_t clock_ = 0;
  std::vector<ExpertLayerStats> stats_;
  std::vector<bool> slot_ever_used_;
  std::vector<int32_t> quota_;       // per-layer mode: slots of each layer
  std::unordered_map<int32_t, Hints> hints_;  // per client (kNoClient too)
  GuessGate gate_;                            // which guesses are worth a read (every client's)
  std::shared_ptr<TimelineRecorder> trace_;         // set_trace (under mu_)
  // Clients: their counters per layer, and admission per pool (one, or one per layer's quota):
  // pins handed out by prepare() and not yet given back, and the tickets waiting, oldest first.
  std::unordered_map<int32_t, std::vector<ExpertLayerStats>> clients_;
  // Pins each client holds (admitted and not given back): one about to wait for admission while
  // holding some would wait for itself, which is a leak, reported instead of waited for.
  std::unordered_map<int32_t, int32_t> client_pins_;
  int32_t next_client_ = 0;
  std::vector<int32_t> admitted_pins_;
  std::vector<std::deque<uint64_t>> admission_queue_;
  uint64_t next_ticket_ = 0;
  std::condition_variable admit_cv_;  // pins were given back, or a waiter left the queue
};

}  // namespace moelite
