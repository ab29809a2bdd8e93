// The expert executor's window (core/moe/expert_executor.cpp, run_window): a layer whose experts
// take several rounds keeps `capacity` of them pinned, and each computed expert's release lets
// the next of the schedule join (ExpertSource::extend_round), so reads stay in flight. Checked
// against a scripted source that hands experts out in the reverse of their order (loads landing
// out of order) and logs the protocol: the pins never exceed the capacity, releases follow the
// schedule whatever the arrival order, a declining source gets whole rounds prepared with nothing
// held, errors give every pin back, and the layer's output is bitwise the resident run's. A layer
// that fits one round computes its experts in memory together first (run_round, compute_ready),
// and a layer's shared expert runs once, while loads are in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "tests/backend_ops_util.h"

using namespace moelite;
using namespace moelite::test;

namespace {

constexpr int32_t kExperts = 8;
constexpr int64_t kTokens = 6, kDim = 32, kFf = 48;

// Budgeted experts of `capacity` at a time; expert 0 counts as in memory (the schedule puts it
// first). The last expert added to the round arrives first.
class WindowSource final : public ExpertSource {
 public:
  std::vector<ExpertWeights> w;
  int32_t cap = 2;
  bool declines = false;             // as when another context waits for the pool
  Status extend_error = MOELITE_OK;  // what extend_round returns instead of adding
  int32_t pins = 0, max_pins = 0, prepares = 0, extends = 0;
  std::vector<int32_t> released;
  std::vector<std::string> log;

  int32_t capacity(int32_t) const override { return cap; }
  void residency(int32_t, int32_t n_expert, std::vector<uint8_t>* mask) const override {
    mask->assign(static_cast<size_t>(n_expert), 0);
    (*mask)[0] = 1;
  }
  Status prepare(int32_t, const std::vector<int32_t>& experts) override {
    EXPECT_EQ(pins, 0) << "a round is prepared only when the last one is given back";
    EXPECT_LE(static_cast<int32_t>(experts.size()), cap);
    ++prepares;
    take(static_cast<int32_t>(experts.size()));
    log.push_back("prepare");
    return MOELITE_OK;
  }
  Status extend_round(int32_t, int32_t expert, bool* added) override {
    *added = false;
    if (extend_error != MOELITE_OK) return extend_error;
    if (declines || pins + 1 > cap) return MOELITE_OK;
    *added = true;
    ++extends;
    take(1);
    log.push_back("extend " + std::to_string(expert));
    return MOELITE_OK;
  }
  // Experts take_ready hands out (in memory when their round is prepared).
  std::vector<int32_t> ready_now;
  void take_ready(int32_t, std::vector<int32_t>* pending, std::vector<ReadyExpert>* out) override {
    std::string line = "take_ready";
    std::vector<int32_t> rest;
    for (int32_t e : *pending) {
      if (std::find(ready_now.begin(), ready_now.end(), e) == ready_now.end()) {
        rest.push_back(e);
        continue;
      }
      EXPECT_LT(out->size(), out->capacity()) << "the caller reserved room for every pending expert";
      out->push_back({e, w[static_cast<size_t>(e)]});
      line += " " + std::to_string(e);
    }
    *pending = rest;
    log.push_back(line);
  }
  Status acquire_next(int32_t, std::vector<int32_t>* pending, int32_t* e, ExpertWeights* out) override {
    *e = pending->back();
    pending->pop_back();
    *out = w[static_cast<size_t>(*e)];
    log.push_back("acquire " + std::to_string(*e));
    return MOELITE_OK;
  }
  void release(int32_t, int32_t expert) override {
    --pins;
    released.push_back(expert);
    log.push_back("release " + std::to_string(expert));
  }

