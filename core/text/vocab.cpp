#include "core/text/vocab.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/support/unicode.h"

namespace moelite {
namespace {

constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kScores = "tokenizer.ggml.scores";
constexpr const char* kTypes = "tokenizer.ggml.token_type";

TokenAttr attr_from_type(int64_t t) {
  switch (t) {
    case 1: return TokenAttr::Normal;
    case 2: return TokenAttr::Unknown;
    case 3: return TokenAttr::Control;
    case 4: return TokenAttr::UserDefined;
    case 6: return TokenAttr::Byte;
    default: return TokenAttr::Unused;  // 5, and undefined types: never rendered
  }
}

// Numeric array element k as float/int, with fast paths for the usual element types.
bool array_float(const gguf::Value& a, uint64_t k, float* out) {
  if (a.elem_type == gguf::ValueType::FLOAT32 && (k + 1) * 4 <= a.raw.size()) {
    std::memcpy(out, a.raw.data() + k * 4, 4);
    return true;
  }
  double d;
  if (!a.array_double(k, &d)) return false;
  *out = static_cast<float>(d);
  return true;
}
bool array_int(const gguf::Value& a, uint64_t k, int64_t* out) {
  if (a.elem_type == gguf::ValueType::INT32 && (k + 1) * 4 <= a.raw.size()) {
    int32_t x;
    std::memcpy(&x, a.raw.data() + k * 4, 4);
    *out = x;
    return true;
  }
  return a.array_int(k, out);
}

// Token texts llama.cpp treats as end of turn / end of generation.
const char* const kEotTexts[] = {"<|eot_id|>",
                                 "<|im_end|>",
                                 "<|end|>",
                                 "<end_of_turn>",
                                 "<|endoftext|>",
                                 "<|end_of_text|>",
                                 "<EOT>",
                                 "_<EOT>",
                                 "[EOT]",
                                 "<\xEF\xBD\x9C"
                                 "end\xE2\x96\x81"
                                 "of\xE2\x96\x81"
                                 "sentence\xEF\xBD\x9C>",
                                 "<end_of_utterance>"};
const char* const kEogTexts[] = {"<|eot_id|>",
                                 "<|im_end|>",
                                 "<|end|>",
                                 "<|return|>",
                                 "<|call|>",
                                 "<|flush|>",
                                 "<|calls|>",
                                 "<end_of_turn>",
                                 "<|endoftext|>",
                                 "</s>",
                                 "<|eom_id|>",
                                 "<EOT>",
                                 "_<EOT>",
                                 "[EOT]",
                                 "[EOS]",
                                 "<|end_of_text|>",
                                 "<end_of_utterance>",
                                 "<eos>",
                                 "<\xEF\xBD\x9C"
                                 "end\xE2\x96\x81"
                                 "of\xE2\x96\x81"
                                 "sentence\xEF\xBD\x9C>"};

template <size_t N>
bool in_list(const char* const (&list)[N], const std::string& s) {
  for (const char* x : list)
    if (s == x) return true;
  return false;
}

void read_special_id(const gguf::Reader& g, const char* key, int32_t n, int32_t* id) {
  if (*id >= n) *id = -1;  // a default outside the vocabulary is no token
  int64_t v;
  if (!g.find(key)) return;
  if (!g.get_int(key, &v)) {
    log_msg(MOELITE_LOG_WARN, "tokenizer: %s is not an integer; ignored", key);
    return;
  }
  if (v < 0 || v >= n) {
    log_msg(MOELITE_LOG_WARN, "tokenizer: %s = %lld is outside the vocabulary (%d tokens); ignored", key,
            static_cast<long long>(v), n);
    return;
  }
  *id = static_cast<int32_t>(v);
}

std::string decode_bpe_text(const std::string& text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    uint32_t cp = unicode::decode_one(text.data(), text.size(), &pos);
    int b = cp == unicode::kReplacement ? -1 : unicode::cp_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text, start, pos - start);  // not a byte-level character: keep its bytes
    }
  }
  return out;
}

