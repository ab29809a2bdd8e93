// Cache policies and trace replay on traces whose answers are worked out by hand (in comments),
// plus Belady's optimality against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "core/experts/cache_policy.h"
#include "core/experts/trace_replay.h"

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

TEST(CachePolicy, CyclicEvictsTheFurthestExpectedUse) {
  // Three layers, one expert each (A in layer 0, B in 1, C in 2), four tokens, one global pool of
  // 2: the layers are a scan larger than the pool, so LRU evicts the one wanted next every time
  // (12 loads, 0 hits). Cyclic, with a rate r per pass (one use: 1, halving every 8 passes; steady
  // use: 1 / (1 - 2^(-1/8)) = 12.04, p = r / 12.04) and score turn_in + 3 (1/p - 1):
  //   token 1: at C (serving 2) A scores 0 + 3 x 11.04 = 33.1, B 1 + 33.1: B goes.
  //   token 2: A hits (r 1.917, p 0.159). At B (serving 1): A 1 + 3 x 5.28 = 16.8, C (r 0.917,
  //            p 0.076) 0 + 3 x 12.1 = 36.4: C goes. At C (serving 2): A 15.8, B 34.1: B goes.
  //   tokens 3, 4: the same; A's rate only grows. So A hits from token 2 on: 9 loads, 3 hits.
  Trace t;
  for (int64_t tok = 0; tok < 4; ++tok)
    for (int32_t l = 0; l < 3; ++l) t.entries.push_back({tok, l, {l}});
  t.n_layers = 3;
  t.n_experts = 3;
  t.top_k = 1;
  EXPECT_EQ(run(t, "lru", 2, true).hits, 0u);
  EXPECT_EQ(run(t, "cyclic", 2, true).hits, 3u);
  EXPECT_EQ(run(t, "cyclic", 2, true).loads, 9u);
  // Within one layer (a per-layer pool) every turn is the next pass's: the lowest rate goes. A A A
  // B C A, capacity 2: at C, A's rate (2.8) beats B's (1): B goes and A hits: 3 hits (LRU: 2).
  EXPECT_EQ(run(sequence("AAABCA"), "cyclic", 2).hits, 3u);
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

TEST(CachePolicy, FactoryNamesTheAvailablePolicies) {
  std::unique_ptr<CachePolicy> p;
  ASSERT_EQ(make_policy("fifo", &p), MOELITE_ERR_INVALID_ARGUMENT);
  const std::string msg = last_error_message();
  for (const std::string& name : policy_names()) EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_EQ(policy_names().size(), 6u);
  for (const std::string& name : policy_names()) {
    ASSERT_EQ(make_policy(name, &p), MOELITE_OK) << name;
    EXPECT_EQ(name, p->name());
  }
}

TEST(CachePolicy, DecayHalfLifeIs64Accesses) {
  // A used at 0 and 64: at now = 128 its score is 0.5^2 + 0.5^1 = 0.75.
  // B used once at 101: 0.5^(27/64) = 0.7465 < 0.75, so B goes; used at 104 instead:
  // 0.5^(24/64) = 0.771 > 0.75, so A goes. (A half-life of 32 would evict A in both; LFU evicts
  // B, the less used, in both.)
  const ExpertKey a{0, 0}, b{0, 1};
  for (uint64_t b_at : {101u, 104u}) {
    std::unique_ptr<CachePolicy> decay, lfu;
    ASSERT_EQ(make_policy("decay", &decay), MOELITE_OK);
    ASSERT_EQ(make_policy("lfu", &lfu), MOELITE_OK);
    for (CachePolicy* p : {decay.get(), lfu.get()}) {
      p->on_insert(a, 0);
      p->on_access(a, 0);
      p->on_access(a, 64);
      p->on_insert(b, b_at);
      p->on_access(b, b_at);
    }
    EXPECT_EQ(decay->victim({a, b}, 128), b_at == 101 ? b : a) << b_at;
    EXPECT_EQ(lfu->victim({a, b}, 128), b) << b_at;
  }
}

TEST(CachePolicy, StaticLearnsCountsFromAccesses) {
  // No profile: counts come from accesses and survive eviction. A used 3 times, D twice (then
  // evicted), B once. Residents A and B, so the hot set is the 2 most used: A and D. B is not hot
  // and goes although A is less recent; LRU evicts A.
  std::unique_ptr<CachePolicy> st, lru;
  ASSERT_EQ(make_policy("static", &st), MOELITE_OK);
  ASSERT_EQ(make_policy("lru", &lru), MOELITE_OK);
  const ExpertKey a{0, 0}, b{0, 1}, d{0, 3};
  for (CachePolicy* p : {st.get(), lru.get()}) {
    p->on_insert(a, 0);
    for (uint64_t t = 0; t < 3; ++t) p->on_access(a, t);
    p->on_insert(d, 3);
    p->on_access(d, 3);
    p->on_access(d, 4);
    p->on_evict(d);
    p->on_insert(b, 5);
    p->on_access(b, 5);
  }
  EXPECT_EQ(st->victim({a, b}, 6), b);
  EXPECT_EQ(lru->victim({a, b}, 6), a);
  // Equal counts tie at the boundary: both hot, so least recent (A) goes.
  std::unique_ptr<CachePolicy> tie;
  ASSERT_EQ(make_policy("static", &tie), MOELITE_OK);
  tie->on_insert(a, 0);
  tie->on_access(a, 0);
  tie->on_insert(b, 1);
  tie->on_access(b, 1);
  EXPECT_EQ(tie->victim({a, b}, 2), a);
}

TEST(CachePolicy, StaticHotSetFromGivenFrequencies) {
  // Vector form, 2 layers x 4 experts: layer 0 counts 5 0 1 9, layer 1 counts 0 0 7 0. Hot set of
  // 3: (0,3)=9, (1,2)=7, (0,0)=5. (0,2) is not hot, so it goes before the less recent (0,0).
  std::unique_ptr<CachePolicy> st;
  ASSERT_EQ(make_policy("static", &st), MOELITE_OK);
  st->set_frequencies(std::vector<uint64_t>{5, 0, 1, 9, 0, 0, 7, 0}, 4, 3);
  const ExpertKey e00{0, 0}, e02{0, 2}, e03{0, 3}, e12{1, 2};
  st->on_access(e00, 0);
  st->on_access(e02, 1);
  st->on_access(e03, 2);
  st->on_access(e12, 3);
  EXPECT_EQ(st->victim({e00, e02, e03, e12}, 4), e02);
  // All hot: least recent.
  EXPECT_EQ(st->victim({e12, e03, e00}, 4), e00);
  // Given counts are not updated by accesses: (0,2) stays cold however often it is used.
  for (uint64_t t = 5; t < 50; ++t) st->on_access(e02, t);
  EXPECT_EQ(st->victim({e00, e02}, 50), e02);
  // Map form with hot_size 1: only (1,2).
  std::unique_ptr<CachePolicy> st2;
  ASSERT_EQ(make_policy("static", &st2), MOELITE_OK);
  st2->set_frequencies(std::unordered_map<uint64_t, uint64_t>{{e03.packed(), 2}, {e12.packed(), 8}}, 1);
  st2->on_access(e12, 0);
  st2->on_access(e03, 1);
  EXPECT_EQ(st2->victim({e12, e03}, 2), e03);
}

TEST(CachePolicy, BeladyFurthestNextUseUnknownIsInfinityTiesLru) {
  std::unique_ptr<CachePolicy> b;
  ASSERT_EQ(make_policy("belady", &b), MOELITE_OK);
  const ExpertKey x{0, 0}, y{0, 1}, z{0, 2};
  b->on_access(x, 0);
  b->on_access(y, 1);
  b->on_access(z, 2);
  // No future known: every next use is infinitely far, ties go to the least recent (x).
  EXPECT_EQ(b->victim({x, y, z}, 3), x);
  // x next at 10, y at 5, z never again (beyond the future): z goes.
  std::unordered_map<uint64_t, std::vector<uint64_t>> future = {{x.packed(), {0, 10}}, {y.packed(), {1, 5}}};
  b->set_future(&future);
  EXPECT_EQ(b->victim({x, y, z}, 3), z);
  EXPECT_EQ(b->victim({x, y}, 3), x);
  // After time 10 neither x nor y is used again: tie, least recent (x).
  EXPECT_EQ(b->victim({y, x}, 11), x);
}

TEST(TraceReplay, CyclicPatternWithRoomForAll) {
  // A B C A B C, capacity 3: 3 cold loads, then 3 hits, whatever the policy.
  for (const std::string& p : policy_names()) {
    const ReplayResult r = run(sequence("ABCABC"), p, 3);
    EXPECT_EQ(r.loads, 3u) << p;
    EXPECT_EQ(r.hits, 3u) << p;
    EXPECT_EQ(r.accesses, 6u) << p;
  }
}

TEST(TraceReplay, StaticProfileKeepsTheHotPair) {
  // A B C A B A B C A B, capacity 2. Counts over the trace: A 4, B 4, C 2: hot set {A, B}.
  // LRU: A B C(-A) A(-B) B(-C) A+ B+ C(-A) A(-B) B(-C): 8 loads, 2 hits.
  // static: A B C(A, B both hot: least recent A goes) A(-C, not hot) B+ A+ B+ C(-A, least recent
  //   hot) A(-C) B+: loads A B C A C A = 6, hits 4.
  // Belady: A B C(-B: A next at 3, B at 4) A+ B(-C: A next 5, C 7) A+ B+ C(-B: A next 8, B 9)
  //   A+ B(-C): 6 loads, 4 hits.
  const Trace t = sequence("ABCABABCAB");
  EXPECT_EQ(run(t, "lru", 2).hits, 2u);
  EXPECT_EQ(run(t, "static", 2).hits, 4u);
  EXPECT_EQ(run(t, "belady", 2).hits, 4u);
}

TEST(TraceReplay, LfuBeatsLruOnSkewedRoutingAndDecayFollowsIt) {
  // Expert A between runs of fresh experts: A B C A D E A F G A, capacity 2.
  // LRU: A B C(-A) A(-B) D(-C) E(-A) A(-D) F(-E) G(-A) A(-F): 10 loads, 0 hits.
  // LFU: A B C(-B: A has 1 use, B 1, tie -> least recent is A!) ... worked out: A's count grows
  // once it is used twice; from then on A stays. A B C(-A) A(-B) D(-C) E(-D: A 2 uses) A+ F(-E)
  // G(-F) A+: 8 loads, 2 hits. Decay (half-life 64) ranks the same here: 2 hits.
  const Trace t = sequence("ABCADEAFGA");
  EXPECT_EQ(run(t, "lru", 2).hits, 0u);
  EXPECT_EQ(run(t, "lfu", 2).hits, 2u);
  EXPECT_EQ(run(t, "decay", 2).hits, 2u);
}

TEST(TraceReplay, HeaderlessTraceTokensFromAnyNumber) {
  // Tokens 1000 and 1001, two layers, top-2, no weights, keys in any order. Per layer capacity 2:
  // token 1000 loads 4; token 1001 reuses layer 0's {1, 2}, and in layer 1 swaps 5 for 6:
  // 5 loads over 2 tokens = 2.5, hits 3 of 8.
  const std::string text =
      "{\"experts\": [1, 2], \"layer\": 0, \"token\": 1000}\n"
      "  {\"token\":1000,\"layer\":1,\"experts\":[4,5],\"engine\":\"other\",\"logits\":null}\r\n"
      "{\"token\":1001,\"layer\":0,\"experts\":[2,1]}\n"
      "{\"token\":1001,\"layer\":1,\"experts\":[4,6],\"weights\":[0.5,0.5]}";
  Trace t;
  ASSERT_EQ(parse_trace(text, &t), MOELITE_OK) << last_error_message();
  EXPECT_EQ(t.n_layers, 2);
  EXPECT_EQ(t.n_experts, 7);
  EXPECT_EQ(t.top_k, 2);
  const ReplayResult r = run(t, "lru", 2);
  EXPECT_EQ(r.tokens, 2u);
  EXPECT_EQ(r.accesses, 8u);
  EXPECT_EQ(r.loads, 5u);
  EXPECT_DOUBLE_EQ(r.loads_per_token(), 2.5);
  EXPECT_DOUBLE_EQ(r.hit_rate(), 3.0 / 8.0);
  ASSERT_EQ(r.per_layer_hit_rate.size(), 2u);
  EXPECT_DOUBLE_EQ(r.per_layer_hit_rate[0], 0.5);
  EXPECT_DOUBLE_EQ(r.per_layer_hit_rate[1], 0.25);
  // Capacity below top-k is an error, not a crash; so is a negative one.
  ReplayResult bad;
  EXPECT_EQ(replay(t, "lru", 1, false, &bad), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(replay(t, "lru", -1, false, &bad), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(replay(t, "nope", 2, false, &bad), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(TraceReplay, CapacityParsing) {
  Trace t;
  t.n_layers = 3;
  t.n_experts = 100;
  int64_t cap = -1;
  // floor(29% x 100) = 29 (0.29 * 100 in floating point is 28.999...).
  ASSERT_EQ(parse_capacity("29%", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 29);
  ASSERT_EQ(parse_capacity("12.5%", t, false, &cap), MOELITE_OK);  // floor(12.5) = 12
  EXPECT_EQ(cap, 12);
  ASSERT_EQ(parse_capacity("12.5%", t, true, &cap), MOELITE_OK);  // floor(37.5) = 37
  EXPECT_EQ(cap, 37);
  ASSERT_EQ(parse_capacity("100%", t, true, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 300);
  ASSERT_EQ(parse_capacity("0%", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 0);
  ASSERT_EQ(parse_capacity("17", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 17);
  for (const char* bad : {"", "%", "-1", "2.5", "nan", "inf", "nan%", "101%", "5%%", "5x", " 5", "1e300"})
    EXPECT_EQ(parse_capacity(bad, t, false, &cap), MOELITE_ERR_INVALID_ARGUMENT) << bad;
}

TEST(TraceReplay, MalformedValuesNameTheLineAndNeverCrash) {
  Trace t;
  const std::string ok = "{\"token\":0,\"layer\":0,\"experts\":[1]}\n";
  const std::pair<std::string, const char*> cases[] = {
      {"{\"n_layers\":1e20}\n" + ok, "line 1"},
      {ok + "{\"n_experts\":-3}\n", "line 2"},
      {ok + "{\"token\":1,\"layer\":1e9,\"experts\":[1]}\n", "line 2"},
      {ok + ok + "{\"token\":1.5,\"layer\":0,\"experts\":[1]}\n", "line 3"},
      {ok + "{\"token\":1,\"layer\":0,\"experts\":[1e30]}\n", "line 2"},
      {ok + "{\"token\":1,\"layer\":0,\"experts\":[1,]}\n", "line 2"},
      {ok + "{\"token\":1,\"layer\":0,\"experts\":[1]} trailing\n", "line 2"},
      {ok + "{\"token\":1,\"layer\":0,\"experts\":[\"a\"]}\n", "line 2"},
      {ok + "{\"token\":1,\"layer\":0,\"experts\":[1],\"x\":" + std::string(5000, '[') + "}\n", "line 2"},
      {ok + "{\"token\":1,\"layer\":0,\"experts\":[1],\"s\":\"unterminated}\n", "line 2"},
      {ok + "{\"token\":nan,\"layer\":0,\"experts\":[1]}\n", "line 2"},
      {ok + "not json\n", "line 2"},
  };
  for (const auto& [text, where] : cases) {
    EXPECT_EQ(parse_trace(text, &t), MOELITE_ERR_INVALID_ARGUMENT) << text.substr(0, 80);
    EXPECT_NE(std::string(last_error_message()).find(where), std::string::npos) << last_error_message();
  }
  // A hand-built trace whose entry lies outside its layers is refused by replay.
  Trace odd = sequence("AB");
  odd.entries[1].layer = 4;
  ReplayResult r;
  EXPECT_EQ(replay(odd, "lru", 2, false, &r), MOELITE_ERR_INVALID_ARGUMENT);
}

TEST(TraceReplay, BeladyMatchesBruteForceAtCapacityThree) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    std::string s;
    const int len = 4 + static_cast<int>(rng() % 7);
    for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('A' + rng() % 5));
    std::vector<int32_t> seq;
    for (char c : s) seq.push_back(c - 'A');
    const uint64_t best = brute_force_loads(seq, 3);
    EXPECT_EQ(run(sequence(s, 5), "belady", 3).loads, best) << s;
    for (const std::string& p : policy_names()) EXPECT_GE(run(sequence(s, 5), p, 3).loads, best) << p << " " << s;
  }
}

TEST(TraceReplay, MutatedTracesNeverCrash) {
  // Random byte edits of a valid trace: the parser answers OK or INVALID_ARGUMENT, and whatever it
  // accepts replays (run under ASan/UBSan in the sanitizer build).
  const std::string base =
      "{\"n_layers\":2,\"n_experts\":8,\"top_k\":2}\n"
      "{\"token\":0,\"layer\":0,\"experts\":[1,5],\"weights\":[0.6,0.4]}\n"
      "{\"token\":0,\"layer\":1,\"experts\":[2,7],\"weights\":[0.9,0.1]}\n"
      "{\"token\":1,\"layer\":0,\"experts\":[3,5],\"weights\":[0.5,0.5]}\n";
  const std::string alphabet = "{}[]:,\"-.e0123456789 \nabc";
  std::mt19937 rng(3);
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < edits && !s.empty(); ++i) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(at, 1 + rng() % 3); break;
        default: s.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    Trace t;
    const Status st = parse_trace(s, &t);
    ASSERT_TRUE(st == MOELITE_OK || st == MOELITE_ERR_INVALID_ARGUMENT) << s;
    if (st != MOELITE_OK) continue;
    ++accepted;
    for (const std::string& p : policy_names()) {
      ReplayResult r;
      EXPECT_EQ(replay(t, p, t.top_k, false, &r), MOELITE_OK) << p << "\n" << s;
      EXPECT_EQ(replay(t, p, t.top_k, true, &r), MOELITE_OK) << p << "\n" << s;
    }
  }
  EXPECT_GT(accepted, 0);
}

TEST(CachePolicy, DecayHalfLifeIsSettable) {
  // The DecayHalfLifeIs64Accesses scenario with B used at 101 and a half-life of 32: A scores
  // 0.5^4 + 0.5^2 = 0.3125, B 0.5^(27/32) = 0.557, so A goes (with 64, B went).
  const ExpertKey a{0, 0}, b{0, 1};
  PolicyOptions opts;
  opts.half_life = 32;
  std::unique_ptr<CachePolicy> decay;
  ASSERT_EQ(make_policy("decay", opts, &decay), MOELITE_OK);
  decay->on_access(a, 0);
  decay->on_access(a, 64);
  decay->on_access(b, 101);
  EXPECT_EQ(decay->victim({a, b}, 128), a);
  // A half-life must be a positive finite number, whichever policy is asked for.
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    opts.half_life = bad;
    EXPECT_EQ(make_policy("decay", opts, &decay), MOELITE_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(make_policy("lru", opts, &decay), MOELITE_ERR_INVALID_ARGUMENT) << bad;
  }
}

TEST(CachePolicy, DecayTiesGoToTheLeastRecent) {
  // Half-life 1: A used once at 5, B twice at 4. At now = 10 both score exactly 2^-5
  // (1 * 0.5^5 = 2 * 0.5^6): a tie, so the least recent (B, last used at 4) goes. LFU evicts A
  // (1 use against 2), so the decision really is the tie-break, not the counts.
  PolicyOptions opts;
  opts.half_life = 1;
  std::unique_ptr<CachePolicy> decay, lfu;
  ASSERT_EQ(make_policy("decay", opts, &decay), MOELITE_OK);
  ASSERT_EQ(make_policy("lfu", &lfu), MOELITE_OK);
  const ExpertKey a{0, 0}, b{0, 1};
  for (CachePolicy* p : {decay.get(), lfu.get()}) {
    p->on_access(b, 4);
    p->on_access(b, 4);
    p->on_access(a, 5);
  }
  EXPECT_EQ(decay->victim({a, b}, 10), b);
  EXPECT_EQ(decay->victim({b, a}, 10), b);  // whatever the candidate order
  EXPECT_EQ(lfu->victim({a, b}, 10), a);
  // Long-unused experts underflow to score 0 alike: again the least recent goes.
  EXPECT_EQ(decay->victim({a, b}, 100000), b);
}

TEST(CachePolicy, BeladyLookaheadWindow) {
  // y used at 0, x at 1; x next at 10, y next at 5. Whole future: x (furthest) goes. Window of 1
  // at now = 3 sees (3, 4]: neither use, both "never": the least recent (y) goes. Window of 2
  // sees y's use at 5 only: x goes.
  const ExpertKey x{0, 0}, y{0, 1};
  std::unordered_map<uint64_t, std::vector<uint64_t>> future = {{x.packed(), {1, 10}}, {y.packed(), {0, 5}}};
  for (uint64_t window : {0u, 1u, 2u, 7u}) {
    PolicyOptions opts;
    opts.lookahead = window;
    std::unique_ptr<CachePolicy> b;
    ASSERT_EQ(make_policy("belady", opts, &b), MOELITE_OK);
    b->set_future(&future);
    b->on_access(y, 0);
    b->on_access(x, 1);
    EXPECT_EQ(b->victim({x, y}, 3), window == 1 ? y : x) << window;
  }
}

TEST(TraceReplay, BeladyWithAShortWindowLosesTheBound) {
  // A B C C A, capacity 2. At C (t=2): A is next used at 4, B never.
  // Whole future: B goes; C hits, A hits: 2 hits, 3 loads.
  // Lookahead 1 sees only t=3: A and B both look unused, LRU evicts A; C hits, A misses: 1 hit.
  const Trace t = sequence("ABCCA");
  EXPECT_EQ(run(t, "belady", 2).hits, 2u);
  PolicyOptions opts;
  opts.lookahead = 1;
  ReplayResult r;
  ASSERT_EQ(replay(t, "belady", 2, false, &r, opts), MOELITE_OK);
  EXPECT_EQ(r.hits, 1u);
  EXPECT_EQ(r.loads, 4u);
  opts.lookahead = 2;  // sees A's use at 4 from t=2: optimal again
  ASSERT_EQ(replay(t, "belady", 2, false, &r, opts), MOELITE_OK);
  EXPECT_EQ(r.hits, 2u);
}

TEST(TraceReplay, PercentCapacityNeverBelowTopK) {
  // 4 layers x 64 experts, top-8. 5% of 64 = 3.2 -> 3, raised to top_k = 8 (a smaller cache
  // could not hold one token's experts). Global: 5% of 256 = 12.8 -> 12, above 8 so kept;
  // 1% of 256 = 2 -> 8.
  Trace t;
  t.n_layers = 4;
  t.n_experts = 64;
  t.top_k = 8;
  int64_t cap = 0;
  ASSERT_EQ(parse_capacity("5%", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 8);
  ASSERT_EQ(parse_capacity("50%", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 32);
  ASSERT_EQ(parse_capacity("5%", t, true, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 12);
  ASSERT_EQ(parse_capacity("1%", t, true, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 8);
  // An explicit count is taken as given (replay then refuses one below top_k).
  ASSERT_EQ(parse_capacity("3", t, false, &cap), MOELITE_OK);
  EXPECT_EQ(cap, 3);
}

TEST(TraceReplay, StaticMatchesItsDefinitionOnRandomTraces) {
  // The static policy's victim is the least recent non-hot candidate (hot = fewer than hot_size
  // keys strictly more used; hot_size 0 = as many as are resident), else the least recent: checked
  // against that definition directly.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::unique_ptr<CachePolicy> st;
    ASSERT_EQ(make_policy("static", &st), MOELITE_OK);
    std::unordered_map<uint64_t, uint64_t> counts;
    for (int32_t e = 0; e < 12; ++e)
      if (rng() % 4) counts[ExpertKey{0, e}.packed()] = rng() % 5;
    const size_t hot_size = rng() % 8;
    st->set_frequencies(counts, hot_size);
    std::vector<ExpertKey> cands;
    std::unordered_map<uint64_t, uint64_t> last;
    for (int32_t e = 0; e < 12; ++e)
      if (rng() % 2) {
        cands.push_back({0, e});
        last[cands.back().packed()] = rng() % 1000 * 16 + static_cast<uint64_t>(e);  // distinct
        st->on_access(cands.back(), last[cands.back().packed()]);
      }
    if (cands.empty()) continue;
    auto count = [&](ExpertKey k) {
      auto it = counts.find(k.packed());
      return it == counts.end() ? 0 : it->second;
    };
    auto hot = [&](ExpertKey k) {
      if (count(k) == 0) return false;
      size_t above = 0;
      for (const auto& [key, n] : counts) above += n > count(k);
      return above < (hot_size ? hot_size : cands.size());
    };
    size_t want = 0;
    for (size_t i = 1; i < cands.size(); ++i) {
      const bool hi = hot(cands[i]), hw = hot(cands[want]);
      if (hi < hw || (hi == hw && last[cands[i].packed()] < last[cands[want].packed()])) want = i;
    }
    EXPECT_EQ(st->choose_victim(cands, 20000), want) << trial;
  }
}

// ---- replay's ordered residents (near-linear replay) against a naive reference

namespace {

// The rules of docs/ARCHITECTURE.md ("Trace replay") and core/experts/cache_policy.h, implemented the slow and obvious
// way: on every miss each unpinned resident is scored from scratch (Belady scans the rest of the
// trace for the next use) and the smallest (primary, last use) is evicted.
ReplayResult naive_replay(const Trace& trace, const std::string& policy, int64_t capacity, bool global) {
  struct Access {
    uint64_t key;
    size_t cache;
  };
  std::vector<Access> acc;
  for (const TraceEntry& e : trace.entries)
    for (int32_t x : e.experts)
      acc.push_back({ExpertKey{e.layer, x}.packed(), global ? size_t{0} : static_cast<size_t>(e.layer)});
  const size_t n_caches = global ? 1 : static_cast<size_t>(trace.n_layers);
  std::vector<std::map<uint64_t, uint64_t>> total(n_caches);  // whole-trace counts (static's hot set)
  for (const Access& a : acc) total[a.cache][a.key]++;
  auto hot = [&](size_t c, uint64_t key) {
    const uint64_t n = total[c][key];
    int64_t above = 0;
    for (const auto& kv : total[c]) above += kv.second > n;
    return n > 0 && above < capacity;
  };
  std::vector<std::vector<uint64_t>> resident(n_caches);
  std::map<uint64_t, uint64_t> last, count;
  ReplayResult r;
  std::vector<uint64_t> layer_hits(static_cast<size_t>(trace.n_layers)), layer_acc(layer_hits.size());
  uint64_t t = 0;
  int32_t layers_seen = 0, served = -1;  // cyclic: the most layers seen, the layer served last
  uint64_t pass = 0;                     // cyclic: passes over the layers
  std::map<uint64_t, std::pair<double, uint64_t>> rate;  // cyclic: a key's use rate and the pass it was at
  const double half_life = 8.0, steady = 1.0 / (1.0 - std::pow(0.5, 1.0 / half_life));
  auto rate_now = [&](uint64_t key) {
    auto it = rate.find(key);
    return it == rate.end() ? 0.0 : it->second.first * std::pow(0.5, double(pass - it->second.second) / half_life);
  };
  for (const TraceEntry& e : trace.entries) {
    layers_seen = std::max(layers_seen, e.layer + 1);
    if (e.layer <= served) ++pass;
    served = e.layer;
    std::vector<uint64_t> pinned;
    for (int32_t x : e.experts) pinned.push_back(ExpertKey{e.layer, x}.packed());
    for (int32_t x : e.experts) {
      const uint64_t key = ExpertKey{e.layer, x}.packed();
      std::vector<uint64_t>& res = resident[global ? 0 : static_cast<size_t>(e.layer)];
      const size_t c = global ? 0 : static_cast<size_t>(e.layer);
      r.accesses++;
      layer_acc[static_cast<size_t>(e.layer)]++;
      if (std::find(res.begin(), res.end(), key) != res.end()) {
        r.hits++;
        layer_hits[static_cast<size_t>(e.layer)]++;
      } else {
        r.loads++;
        if (static_cast<int64_t>(res.size()) >= capacity) {
          size_t best = SIZE_MAX;
          std::pair<double, uint64_t> best_rank;
          for (size_t i = 0; i < res.size(); ++i) {
            if (std::find(pinned.begin(), pinned.end(), res[i]) != pinned.end()) continue;
            double primary = 0;
            if (policy == "lfu") primary = static_cast<double>(count[res[i]]);
            if (policy == "static") primary = hot(c, res[i]) ? 1 : 0;
            if (policy == "cyclic") {  // the furthest expected next use, in layer turns
              const int32_t layer = static_cast<int32_t>(res[i] >> 32);
              const int32_t turn_in = ((layer - e.layer - 1) % layers_seen + layers_seen) % layers_seen;
              const double p = std::clamp(rate_now(res[i]) / steady, 1e-3, 1.0);
              primary = -(turn_in + layers_seen * (1.0 / p - 1.0));
            }
            if (policy == "belady") {
              uint64_t next = UINT64_MAX;
              for (uint64_t u = t + 1; u < acc.size() && next == UINT64_MAX; ++u)
                if (acc[u].key == res[i]) next = u;
              primary = -static_cast<double>(next);
            }
            const std::pair<double, uint64_t> rank{primary, last[res[i]]};
            if (best == SIZE_MAX || rank < best_rank) {
              best = i;
              best_rank = rank;
            }
          }
          res.erase(res.begin() + static_cast<std::ptrdiff_t>(best));
        }
        res.push_back(key);
      }
      last[key] = t;
      count[key]++;
      rate[key] = {rate_now(key) + 1.0, pass};
      ++t;
    }
  }
  for (size_t l = 0; l < layer_acc.size(); ++l)
    r.per_layer_hit_rate.push_back(layer_acc[l] ? double(layer_hits[l]) / double(layer_acc[l]) : 0.0);
  return r;
}

}  // namespace

TEST(ReplayOrdered, MatchesNaiveReferenceOnRandomTraces) {
  std::mt19937 rng(2024);
  for (int iter = 0; iter < 60; ++iter) {
    Trace t;
    t.n_layers = 1 + static_cast<int32_t>(rng() % 3);
    t.n_experts = 2 + static_cast<int32_t>(rng() % 10);
    t.top_k = 1 + static_cast<int32_t>(rng() % std::min(3, t.n_experts));
    // Skewed expert choice, so frequencies differ and hot sets matter.
    const int n_tokens = 20 + static_cast<int>(rng() % 60);
    for (int tok = 0; tok < n_tokens; ++tok)
      for (int32_t l = 0; l < t.n_layers; ++l) {
        TraceEntry e{tok, l, {}};
        while (static_cast<int32_t>(e.experts.size()) < t.top_k) {
          const int32_t x = static_cast<int32_t>(std::min(rng() % t.n_experts, rng() % t.n_experts));
          if (std::find(e.experts.begin(), e.experts.end(), x) == e.experts.end()) e.experts.push_back(x);
        }
        std::sort(e.experts.begin(), e.experts.end());
        t.entries.push_back(e);
      }
    for (bool global : {false, true})
      for (const char* policy : {"lru", "lfu", "static", "belady", "cyclic"}) {
        const int64_t capacity = t.top_k + static_cast<int64_t>(rng() % (global ? 3 * t.n_experts : t.n_experts));
        const ReplayResult want = naive_replay(t, policy, capacity, global);
        ReplayResult got;
        ASSERT_EQ(replay(t, policy, capacity, global, &got), MOELITE_OK) << last_error_message();
        ASSERT_EQ(got.hits, want.hits) << policy << " capacity " << capacity << " global " << global << " iter "
                                       << iter;
        ASSERT_EQ(got.loads, want.loads);
        ASSERT_EQ(got.per_layer_hit_rate, want.per_layer_hit_rate);
      }
  }
}

// The one-pass LRU hit curves (calibration's) equal one replay per capacity, on skewed random
// traces with pinned multi-expert entries, per layer; repeats within an entry are hits.
TEST(TraceReplay, LruHitCurvesEqualReplayAtEveryCapacity) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 6; ++trial) {
    Trace t;
    t.n_layers = 1 + trial % 3;
    t.n_experts = 8 + 4 * trial;
    t.top_k = 1 + trial % 4;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int64_t tok = 0; tok < 400; ++tok)
      for (int32_t l = 0; l < t.n_layers; ++l) {
        TraceEntry e;
        e.token = tok;
        e.layer = l;
        while (static_cast<int32_t>(e.experts.size()) < t.top_k) {
          // skewed: low ids far more often, so every depth occurs
          const int32_t x = static_cast<int32_t>(std::pow(u(rng), 2.5) * t.n_experts);
          if (std::find(e.experts.begin(), e.experts.end(), x) == e.experts.end()) e.experts.push_back(x);
        }
        t.entries.push_back(e);
      }
    std::vector<std::vector<double>> curves;
    ASSERT_EQ(lru_hit_curves(t, &curves), MOELITE_OK);
    ASSERT_EQ(curves.size(), static_cast<size_t>(t.n_layers));
    for (int64_t c = t.top_k; c <= t.n_experts; ++c) {
      ReplayResult r;
      ASSERT_EQ(replay(t, "lru", c, false, &r), MOELITE_OK);
      for (int32_t l = 0; l < t.n_layers; ++l)
        EXPECT_DOUBLE_EQ(curves[static_cast<size_t>(l)][static_cast<size_t>(c)], r.per_layer_hit_rate[static_cast<size_t>(l)])
            << "trial " << trial << " layer " << l << " capacity " << c;
    }
  }
  Trace dup;
  dup.n_layers = 1;
  dup.n_experts = 4;
  dup.entries.push_back({0, 0, {2, 2}});
  std::vector<std::vector<double>> curves;
  ASSERT_EQ(lru_hit_curves(dup, &curves), MOELITE_OK);
  EXPECT_DOUBLE_EQ(curves[0][2], 0.5);  // the repeat hits, as replay counts it
  dup.entries.push_back({1, 3, {0}});
  EXPECT_EQ(lru_hit_curves(dup, &curves), MOELITE_ERR_INVALID_ARGUMENT);
  dup.entries.back() = {1, 0, {7}};
  EXPECT_EQ(lru_hit_curves(dup, &curves), MOELITE_ERR_INVALID_ARGUMENT);
}

// Warm-up entries are replayed (they fill the cache) but not counted. "ABCA" at capacity 2 after
// warming up with "ABC": the cache holds B and C, so A misses: 1 access, 0 hits, 1 load, 1 token.
// "ABAB" after "AB": both hit at capacity 2, both miss at capacity 1.
TEST(TraceReplay, WarmUpEntriesFillTheCacheButAreNotCounted) {
  ReplayResult r;
  ASSERT_EQ(replay(sequence("ABCA"), "lru", 2, false, &r, PolicyOptions{}, 3), MOELITE_OK);
  EXPECT_EQ(r.accesses, 1u);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.loads, 1u);
  EXPECT_EQ(r.tokens, 1u);
  ASSERT_EQ(replay(sequence("ABAB"), "lru", 2, true, &r, PolicyOptions{}, 2), MOELITE_OK);
  EXPECT_EQ(r.accesses, 2u);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.loads, 0u);
  ASSERT_EQ(replay(sequence("ABAB"), "lru", 1, false, &r, PolicyOptions{}, 2), MOELITE_OK);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.loads, 2u);
  ASSERT_EQ(replay(sequence("ABAB"), "lru", 2, false, &r, PolicyOptions{}, 4), MOELITE_OK);  // all warm-up
  EXPECT_EQ(r.accesses, 0u);
  EXPECT_EQ(r.tokens, 0u);

  // The stack-distance curves: A's depth after "ABC" is 2, so it hits from 3 slots up.
  std::vector<std::vector<double>> curves;
  std::vector<uint64_t> counted;
  ASSERT_EQ(lru_hit_curves(sequence("ABCA", 4), &curves, 3, &counted), MOELITE_OK);
  EXPECT_EQ(counted, std::vector<uint64_t>{1});
  EXPECT_DOUBLE_EQ(curves[0][2], 0.0);
  EXPECT_DOUBLE_EQ(curves[0][3], 1.0);
  ASSERT_EQ(lru_hit_curves(sequence("ABCA", 4), &curves, 0, &counted), MOELITE_OK);
  EXPECT_EQ(counted, std::vector<uint64_t>{4});
  EXPECT_DOUBLE_EQ(curves[0][3], 0.25);
}

// A causal policy's counted hits after w warm-up entries are its hits over the whole trace less
// those over the first w entries alone, on random multi-layer traces, per layer and global.
TEST(TraceReplay, WarmUpCountsWhatTheWholeReplayCountsAfterThePrefix) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    Trace t;
    t.n_layers = 1 + trial % 3;
    t.n_experts = 6 + trial % 5;
    t.top_k = 1 + trial % 3;
    for (int64_t tok = 0; tok < 60; ++tok)
      for (int32_t l = 0; l < t.n_layers; ++l) {
        TraceEntry e{tok, l, {}};
        while (static_cast<int32_t>(e.experts.size()) < t.top_k) {
          const int32_t x = static_cast<int32_t>(std::min(rng() % t.n_experts, rng() % t.n_experts));
          if (std::find(e.experts.begin(), e.experts.end(), x) == e.experts.end()) e.experts.push_back(x);
        }
        t.entries.push_back(e);
      }
    const size_t w = rng() % t.entries.size();
    Trace prefix = t;
    prefix.entries.resize(w);
    for (bool global : {false, true})
      for (const char* policy : {"lru", "lfu"}) {
        const int64_t capacity = t.top_k + static_cast<int64_t>(rng() % t.n_experts);
        ReplayResult all, first, rest;
        ASSERT_EQ(replay(t, policy, capacity, global, &all), MOELITE_OK);
        ASSERT_EQ(replay(prefix, policy, capacity, global, &first), MOELITE_OK);
        ASSERT_EQ(replay(t, policy, capacity, global, &rest, PolicyOptions{}, w), MOELITE_OK);
        EXPECT_EQ(rest.accesses, all.accesses - first.accesses) << policy << " trial " << trial;
        EXPECT_EQ(rest.hits, all.hits - first.hits) << policy << " trial " << trial;
      }
    std::vector<std::vector<double>> whole, early, late;
    std::vector<uint64_t> n_whole, n_early, n_late;
    ASSERT_EQ(lru_hit_curves(t, &whole, 0, &n_whole), MOELITE_OK);
    ASSERT_EQ(lru_hit_curves(prefix, &early, 0, &n_early), MOELITE_OK);
    ASSERT_EQ(lru_hit_curves(t, &late, w, &n_late), MOELITE_OK);
    for (size_t l = 0; l < whole.size(); ++l) {
      ASSERT_EQ(n_late[l], n_whole[l] - n_early[l]);
      for (size_t c = 0; c < whole[l].size(); ++c)
        EXPECT_NEAR(late[l][c] * n_late[l], whole[l][c] * n_whole[l] - early[l][c] * n_early[l], 1e-9)
            << "trial " << trial << " layer " << l << " capacity " << c;
    }
  }
}
