// The vocabulary shared by both tokenizer kinds: token strings, scores, attributes, special ids,
// end-of-generation set, special-token matching and the token -> bytes cache.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "core/gguf/reader.h"
#include "core/text/tokenizer.h"

namespace moelite {

enum class VocabKind { Spm, Bpe };

struct Vocab {
  VocabKind kind = VocabKind::Spm;
  std::vector<std::string> text;  // as stored (empty strings replaced by "[EMPTY_<id>]")
  std::vector<float> score;
  std::vector<TokenAttr> attr;
  std::unordered_map<std::string_view, int32_t> to_id;  // views into `text` (never resized after load)

  int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;

  std::vector<uint8_t> eog;                    // per token: ends generation
  std::vector<int32_t> special_cache;          // control / user-defined / unknown ids, longest text first
  std::vector<uint32_t> special_lengths[256];  // per first byte: distinct special text lengths
  std::vector<std::string> piece;              // bytes of each token (as token_to_piece with special=true)

  int32_t n() const { return static_cast<int32_t>(text.size()); }
  int32_t find(std::string_view s) const {
    auto it = to_id.find(s);
    return it == to_id.end() ? -1 : it->second;
  }
};

// Reads tokens / scores / token_type and the special-token keys. `add_bos_default` is the
// kind's default before tokenizer.ggml.add_bos_token. Piece cache and special lists are built by
// finish_vocab (after the kind-specific decoding rule is known).
Status load_vocab(const gguf::Reader& gguf, VocabKind kind, bool add_bos_default, Vocab* v);
void finish_vocab(Vocab* v);

// A run of the input: raw text [off, off+len) when token < 0, else a special token.
struct Fragment {
  int32_t token;
  size_t off;
  size_t len;
};
// Splits `text` at occurrences of special tokens as llama.cpp's tokenizer_st_partition does:
// longest special texts first, each over all remaining raw fragments. Control and unknown tokens
// take part only when parse_special; user-defined tokens always do (as in llama.cpp / HF).
//
// `trusted` (optional): byte ranges [first, second) of `text` that may hold special tokens. When
// given, a special token of any kind (control, unknown, user-defined) becomes that token only if
// its text lies entirely inside one range, and text elsewhere is always plain text: chat
// formatting passes the template's own markers as trusted and message content as untrusted, so
// content that spells "<|im_end|>" cannot open a turn of its own.
std::vector<Fragment> partition_special(const Vocab& v, const std::string& text, bool parse_special,
                                        const ByteRanges* trusted = nullptr);

// SentencePiece BPE (llama.cpp llm_tokenizer_spm) over already-escaped text ('▁' for spaces).
// byte_tokens: the <0xNN> token of each byte (-1: none). by_word: merge each '▁'-started word on
// its own, valid when spm_words_are_independent(v).
void spm_tokenize(const Vocab& v, const int32_t byte_tokens[256], bool by_word, std::string_view text,
                  std::vector<int32_t>* out);
bool spm_words_are_independent(const Vocab& v);

}  // namespace moelite
