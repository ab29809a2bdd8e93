#include "json_value.h"

#include <cstdlib>
#include <cstring>

namespace cli {

namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  bool document(JsonValue* out, std::string* error) {
    bool ok = value(out, 0);
    if (ok) {
      space();
      if (i_ != s_.size()) ok = bad("text after the value");
    }
    if (!ok) *error = error_;
    return ok;
  }

 private:
  bool bad(const char* what) {
    if (error_.empty()) error_ = std::string(what) + " at byte " + std::to_string(i_);
    return false;
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(const char* word) {
    const size_t n = strlen(word);
    if (s_.compare(i_, n, word) != 0) return bad("unexpected character");
    i_ += n;
    return true;
  }
  bool value(JsonValue* v, int depth) {
    if (depth > kMaxDepth) return bad("nesting too deep");
    space();
    if (i_ >= s_.size()) return bad("unexpected end");
    const char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->kind = JsonValue::Kind::String;
      return string(&v->text);
    }
    if (c == 't' || c == 'f') {
      v->kind = JsonValue::Kind::Bool;
      v->boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return literal("null");
    return number(v);
  }
  bool number(JsonValue* v) {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    auto digits = [&] {
      const size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > d;
    };
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (!digits()) {
      return bad("expected a value");
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) return bad("expected digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return bad("expected an exponent");
    }
    v->kind = JsonValue::Kind::Number;
    v->number = strtod(s_.substr(start, i_ - start).c_str(), nullptr);
    return true;
  }
  bool hex4(uint32_t* out) {
    if (i_ + 4 > s_.size()) return bad("short \\u escape");
    uint32_t x = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      x <<= 4;
      if (h >= '0' && h <= '9') x |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') x |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') x |= uint32_t(h - 'A' + 10);
      else return bad("bad \\u escape");
    }
    *out = x;
    return true;
  }
  static void utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(char(cp));
    } else if (cp < 0x800) {
      out->push_back(char(0xC0 | (cp >> 6)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(char(0xE0 | (cp >> 12)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(char(0xF0 | (cp >> 18)));
      out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    }
  }
  bool string(std::string* out) {
    ++i_;  // the opening quote
    out->clear();
    while (i_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return bad("control character in a string");
      if (c != '\\') {
        out->push_back(char(c));
        continue;
      }
      if (i_ >= s_.size()) break;
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
          if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate must be followed by a low one
            uint32_t lo;
            if (s_.compare(i_, 2, "\\u") != 0) return bad("unpaired surrogate");
            i_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo >= 0xE000) return bad("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return bad("unpaired surrogate");
          }
          utf8(cp, out);
          break;
        }
        default: return bad("bad escape");
      }
    }
    return bad("unterminated string");
  }
  bool array(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::Array;
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      v->items.emplace_back();
      if (!value(&v->items.back(), depth + 1)) return false;
      space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      return bad("expected ',' or ']'");
    }
  }
  bool object(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::Object;
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      space();
      if (i_ >= s_.size() || s_[i_] != '"') return bad("expected a key");
      std::string key;
      if (!string(&key)) return false;
      space();
      if (i_ >= s_.size() || s_[i_] != ':') return bad("expected ':'");
      ++i_;
      JsonValue item;
      if (!value(&item, depth + 1)) return false;
      v->fields[key] = std::move(item);
      space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      return bad("expected ',' or '}'");
    }
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string error_;
};

}  // namespace

bool parse_json(const std::string& text, JsonValue* out, std::string* error) {
  *out = JsonValue{};
  return Parser(text).document(out, error);
}

}  // namespace cli
