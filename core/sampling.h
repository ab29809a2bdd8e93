// Token sampling from logits: repetition penalty, then temperature, top-k, top-p and min-p
// filters, then a draw from a seeded generator (greedy when temperature <= 0).
#pragma once
#include <cstdint>
#include <vector>

namespace moelite {

struct SamplerParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax)
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off; keep tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f;  // 1: off; llama.cpp's rule: logit > 0 ? logit / r : logit * r
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at
  uint64_t seed = 0x5eed;
};

// A small, fully specified generator (splitmix64-seeded xoshiro256**), so a seed gives the same
// stream on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}
  // Picks a token from n_vocab logits. `history` is the sequence so far (prompt + generated).
  int32_t sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history);
  // The candidate distribution after all filters (token, probability) in descending order;
  // exposed for tests and diagnostics. Greedy gives one candidate with probability 1.
  std::vector<std::pair<int32_t, float>> distribution(const float* logits, int32_t n_vocab,
                                                      const std::vector<int32_t>& history) const;

 private:
  SamplerParams p_;
  Rng rng_;
};

}  // namespace moelite
