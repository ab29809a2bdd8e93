#include "core/experts/guess_gate.h"

#include <algorithm>
#include <cmath>

namespace moelite {

float guess_confidence(float score) {
  if (!(score > 0.0f)) return 0.0f;  // NaN too
  return std::min(score, std::nextafter(kCertain, 0.0f));
}

int GuessGate::band(float confidence) {
  if (!(confidence > 0.0f)) return kBands - 1;
  // Half-octaves: band b holds (2^-(b+1)/2, 2^-b/2]: (0.707, 1] is band 0, (0.5, 0.707] band 1, ...
  const double halves = -2.0 * std::log2(static_cast<double>(confidence));
  return static_cast<int>(std::clamp(std::floor(halves), 0.0, static_cast<double>(kBands - 1)));
}

double GuessGate::precision(float confidence) const {
  const Counts& c = counts_[static_cast<size_t>(band(confidence))];
  return c.seen < kEnoughToKnow ? 1.0 : static_cast<double>(c.used) / static_cast<double>(c.seen);
}

bool GuessGate::worth_reading(float confidence) const {
  return confidence >= kCertain || precision(confidence) >= min_precision_;
}

void GuessGate::score(float confidence, bool used) {
  if (confidence >= kCertain) return;
  Counts& c = counts_[static_cast<size_t>(band(confidence))];
  c.seen += 1;
  c.used += used ? 1 : 0;
  if (c.seen >= kWindow) {
    c.seen /= 2;
    c.used /= 2;
  }
}

}  // namespace moelite
