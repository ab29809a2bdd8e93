// Unicode helpers for the tokenizers: UTF-8 decoding that never fails (llama.cpp-compatible:
// an invalid sequence becomes U+FFFD and consumes one byte), general categories from the
// generated run table (unicode_tables.cpp), the regex classes \p{L} \p{N} \p{P} \p{S} \p{M} and
// \s, and the GPT-2 byte <-> code point mapping used by byte-level BPE.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moelite::unicode {

// General categories; the order is the generator's (tools/gen_unicode_tables.py).
enum Category : uint8_t {
  Cn = 0,
  Lu,
  Ll,
  Lt,
  Lm,
  Lo,
  Mn,
  Mc,
  Me,
  Nd,
  Nl,
  No,
  Pc,
  Pd,
  Ps,
  Pe,
  Pi,
  Pf,
  Po,
  Sm,
  Sc,
  Sk,
  So,
  Zs,
  Zl,
  Zp,
  Cc,
  Cf,
  Cs,
  Co,
};

struct CategoryRun {
  uint32_t first;
  uint8_t category;
};
extern const CategoryRun kCategoryRuns[];
extern const size_t kCategoryRunCount;
extern const char* const kUnicodeVersion;

// Class bits of a code point.
enum Flag : uint16_t {
  kLetter = 1 << 0,      // \p{L}
  kNumber = 1 << 1,      // \p{N}
  kPunct = 1 << 2,       // \p{P}
  kSymbol = 1 << 3,      // \p{S}
  kMark = 1 << 4,        // \p{M}
  kSeparator = 1 << 5,   // \p{Z}
  kOther = 1 << 6,       // \p{C} (incl. unassigned)
  kWhitespace = 1 << 7,  // \s: the White_Space property
};

constexpr uint32_t kReplacement = 0xFFFD;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

Category category(uint32_t cp);  // Cn beyond U+10FFFF
uint16_t flags(uint32_t cp);
inline bool is_letter(uint32_t cp) { return flags(cp) & kLetter; }
inline bool is_number(uint32_t cp) { return flags(cp) & kNumber; }
inline bool is_whitespace(uint32_t cp) { return flags(cp) & kWhitespace; }

// Byte length of the UTF-8 sequence a lead byte announces (1 for continuation/invalid bytes),
// as llama.cpp's unicode_len_utf8.
size_t utf8_len(uint8_t lead);

// Decodes one code point at text[*pos]; advances *pos. Ill-formed sequences (stray continuation
// byte, truncated sequence, bad lead byte, overlong form, surrogate, beyond U+10FFFF) give
// U+FFFD and advance one byte.
uint32_t decode_one(const char* text, size_t size, size_t* pos);
std::vector<uint32_t> decode_utf8(const std::string& text);
void append_utf8(std::string* out, uint32_t cp);  // cp > U+10FFFF is written as U+FFFD
std::string encode_utf8(const std::vector<uint32_t>& cpts);

// GPT-2 byte-level mapping: every byte is shown as a printable code point.
uint32_t byte_to_cp(uint8_t byte);
const std::string& byte_to_utf8(uint8_t byte);  // the code point above, UTF-8 encoded
int cp_to_byte(uint32_t cp);                    // -1 if cp is not in the mapping

}  // namespace moelite::unicode
