#include "core/exec/quality_meter.h"

#include <cmath>
#include <vector>

namespace moelite {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a position's bits spread over the whole word
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

bool quality_meter_samples(double rate, int32_t seq, int32_t pos, uint64_t step) {
  if (!(rate > 0.0)) return false;
  if (rate >= 1.0) return true;
  const uint64_t h = mix(mix((static_cast<uint64_t>(static_cast<uint32_t>(seq)) << 32) | static_cast<uint32_t>(pos)) ^ step);
  return static_cast<double>(h >> 11) * 0x1.0p-53 < rate;
}

NextTokenComparison compare_next_token(const float* exact_logits, const float* approx_logits, int32_t n_vocab) {
  NextTokenComparison c;
  double max_e = -INFINITY, max_a = -INFINITY;
  int32_t top_e = 0, top_a = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (exact_logits[i] > max_e) max_e = exact_logits[top_e = i];
    if (approx_logits[i] > max_a) max_a = approx_logits[top_a = i];
  }
  double sum_e = 0.0, sum_a = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    sum_e += std::exp(static_cast<double>(exact_logits[i]) - max_e);
    sum_a += std::exp(static_cast<double>(approx_logits[i]) - max_a);
  }
  const double log_z_e = max_e + std::log(sum_e), log_z_a = max_a + std::log(sum_a);
  double kl = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    const double log_p = static_cast<double>(exact_logits[i]) - log_z_e;
    const double log_q = static_cast<double>(approx_logits[i]) - log_z_a;
    const double p = std::exp(log_p);
    if (p > 0.0) kl += p * (log_p - log_q);
  }
  c.kl = kl > 0.0 ? kl : 0.0;  // rounding can leave a tiny negative sum for equal rows
  c.same_top1 = top_e == top_a;
  return c;
}

}  // namespace moelite
