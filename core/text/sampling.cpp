#include "core/text/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace moelite {

namespace {
uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = splitmix64(&seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::vector<std::pair<int32_t, float>> Sampler::distribution(const float* logits, int32_t n_vocab,
                                                             const std::vector<int32_t>& history) const {
  std::vector<std::pair<int32_t, float>> cand(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cand[static_cast<size_t>(i)] = {i, logits[i]};

  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0) {
    const size_t n =
        p_.repeat_last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(p_.repeat_last_n));
    std::unordered_set<int32_t> recent(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (int32_t t : recent) {
      if (t < 0 || t >= n_vocab) continue;
      float& l = cand[static_cast<size_t>(t)].second;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
  }
  // Banned or masked tokens (-infinity) and NaN logits are never candidates: with a temperature
  // their probability would be 0 or NaN, and rounding could still draw one.
  cand.erase(std::remove_if(cand.begin(), cand.end(),
                            [](const auto& c) { return !(c.second > -std::numeric_limits<float>::infinity()); }),
             cand.end());
  if (cand.empty()) return {};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  if (p_.temperature <= 0.0f) {
    auto best = std::min_element(cand.begin(), cand.end(), by_logit);
    return {{best->first, 1.0f}};
  }
  size_t keep = cand.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    keep = static_cast<size_t>(p_.top_k);
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(), by_logit);
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  cand.resize(keep);
  // Softmax at the temperature, in double for a stable normalisation.
  const double max_l = cand[0].second;
  double sum = 0.0;
  std::vector<double> p(keep);
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((cand[i].second - max_l) / p_.temperature);
  for (double& v : p) v /= sum;
  // top-p: the smallest prefix whose mass reaches top_p.
  size_t n = keep;
  if (p_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      mass += p[i];
      if (mass >= p_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (p_.min_p > 0.0f) {
    size_t m = 1;
    while (m < n && p[m] >= p_.min_p * p[0]) ++m;
    n = m;
  }
  double kept = 0.0;
  for (size_t i = 0; i < n; ++i) kept += p[i];
  std::vector<std::pair<int32_t, float>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {cand[i].first, static_cast<float>(p[i] / kept)};
  return out;
}

void SamplerParams::set_bias(int32_t token, float bias) {
  auto it = std::find_if(logit_bias.begin(), logit_bias.end(), [&](const auto& e) { return e.first == token; });
  if (it != logit_bias.end()) logit_bias.erase(it);
  if (bias != 0.0f) logit_bias.emplace_back(token, bias);
}

Sampler::Outcome Sampler::pick(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history,
                               int32_t* token) {
  *token = -1;
  const float* use = logits;
  if (!p_.logit_bias.empty() || p_.on_logits) {
    scratch_.assign(logits, logits + n_vocab);
    for (const auto& [t, b] : p_.logit_bias)
      if (t >= 0 && t < n_vocab) scratch_[static_cast<size_t>(t)] += b;
    if (p_.on_logits && p_.on_logits(scratch_.data(), n_vocab, history.data(), static_cast<int32_t>(history.size()),
                                     p_.logits_user) == 0)
      return Outcome::Stopped;
    use = scratch_.data();
  }
  const auto dist = distribution(use, n_vocab, history);
  if (dist.empty()) return Outcome::NoCandidate;
  *token = draw(dist);
  return Outcome::Token;
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history) {
  const auto dist = distribution(logits, n_vocab, history);
  return dist.empty() ? -1 : draw(dist);
}

int32_t Sampler::draw(const std::vector<std::pair<int32_t, float>>& dist) {
  if (dist.size() == 1) return dist[0].first;
  double u = rng_.uniform(), acc = 0.0;
  for (const auto& [token, prob] : dist) {
    acc += prob;
    if (u < acc) return token;
  }
  return dist.back().first;  // rounding left u above the summed mass
}

}  // namespace moelite
