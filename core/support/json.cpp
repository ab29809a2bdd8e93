#include "core/support/json.h"

#include "core/support/unicode.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moelite {
namespace json {

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  bool document(Value* out, std::string* error) {
    ws();
    bool ok = value(out, 0);
    if (ok) {
      ws();
      if (i_ != s_.size()) ok = err("trailing characters after the document");
    }
    if (!ok) {
      size_t line = 1;
      for (size_t j = 0; j < i_ && j < s_.size(); ++j) line += s_[j] == '\n';
      *error = "line " + std::to_string(line) + ": " + error_;
    }
    return ok;
  }

 private:
  bool err(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(const char* word) {
    const size_t n = strlen(word);
    if (s_.compare(i_, n, word) != 0) return err("unexpected characters");
    i_ += n;
    return true;
  }

  bool value(Value* v, int depth) {
    if (depth > kMaxDepth) return err("nesting deeper than 64 levels");
    switch (peek()) {
      case '{': return object(v, depth);
      case '[': return array(v, depth);
      case '"': v->kind = Value::Kind::String; return string(&v->string);
      case 't':
        v->kind = Value::Kind::Bool;
        v->boolean = true;
        return literal("true");
      case 'f':
        v->kind = Value::Kind::Bool;
        v->boolean = false;
        return literal("false");
      case 'n': v->kind = Value::Kind::Null; return literal("null");
      default: v->kind = Value::Kind::Number; return number(&v->number);
    }
  }

  bool object(Value* v, int depth) {
    v->kind = Value::Kind::Object;
    ++i_;
    ws();
    if (peek() == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      ws();
      std::string key;
      if (peek() != '"' || !string(&key)) return err("expected a string key");
      ws();
      if (peek() != ':') return err("expected ':'");
      ++i_;
      ws();
      v->object.emplace_back(std::move(key), Value());
      if (!value(&v->object.back().second, depth + 1)) return false;
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == '}') {
        ++i_;
        return true;
      }
      return err("expected ',' or '}'");
    }
  }

  bool array(Value* v, int depth) {
    v->kind = Value::Kind::Array;
    ++i_;
    ws();
    if (peek() == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      ws();
      v->array.emplace_back();
      if (!value(&v->array.back(), depth + 1)) return false;
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == ']') {
        ++i_;
        return true;
      }
      return err("expected ',' or ']'");
    }
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  bool hex4(uint32_t* cp) {
    if (i_ + 4 > s_.size()) return err("truncated \\u escape");
    *cp = 0;
    for (int j = 0; j < 4; ++j) {
      const int h = hex(s_[i_ + j]);
      if (h < 0) return err("bad \\u escape");
      *cp = *cp * 16 + static_cast<uint32_t>(h);
    }
    i_ += 4;
    return true;
  }

  bool string(std::string* out) {
    ++i_;  // opening quote
    for (;;) {
      if (i_ >= s_.size()) return err("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return err("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return err("unterminated string");
      const char e = s_[i_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            uint32_t lo;
            if (s_.compare(i_, 2, "\\u") != 0) return err("unpaired surrogate");
            i_ += 2;
            if (!hex4(&lo) || lo < 0xDC00 || lo > 0xDFFF) return err("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return err("unpaired surrogate");
          }
          unicode::append_utf8(out, cp);
          break;
        }
        default: return err("bad escape in a string");
      }
    }
  }

  bool number(double* v) {
    // Validate the JSON grammar first (strtod accepts more: hex, inf, nan, leading '+').
    const size_t start = i_;
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    } else {
      return err("expected a value");
    }
    if (peek() == '.') {
      ++i_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) return err("bad number");
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) return err("bad number");
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    }
    const std::string text = s_.substr(start, i_ - start);
    *v = strtod(text.c_str(), nullptr);
    return true;
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string error_;
};

}  // namespace

bool parse(const std::string& text, Value* out, std::string* error) {
  Value v;
  if (!Parser(text).document(&v, error)) return false;
  *out = std::move(v);
  return true;
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the shortest form that reads back the same double.
  for (int prec = 6; prec < 17; ++prec) {
    char shorter[32];
    snprintf(shorter, sizeof shorter, "%.*g", prec, v);
    if (strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

}  // namespace json
}  // namespace moelite