 private:
  void take(int32_t n) {
    pins += n;
    max_pins = std::max(max_pins, pins);
  }
};

struct Layer {
  std::unique_ptr<Backend> cpu;
  std::vector<ExpertWeights> w;
  std::vector<float> x;
  Routing r;
  FfnKind kind;
  // Uses per expert: 1 -> 1 token pair, 2 -> 2, ... so the schedule's order is known.
  Layer() {
    EXPECT_EQ(cpu::CpuBackend::create(1, &cpu), MOELITE_OK);
    std::mt19937 rng(4);
    for (int32_t e = 0; e < kExperts; ++e)
      w.push_back(ExpertWeights{random_matrix(TensorType::F32, kFf, kDim, rng),
                                random_matrix(TensorType::F32, kFf, kDim, rng),
                                random_matrix(TensorType::F32, kDim, kFf, rng)});
    x = randv(static_cast<size_t>(kTokens * kDim), rng, -2, 2);
    // Top-2 of 8 for 6 tokens; expert e is used by these tokens.
    const int32_t ids[kTokens][2] = {{7, 6}, {7, 5}, {6, 4}, {7, 3}, {5, 2}, {1, 0}};
    r.n_tokens = static_cast<int32_t>(kTokens);
    r.k = 2;
    for (const auto& t : ids)
      for (int32_t id : t) {
        r.ids.push_back(id);
        r.weights.push_back(id == t[0] ? 0.7f : 0.3f);
      }
  }
  std::vector<float> run(ExpertSource& source, Status* st, const std::function<Status()>* shared_expert = nullptr) {
    HostAct xa(cpu.get(), kTokens, kDim), o(cpu.get(), kTokens, kDim);
    xa.set(x);
    *st = run_routed_experts(*cpu, source, 0, kind, xa.a, r, &o.a, nullptr, shared_expert);
    return o.get();
  }
  std::vector<float> resident_output() {
    FakeExperts resident;
    resident.w = w;
    Status st;
    std::vector<float> out = run(resident, &st);
    EXPECT_EQ(st, MOELITE_OK);
    return out;
  }
};

// The schedule: expert 0 (in memory) first, then the experts to load by fewest uses, ties by id.
// Uses: 7 -> 3, 6 -> 2, 5 -> 2, 4, 3, 2, 1 -> 1 each.
const std::vector<int32_t> kSchedule = {0, 1, 2, 3, 4, 5, 6, 7};

}  // namespace

TEST(ExpertWindow, EachReleaseLetsTheNextExpertInAndReleasesFollowTheSchedule) {
  Layer layer;
  WindowSource source;
  source.w = layer.w;
  Status st;
  const std::vector<float> out = layer.run(source, &st);
  ASSERT_EQ(st, MOELITE_OK) << last_error_message();
  EXPECT_EQ(source.prepares, 1) << "one round, then the window slides";
  EXPECT_EQ(source.extends, kExperts - source.cap);
  EXPECT_EQ(source.max_pins, source.cap);
  EXPECT_EQ(source.pins, 0);
  // Experts arrive last-added first, yet each is released in the schedule's order, and each
  // release but the last `cap` lets the next expert of the schedule in at once.
  EXPECT_EQ(source.released, kSchedule);
  std::vector<std::string> want = {"prepare"};
  for (size_t i = 0; i < kSchedule.size(); ++i) {
    want.push_back("release " + std::to_string(kSchedule[i]));
    if (i + source.cap < kSchedule.size()) want.push_back("extend " + std::to_string(kSchedule[i + source.cap]));
  }
  std::vector<std::string> protocol;  // the log without the acquires
  for (const std::string& line : source.log)
    if (line.rfind("acquire", 0) != 0) protocol.push_back(line);
  EXPECT_EQ(protocol, want);
  EXPECT_EQ(out, layer.resident_output()) << "the combine does not depend on the order experts ran in";
}

// A layer whose experts fit one round (a decode step's): the experts in memory when it is prepared
// are taken at once and computed together, each released after that pass, before the round waits
// for any expert still loading; those follow one at a time as they arrive. The output is bitwise
// the resident run's.
TEST(ExpertRound, ExpertsInMemoryAreComputedTogetherBeforeAnyLoadIsWaitedFor) {
  Layer layer;
  WindowSource source;
  source.w = layer.w;
  source.cap = kExperts;
  source.ready_now = {6, 0, 3};
  Status st;
  const std::vector<float> out = layer.run(source, &st);
  ASSERT_EQ(st, MOELITE_OK) << last_error_message();
  EXPECT_EQ(source.prepares, 1);
  EXPECT_EQ(source.pins, 0);
  // Routing order (TokensByExpert: by id) is the round's order; 7 is acquired first (the last
  // pending arrives first in this source).
  const std::vector<std::string> want = {"prepare",   "take_ready 0 3 6", "release 0", "release 3", "release 6",
                                         "acquire 7", "release 7",        "acquire 5", "release 5", "acquire 4",
                                         "release 4", "acquire 2",        "release 2", "acquire 1", "release 1"};
  EXPECT_EQ(source.log, want);
  EXPECT_EQ(out, layer.resident_output());
  // A shared expert runs once, after the experts in memory and before any wait for a load.
  WindowSource with_shared;
  with_shared.w = layer.w;
  with_shared.cap = kExperts;
  with_shared.ready_now = {6, 0, 3};
  int shared_runs = 0;
  const std::function<Status()> shared = [&] {
    ++shared_runs;
    with_shared.log.push_back("shared");
    return MOELITE_OK;
  };
  EXPECT_EQ(layer.run(with_shared, &st, &shared), layer.resident_output());
  ASSERT_EQ(st, MOELITE_OK);
  EXPECT_EQ(shared_runs, 1);
  std::vector<std::string> want_shared = want;
  want_shared.insert(want_shared.begin() + 5, "shared");
  EXPECT_EQ(with_shared.log, want_shared);
  // Nothing in memory: every expert is acquired one at a time, with the same output.
  WindowSource cold;
  cold.w = layer.w;
  cold.cap = kExperts;
  EXPECT_EQ(layer.run(cold, &st), layer.resident_output());
  ASSERT_EQ(st, MOELITE_OK);
  EXPECT_EQ(cold.log[1], "take_ready");
  EXPECT_EQ(cold.pins, 0);
}

