// Cache policies and trace replay on traces whose answers are worked out by hand (in comments),
// plus Belady's optimality against brute force.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>

#include "core/expert_cache/policy.h"
#include "core/expert_cache/replay.h"

using namespace moelite;

namespace {

// One layer, one expert per step: "ABCABC" -> experts 0 1 2 0 1 2.
Trace sequence(const std::string& s, int32_t n_experts = 0) {
  Trace t;
  for (size_t i = 0; i < s.size(); ++i) t.entries.push_back({static_cast<int64_t>(i), 0, {s[i] - 'A'}});
  t.n_layers = 1;
  t.n_experts = n_experts ? n_experts : 26;
  t.top_k = 1;
  return t;
}

ReplayResult run(const Trace& t, const std::string& policy, int64_t capacity, bool global = false) {
  ReplayResult r;
  EXPECT_EQ(replay(t, policy, capacity, global, &r), MOELITE_OK) << last_error_message();
  return r;
}

// The fewest loads any eviction strategy achieves (exhaustive search), for tiny traces.
uint64_t brute_force_loads(const std::vector<int32_t>& seq, size_t capacity) {
  std::function<uint64_t(size_t, std::vector<int32_t>)> go = [&](size_t i, std::vector<int32_t> cache) -> uint64_t {
    if (i == seq.size()) return 0;
    for (int32_t c : cache)
      if (c == seq[i]) return go(i + 1, cache);
    if (cache.size() < capacity) {
      cache.push_back(seq[i]);
      return 1 + go(i + 1, cache);
    }
    uint64_t best = UINT64_MAX;
    for (size_t v = 0; v < cache.size(); ++v) {
      std::vector<int32_t> next = cache;
      next[v] = seq[i];
      best = std::min(best, 1 + go(i + 1, next));
    }
    return best;
  };
  return go(0, {});
}

}  // namespace

TEST(CachePolicy, CyclicPatternLruVersusBelady) {
  // Capacity 2 on A B C A B C. LRU always evicts the one needed next: 6 loads, 0 hits.
  // Belady: A, B load; C evicts B (A is needed sooner); A hits; B evicts A (never used again);
  // C hits: 4 loads, 2 hits.
  const Trace t = sequence("ABCABC");
  EXPECT_EQ(run(t, "lru", 2).hits, 0u);
  EXPECT_EQ(run(t, "lru", 2).loads, 6u);
  EXPECT_EQ(run(t, "belady", 2).hits, 2u);
  EXPECT_EQ(run(t, "belady", 2).loads, 4u);
}

TEST(CachePolicy, LfuKeepsTheFrequentExpert) {
  // A A A B C A, capacity 2. At C: LRU evicts A (used at 2, B at 3) and misses A again: 2 hits.
  // LFU evicts B (1 use against 3): A then hits: 3 hits.
  const Trace t = sequence("AAABCA");
  EXPECT_EQ(run(t, "lru", 2).hits, 2u);
  EXPECT_EQ(run(t, "lfu", 2).hits, 3u);
}

TEST(CachePolicy, DecayForgetsOldBursts) {
  // A used 3 times long ago, B once just now. LFU evicts B (1 < 3); decayed frequency evicts A:
  // 3 * 0.5^(300/64) = 0.12 < B's 0.5^(1/64) = 0.99.
  std::unique_ptr<CachePolicy> lfu, decay;
  ASSERT_EQ(make_policy("lfu", &lfu), MOELITE_OK);
  ASSERT_EQ(make_policy("decay", &decay), MOELITE_OK);
  const ExpertKey a{0, 0}, b{0, 1};
  for (CachePolicy* p : {lfu.get(), decay.get()}) {
    for (uint64_t t = 0; t < 3; ++t) p->on_access(a, t);
    p->on_access(b, 300);
  }
  EXPECT_EQ(lfu->choose_victim({a, b}, 301), 1u);
  EXPECT_EQ(decay->choose_victim({a, b}, 301), 0u);
}

