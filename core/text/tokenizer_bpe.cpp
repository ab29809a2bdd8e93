#include "core/text/tokenizer_bpe.h"

#include <algorithm>
#include <queue>

#include "core/support/unicode.h"

namespace moelite {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t off;  // into the word
  size_t n;    // bytes; 0 once merged away
  int32_t id;  // interned id of the symbol's text, -1 when it is no vocabulary/merge string
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  int32_t left_id;
  int32_t right_id;
  int32_t result;
};

struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

int32_t BpeModel::intern(const std::string& s, int32_t n_vocab) {
  int32_t id = lookup(s);
  if (id >= 0) return id;
  extra_.push_back(s);
  id = n_vocab + static_cast<int32_t>(extra_.size()) - 1;
  ids_.emplace(std::string_view(extra_.back()), id);
  return id;
}

Status BpeModel::load(const gguf::Reader& g, const Vocab& v) {
  const char* key = "tokenizer.ggml.merges";
  const gguf::Value* merges = g.find(key);
  if (!merges) return fail(MOELITE_ERR_MISSING_METADATA, "tokenizer: %s is missing (needed by a gpt2 tokenizer)", key);
  if (merges->type != gguf::ValueType::ARRAY || merges->elem_type != gguf::ValueType::STRING)
    return fail(MOELITE_ERR_MISSING_METADATA, "tokenizer: %s is not an array of strings", key);
  if (merges->strings.size() > static_cast<size_t>(MOELITE_MAX_VOCAB))
    return fail(MOELITE_ERR_BAD_METADATA, "tokenizer: %s has %zu entries, above the limit of %d", key,
                merges->strings.size(), MOELITE_MAX_VOCAB);

  const int32_t n = v.n();
  ids_.reserve(n + merges->strings.size() / 8);
  for (int32_t i = 0; i < n; ++i) ids_.emplace(std::string_view(v.text[i]), i);
  for (int b = 0; b < 256; ++b) single_byte_token_[b] = v.find(std::string(1, static_cast<char>(b)));

  merges_.reserve(merges->strings.size());
  size_t skipped = 0, outside = 0;
  for (size_t i = 0; i < merges->strings.size(); ++i) {
    const std::string& line = merges->strings[i];
    size_t pos = line.size() > 1 ? line.find(' ', 1) : std::string::npos;
    if (pos == std::string::npos || pos + 1 >= line.size()) {
      ++skipped;
      continue;
    }
    std::string left = line.substr(0, pos), right = line.substr(pos + 1);
    if (v.find(left) < 0 || v.find(right) < 0 || v.find(left + right) < 0) ++outside;
    int32_t l = intern(left, n), r = intern(right, n), res = intern(left + right, n);
    merges_.emplace(pair_key(l, r), Merge{static_cast<int32_t>(i), res});  // first line wins
  }
  if (skipped) log_msg(MOELITE_LOG_WARN, "tokenizer: skipped %zu malformed merge lines", skipped);
  if (outside) log_msg(MOELITE_LOG_DEBUG, "tokenizer: %zu merges name strings outside the vocabulary", outside);
  return MOELITE_OK;
}

void BpeModel::tokenize_word(const Vocab& v, const std::string& word, std::vector<int32_t>* out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t off = 0; off < word.size();) {
    size_t len = std::min(unicode::utf8_len(static_cast<uint8_t>(word[off])), word.size() - off);
    int idx = static_cast<int>(symbols.size());
    symbols.push_back(
        {idx - 1, off + len == word.size() ? -1 : idx + 1, off, len, lookup(std::string_view(word.data() + off, len))});
    off += len;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    int32_t a = symbols[left].id, b = symbols[right].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    queue.push({left, right, it->second.rank, a, b, it->second.result});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add(i - 1, i);

  while (!queue.empty()) {
    Bigram bg = queue.top();
    queue.pop();
    Symbol& l = symbols[bg.left];
    Symbol& r = symbols[bg.right];
    // Outdated when either side changed since the pair was queued.
    if (l.n == 0 || r.n == 0 || l.id != bg.left_id || r.id != bg.right_id) continue;
    l.n += r.n;
    l.id = bg.result;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }

  const int32_t n_vocab = v.n();
  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0 && s.id < n_vocab) {
      out->push_back(s.id);
      continue;
    }
    // Not a token: llama.cpp emits the tokens of the symbol's single bytes, where such exist.
    for (size_t k = 0; k < s.n; ++k) {
      int32_t t = single_byte_token_[static_cast<uint8_t>(word[s.off + k])];
      if (t >= 0) out->push_back(t);
    }
  }
}

void BpeModel::tokenize(const Vocab& v, PreTokenizer pre, bool ignore_merges, const std::string& text,
                        std::vector<int32_t>* out) const {
  const std::vector<uint32_t> cpts = unicode::decode_utf8(text);
  const std::vector<size_t> pieces = pretokenize(cpts, pre);
  std::string word, utf8;
  size_t start = 0;
  for (size_t len : pieces) {
    word.clear();
    for (size_t k = start; k < start + len; ++k) {
      utf8.clear();
      unicode::append_utf8(&utf8, cpts[k]);
      for (char c : utf8) word += unicode::byte_to_utf8(static_cast<uint8_t>(c));
    }
    start += len;
    if (ignore_merges) {
      int32_t id = v.find(word);
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
    }
    tokenize_word(v, word, out);
  }
}

}  // namespace moelite
