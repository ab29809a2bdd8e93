// Which guesses are worth a read. A predictor's guess of an expert that is not in memory costs a
// read; a wrong one costs the read (bytes a slow device spends its whole time on, and the eviction
// of an expert that may be used again) and gains nothing. A predictor's confidence is a score on
// its own scale (next-gate: the router's weight of the guessed expert; learned: a fitted score),
// so the gate learns what a confidence is worth: per band of confidence, how many guesses of an
// absent expert the routing then used. A guess is read only where its band's precision reaches the
// minimum (MOELITE_PREDICT_MIN_PRECISION).
//
// Every guess of an absent expert is scored, read or not, so a band the gate closed opens again
// when its guesses improve; a band seen fewer times than it takes to know counts as precise
// (guessing is what the predictor was asked to do). Counts are halved as they grow, so the gate
// follows a prompt's drift rather than the whole run's average.
#pragma once
#include <array>
#include <cstdint>

#include "core/experts/cache_policy.h"

namespace moelite {

// A predictor's score as a guess's confidence: clamped into [0, kCertain) (cache_policy.h: kCertain
// is never gated nor scored).
float guess_confidence(float score);

class GuessGate {
 public:
  // min_precision in [0, 1]; 0 reads every guess (no gate).
  explicit GuessGate(double min_precision = 0.0) : min_precision_(min_precision) {}
  // Whether a guess of an absent expert with this confidence is worth its read.
  bool worth_reading(float confidence) const;
  // A guess of an absent expert with this confidence was (not) used by the routing that followed.
  void score(float confidence, bool used);
  // The band's precision as the gate counts it: used / seen, 1 until seen kEnoughToKnow times.
  double precision(float confidence) const;

  static constexpr int kBands = 24;  // half-octaves of confidence from 1 down to 2^-12, the last below
  static constexpr float kEnoughToKnow = 8;
  static constexpr float kWindow = 256;  // counts halve when a band has seen this many
  static int band(float confidence);

 private:
  struct Counts {
    float used = 0, seen = 0;
  };
  double min_precision_;
  std::array<Counts, kBands> counts_{};
};

}  // namespace moelite
