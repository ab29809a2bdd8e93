// A small JSON reader for the command-line tool's inputs (`moelite batch` reads JSON lines).
// Strict RFC 8259: one value, nothing after it but whitespace; strings are UTF-8 with escapes
// (\uXXXX, surrogate pairs joined); nesting is limited so hostile input cannot exhaust the stack.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cli {

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string text;                         // String
  std::vector<JsonValue> items;             // Array
  std::map<std::string, JsonValue> fields;  // Object (a repeated key keeps the last value)

  const JsonValue* find(const std::string& key) const {
    auto it = fields.find(key);
    return kind == Kind::Object && it != fields.end() ? &it->second : nullptr;
  }
};

// Parses `text` into *out; false with a message naming the byte offset on any error.
bool parse_json(const std::string& text, JsonValue* out, std::string* error);

}  // namespace cli