int parse_byte_token(const std::string& t) {  // "<0xHH>" -> HH, else -1
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    char c = t[k];
    int d = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                     : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

Status load_vocab(const gguf::Reader& g, VocabKind kind, bool add_bos_default, Vocab* v) {
  v->kind = kind;
  const gguf::Value* tokens = g.find(kTokens);
  if (!tokens) return fail(MOELITE_ERR_MISSING_METADATA, "tokenizer: %s is missing", kTokens);
  if (tokens->type != gguf::ValueType::ARRAY || tokens->elem_type != gguf::ValueType::STRING)
    return fail(MOELITE_ERR_MISSING_METADATA, "tokenizer: %s is not an array of strings", kTokens);
  const size_t n = tokens->strings.size();
  if (n == 0) return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s is empty", kTokens);
  if (n > static_cast<size_t>(MOELITE_MAX_VOCAB))
    return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s has %zu tokens, above the limit of %d", kTokens, n,
                MOELITE_MAX_VOCAB);

  const gguf::Value* scores = g.find(kScores);
  if (scores) {
    bool numeric = scores->type == gguf::ValueType::ARRAY &&
                   (scores->elem_type == gguf::ValueType::FLOAT32 || scores->elem_type == gguf::ValueType::INT32);
    if (!numeric) return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s must be an array of float32 or int32", kScores);
    if (scores->count < n)
      return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s has %llu entries for %zu tokens", kScores,
                  static_cast<unsigned long long>(scores->count), n);
  }
  const gguf::Value* types = g.find(kTypes);
  if (types) {
    bool integer = types->type == gguf::ValueType::ARRAY && types->elem_type != gguf::ValueType::STRING &&
                   types->elem_type != gguf::ValueType::ARRAY && types->elem_type != gguf::ValueType::FLOAT32 &&
                   types->elem_type != gguf::ValueType::FLOAT64;
    if (!integer) return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s must be an integer array", kTypes);
    if (types->count < n)
      return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s has %llu entries for %zu tokens", kTypes,
                  static_cast<unsigned long long>(types->count), n);
  }

  v->text.resize(n);
  v->score.assign(n, 0.0f);
  v->attr.assign(n, TokenAttr::Normal);
  for (size_t i = 0; i < n; ++i) {
    v->text[i] = tokens->strings[i];
    if (v->text[i].empty()) {
      log_msg(MOELITE_LOG_WARN, "tokenizer: empty token at index %zu", i);
      v->text[i] = "[EMPTY_" + std::to_string(i) + "]";
    }
    if (scores && !array_float(*scores, i, &v->score[i]))
      return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s[%zu] is unreadable", kScores, i);
    int64_t t = 1;
    if (types && !array_int(*types, i, &t))
      return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s[%zu] is unreadable", kTypes, i);
    v->attr[i] = attr_from_type(t);
  }
  // The map holds views into v->text, which is not resized from here on.
  v->to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto ins = v->to_id.emplace(std::string_view(v->text[i]), static_cast<int32_t>(i));
    if (!ins.second)
      return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: duplicate token '%s' (ids %d and %zu)", v->text[i].c_str(),
                  ins.first->second, i);
  }

  const int32_t nt = v->n();
  if (kind == VocabKind::Spm) {
    v->bos = 1;
    v->eos = 2;
    v->unk = 0;
  }
  read_special_id(g, "tokenizer.ggml.bos_token_id", nt, &v->bos);
  read_special_id(g, "tokenizer.ggml.eos_token_id", nt, &v->eos);
  read_special_id(g, "tokenizer.ggml.unknown_token_id", nt, &v->unk);
  read_special_id(g, "tokenizer.ggml.padding_token_id", nt, &v->pad);
  read_special_id(g, "tokenizer.ggml.eot_token_id", nt, &v->eot);
  read_special_id(g, "tokenizer.ggml.eom_token_id", nt, &v->eom);

  v->add_bos = add_bos_default;
  v->add_eos = false;
  v->add_space_prefix = kind == VocabKind::Spm;
  g.get_bool("tokenizer.ggml.add_bos_token", &v->add_bos);
  g.get_bool("tokenizer.ggml.add_eos_token", &v->add_eos);
  g.get_bool("tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
  if (v->add_bos && v->bos < 0) {
    log_msg(MOELITE_LOG_WARN, "tokenizer: add_bos_token is set but there is no BOS token; not adding one");
    v->add_bos = false;
  }
  if (v->add_eos && v->eos < 0) {
    log_msg(MOELITE_LOG_WARN, "tokenizer: add_eos_token is set but there is no EOS token; not adding one");
    v->add_eos = false;
  }

  // End-of-turn / end-of-generation tokens by text, as llama.cpp's heuristics (such tokens become
  // control tokens).
  for (int32_t id = 0; id < nt; ++id) {
    if (v->eot < 0 && in_list(kEotTexts, v->text[id])) v->eot = id;
    if (v->eom < 0 && v->text[id] == "<|eom_id|>") v->eom = id;
  }
  v->eog.assign(n, 0);
  int32_t end_id = -1;
  bool has_return = false, has_call = false, has_flush = false;
  for (int32_t id = 0; id < nt; ++id) {
    const std::string& t = v->text[id];
    if (!in_list(kEogTexts, t)) continue;
    v->eog[id] = 1;
    if (v->attr[id] != TokenAttr::Control) {
      log_msg(MOELITE_LOG_DEBUG, "tokenizer: token %d '%s' looks like a control token; treated as one", id, t.c_str());
      v->attr[id] = TokenAttr::Control;
    }
    if (t == "<|end|>") end_id = id;
    if (t == "<|return|>") has_return = true;
    if (t == "<|call|>" || t == "<|calls|>") has_call = true;
    if (t == "<|flush|>") has_flush = true;
  }
  for (int32_t id : {v->eot, v->eom}) {
    if (id >= 0 && v->attr[id] != TokenAttr::Control) v->attr[id] = TokenAttr::Control;
  }
  // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
  if (end_id >= 0 && has_call && (has_return || has_flush)) {
    v->eog[end_id] = 0;
    v->attr[end_id] = TokenAttr::UserDefined;
  }
  for (int32_t id : {v->eos, v->eot, v->eom})
    if (id >= 0) v->eog[id] = 1;
  return MOELITE_OK;
}

