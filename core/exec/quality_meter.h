// The quality meter: what lossy gating (sensitivity, score or cache-aware, with substitution)
// costs against exact routing, measured while it runs.
//
// On a deterministic sample of the decoded tokens -- a hash of the sequence, the position and the
// count of tokens evaluated before, so the same inputs meter the same tokens, never a matter of
// timing, and a text evaluated window after window from position 0 is not metered at the same
// few positions of every window -- the context evaluates the
// token a second time with exact routing, over the same (gated) history, and compares the two
// next-token distributions: the KL divergence KL(exact || gated) and whether their most likely
// tokens agree. That exact pass reads the experts it needs (paid for, its time counted), writes
// nothing the context keeps (its cache rows are restored) and counts in no routing statistic.
// Every token also gets the sensitivity model's prediction of its loss (apply_gating's
// predicted_loss), so the two can be compared on the same tokens.
#pragma once
#include <cstdint>

namespace moelite {

// Whether the token at `pos` of sequence `seq`, the context's `step`th gated token, is metered at
// sampling rate `rate` in [0, 1].
bool quality_meter_samples(double rate, int32_t seq, int32_t pos, uint64_t step);

struct NextTokenComparison {
  double kl = 0.0;         // KL(exact || approximate), nats
  bool same_top1 = false;  // the two distributions' most likely tokens are the same
};

// Softmax of both logit rows in double precision (log-sum-exp), then the divergence.
NextTokenComparison compare_next_token(const float* exact_logits, const float* approx_logits, int32_t n_vocab);

// A context's running totals.
struct QualityTally {
  uint64_t tokens = 0;            // tokens evaluated under lossy gating
  double predicted_loss = 0.0;    // the sensitivity model's loss, summed over them
  uint64_t metered = 0;           // next-token distributions compared
  double predicted_metered = 0.0;  // the predicted loss of the metered tokens' evaluations
  double kl_sum = 0.0, kl_squares = 0.0;
  uint64_t top1_agreements = 0;
  uint64_t exact_passes = 0;      // extra evaluations (one per metered batch)
  double meter_seconds = 0.0;     // their time, with saving and restoring the cache rows
};

}  // namespace moelite
