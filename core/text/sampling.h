// Token sampling from logits: repetition penalty, then temperature, top-k, top-p and min-p
// filters, then a draw from a seeded generator (greedy when temperature <= 0).
#pragma once
#include <cstdint>
#include <utility>
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
  // Added to the logits before anything else; -infinity bans a token. One entry per token (a
  // later setting of the same token replaces the earlier one).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Sees (and may change) the biased logits before the filters; tokens it sets to -infinity are
  // never drawn. Returns 0 to stop. history/n_history: the sequence so far.
  int (*on_logits)(float* logits, int32_t n_vocab, const int32_t* history, int32_t n_history, void* user) = nullptr;
  void* logits_user = nullptr;

  void set_bias(int32_t token, float bias);
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
  enum class Outcome { Token, Stopped, NoCandidate };
  // Picks a token from n_vocab logits: logit bias, then the logits hook, then distribution() and a
  // draw. `history` is the sequence so far (prompt + generated). Stopped: the hook returned 0;
  // NoCandidate: every token was banned or masked (or the logits were all NaN / -infinity).
  Outcome pick(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history, int32_t* token);
  // pick() for callers without a hook or bans: the token, or -1 when there is no candidate.
  int32_t sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history);
  // The candidate distribution after the penalty and the filters (token, probability) in
  // descending order; tokens whose logit is -infinity or NaN are never candidates. Bias and hook
  // are not applied here (pick() applies them first). Greedy gives one candidate with
  // probability 1; no candidate at all gives an empty vector.
  std::vector<std::pair<int32_t, float>> distribution(const float* logits, int32_t n_vocab,
                                                      const std::vector<int32_t>& history) const;
  const SamplerParams& params() const { return p_; }

 private:
  SamplerParams p_;
  Rng rng_;
  std::vector<float> scratch_;  // biased / hooked logits

  int32_t draw(const std::vector<std::pair<int32_t, float>>& dist);
};

}  // namespace moelite
