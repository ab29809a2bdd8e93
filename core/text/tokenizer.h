// Tokenizers built from GGUF metadata (tokenizer.ggml.*): SentencePiece-style ("llama") and
// byte-level BPE ("gpt2") with the pre-tokenizer named by tokenizer.ggml.pre.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "core/gguf/reader.h"

namespace moelite {

// Byte ranges [first, second) of a text, sorted and disjoint.
using ByteRanges = std::vector<std::pair<size_t, size_t>>;

enum class TokenAttr : uint8_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer a GGUF file describes. Errors: MOELITE_ERR_MISSING_METADATA when
  // tokenizer.ggml.model / tokens are absent, MOELITE_ERR_UNSUPPORTED_TYPE (message names the
  // model or pre-tokenizer) for an unknown tokenizer kind. An unknown `pre` falls back to the
  // default GPT-2 pre-tokenizer with a warning.
  static Status from_gguf(const gguf::Reader& gguf, std::unique_ptr<Tokenizer>* out);

  // Token ids of `text` (any bytes; invalid UTF-8 must not crash). add_special: prepend BOS /
  // append EOS as tokenizer.ggml.add_bos_token / add_eos_token say (defaults per model kind, as
  // llama.cpp). parse_special: text matching a control (or unknown) token's text becomes that
  // token; otherwise such text is tokenized as plain text. User-defined tokens (type 4) are
  // matched either way, as llama.cpp and HF tokenizers do. Invalid UTF-8 reaches byte-level BPE
  // as U+FFFD (llama.cpp), SentencePiece as <0xNN> byte tokens.
  virtual std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const = 0;
  // As tokenize(), but special tokens of any kind are recognised only inside the `trusted` byte
  // ranges; all other text is plain text (chat formatting: the template's markers are trusted,
  // message content is not).
  virtual std::vector<int32_t> tokenize_trusted(const std::string& text, bool add_special,
                                                const ByteRanges& trusted) const = 0;

  // The bytes a token stands for (byte-level BPE bytes decoded, SentencePiece '▁' -> ' ', byte
  // tokens <0xNN> -> that byte). Control and unknown tokens give "" unless `special` is true
  // (llama.cpp); unused tokens and ids out of range give "".
  virtual std::string token_to_piece(int32_t token, bool special) const = 0;

  // Concatenated pieces; remove_leading_space drops the space SentencePiece adds before the first
  // word (when the vocabulary asks for add_space_prefix): the first token that renders (BOS
  // skipped when !special) loses one leading ' '. Out-of-range ids render as nothing.
  virtual std::string detokenize(const std::vector<int32_t>& tokens, bool special,
                                 bool remove_leading_space = true) const = 0;

  virtual int32_t n_tokens() const = 0;
  virtual int32_t bos() const = 0;  // -1 if none
  virtual int32_t eos() const = 0;
  virtual bool is_end_of_generation(int32_t token) const = 0;  // eos, eot, eom ... ids
  virtual TokenAttr attr(int32_t token) const = 0;
  virtual const std::string& text(int32_t token) const = 0;  // the vocabulary string as stored
  virtual const char* kind() const = 0;                      // "llama (spm)" / "gpt2 (bpe: qwen2)"
};

}  // namespace moelite