TEST(ExpertWindow, AWiderWindowAndASourceThatDeclinesGetWholeGroups) {
  Layer layer;
  const std::vector<float> want = layer.resident_output();
  for (int32_t cap : {3, 7}) {
    WindowSource source;
    source.w = layer.w;
    source.cap = cap;
    Status st;
    EXPECT_EQ(layer.run(source, &st), want) << cap;
    ASSERT_EQ(st, MOELITE_OK);
    EXPECT_EQ(source.prepares, 1) << cap;
    EXPECT_EQ(source.max_pins, cap);
    EXPECT_EQ(source.released, kSchedule) << cap;
  }
  // Declined (another context waits for the pool): the window drains, and the rest goes in rounds
  // prepared with nothing held (WindowSource::prepare checks), so no context waits for pins that
  // a waiting context holds.
  WindowSource source;
  source.w = layer.w;
  source.declines = true;
  Status st;
  EXPECT_EQ(layer.run(source, &st), want);
  ASSERT_EQ(st, MOELITE_OK);
  EXPECT_EQ(source.prepares, kExperts / source.cap);
  EXPECT_EQ(source.extends, 0);
  EXPECT_EQ(source.pins, 0);
  EXPECT_EQ(source.released, kSchedule);
}

// Several rounds: the shared expert runs once, as soon as the first window is prepared (its reads
// in flight); resident experts: once, after the pass; its error is the layer's.
TEST(ExpertWindow, TheSharedExpertRunsOnceWhileTheFirstWindowLoads) {
  Layer layer;
  WindowSource source;
  source.w = layer.w;
  int runs = 0;
  const std::function<Status()> shared = [&] {
    ++runs;
    source.log.push_back("shared");
    return MOELITE_OK;
  };
  Status st;
  EXPECT_EQ(layer.run(source, &st, &shared), layer.resident_output());
  ASSERT_EQ(st, MOELITE_OK);
  EXPECT_EQ(runs, 1);
  ASSERT_GE(source.log.size(), 2u);
  EXPECT_EQ(source.log[0], "prepare");
  EXPECT_EQ(source.log[1], "shared");
  FakeExperts resident;
  resident.w = layer.w;
  int resident_runs = 0;
  const std::function<Status()> counted = [&] {
    ++resident_runs;
    return MOELITE_OK;
  };
  EXPECT_EQ(layer.run(resident, &st, &counted), layer.resident_output());
  ASSERT_EQ(st, MOELITE_OK);
  EXPECT_EQ(resident_runs, 1);
  WindowSource failing;
  failing.w = layer.w;
  const std::function<Status()> broken = [] { return fail(MOELITE_ERR_OUT_OF_MEMORY, "injected: the shared expert"); };
  (void)layer.run(failing, &st, &broken);
  EXPECT_EQ(st, MOELITE_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(failing.pins, 0) << "the window's experts are given back";
}

TEST(ExpertWindow, AnErrorFromTheSourceGivesEveryPinBack) {
  Layer layer;
  WindowSource source;
  source.w = layer.w;
  source.extend_error = fail(MOELITE_ERR_IO, "injected: the next expert's read could not start");
  Status st;
  (void)layer.run(source, &st);
  EXPECT_EQ(st, MOELITE_ERR_IO);
  EXPECT_EQ(source.pins, 0) << "held and pending experts are released";
}
