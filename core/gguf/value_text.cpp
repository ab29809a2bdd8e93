#include "core/gguf/value_text.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "core/support/json.h"

namespace moelite::gguf {

namespace {

std::string int_text(int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  return buf;
}
std::string uint_text(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  return buf;
}
// %.17g reads back as the same double; a float32 widened to double reads back as itself too.
std::string float_text(double v) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

bool is_unsigned(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}

// Element k of a numeric or bool array, from its little-endian bytes.
std::string element_text(const Value& v, uint64_t k) {
  if (v.elem_type == ValueType::BOOL) return v.raw[k] ? "true" : "false";
  if (v.elem_type == ValueType::FLOAT32 || v.elem_type == ValueType::FLOAT64) {
    double d = 0;
    v.array_double(k, &d);
    return json::number(d);  // null for NaN / infinity: the array stays valid JSON
  }
  if (v.elem_type == ValueType::UINT64) {  // may exceed int64
    uint64_t u = 0;
    for (int b = 7; b >= 0; --b) u = (u << 8) | v.raw[k * 8 + static_cast<uint64_t>(b)];
    return uint_text(u);
  }
  int64_t i = 0;
  v.array_int(k, &i);
  return is_unsigned(v.elem_type) ? uint_text(static_cast<uint64_t>(i)) : int_text(i);
}

void array_text(const Value& v, std::string* out) {
  *out += '[';
  for (uint64_t k = 0; k < v.count; ++k) {
    if (k) *out += ',';
    if (v.elem_type == ValueType::STRING) {
      *out += json::quote(v.strings[k]);
    } else if (v.elem_type == ValueType::ARRAY) {
      array_text(v.nested[k], out);
    } else {
      *out += element_text(v, k);
    }
  }
  *out += ']';
}

}  // namespace

std::string value_to_text(const Value& v) {
  switch (v.type) {
    case ValueType::STRING: return v.str;
    case ValueType::BOOL: return v.u ? "true" : "false";
    case ValueType::FLOAT32:
    case ValueType::FLOAT64: return float_text(v.f);
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64: return uint_text(v.u);
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64: return int_text(v.i);
    case ValueType::ARRAY: {
      std::string out;
      array_text(v, &out);
      return out;
    }
  }
  return std::string();
}

}  // namespace moelite::gguf
