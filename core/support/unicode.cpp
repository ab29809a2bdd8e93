#include "core/support/unicode.h"

#include <algorithm>
#include <array>

namespace moelite::unicode {
namespace {

uint16_t flags_of_category(Category c) {
  switch (c) {
    case Lu:
    case Ll:
    case Lt:
    case Lm:
    case Lo: return kLetter;
    case Mn:
    case Mc:
    case Me: return kMark;
    case Nd:
    case Nl:
    case No: return kNumber;
    case Pc:
    case Pd:
    case Ps:
    case Pe:
    case Pi:
    case Pf:
    case Po: return kPunct;
    case Sm:
    case Sc:
    case Sk:
    case So: return kSymbol;
    case Zs:
    case Zl:
    case Zp: return kSeparator;
    default: return kOther;
  }
}

// White_Space (PropList.txt); this is what \s means in the tokenizers' regexes.
bool white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

Category category_slow(uint32_t cp) {
  if (cp > kMaxCodePoint) return Cn;
  const CategoryRun* begin = kCategoryRuns;
  const CategoryRun* end = kCategoryRuns + kCategoryRunCount;
  const CategoryRun* it =
      std::upper_bound(begin, end, cp, [](uint32_t v, const CategoryRun& r) { return v < r.first; });
  return it == begin ? Cn : static_cast<Category>((it - 1)->category);
}

// Flags of the Basic Multilingual Plane, filled once.
constexpr uint32_t kFlatSize = 0x10000;
struct FlatTable {
  std::array<uint16_t, kFlatSize> flags;
  FlatTable() {
    for (size_t r = 0; r < kCategoryRunCount; ++r) {
      uint32_t first = kCategoryRuns[r].first;
      if (first >= kFlatSize) break;
      uint32_t last = r + 1 < kCategoryRunCount ? std::min<uint32_t>(kCategoryRuns[r + 1].first, kFlatSize) : kFlatSize;
      uint16_t f = flags_of_category(static_cast<Category>(kCategoryRuns[r].category));
      for (uint32_t cp = first; cp < last; ++cp) flags[cp] = f | (white_space(cp) ? kWhitespace : 0);
    }
  }
};
const FlatTable& flat() {
  static const FlatTable table;
  return table;
}

struct ByteMap {
  uint32_t to_cp[256];
  std::string to_utf8[256];
  ByteMap() {
    // Printable Latin-1 bytes stand for themselves; the others get U+0100 upwards in byte order.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = keep ? static_cast<uint32_t>(b) : next++;
      append_utf8(&to_utf8[b], to_cp[b]);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

Category category(uint32_t cp) { return category_slow(cp); }

uint16_t flags(uint32_t cp) {
  if (cp < kFlatSize) return flat().flags[cp];
  return flags_of_category(category_slow(cp)) | (white_space(cp) ? kWhitespace : 0);
}

size_t utf8_len(uint8_t lead) {
  static const uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

uint32_t decode_one(const char* text, size_t size, size_t* pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text);
  size_t p = *pos;
  uint8_t b0 = s[p];
  if (b0 < 0x80) {
    *pos = p + 1;
    return b0;
  }
  size_t n = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  } else {  // continuation byte or 0xF8..0xFF
    *pos = p + 1;
    return kReplacement;
  }
  if (p + n > size) {
    *pos = p + 1;
    return kReplacement;
  }
  for (size_t k = 1; k < n; ++k) {
    if ((s[p + k] & 0xC0) != 0x80) {
      *pos = p + 1;
      return kReplacement;
    }
    cp = (cp << 6) | (s[p + k] & 0x3F);
  }
  // Well-formed UTF-8 only (Unicode 15, table 3-7): an overlong form would let "\xC1\xB3" pass
  // for 's' and smuggle ASCII past a byte-level filter; a surrogate or a value beyond U+10FFFF
  // is no code point. llama.cpp accepts all three; its output for valid text is unchanged.
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > kMaxCodePoint) {
    *pos = p + 1;
    return kReplacement;
  }
  *pos = p + n;
  return cp;
}

std::vector<uint32_t> decode_utf8(const std::string& text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) out.push_back(decode_one(text.data(), text.size(), &pos));
  return out;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp > kMaxCodePoint) cp = kReplacement;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(const std::vector<uint32_t>& cpts) {
  std::string out;
  out.reserve(cpts.size());
  for (uint32_t cp : cpts) append_utf8(&out, cp);
  return out;
}

uint32_t byte_to_cp(uint8_t byte) { return byte_map().to_cp[byte]; }
const std::string& byte_to_utf8(uint8_t byte) { return byte_map().to_utf8[byte]; }

int cp_to_byte(uint32_t cp) {
  if (cp < 256) {
    bool keep = (cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF);
    return keep ? static_cast<int>(cp) : -1;
  }
  if (cp >= 256 && cp < 256 + 68) {
    // U+0100.. stand for the non-printable bytes in increasing byte order.
    static const std::array<int16_t, 68> kInverse = [] {
      std::array<int16_t, 68> inv{};
      for (int b = 0; b < 256; ++b) {
        uint32_t c = byte_map().to_cp[b];
        if (c >= 256) inv[c - 256] = static_cast<int16_t>(b);
      }
      return inv;
    }();
    return kInverse[cp - 256];
  }
  return -1;
}

}  // namespace moelite::unicode
