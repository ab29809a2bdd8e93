// Sampling against distributions computed by hand from the definitions of each filter.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "core/text/sampling.h"

using moelite::Sampler;
using moelite::SamplerParams;

namespace {
SamplerParams plain(float temp) {
  SamplerParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}
}  // namespace

TEST(Sampling, GreedyPicksArgmaxLowestIdOnTies) {
  const float logits[] = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler s(plain(0.0f));
  EXPECT_EQ(s.sample(logits, 4, {}), 1);
}

TEST(Sampling, TemperatureSoftmaxMatchesDefinition) {
  const float logits[] = {1.0f, 2.0f, 3.0f};
  Sampler s(plain(2.0f));
  auto d = s.distribution(logits, 3, {});
  ASSERT_EQ(d.size(), 3u);
  const double z = std::exp(0.5) + std::exp(1.0) + std::exp(1.5);
  EXPECT_EQ(d[0].first, 2);
  EXPECT_NEAR(d[0].second, std::exp(1.5) / z, 1e-6);
  EXPECT_NEAR(d[2].second, std::exp(0.5) / z, 1e-6);
}

TEST(Sampling, TopKTopPMinP) {
  // p at T=1: softmax(log([0.5, 0.25, 0.15, 0.1])) = the same numbers.
  const float logits[] = {std::log(0.1f), std::log(0.5f), std::log(0.15f), std::log(0.25f)};
  SamplerParams p = plain(1.0f);
  p.top_k = 2;
  auto d = Sampler(p).distribution(logits, 4, {});
  ASSERT_EQ(d.size(), 2u);  // tokens 1 and 3, renormalised 0.5/0.75 and 0.25/0.75
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 3);
  EXPECT_NEAR(d[0].second, 2.0 / 3.0, 1e-6);

  p = plain(1.0f);
  p.top_p = 0.8f;  // 0.5 + 0.25 = 0.75 < 0.8, + 0.15 = 0.9 >= 0.8: three tokens
  d = Sampler(p).distribution(logits, 4, {});
  EXPECT_EQ(d.size(), 3u);

  p = plain(1.0f);
  p.min_p = 0.4f;  // keep p >= 0.2: tokens 1 (0.5) and 3 (0.25)
  d = Sampler(p).distribution(logits, 4, {});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[1].second, 1.0 / 3.0, 1e-6);
}

TEST(Sampling, RepetitionPenaltyFollowsLlamaCppRule) {
  const float logits[] = {2.0f, -1.0f, 1.0f};
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 4.0f;
  // token 0: 2/4 = 0.5 < token 2's 1.0, so greedy moves to token 2; negative logits get lower.
  EXPECT_EQ(Sampler(p).sample(logits, 3, {0}), 2);
  p.repeat_last_n = 1;
  EXPECT_EQ(Sampler(p).sample(logits, 3, {0, 1}), 0);  // only token 1 is recent
}

TEST(Sampling, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  const float logits[] = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplerParams p = plain(1.0f);
  p.seed = 1234;
  Sampler a(p), b(p);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    int32_t ta = a.sample(logits, 3, {}), tb = b.sample(logits, 3, {});
    ASSERT_EQ(ta, tb);
    ++counts[ta];
  }
  // Binomial standard deviation at n = 20000 is <= 0.0035; allow 5 sigma.
  EXPECT_NEAR(counts[0] / double(n), 0.6, 0.0175);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.0175);
  EXPECT_NEAR(counts[2] / double(n), 0.1, 0.0175);
  p.seed = 99;
  Sampler c(p);
  int differ = 0;
  for (int i = 0; i < 100; ++i) differ += c.sample(logits, 3, {}) != a.sample(logits, 3, {});
  EXPECT_GT(differ, 0);
}

TEST(Sampling, RngKnownValues) {
  // xoshiro256** seeded through splitmix64(0); expected values from an independent Python
  // transcription of the published algorithms.
  moelite::Rng r(0);
  EXPECT_EQ(r.next(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(r.next(), 0xbf6e1f784956452aull);
  EXPECT_EQ(r.next(), 0x1a5f849d4933e6e0ull);
}

TEST(Sampling, BannedTokensAreNeverCandidates) {
  const float inf = std::numeric_limits<float>::infinity();
  const float logits[] = {0.0f, -inf, 0.0f, NAN};
  const auto d = Sampler(plain(1.0f)).distribution(logits, 4, {});
  ASSERT_EQ(d.size(), 2u);  // tokens 0 and 2, one half each
  EXPECT_EQ(d[0].first, 0);
  EXPECT_EQ(d[1].first, 2);
  EXPECT_FLOAT_EQ(d[0].second, 0.5f);
  const float none[] = {-inf, -inf};
  EXPECT_TRUE(Sampler(plain(1.0f)).distribution(none, 2, {}).empty());
  EXPECT_EQ(Sampler(plain(0.0f)).sample(none, 2, {}), -1);
}

TEST(Sampling, LogitBiasAppliesBeforeTheFilters) {
  const float inf = std::numeric_limits<float>::infinity();
  const float logits[] = {1.0f, 3.0f, 2.0f};
  SamplerParams p = plain(0.0f);
  p.set_bias(1, -inf);  // ban the argmax: greedy takes the next best
  int32_t t = -1;
  Sampler s(p);
  EXPECT_EQ(s.pick(logits, 3, {}, &t), Sampler::Outcome::Token);
  EXPECT_EQ(t, 2);
  p.set_bias(0, 2.5f);  // 1 + 2.5 > 2
  EXPECT_EQ(Sampler(p).pick(logits, 3, {}, &t), Sampler::Outcome::Token);
  EXPECT_EQ(t, 0);
  p.set_bias(0, 0.0f);  // removed
  p.set_bias(1, 0.0f);
  EXPECT_TRUE(p.logit_bias.empty());
  p.set_bias(0, -inf);
  p.set_bias(1, -inf);
  p.set_bias(2, -inf);
  EXPECT_EQ(Sampler(p).pick(logits, 3, {}, &t), Sampler::Outcome::NoCandidate);
  EXPECT_EQ(t, -1);
}

TEST(Sampling, LogitsHookMasksAndStops) {
  struct Hook {
    static int keep_last(float* l, int32_t n, const int32_t*, int32_t n_history, void* user) {
      for (int32_t i = 0; i + 1 < n; ++i) l[i] = -std::numeric_limits<float>::infinity();
      *static_cast<int32_t*>(user) = n_history;
      return 1;
    }
    static int stop(float*, int32_t, const int32_t*, int32_t, void*) { return 0; }
  };
  const float logits[] = {5.0f, 4.0f, 1.0f};
  SamplerParams p = plain(1.0f);
  int32_t seen_history = -1;
  p.on_logits = Hook::keep_last;
  p.logits_user = &seen_history;
  Sampler s(p);
  int32_t t = -1;
  for (int i = 0; i < 20; ++i) {  // only the last token survives the mask, whatever the draw
    EXPECT_EQ(s.pick(logits, 3, {7, 8}, &t), Sampler::Outcome::Token);
    EXPECT_EQ(t, 2);
  }
  EXPECT_EQ(seen_history, 2);
  p.on_logits = Hook::stop;
  EXPECT_EQ(Sampler(p).pick(logits, 3, {}, &t), Sampler::Outcome::Stopped);
}
