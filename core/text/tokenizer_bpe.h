// Byte-level BPE (llama.cpp llm_tokenizer_bpe): pre-tokenize, map each byte of a piece to its
// GPT-2 code point, then merge adjacent symbols by tokenizer.ggml.merges rank (lowest first,
// ties leftmost).
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "core/gguf/reader.h"
#include "core/text/pretokenize.h"
#include "core/text/vocab.h"

namespace moelite {

class BpeModel {
 public:
  // Reads tokenizer.ggml.merges ("left right" per line; the rank is the line number). Merge
  // parts that are not vocabulary entries are kept (as llama.cpp keeps them) under ids past the
  // vocabulary; lines without a separating space are skipped.
  Status load(const gguf::Reader& gguf, const Vocab& v);

  void tokenize(const Vocab& v, PreTokenizer pre, bool ignore_merges, const std::string& text,
                std::vector<int32_t>* out) const;

  size_t n_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // interned id of left+right
  };
  int32_t intern(const std::string& s, int32_t n_vocab);
  int32_t lookup(std::string_view s) const {
    auto it = ids_.find(s);
    return it == ids_.end() ? -1 : it->second;
  }
  void tokenize_word(const Vocab& v, const std::string& word, std::vector<int32_t>* out) const;

  std::unordered_map<std::string_view, int32_t> ids_;  // vocabulary texts and extra merge strings
  std::deque<std::string> extra_;                      // storage of strings outside the vocabulary
  std::unordered_map<uint64_t, Merge> merges_;         // (left id << 32 | right id) -> merge
  int32_t single_byte_token_[256];
};

}  // namespace moelite
