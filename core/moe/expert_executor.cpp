#include "core/moe/expert_executor.h"

#include <algorithm>

#include "core/moe/tokens_by_expert.h"
#include "core/support/timeline.h"

namespace moelite {

namespace {

// What one round of a pass holds of the source: experts prepared and not yet acquired (pending)
// and experts acquired and not yet released (held). On every way out, errors and exceptions (an
// allocation failing mid-round) included, the backend's round is ended first (a device must be done
// with the slots) and then both are given back: no pin outlives the pass, or the pool would shrink
// until no expert could load (and, with contexts sharing the store, the next round would wait for
// ever to be admitted). The lease is made, with everything it allocates, before prepare(): once
// the source has pinned the round nothing may fail before the lease owns the pins.
class RoundLease {
 public:
  RoundLease(Backend& be, ExpertSource& source, int32_t layer, std::vector<int32_t>* pending)
      : be_(be), source_(source), layer_(layer), pending_(pending) {
    held_.reserve(pending->size());  // so that add() cannot throw between acquire and record
  }
  // Pins the round (ExpertSource::prepare); on failure the source has given back what it took.
  Status prepare() {
    MOELITE_TRY(source_.prepare(layer_, *pending_));
    prepared_ = true;
    return MOELITE_OK;
  }
  ~RoundLease() {
    if (!prepared_) return;
    if (!ended_) (void)be_.expert_round_end();
    release_all();
    for (int32_t p : *pending_) source_.release(layer_, p);
    pending_->clear();
  }
  void add(int32_t expert) { held_.push_back(expert); }
  void release(int32_t expert) {
    source_.release(layer_, expert);
    held_.erase(std::find(held_.begin(), held_.end(), expert));
  }
  Status end_round() {
    ended_ = true;
    return be_.expert_round_end();
  }

 private:
  void release_all() {
    for (int32_t e : held_) source_.release(layer_, e);
    held_.clear();
  }

  Backend& be_;
  ExpertSource& source_;
  int32_t layer_;
  std::vector<int32_t>* pending_;
  std::vector<int32_t> held_;
  bool prepared_ = false;
  bool ended_ = false;
};

// Row lists of the tasks built so far (the tasks point into them).
struct TaskRows {
  std::vector<int32_t> x_rows, out_rows;
};

ExpertTask make_task(const TokensByExpert& by_expert, int32_t layer, int32_t expert, const ExpertWeights& w, bool resident,
                     TaskRows* rows) {
  by_expert.rows(expert, &rows->x_rows, &rows->out_rows);
  ExpertTask t;
  t.layer = layer;
  t.expert = expert;
  t.w = w;
  t.resident = resident;
  t.x_rows = rows->x_rows.data();
  t.out_rows = rows->out_rows.data();
  t.n_rows = static_cast<int32_t>(rows->x_rows.size());
  return t;
}

// Waits shorter than this are not worth a trace event (an acquire of a ready expert).
constexpr double kTraceWaitMinUs = 20.0;

// The layer's shared expert (run_routed_experts' `shared_expert`), run once: on the CPU under a
// budget as soon as the first round's loads are under way (run_round, run_window), else after the
// pass. Later calls do nothing.
class SharedExpertTurn {
 public:
  SharedExpertTurn(const std::function<Status()>* work, int32_t layer, TimelineRecorder* trace)
      : work_(work), layer_(layer), trace_(trace) {}
  Status run() {
    if (!work_) return MOELITE_OK;
    const std::function<Status()>& work = *work_;
    work_ = nullptr;
    const double start = trace_ ? TimelineRecorder::now_us() : 0.0;
    MOELITE_TRY(work());
    if (trace_)
      trace_->complete("shared expert", "compute", "evaluation", start, TimelineRecorder::now_us(),
                       {{"layer", layer_}});
    return MOELITE_OK;
  }

