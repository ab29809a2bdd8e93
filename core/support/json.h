// A small JSON reader and writer helpers for the files moelite reads and writes itself
// (calibration profiles). Strict RFC 8259 syntax, depth-limited, no extensions.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moelite {
namespace json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;  // in file order

  // Member `key` of an object, or null if absent (or not an object).
  const Value* find(const std::string& key) const;
  bool is_number() const { return kind == Kind::Number; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_string() const { return kind == Kind::String; }
};

// Parses a whole document. On a syntax error returns false with "line L: what" in *error.
bool parse(const std::string& text, Value* out, std::string* error);

// A number as JSON text: shortest round-trip form for doubles (%.17g trimmed), `null` for
// non-finite values (JSON has no NaN/Inf).
std::string number(double v);
// A string literal with the required escapes.
std::string quote(const std::string& s);

}  // namespace json
}  // namespace moelite
