#include "core/exec/quality_governor.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace moelite {

namespace {
constexpr double kSmoothing = 0.05;  // weight of a token in the moving average (~20 tokens)
constexpr double kGain = 0.25;       // how hard a step corrects: (aim / level)^kGain
constexpr double kPriorTokens = 4.0;  // the ratio's prior (1) weighs as much as this many tokens at target
constexpr double kStartFraction = 1e-6;  // a threshold of target x this drops (almost) nothing
}  // namespace

bool parse_quality_target(const std::string& text, QualityTarget* out, std::string* why) {
  auto number = [](const std::string& s, double* v) {
    if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
    char* end = nullptr;
    errno = 0;
    *v = std::strtod(s.c_str(), &end);
    return *end == 0 && errno == 0 && std::isfinite(*v);
  };
  QualityTarget t;
  double v = 0;
  if (text.size() > 1 && text.back() == '%' && number(text.substr(0, text.size() - 1), &v) && v > 0 && v <= 100) {
    t.perplexity_rise = v / 100.0;
    t.kl = std::log1p(t.perplexity_rise);
  } else if (text.compare(0, 3, "kl:") == 0 && number(text.substr(3), &v) && v > 0 && v <= 10) {
    t.kl = v;
  } else {
    *why = "quality target '" + text + "': expected a perplexity rise in (0%, 100%] such as 1% or a KL per token in "
           "(0, 10] nats such as kl:0.01";
    return false;
  }
  t.set = true;
  *out = t;
  return true;
}

QualityGovernor::QualityGovernor(double target_kl, double min_threshold, double max_threshold, double start)
    : target_(target_kl), min_(min_threshold), max_(max_threshold) {
  threshold_ = std::clamp(start > 0 ? start : target_kl * kStartFraction, min_, max_);
}

double QualityGovernor::ratio() const {
  const double prior = kPriorTokens * target_;
  return (kl_seen_ + prior) / (predicted_seen_ + prior);
}

void QualityGovernor::on_evaluated(int32_t n, double predicted) {
  if (n <= 0) return;
  const double per_token = std::max(0.0, predicted / n);
  const double keep = std::pow(1.0 - kSmoothing, n);  // n tokens of one batch, each weighed as one
  level_ = level_set_ ? keep * level_ + (1.0 - keep) * per_token : per_token;
  level_set_ = true;
  const double aim = target_ / ratio();
  // Nothing dropped yet (level 0): grow at the fastest allowed rate.
  const double factor = level_ > 0 ? std::clamp(std::pow(aim / level_, kGain), 0.5, 2.0) : 2.0;
  threshold_ = std::clamp(threshold_ * factor, min_, max_);
}

void QualityGovernor::on_metered(int32_t n, double kl, double predicted) {
  if (n <= 0) return;
  kl_seen_ += std::max(0.0, kl);
  predicted_seen_ += std::max(0.0, predicted);
}

}  // namespace moelite