 private:
  const std::function<Status()>* work_;
  int32_t layer_;
  TimelineRecorder* trace_;
};

// One backend pass over `experts`, every gate/up and then every down: the threads split the work
// of all of them, where one expert at a time (in decode, one token's row through each matrix) made
// them wait for one another and for the dispatch once per expert, at each of the two steps.
Status compute_pass(Backend& be, const TokensByExpert& by_expert, int32_t layer,
                    const std::vector<ReadyExpert>& experts, bool resident) {
  if (experts.empty()) return MOELITE_OK;
  const int32_t n = static_cast<int32_t>(experts.size());
  std::vector<TaskRows> rows(experts.size());
  std::vector<ExpertTask> tasks;
  tasks.reserve(experts.size());
  for (const ReadyExpert& r : experts)
    tasks.push_back(make_task(by_expert, layer, r.expert, r.w, resident, &rows[tasks.size()]));
  MOELITE_TRY(be.expert_gate_up(tasks.data(), n));
  return be.expert_down(tasks.data(), n);
}

// Everything resident: one pass over all of the layer's experts, which balances threads best.
Status run_resident(Backend& be, ExpertSource& source, int32_t layer, const TokensByExpert& by_expert,
                    TimelineRecorder* trace) {
  const double start = trace ? TimelineRecorder::now_us() : 0.0;
  std::vector<ReadyExpert> experts;
  experts.reserve(by_expert.order().size());
  for (std::vector<int32_t> pending = by_expert.order(); !pending.empty();) {
    ReadyExpert r;
    MOELITE_TRY(source.acquire_next(layer, &pending, &r.expert, &r.w));
    experts.push_back(r);
  }
  MOELITE_TRY(compute_pass(be, by_expert, layer, experts, true));
  MOELITE_TRY(be.expert_round_end());
  if (trace)
    trace->complete("experts", "compute", "evaluation", start, TimelineRecorder::now_us(),
                    {{"layer", layer}, {"experts", static_cast<int64_t>(experts.size())}});
  return MOELITE_OK;
}

// Waits for one expert of *pending (the one that arrives first), computes it, and leaves it held
// by the lease in *expert. On an error from the source nothing of *pending is held any more.
Status compute_next(Backend& be, ExpertSource& source, int32_t layer, const TokensByExpert& by_expert,
                    std::vector<int32_t>* pending, RoundLease* lease, int32_t* expert, TimelineRecorder* trace) {
  int32_t e;
  ExpertWeights w;
  const double wait_start = trace ? TimelineRecorder::now_us() : 0.0;
  const Status acquired = source.acquire_next(layer, pending, &e, &w);
  if (acquired != MOELITE_OK) {
    pending->clear();  // the source released what was still pending
    return acquired;
  }
  lease->add(e);
  *expert = e;
  const double compute_start = trace ? TimelineRecorder::now_us() : 0.0;
  if (trace && compute_start - wait_start >= kTraceWaitMinUs)
    trace->complete("wait for a load", "wait", "evaluation", wait_start, compute_start,
                    {{"layer", layer}, {"expert", e}});
  TaskRows rows;
  const ExpertTask task = make_task(by_expert, layer, e, w, false, &rows);
  MOELITE_TRY(be.expert_gate_up(&task, 1));
  const double t0 = trace ? TimelineRecorder::now_us() : 0.0;
  MOELITE_TRY(source.wait_down(layer, e));
  const double down_wait = trace ? TimelineRecorder::now_us() - t0 : 0.0;
  MOELITE_TRY(be.expert_down(&task, 1));
  if (trace)
    trace->complete("expert", "compute", "evaluation", compute_start, TimelineRecorder::now_us(),
                    {{"layer", layer},
                     {"expert", e},
                     {"rows", task.n_rows},
                     {"waited_for_down_us", static_cast<int64_t>(down_wait)}});
  return MOELITE_OK;
}

// The round's experts that are in memory already (its hits), computed together in one pass
// (compute_pass) and released, as a resident layer's are (bench model, 2 threads, decode, layers
// that waited for no read: the experts took 1.47 ms at a 75 % budget against 1.21 ms resident one
// at a time, 1.64 against 1.57 in one pass). Only where the backend is done with each expert once
// its down projection has run (the CPU); the device backends, which hold a round's experts to its
// end, keep handing them out one at a time (a batch of slot experts is untried there).
Status compute_ready(Backend& be, ExpertSource& source, int32_t layer, const TokensByExpert& by_expert,
                     std::vector<int32_t>* pending, RoundLease* lease, TimelineRecorder* trace) {
  const double start = trace ? TimelineRecorder::now_us() : 0.0;
  std::vector<ReadyExpert> ready;
  ready.reserve(pending->size());
  source.take_ready(layer, pending, &ready);
  for (const ReadyExpert& r : ready) lease->add(r.expert);
  if (ready.empty()) return MOELITE_OK;
  MOELITE_TRY(compute_pass(be, by_expert, layer, ready, false));
  for (const ReadyExpert& r : ready) lease->release(r.expert);
  if (trace)
    trace->complete("experts in memory", "compute", "evaluation", start, TimelineRecorder::now_us(),
                    {{"layer", layer}, {"experts", static_cast<int64_t>(ready.size())}});
  return MOELITE_OK;
}

// Budgeted experts: rounds of at most capacity() experts; within a round each expert runs as soon
// as its gate and up matrices are in, so computation overlaps the loads still in flight. On the
// CPU the experts in memory go first, in one pass, then the shared expert while the misses still
// load (the bench model's shape as qwen2moe with a shared expert four routed experts wide, one
// sequence, 2 threads, against the shared expert after the pass: 1.10-1.30x at a 50 % budget,
// 1.07-1.11x at 75 %; no change where reads dominate, capped at 2 GB/s).
Status run_round(Backend& be, ExpertSource& source, int32_t layer, const TokensByExpert& by_expert,
                 std::vector<int32_t> pending, SharedExpertTurn* shared, TimelineRecorder* trace) {
  RoundLease lease(be, source, layer, &pending);
  MOELITE_TRY(lease.prepare());
  const bool hold_to_end = be.reads_experts_until_round_end();
  if (!hold_to_end) {
    MOELITE_TRY(compute_ready(be, source, layer, by_expert, &pending, &lease, trace));
    MOELITE_TRY(shared->run());
  }
  Status st = MOELITE_OK;
  while (!pending.empty()) {
    int32_t e = -1;
    st = compute_next(be, source, layer, by_expert, &pending, &lease, &e, trace);
    if (st != MOELITE_OK) break;
    if (!hold_to_end) lease.release(e);
  }
  const Status end = lease.end_round();
  return st != MOELITE_OK ? st : end;  // the lease gives back what is still held or pending
}

// A layer whose experts take several rounds, on a backend done with each expert once its down
// projection has run (the CPU): a window of `width` experts slides along `order`. Each computed
// expert is released and the next expert of the order joins the window (extend_round), so reads
// stay in flight through the whole layer; in rounds, the storage idled from a round's last load
// until the next round's first, which cost a batch of several sequences under a small per-layer
// quota much of its read rate. Experts are computed in arrival order but released in `order`: one
// computed before an earlier one of the order is held until that one is done. So each load picks
// its slot (evicts) among the same released experts whatever the storage's timing, and the cache's
// contents (hence misses, and cache-aware gating's routing) remain a function of the evaluations
// alone. Where the source declines to extend (another context waits for the pool), the window
// drains and the rest goes on in rounds admitted as a whole.
Status run_window(Backend& be, ExpertSource& source, int32_t layer, const TokensByExpert& by_expert,
                  const std::vector<int32_t>& order, size_t width, SharedExpertTurn* shared, TimelineRecorder* trace) {
  std::vector<uint8_t> computed(static_cast<size_t>(by_expert.order().back()) + 1, 0);  // by expert id
  size_t prepared = 0;  // order[0, prepared) has been prepared or added to a round
  size_t released = 0;  // order[0, released) has been released
  while (prepared < order.size()) {
    std::vector<int32_t> pending(order.begin() + static_cast<std::ptrdiff_t>(prepared),
                                 order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), prepared + width)));
    pending.reserve(width);  // so that adding one cannot throw once the source has pinned it
    RoundLease lease(be, source, layer, &pending);
    MOELITE_TRY(lease.prepare());
    prepared += pending.size();
    MOELITE_TRY(shared->run());  // while the first window's misses load
    bool extending = true;
    Status st = MOELITE_OK;
    while (st == MOELITE_OK && !pending.empty()) {
      int32_t e = -1;
      st = compute_next(be, source, layer, by_expert, &pending, &lease, &e, trace);
      if (st != MOELITE_OK) break;
      computed[static_cast<size_t>(e)] = 1;
      while (st == MOELITE_OK && released < prepared && computed[static_cast<size_t>(order[released])]) {
        lease.release(order[released++]);
        if (!extending || prepared == order.size()) continue;
        bool added = false;
        st = source.extend_round(layer, order[prepared], &added);
        if (added) pending.push_back(order[prepared++]);
        extending = added;
      }
    }
    const Status end = lease.end_round();
    MOELITE_TRY(st);  // the lease gives back what is still held or pending
    MOELITE_TRY(end);
  }
  return MOELITE_OK;
}

