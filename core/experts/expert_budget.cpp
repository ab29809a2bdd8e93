#include "core/experts/expert_budget.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moelite {

ExpertBudget ExpertBudget::of_bytes(uint64_t bytes) {
  ExpertBudget b;
  b.kind = bytes > 0 ? Kind::Bytes : Kind::None;
  b.bytes = bytes;
  return b;
}

ExpertBudget ExpertBudget::of_share(double share) {
  ExpertBudget b;
  b.kind = Kind::Share;
  b.share = share;
  return b;
}

ExpertBudget ExpertBudget::automatic(uint64_t headroom) {
  ExpertBudget b;
  b.kind = Kind::Auto;
  b.headroom = headroom;
  return b;
}

std::string ExpertBudget::describe() const {
  char buf[96];
  switch (kind) {
    case Kind::None: return "none";
    case Kind::Bytes: std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0); return buf;
    case Kind::Share: std::snprintf(buf, sizeof buf, "%g%%", share * 100.0); return buf;
    case Kind::Auto:
      if (headroom == 0) return "auto";
      std::snprintf(buf, sizeof buf, "auto (headroom %.1f MiB)", static_cast<double>(headroom) / 1048576.0);
      return buf;
  }
  return "?";
}

namespace {

// The number at the start of `text` (digits, optionally a '.' and more digits), the rest in *unit.
bool leading_number(const std::string& text, double* value, std::string* unit) {
  size_t i = 0, digits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++digits;
  }
  if (digits == 0 || digits > 30) return false;
  *value = std::strtod(text.substr(0, i).c_str(), nullptr);
  *unit = text.substr(i);
  return std::isfinite(*value);
}

}  // namespace

Status parse_size(const std::string& text, uint64_t* out) {
  static const struct {
    const char* unit;
    double scale;
  } kUnits[] = {{"", 1},
                {"B", 1},
                {"K", 1e3},
                {"KB", 1e3},
                {"KiB", 1024.0},
                {"M", 1e6},
                {"MB", 1e6},
                {"MiB", 1048576.0},
                {"G", 1e9},
                {"GB", 1e9},
                {"GiB", 1073741824.0},
                {"T", 1e12},
                {"TB", 1e12},
                {"TiB", 1099511627776.0}};
  double number;
  std::string unit;
  if (leading_number(text, &number, &unit))
    for (const auto& u : kUnits) {
      if (unit != u.unit) continue;
      const double bytes = std::floor(number * u.scale);
      if (bytes < 1.0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "size '%.64s' is below one byte", text.c_str());
      if (bytes > static_cast<double>(kMaxBudgetBytes))
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "size '%.64s' is above 2^62 bytes", text.c_str());
      *out = static_cast<uint64_t>(bytes);
      return MOELITE_OK;
    }
  return fail(MOELITE_ERR_INVALID_ARGUMENT,
              "'%.64s' is not a size: expected bytes with an optional unit, like 123456, 512MiB, 1.5G or 2GiB",
              text.c_str());
}

Status parse_expert_budget(const std::string& text, ExpertBudget* out) {
  if (text == "none") {
    *out = ExpertBudget{};
    return MOELITE_OK;
  }
  if (text == "auto") {
    *out = ExpertBudget::automatic(0);
    return MOELITE_OK;
  }
  double number;
  std::string unit;
  if (leading_number(text, &number, &unit) && unit == "%") {
    if (!(number > 0.0 && number <= 100.0))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "expert budget '%.64s': a share must be in (0%%, 100%%]", text.c_str());
    *out = ExpertBudget::of_share(number / 100.0);
    return MOELITE_OK;
  }
  uint64_t bytes;
  if (parse_size(text, &bytes) != MOELITE_OK)
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "expert budget '%.64s': expected a size of at least one byte (2GiB, 512MiB, 1.5G, 123456), a "
                "share of the experts (25%%), auto or none",
                text.c_str());
  *out = ExpertBudget::of_bytes(bytes);
  return MOELITE_OK;
}

}  // namespace moelite