TEST(CachePolicy, StaticHotSetStays) {
  // A is hot; B is more recent. LRU would evict A; static evicts the non-hot B.
  std::unique_ptr<CachePolicy> lru, st;
  ASSERT_EQ(make_policy("lru", &lru), MOELITE_OK);
  ASSERT_EQ(make_policy("static", &st), MOELITE_OK);
  const ExpertKey a{0, 0}, b{0, 1};
  st->set_hot({a});
  for (CachePolicy* p : {lru.get(), st.get()}) {
    p->on_access(a, 0);
    p->on_access(b, 1);
  }
  EXPECT_EQ(lru->choose_victim({a, b}, 2), 0u);
  EXPECT_EQ(st->choose_victim({a, b}, 2), 1u);
  std::unique_ptr<CachePolicy> none;
  EXPECT_EQ(make_policy("random", &none), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(TraceReplay, PinnedEntriesAndCapacity) {
  Trace t;
  t.entries = {{0, 0, {0, 1}}, {1, 0, {2, 3}}, {2, 0, {0, 1}}};
  t.n_layers = 1;
  t.n_experts = 4;
  // Capacity 2 = one entry's experts: every entry evicts the other pair: 6 loads.
  EXPECT_EQ(run(t, "lru", 2).loads, 6u);
  // Capacity 4 holds all: 4 cold loads, 2 hits.
  EXPECT_EQ(run(t, "lru", 4).hits, 2u);
  ReplayResult r;
  EXPECT_EQ(replay(t, "lru", 1, false, &r), MOELITE_ERR_INVALID_ARGUMENT);  // 2 experts cannot fit in 1
}

TEST(TraceReplay, PerLayerVersusGlobalPools) {
  // Layers 0 and 1 alternate, each using its expert 0. Per layer with capacity 1: 2 cold loads,
  // then hits. One global slot: the layers keep evicting each other: every access loads.
  Trace t;
  for (int64_t tok = 0; tok < 5; ++tok)
    for (int32_t l = 0; l < 2; ++l) t.entries.push_back({tok, l, {0}});
  t.n_layers = 2;
  t.n_experts = 8;
  EXPECT_EQ(run(t, "lru", 1).loads, 2u);
  EXPECT_EQ(run(t, "lru", 1, true).loads, 10u);
  const ReplayResult r = run(t, "lru", 1);
  EXPECT_EQ(r.tokens, 5u);
  EXPECT_DOUBLE_EQ(r.loads_per_token(), 2.0 / 5.0);
  ASSERT_EQ(r.per_layer_hit_rate.size(), 2u);
  EXPECT_DOUBLE_EQ(r.per_layer_hit_rate[1], 4.0 / 5.0);
}

TEST(TraceReplay, ParsesOtherEnginesFormatting) {
  const std::string text =
      "\n"
      "{ \"layer\" : 1, \"experts\":[3, 1], \"token\": 5, \"extra\": {\"a\": [1, \"x\"]}, \"note\": \"hi\" }\n"
      "{\"token\":5,\"layer\":0,\"experts\":[2,0],\"weights\":[0.7,0.3],\"ok\":true}\n";
  Trace t;
  ASSERT_EQ(parse_trace(text, &t), MOELITE_OK) << last_error_message();
  EXPECT_EQ(t.n_layers, 2);
  EXPECT_EQ(t.n_experts, 4);
  EXPECT_EQ(t.top_k, 2);
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(t.entries[0].token, 5);
  EXPECT_EQ(t.entries[0].experts, (std::vector<int32_t>{1, 3}));
  // A header is read; P% is a share of one layer's experts, or of all with a global pool.
  ASSERT_EQ(parse_trace("{\"n_layers\":2,\"n_experts\":8,\"top_k\":2}\n" + text, &t), MOELITE_OK);
  int64_t cap = 0;
  ASSERT_EQ(parse_capacity("50%", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 4);
  ASSERT_EQ(parse_capacity("50%", t, true, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 8);
  ASSERT_EQ(parse_capacity("3", t, true, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 3);
  EXPECT_EQ(parse_capacity("lots", t, true, &cap), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(TraceReplay, MalformedLinesNameTheLine) {
  Trace t;
  EXPECT_EQ(parse_trace("{\"token\":0,\"layer\":0,\"experts\":[1]}\n\n{\"token\":1,\"layer\":0,\"experts\":[1\n", &t),
            MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(last_error_message()).find("line 3"), std::string::npos) << last_error_message();
  EXPECT_EQ(parse_trace("{\"token\":0,\"layer\":-1,\"experts\":[1]}\n", &t), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(parse_trace("{\"token\":0,\"layer\":0}\n", &t), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(parse_trace("", &t), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(parse_trace("[[[[[[[[[[[[[[[[[[[[[[[[", &t), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(TraceReplay, BeladyIsOptimalAndBoundsEveryPolicy) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Tiny single-layer traces: Belady equals the exhaustive optimum.
    std::string s;
    const int len = 3 + static_cast<int>(rng() % 8);
    for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('A' + rng() % 4));
    const Trace t = sequence(s, 4);
    std::vector<int32_t> seq;
    for (char c : s) seq.push_back(c - 'A');
    EXPECT_EQ(run(t, "belady", 2).loads, brute_force_loads(seq, 2)) << s;
  }
  // Random multi-layer, multi-expert traces: no policy beats Belady.
  for (int trial = 0; trial < 20; ++trial) {
    Trace t;
    t.n_layers = 3;
    t.n_experts = 16;
    for (int64_t tok = 0; tok < 60; ++tok)
      for (int32_t l = 0; l < 3; ++l) {
        std::vector<int32_t> e = {static_cast<int32_t>(rng() % 16), static_cast<int32_t>(rng() % 16)};
        if (e[0] == e[1]) e.pop_back();
        t.entries.push_back({tok, l, e});
      }
    for (bool global : {false, true}) {
      const int64_t cap = global ? 12 : 5;
      const double best = run(t, "belady", cap, global).hit_rate();
      for (const std::string& p : policy_names()) EXPECT_LE(run(t, p, cap, global).hit_rate(), best + 1e-12) << p;
    }
  }
}
