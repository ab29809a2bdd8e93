// Reading one hyperparameter key "{arch}.suffix" with its type and valid range checked
// (declared in arch.h). A file is hostile until checked: every number the forward pass divides
// by, or takes a log, root or power of, passes through one of these, so that a NaN, an infinity
// or a zero becomes MOELITE_ERR_BAD_METADATA naming the key instead of NaN logits later.
#include <cinttypes>
#include <cmath>
#include <string>

#include "core/model/arch/arch.h"

namespace moelite {

Status required_int(const gguf::Reader& g, const std::string& arch, const char* suffix, int64_t lo, int64_t hi,
                    int32_t* out) {
  const std::string key = arch + "." + suffix;
  int64_t v;
  if (!g.find(key)) return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' is required but absent", key.c_str());
  if (!g.get_int(key, &v))
    return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' must be an integer", key.c_str());
  if (v < lo || v > hi)
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]",
                key.c_str(), v, lo, hi);
  *out = static_cast<int32_t>(v);
  return MOELITE_OK;
}

Status optional_int(const gguf::Reader& g, const std::string& arch, const char* suffix, int64_t lo, int64_t hi,
                    int32_t fallback, int32_t* out) {
  if (!g.find(arch + "." + suffix)) {
    *out = fallback;
    return MOELITE_OK;
  }
  return required_int(g, arch, suffix, lo, hi, out);
}

Status float_key_in(const gguf::Reader& g, const std::string& key, double lo, double hi, double fallback, float* out) {
  double v = fallback;
  if (g.find(key) && !g.get_float(key, &v))
    return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' must be a number", key.c_str());
  // Checked as the float the forward pass will use: a double that is finite may not be as a float.
  const float f = static_cast<float>(v);
  if (std::isfinite(f) && f > lo && f <= hi) {
    *out = f;
    return MOELITE_OK;
  }
  if (std::isinf(lo) && std::isinf(hi))
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = %g is not a finite number", key.c_str(), v);
  if (std::isinf(hi))
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = %g is not a finite number above %g", key.c_str(), v, lo);
  return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = %g is outside (%g, %g]", key.c_str(), v, lo, hi);
}

Status required_float(const gguf::Reader& g, const std::string& arch, const char* suffix, double lo, double hi,
                      float* out) {
  const std::string key = arch + "." + suffix;
  if (!g.find(key)) return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' is required but absent", key.c_str());
  return float_key_in(g, key, lo, hi, 0.0, out);
}

Status optional_float(const gguf::Reader& g, const std::string& arch, const char* suffix, double lo, double hi,
                      double fallback, float* out) {
  return float_key_in(g, arch + "." + suffix, lo, hi, fallback, out);
}

}  // namespace moelite
