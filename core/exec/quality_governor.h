// The quality governor: holds lossy gating's cost at a target by moving the gating threshold,
// token by token, within bounds the caller sets.
//
// Two signals, one cheap and one true. The sensitivity model's predicted loss of each gated token
// (apply_gating's predicted_loss) is known for every token and moves smoothly with the threshold;
// the quality meter's KL against exact routing (quality_meter.h) is what the target is about, but
// known only on sampled tokens and noisy. So the meter calibrates the model and the model steers:
//   ratio  = (sum of metered KL + prior) / (sum of their predicted loss + prior)   (KL per unit of prediction)
//   aim    = target / ratio                                                       (predicted loss per token)
//   level  = moving average of the predicted loss per token (time constant ~1/kSmoothing tokens)
//   threshold *= clamp((aim / level)^kGain, 1/2, 2)    after every gated step, within the bounds.
// Without a calibration profile every layer's sensitivity is 1 and the ratio learns the scale; the
// threshold starts near zero (exact) and doubles per step until gating drops experts.
//
// Deterministic: the trajectory depends only on the predicted losses and the metered divergences,
// which depend on the inputs, the parameters and the sampled positions -- never on timing or on
// which expert loads finished first.
#pragma once
#include <cstdint>
#include <string>

namespace moelite {

// A quality target: KL per token (nats), or a perplexity rise (0.01: 1 %) -- a rise r is a KL of
// ln(1 + r) per token, the expected growth of the cross-entropy when text follows the exact model.
struct QualityTarget {
  bool set = false;
  double kl = 0.0;             // the target as KL per token, nats
  double perplexity_rise = 0;  // as given, when given as a rise (else 0)
};

// "1%", "0.5%" (perplexity rise), "kl:0.01" (nats per token); false with `why` otherwise.
bool parse_quality_target(const std::string& text, QualityTarget* out, std::string* why);

class QualityGovernor {
 public:
  // `target_kl` > 0; `max_threshold` >= `min_threshold` >= 0; `start` the threshold to begin with
  // (0: near exact).
  QualityGovernor(double target_kl, double min_threshold, double max_threshold, double start);

  double threshold() const { return threshold_; }
  double ratio() const;  // measured KL per unit of predicted loss, as estimated now
  // After a gated evaluation of `n` tokens whose predicted loss summed to `predicted`.
  void on_evaluated(int32_t n, double predicted);
  // After a metered step: the divergences measured on `n` tokens (summed) and their predicted loss.
  void on_metered(int32_t n, double kl, double predicted);

 private:
  double target_, min_, max_, threshold_;
  double level_ = 0.0;  // moving average of the predicted loss per token
  bool level_set_ = false;
  double kl_seen_ = 0.0, predicted_seen_ = 0.0;
};

}  // namespace moelite