// The order of a layer's experts when they take several rounds (a batch of many tokens, often of
// several sequences, routes to more experts than the source holds at once). Experts already in
// memory go first: in a later round the loads before them would evict them unused. The experts to
// load follow, those serving the fewest tokens first, so the layer leaves in memory the ones most
// of its tokens used, which the sequences' next tokens are likeliest to route to again.
std::vector<int32_t> round_schedule(ExpertSource& source, int32_t layer, const TokensByExpert& by_expert) {
  std::vector<int32_t> order = by_expert.order();
  std::vector<uint8_t> resident;
  source.residency(layer, order.back() + 1, &resident);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const bool ra = resident[static_cast<size_t>(a)] != 0, rb = resident[static_cast<size_t>(b)] != 0;
    if (ra != rb) return ra;
    return !ra && by_expert.uses(a) < by_expert.uses(b);
  });
  return order;
}

}  // namespace

Status run_routed_experts(Backend& be, ExpertSource& source, int32_t layer, const FfnKind& kind, const Act& x,
                          const Routing& r, Act* out, TimelineRecorder* trace,
                          const std::function<Status()>* shared_expert) {
  SharedExpertTurn shared(shared_expert, layer, trace);
  source.on_routing(layer, r);
  const TokensByExpert by_expert(r);
  MOELITE_TRY(be.moe_begin(x, kind, static_cast<int64_t>(r.n_tokens) * r.k));
  if (source.all_resident()) {
    MOELITE_TRY(run_resident(be, source, layer, by_expert, trace));
  } else {
    const size_t round_size = static_cast<size_t>(std::max(1, source.capacity(layer)));
    // One round: the source hands out what is in memory first anyway (acquire_next).
    const std::vector<int32_t> order =
        by_expert.order().size() > round_size ? round_schedule(source, layer, by_expert) : by_expert.order();
    if (order.size() > round_size && !be.reads_experts_until_round_end()) {
      MOELITE_TRY(run_window(be, source, layer, by_expert, order, round_size, &shared, trace));
    } else {
      for (size_t g0 = 0; g0 < order.size(); g0 += round_size) {
        const auto first = order.begin() + static_cast<std::ptrdiff_t>(g0);
        const auto last = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), g0 + round_size));
        MOELITE_TRY(run_round(be, source, layer, by_expert, std::vector<int32_t>(first, last), &shared, trace));
      }
    }
  }
  MOELITE_TRY(be.moe_combine(r, out));
  return shared.run();  // resident, or a device backend: after the pass
}

}  // namespace moelite
