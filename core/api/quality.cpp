// The quality meter's public entry points (core/exec/quality_meter.h).
#include <cmath>
#include <algorithm>
#include <cstring>
#include <string>

#include "core/api/handles.h"
#include "core/exec/context.h"

using moelite::fail;
using moelite::api::busy;
using moelite::api::ContextTurn;
using moelite::api::guarded;
using moelite::api::null_arg;

MOELITE_API moelite_status moelite_context_params_set_quality_meter(moelite_context_params* p, double sample_rate) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!(sample_rate >= 0.0 && sample_rate <= 1.0))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: sample_rate %g is outside [0, 1]", api_fn, sample_rate);
    p->opts.quality_sample_rate = sample_rate;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_params_set_quality_target(moelite_context_params* p, const char* target) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!target || !*target) {
      p->opts.quality_target = moelite::QualityTarget();
      return MOELITE_OK;
    }
    std::string why;
    moelite::QualityTarget t;
    if (!moelite::parse_quality_target(target, &t, &why)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s", why.c_str());
    p->opts.quality_target = t;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_params_set_quality_bounds(moelite_context_params* p, double min_threshold,
                                                                     double max_threshold) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!p) return null_arg(api_fn, "params");
    if (!(min_threshold >= 0.0 && max_threshold >= min_threshold) || !std::isfinite(min_threshold) ||
        std::isnan(max_threshold))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: [%g, %g] is not a range of thresholds >= 0", api_fn, min_threshold,
                  max_threshold);
    p->opts.min_threshold = min_threshold;
    p->opts.max_threshold = max_threshold;
    return MOELITE_OK;
  });
}

MOELITE_API moelite_status moelite_context_quality_stats(const moelite_context* c, moelite_quality_stats* out) {
  const char* const api_fn = __func__;
  return guarded(api_fn, [&]() -> moelite_status {
    if (!c) return null_arg(api_fn, "ctx");
    const ContextTurn turn(c);  // an evaluation on another thread rewrites what this reads
    if (!turn.ok()) return busy(api_fn);
    if (!out || out->struct_size < sizeof(size_t))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s: out->struct_size must be set", api_fn);
    const moelite::QualityTally& q = c->impl->quality();
    moelite_quality_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = out->struct_size;
    s.gated_tokens = q.tokens;
    s.predicted_loss = q.tokens ? q.predicted_loss / static_cast<double>(q.tokens) : 0.0;
    s.metered_tokens = q.metered;
    if (q.metered > 0) {
      const double n = static_cast<double>(q.metered);
      s.kl_mean = q.kl_sum / n;
      const double var = q.metered > 1 ? std::max(0.0, (q.kl_squares - n * s.kl_mean * s.kl_mean) / (n - 1)) : 0.0;
      s.kl_stderr = std::sqrt(var / n);
      s.top1_agreement = static_cast<double>(q.top1_agreements) / n;
      s.top1_stderr = std::sqrt(s.top1_agreement * (1.0 - s.top1_agreement) / n);
      s.predicted_loss_metered = q.predicted_metered / n;
    }
    s.meter_evaluations = q.exact_passes;
    s.threshold = c->impl->gating_threshold();
    s.target_kl = c->impl->quality_target_kl();
    s.kl_per_predicted = c->impl->governor_ratio();
    s.meter_seconds = q.meter_seconds;
    memcpy(out, &s, moelite::api::quality_stats_bytes(out->struct_size));
    return MOELITE_OK;
  });
}
