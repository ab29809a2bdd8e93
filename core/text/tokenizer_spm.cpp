// SentencePiece-style tokenization as llama.cpp's llm_tokenizer_spm: start from UTF-8 characters,
// repeatedly merge the adjacent pair whose concatenation is the highest-scoring vocabulary entry
// (ties: leftmost), then emit each final symbol, falling back to <0xNN> byte tokens for symbols
// that are not tokens.
//
// Two equivalences keep this fast without changing results:
//  * llama.cpp re-splits a non-token final symbol along the merge that built it (rev_merge). A
//    merged symbol is always a token, and no pair of symbols can spell a single unmerged symbol
//    (the first symbol of such a pair would have to be cut short by the end of the text), so
//    that lookup never succeeds: non-token symbols go straight to bytes.
//  * When no vocabulary entry has a '▁' preceded by anything but '▁' (true of Llama/Mistral
//    vocabularies; checked at load), no merge can cross the start of a word ("x|▁"), so each word
//    is merged on its own: the same merges in the same order, with small queues.
#include <algorithm>

#include "core/support/unicode.h"
#include "core/text/vocab.h"

namespace moelite {
namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // '▁'

struct Symbol {
  int prev;
  int next;
  size_t off;  // into the text
  size_t n;    // bytes; 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Heap order: highest score on top, ties to the leftmost pair.
inline bool lower_priority(const Bigram& l, const Bigram& r) {
  return l.score < r.score || (l.score == r.score && l.left > r.left);
}

bool is_space_symbol(std::string_view text, const Symbol& s) { return s.n == 3 && text.compare(s.off, 3, kSpace) == 0; }
bool ends_with_space(std::string_view text, const Symbol& s) {
  return s.n >= 3 && text.compare(s.off + s.n - 3, 3, kSpace) == 0;
}

}  // namespace

bool spm_words_are_independent(const Vocab& v) {
  for (const std::string& t : v.text) {
    for (size_t k = t.find(kSpace, 1); k != std::string::npos; k = t.find(kSpace, k + 1)) {
      if (k < 3 || t.compare(k - 3, 3, kSpace) != 0) return false;
    }
  }
  return true;
}

void spm_tokenize(const Vocab& v, const int32_t byte_tokens[256], bool by_word, std::string_view text,
                  std::vector<int32_t>* out) {
  if (text.empty()) return;
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  std::vector<size_t> chunk_starts{0};
  for (size_t off = 0; off < text.size();) {
    size_t len = std::min(unicode::utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
    Symbol s{static_cast<int>(symbols.size()) - 1, static_cast<int>(symbols.size()) + 1, off, len};
    if (by_word && !symbols.empty() && is_space_symbol(text, s) && !ends_with_space(text, symbols.back()))
      chunk_starts.push_back(symbols.size());
    symbols.push_back(s);
    off += len;
  }
  chunk_starts.push_back(symbols.size());

  std::vector<Bigram> heap;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string_view t = text.substr(symbols[left].off, symbols[left].n + symbols[right].n);
    int32_t id = v.find(t);
    if (id < 0) return;
    heap.push_back({left, right, v.score[id], t.size()});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };

  for (size_t c = 0; c + 1 < chunk_starts.size(); ++c) {
    const int first = static_cast<int>(chunk_starts[c]);
    const int last = static_cast<int>(chunk_starts[c + 1]) - 1;
    symbols[first].prev = -1;
    symbols[last].next = -1;
    heap.clear();
    for (int i = first + 1; i <= last; ++i) try_add(i - 1, i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), lower_priority);
      Bigram b = heap.back();
      heap.pop_back();
      Symbol& l = symbols[b.left];
      Symbol& r = symbols[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // outdated
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = first; i != -1; i = symbols[i].next) {
      std::string_view t = text.substr(symbols[i].off, symbols[i].n);
      int32_t id = v.find(t);
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
      for (char ch : t) {
        int32_t bt = byte_tokens[static_cast<uint8_t>(ch)];
        if (bt >= 0) out->push_back(bt);
      }
    }
  }
}

}  // namespace moelite
