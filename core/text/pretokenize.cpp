// Hand-written matchers for the pre-tokenizer regexes llama.cpp uses (src/llama-vocab.cpp,
// llm_tokenizer_bpe). Each matcher returns the length of the regex's match starting exactly at
// `p` within [p, end) (0: no match), honouring the alternatives' order and greedy backtracking.
#include "core/text/pretokenize.h"

#include <algorithm>
#include <cstring>

#include "core/support/unicode.h"

namespace moelite {
namespace {

using unicode::flags;
using Matcher = size_t (*)(const uint32_t* c, size_t p, size_t end);

struct Range {
  uint32_t lo, hi;
};

template <size_t N>
bool in_ranges(const Range (&r)[N], uint32_t cp) {
  for (const Range& x : r)
    if (cp >= x.lo && cp <= x.hi) return true;
  return false;
}

inline bool ws(uint32_t cp) { return flags(cp) & unicode::kWhitespace; }
inline bool letter(uint32_t cp) { return flags(cp) & unicode::kLetter; }
inline bool number(uint32_t cp) { return flags(cp) & unicode::kNumber; }
inline bool punct(uint32_t cp) { return flags(cp) & unicode::kPunct; }
inline bool crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
// [^\s\p{L}\p{N}]
inline bool other(uint32_t cp) { return !(flags(cp) & (unicode::kWhitespace | unicode::kLetter | unicode::kNumber)); }
inline uint32_t lower_ascii(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

// 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII-case-insensitive; p may be `end` (gpt-4o tries a
// contraction after a word that ends the piece).
size_t contraction(const uint32_t* c, size_t p, size_t end, bool icase) {
  if (p + 1 >= end || c[p] != '\'') return 0;
  uint32_t a = icase ? lower_ascii(c[p + 1]) : c[p + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (p + 2 >= end) return 0;
  uint32_t b = icase ? lower_ascii(c[p + 2]) : c[p + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Greedy run of `pred` from q; returns the end.
template <typename Pred>
size_t run(const uint32_t* c, size_t q, size_t end, Pred pred) {
  while (q < end && pred(c[q])) ++q;
  return q;
}

// \s+(?!\S) then (if `plain_ws`) \s+ : the whitespace tail shared by the GPT-2 family.
size_t ws_tail(const uint32_t* c, size_t p, size_t end, bool plain_ws) {
  if (!ws(c[p])) return 0;
  size_t r = run(c, p, end, ws);
  if (r == end) return r - p;       // followed by nothing: the whole run
  if (r - p > 1) return r - p - 1;  // leave the last space to the next word
  return plain_ws ? r - p : 0;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
size_t match_gpt2(const uint32_t* c, size_t p, size_t end) {
  if (size_t n = contraction(c, p, end, false)) return n;
  size_t q = p + (c[p] == ' ' ? 1 : 0);
  if (q < end) {
    if (letter(c[q])) return run(c, q, end, letter) - p;
    if (number(c[q])) return run(c, q, end, number) - p;
    if (other(c[q])) return run(c, q, end, other) - p;
  }
  return ws_tail(c, p, end, false);
}

// \s*[\r\n]+|\s+(?!\S)|\s+ : the whitespace alternatives that end the Llama-3 family's regexes.
size_t whitespace_tail(const uint32_t* c, size_t p, size_t end) {
  if (!ws(c[p])) return 0;
  // \s*[\r\n]+ : the whitespace run up to (and including) its last \r or \n.
  size_t r = p, last_crlf = 0;
  bool has_crlf = false;
  for (; r < end && ws(c[r]); ++r) {
    if (crlf(c[r])) {
      last_crlf = r;
      has_crlf = true;
    }
  }
  if (has_crlf) return last_crlf + 1 - p;
  return ws_tail(c, p, end, true);
}

// Llama-3 / Qwen2:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,K}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
template <size_t kMaxDigits>
size_t match_llama3(const uint32_t* c, size_t p, size_t end) {
  if (size_t n = contraction(c, p, end, true)) return n;
  const uint32_t cp = c[p];
  if (!crlf(cp) && !letter(cp) && !number(cp) && p + 1 < end && letter(c[p + 1])) return run(c, p + 1, end, letter) - p;
  if (letter(cp)) return run(c, p, end, letter) - p;
  if (number(cp)) {
    size_t q = p;
    while (q < end && q - p < kMaxDigits && number(c[q])) ++q;
    return q - p;
  }
  size_t q = p + (cp == ' ' ? 1 : 0);
  if (q < end && other(c[q])) {
    q = run(c, q, end, other);
    return run(c, q, end, crlf) - p;
  }
  return whitespace_tail(c, p, end);
}

// GPT-4o / o200k (gpt-oss, Llama 4), as llama.cpp evaluates it. Its regex is
//   [^\r\n\p{L}\p{N}]?U*W+C? | [^\r\n\p{L}\p{N}]?U+W*C? | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n/]* |
//   \s*[\r\n]+ | \s+(?!\S) | \s+
// with C = 's|'t|'re|'ve|'m|'ll|'d in either case. tokenizer.json's U and W are upper- and
// lower-case letters (and marks), but llama.cpp writes them as "a letter but a-z" and "a letter
// but A-Z" and runs std::regex on a copy of the text where every non-ASCII letter is one stand-in
// character: case is told apart for ASCII only, and marks are not letters. Following llama.cpp is
// what gives its token ids (Hugging Face splits "ÉCOLE" whole; llama.cpp and this, "É" + "COLE").
inline bool not_ascii_lower(uint32_t cp) { return letter(cp) && !(cp >= 'a' && cp <= 'z'); }  // U
inline bool not_ascii_upper(uint32_t cp) { return letter(cp) && !(cp >= 'A' && cp <= 'Z'); }  // W

size_t match_gpt4o(const uint32_t* c, size_t p, size_t end) {
  const uint32_t cp = c[p];
  // The optional leading character: taking it is tried first, and leaving it can only succeed
  // when it is not there (a leading character is no letter, so U and W cannot start on it).
  const size_t s = (!crlf(cp) && !letter(cp) && !number(cp)) ? p + 1 : p;
  // U*W+C?: U* takes its whole run, then gives back one character at a time until W+ can start.
  const size_t u_end = run(c, s, end, not_ascii_lower);
  for (size_t q = u_end;; --q) {
    if (q < end && not_ascii_upper(c[q])) {
      const size_t e = run(c, q, end, not_ascii_upper);
      return e + contraction(c, e, end, true) - p;
    }
    if (q == s) break;
  }
  // U+W*C?
  if (u_end > s) {
    const size_t e = run(c, u_end, end, not_ascii_upper);
    return e + contraction(c, e, end, true) - p;
  }
  if (number(cp)) {
    size_t q = p;
    while (q < end && q - p < 3 && number(c[q])) ++q;
    return q - p;
  }
  size_t q = p + (cp == ' ' ? 1 : 0);
  if (q < end && other(c[q])) {
    q = run(c, q, end, other);
    return run(c, q, end, [](uint32_t x) { return crlf(x) || x == '/'; }) - p;
  }
  return whitespace_tail(c, p, end);
}

// [\p{P}\$\+<=>\^~\|]+  (llama.cpp "default", first pass); Falcon adds '`'.
template <bool kBacktick>
size_t match_punct_run(const uint32_t* c, size_t p, size_t end) {
  auto pred = [](uint32_t cp) {
    return punct(cp) || cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' || cp == '^' || cp == '~' ||
           cp == '|' || (kBacktick && cp == '`');
  };
  return run(c, p, end, pred) - p;
}

size_t match_numbers(const uint32_t* c, size_t p, size_t end) { return run(c, p, end, number) - p; }  // \p{N}+
size_t match_number1(const uint32_t* c, size_t p, size_t end) { return number(c[p]) ? 1 : 0; }        // \p{N}
size_t match_number3(const uint32_t* c, size_t p, size_t end) {                                       // \p{N}{1,3}
  size_t q = p;
  while (q < end && q - p < 3 && number(c[q])) ++q;
  return q - p;
}
size_t match_3digits(const uint32_t* c, size_t p, size_t end) {  // [0-9][0-9][0-9]
  if (p + 3 > end) return 0;
  for (size_t k = 0; k < 3; ++k)
    if (c[p + k] < '0' || c[p + k] > '9') return 0;
  return 3;
}
size_t match_crlf1(const uint32_t* c, size_t p, size_t end) { return crlf(c[p]) ? 1 : 0; }  // [\r\n]

// \s?X+ : an optional whitespace, then a run of X.
template <typename Pred>
size_t ws_opt_run(const uint32_t* c, size_t p, size_t end, Pred pred) {
  if (ws(c[p]) && p + 1 < end && pred(c[p + 1])) return run(c, p + 1, end, pred) - p;
  if (pred(c[p])) return run(c, p, end, pred) - p;
  return 0;
}

// The character classes of the DeepSeek regexes (code point ranges as written there).
constexpr Range kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
constexpr Range kDeepseekPunct[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
                                    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}};
constexpr Range kDeepseekCjk[] = {{0x4E00, 0x9FA5}, {0x800, 0x4E00}, {0xAC00, 0xD7FF}};
constexpr Range kDeepseek3Cjk[] = {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};

size_t match_ds_letters(const uint32_t* c, size_t p, size_t end) {  // \s?[A-Za-zµÀ-Ö...]+
  return ws_opt_run(c, p, end, [](uint32_t cp) { return in_ranges(kDeepseekLetters, cp); });
}
size_t match_ds_punct(const uint32_t* c, size_t p, size_t end) {  // \s?[!-/:-~！-／：-～‘-‟　-。]+
  return ws_opt_run(c, p, end, [](uint32_t cp) { return in_ranges(kDeepseekPunct, cp); });
}
size_t match_ws_at_end(const uint32_t* c, size_t p, size_t end) {  // \s+$
  return run(c, p, end, ws) == end && ws(c[p]) ? end - p : 0;
}
size_t match_ds_cjk(const uint32_t* c, size_t p, size_t end) {  // [一-龥ࠀ-一가-퟿]+
  return run(c, p, end, [](uint32_t cp) { return in_ranges(kDeepseekCjk, cp); }) - p;
}
size_t match_ds3_cjk(const uint32_t* c, size_t p, size_t end) {  // [一-龥぀-ゟ゠-ヿ]+
  return run(c, p, end, [](uint32_t cp) { return in_ranges(kDeepseek3Cjk, cp); }) - p;
}
size_t match_ws_letters(const uint32_t* c, size_t p, size_t end) { return ws_opt_run(c, p, end, letter); }  // \s?\p{L}+
size_t match_ws_puncts(const uint32_t* c, size_t p, size_t end) { return ws_opt_run(c, p, end, punct); }    // \s?\p{P}+

// DeepSeek-V3:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
// ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek3(const uint32_t* c, size_t p, size_t end) {
  auto ascii_alpha = [](uint32_t cp) { return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z'); };
  auto ascii_punct = [](uint32_t cp) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  };
  auto letter_mark = [](uint32_t cp) { return (flags(cp) & (unicode::kLetter | unicode::kMark)) != 0; };
  auto punct_sym = [](uint32_t cp) { return (flags(cp) & (unicode::kPunct | unicode::kSymbol)) != 0; };
  const uint32_t cp = c[p];
  if (ascii_punct(cp) && p + 1 < end && ascii_alpha(c[p + 1])) return run(c, p + 1, end, ascii_alpha) - p;
  bool opt = !crlf(cp) && !(flags(cp) & (unicode::kLetter | unicode::kPunct | unicode::kSymbol));
  if (opt && p + 1 < end && letter_mark(c[p + 1])) return run(c, p + 1, end, letter_mark) - p;
  if (letter_mark(cp)) return run(c, p, end, letter_mark) - p;
  size_t q = p + (cp == ' ' ? 1 : 0);
  if (q < end && punct_sym(c[q])) {
    q = run(c, q, end, punct_sym);
    return run(c, q, end, crlf) - p;
  }
  return whitespace_tail(c, p, end);
}

// One regex pass: every piece is split into matches and the gaps between them.
void split_pass(const uint32_t* c, Matcher m, std::vector<size_t>* pieces) {
  std::vector<size_t> out;
  out.reserve(pieces->size() * 2);
  size_t start = 0;
  for (size_t len : *pieces) {
    const size_t end = start + len;
    size_t gap = start;
    size_t p = start;
    while (p < end) {
      size_t n = m(c, p, end);
      if (n == 0) {
        ++p;
        continue;
      }
      if (p > gap) out.push_back(p - gap);
      out.push_back(n);
      p += n;
      gap = p;
    }
    if (end > gap) out.push_back(end - gap);
    start = end;
  }
  pieces->swap(out);
}

struct Spec {
  PreTokenizer type;
  const char* name;
  Matcher passes[6];
};

const Spec kSpecs[] = {
    {PreTokenizer::Default, "default", {match_punct_run<false>, match_gpt2, match_numbers, match_3digits}},
    {PreTokenizer::Gpt2, "gpt2", {match_gpt2}},
    {PreTokenizer::Llama3, "llama3", {match_llama3<3>}},
    {PreTokenizer::Qwen2, "qwen2", {match_llama3<1>}},
    {PreTokenizer::DeepseekLlm,
     "deepseek-llm",
     {match_crlf1, match_ds_letters, match_ds_punct, match_ws_at_end, match_ds_cjk, match_numbers}},
    {PreTokenizer::DeepseekCoder,
     "deepseek-coder",
     {match_crlf1, match_ws_letters, match_ws_puncts, match_ds_cjk, match_number1}},
    {PreTokenizer::Deepseek3, "deepseek-v3", {match_number3, match_ds3_cjk, match_deepseek3}},
    {PreTokenizer::Starcoder, "starcoder", {match_number1, match_gpt2}},
    {PreTokenizer::Falcon, "falcon", {match_punct_run<true>, match_gpt2, match_3digits}},
    {PreTokenizer::Gpt4o, "gpt-4o", {match_gpt4o}},
};

const Spec& spec(PreTokenizer p) {
  for (const Spec& s : kSpecs)
    if (s.type == p) return s;
  return kSpecs[1];
}

struct NameMap {
  const char* name;
  PreTokenizer type;
};
// tokenizer.ggml.pre values (llama.cpp's llama_vocab::load) for the regex families above.
const NameMap kNames[] = {
    {"default", PreTokenizer::Default},
    {"gpt-2", PreTokenizer::Gpt2},
    {"gpt2", PreTokenizer::Gpt2},
    {"phi-2", PreTokenizer::Gpt2},
    {"olmo", PreTokenizer::Gpt2},
    {"mpt", PreTokenizer::Gpt2},
    {"jais", PreTokenizer::Gpt2},
    {"trillion", PreTokenizer::Gpt2},
    {"jina-es", PreTokenizer::Gpt2},
    {"jina-de", PreTokenizer::Gpt2},
    {"jina-v2-es", PreTokenizer::Gpt2},
    {"jina-v2-de", PreTokenizer::Gpt2},
    {"gigachat", PreTokenizer::Gpt2},
    {"roberta-bpe", PreTokenizer::Gpt2},
    {"exaone4", PreTokenizer::Gpt2},
    {"llama3", PreTokenizer::Llama3},
    {"llama-v3", PreTokenizer::Llama3},
    {"llama-bpe", PreTokenizer::Llama3},
    {"falcon3", PreTokenizer::Llama3},
    {"pixtral", PreTokenizer::Llama3},
    {"dbrx", PreTokenizer::Llama3},
    {"smaug-bpe", PreTokenizer::Llama3},
    {"glm4", PreTokenizer::Llama3},  // GLM-4 (and the GLM-4.x-Flash deepseek2 files): llama3's regex
    {"chatglm-bpe", PreTokenizer::Llama3},
    {"qwen2", PreTokenizer::Qwen2},
    {"deepseek-r1-qwen", PreTokenizer::Qwen2},
    {"stablelm2", PreTokenizer::Qwen2},
    {"megrez", PreTokenizer::Qwen2},
    {"hunyuan", PreTokenizer::Qwen2},
    {"deepseek-llm", PreTokenizer::DeepseekLlm},
    {"deepseek-coder", PreTokenizer::DeepseekCoder},
    {"deepseek-v3", PreTokenizer::Deepseek3},
    {"starcoder", PreTokenizer::Starcoder},
    {"refact", PreTokenizer::Starcoder},
    {"command-r", PreTokenizer::Starcoder},
    {"smollm", PreTokenizer::Starcoder},
    {"codeshell", PreTokenizer::Starcoder},
    {"exaone", PreTokenizer::Starcoder},
    {"minerva-7b", PreTokenizer::Starcoder},
    {"falcon", PreTokenizer::Falcon},
    {"gpt-4o", PreTokenizer::Gpt4o},
    {"llama4", PreTokenizer::Gpt4o},
    {"minimax-m2", PreTokenizer::Gpt4o},
};

}  // namespace

bool pre_tokenizer_from_name(const std::string& name, PreTokenizer* out) {
  for (const NameMap& n : kNames) {
    if (name == n.name) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

const char* pre_tokenizer_name(PreTokenizer p) { return spec(p).name; }

bool pre_name_is_llama3(const std::string& name) {
  return name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "falcon3" || name == "pixtral";
}

std::vector<size_t> pretokenize(const std::vector<uint32_t>& cpts, PreTokenizer p) {
  std::vector<size_t> pieces;
  if (cpts.empty()) return pieces;
  pieces.push_back(cpts.size());
  for (Matcher m : spec(p).passes) {
    if (!m) break;
    split_pass(cpts.data(), m, &pieces);
  }
  return pieces;
}

std::vector<std::string> pretokenize_utf8(const std::string& text, PreTokenizer p) {
  std::vector<uint32_t> cpts = unicode::decode_utf8(text);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t len : pretokenize(cpts, p)) {
    std::string s;
    for (size_t k = start; k < start + len; ++k) unicode::append_utf8(&s, cpts[k]);
    out.push_back(std::move(s));
    start += len;
  }
  return out;
}

}  // namespace moelite