void finish_vocab(Vocab* v) {
  const int32_t nt = v->n();
  for (int32_t id = 0; id < nt; ++id) {
    TokenAttr a = v->attr[id];
    if (a == TokenAttr::Control || a == TokenAttr::UserDefined || a == TokenAttr::Unknown)
      v->special_cache.push_back(id);
  }
  std::stable_sort(v->special_cache.begin(), v->special_cache.end(),
                   [&](int32_t a, int32_t b) { return v->text[a].size() > v->text[b].size(); });
  for (int32_t id : v->special_cache) {
    const std::string& t = v->text[id];
    auto& lens = v->special_lengths[static_cast<uint8_t>(t[0])];
    if (std::find(lens.begin(), lens.end(), t.size()) == lens.end()) lens.push_back(static_cast<uint32_t>(t.size()));
  }

  v->piece.resize(nt);
  for (int32_t id = 0; id < nt; ++id) {
    const std::string& t = v->text[id];
    std::string& p = v->piece[id];
    switch (v->attr[id]) {
      case TokenAttr::Control:
      case TokenAttr::Unknown:
      case TokenAttr::UserDefined: p = t; break;
      case TokenAttr::Normal:
        if (v->kind == VocabKind::Spm) {
          // '▁' (U+2581) stands for a space.
          for (size_t k = 0; k < t.size();) {
            if (t.compare(k, 3, "\xE2\x96\x81") == 0) {
              p.push_back(' ');
              k += 3;
            } else {
              p.push_back(t[k++]);
            }
          }
        } else {
          p = decode_bpe_text(t);
        }
        break;
      case TokenAttr::Byte: {
        int b = parse_byte_token(t);
        if (b >= 0) {
          p.assign(1, static_cast<char>(b));
        } else {
          p = v->kind == VocabKind::Bpe ? decode_bpe_text(t) : t;
        }
        break;
      }
      case TokenAttr::Unused: break;
    }
  }
}

namespace {
// True when [off, off + len) lies inside one of the sorted, disjoint `ranges`.
bool inside_ranges(const ByteRanges& ranges, size_t off, size_t len) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), off,
                             [](size_t o, const std::pair<size_t, size_t>& r) { return o < r.first; });
  if (it == ranges.begin()) return false;
  --it;
  return off >= it->first && off + len <= it->second;
}
}  // namespace

std::vector<Fragment> partition_special(const Vocab& v, const std::string& text, bool parse_special,
                                        const ByteRanges* trusted) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  if (v.special_cache.empty()) return frags;
  if (trusted && trusted->empty()) return frags;
  auto allowed = [&](size_t off, size_t len) { return !trusted || inside_ranges(*trusted, off, len); };

  // Which special tokens occur at all (one pass over the text, a hash probe per candidate length).
  std::vector<int32_t> found;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& lens = v.special_lengths[static_cast<uint8_t>(text[i])];
    for (uint32_t len : lens) {
      if (len > text.size() - i) continue;
      int32_t id = v.find(std::string_view(text.data() + i, len));
      if (id < 0) continue;
      const TokenAttr a = v.attr[id];
      // The text may belong to an ordinary token of the same length: only special ones split.
      // Trusted text splits them only inside its trusted ranges; other text always at user-defined
      // tokens, and at control and unknown ones where special parsing is on.
      const bool special = a == TokenAttr::UserDefined || a == TokenAttr::Control || a == TokenAttr::Unknown;
      const bool eligible =
          special && (trusted ? allowed(i, len) : a == TokenAttr::UserDefined || parse_special);
      if (eligible) found.push_back(id);
    }
  }
  if (found.empty()) return frags;
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  // Same order as the special cache: longest first, ties by id.
  std::stable_sort(found.begin(), found.end(),
                   [&](int32_t a, int32_t b) { return v.text[a].size() > v.text[b].size(); });

  std::vector<Fragment> next;
  for (int32_t id : found) {
    const std::string& st = v.text[id];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.off + f.len;
      size_t base = f.off, from = f.off;
      std::string_view hay(text.data(), end);
      for (;;) {
        size_t m = hay.find(st, from);
        if (m == std::string_view::npos) break;
        if (!allowed(m, st.size())) {  // untrusted text: stays plain, look further on
          from = m + 1;
          continue;
        }
        if (m > base) next.push_back({-1, base, m - base});
        next.push_back({id, m, st.size()});
        base = from = m + st.size();
      }
      if (base < end) next.push_back({-1, base, end - base});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace moelite
