// SentencePiece-style tokenization as llama.cpp's llm_tokenizer_spm: start from UTF-8 characters,
// repeatedly merge the adjacent pair whose concatenation is the highest-scoring vocabulary entry
// (ties: leftmost), then emit each final symbol, re-splitting symbols that are not tokens along
// the merges that built them and falling back to <0xNN> byte tokens.
#include <queue>
#include <unordered_map>

#include "core/tokenizer/unicode.h"
#include "core/tokenizer/vocab.h"

namespace moelite {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t off;  // into the session text
  size_t n;    // bytes; 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

class SpmSession {
 public:
  SpmSession(const Vocab& v, const int32_t* byte_tokens, std::string_view text)
      : v_(v), byte_tokens_(byte_tokens), text_(text) {}

  void run(std::vector<int32_t>* out) {
    size_t off = 0;
    int index = 0;
    while (off < text_.size()) {
      size_t len = std::min(unicode::utf8_len(static_cast<uint8_t>(text_[off])), text_.size() - off);
      Symbol s;
      s.off = off;
      s.n = len;
      s.prev = index - 1;
      off += len;
      s.next = off == text_.size() ? -1 : index + 1;
      ++index;
      symbols_.push_back(s);
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add(i - 1, i);

    while (!queue_.empty()) {
      Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[b.left];
      Symbol& r = symbols_[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // outdated
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next)
      resegment(text_.substr(symbols_[i].off, symbols_[i].n), out);
  }

 private:
  void try_add(int left, int right) {
    if (left < 0 || right < 0) return;
    std::string_view t = text_.substr(symbols_[left].off, symbols_[left].n + symbols_[right].n);
    int32_t id = v_.find(t);
    if (id < 0) return;
    queue_.push({left, right, v_.score[id], t.size()});
    rev_merge_[t] = symbols_[left].n;
  }

  void resegment(std::string_view t, std::vector<int32_t>* out) {
    int32_t id = v_.find(t);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
    auto it = rev_merge_.find(t);
    if (it == rev_merge_.end() || it->second == 0 || it->second >= t.size()) {
      for (char c : t) {
        int32_t b = byte_tokens_[static_cast<uint8_t>(c)];
        if (b >= 0) out->push_back(b);
      }
      return;
    }
    size_t left = it->second;
    resegment(t.substr(0, left), out);
    resegment(t.substr(left), out);
  }

  const Vocab& v_;
  const int32_t* byte_tokens_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::unordered_map<std::string_view, size_t> rev_merge_;  // merged text -> length of its left part
};

}  // namespace

void spm_tokenize(const Vocab& v, const int32_t byte_tokens[256], std::string_view text, std::vector<int32_t>* out) {
  if (text.empty()) return;
  SpmSession(v, byte_tokens, text).run(out);
}

}  // namespace moelite
