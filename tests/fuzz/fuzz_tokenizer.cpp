// Tokenizers. The first byte picks the mode:
//   even: text -> tokenize -> detokenize on the real vocabularies in tests/data/vocab (SentencePiece
//         and byte-level BPE), with and without special-token parsing; every id must lie in the
//         vocabulary, and valid UTF-8 without control characters must round-trip exactly;
//   odd:  a vocabulary built from the input (tokens, types, scores, BPE merges, pre-tokenizer name,
//         special ids) written as a GGUF, loaded (vocab builder, merges, special-token cache) and
//         then used on the rest of the input.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/gguf/reader.h"
#include "core/support/unicode.h"
#include "core/text/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/gguf_builder.h"

using moelite::Tokenizer;
using moelite::gguf::Reader;
using moelite::testing_gguf::GgufBuilder;
using namespace moelite_fuzz;

namespace {

std::unique_ptr<Tokenizer> load(const std::string& path) {
  std::unique_ptr<Reader> r;
  if (Reader::open(path, &r) != MOELITE_OK) return nullptr;
  std::unique_ptr<Tokenizer> t;
  if (Tokenizer::from_gguf(*r, &t) != MOELITE_OK) return nullptr;
  return t;
}

// Text a round trip must reproduce: valid UTF-8 of printable characters, spaces and newlines;
// for SentencePiece also no U+2581 ('▁'), which is how it writes a space, so it reads back as one
// (as in SentencePiece and llama.cpp).
bool round_trippable(const std::string& s, bool spm) {
  if (spm && s.find("\xE2\x96\x81") != std::string::npos) return false;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const uint32_t cp = moelite::unicode::decode_one(s.data(), s.size(), &pos);
    if (cp == moelite::unicode::kReplacement && s.compare(start, 3, "\xEF\xBF\xBD") != 0) return false;
    if (cp < 0x20 && cp != '\n') return false;
    if (cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) return false;
  }
  return true;
}

void exercise(const Tokenizer& t, const std::string& text, bool check_round_trip) {
  for (int flags = 0; flags < 4; ++flags) {
    const std::vector<int32_t> ids = t.tokenize(text, flags & 1, flags & 2);
    for (int32_t id : ids)
      if (id < 0 || id >= t.n_tokens()) {
        std::fprintf(stderr, "token id %d outside [0, %d)\n", id, t.n_tokens());
        std::abort();
      }
    const std::string back = t.detokenize(ids, true);
    if (check_round_trip && flags == 0 && t.detokenize(ids, false) != text) {
      std::fprintf(stderr, "round trip changed the text (%zu -> %zu bytes)\n", text.size(),
                   t.detokenize(ids, false).size());
      std::abort();
    }
    for (int32_t id : ids) (void)t.token_to_piece(id, flags & 1);
  }
  // Chat tokenization's trusted ranges: the whole text trusted is ordinary special parsing;
  // ranges cut at arbitrary places (from the text's own bytes) must never break the tokenizer.
  if (t.tokenize_trusted(text, false, {{0, text.size()}}) != t.tokenize(text, false, true)) {
    std::fprintf(stderr, "a fully trusted text tokenized differently from parse_special\n");
    std::abort();
  }
  moelite::ByteRanges ranges;
  for (size_t at = 0; at + 1 < text.size() && ranges.size() < 16; at += 1 + static_cast<uint8_t>(text[at]) % 7) {
    const size_t end = std::min(text.size(), at + 1 + static_cast<uint8_t>(text[at + 1]) % 23);
    ranges.emplace_back(at, end);
    at = end;
  }
  for (int32_t id : t.tokenize_trusted(text, true, ranges))
    if (id < 0 || id >= t.n_tokens()) std::abort();
}

std::vector<std::string> split(const std::string& s, char sep, size_t max_parts) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size() && out.size() < max_parts) {
    size_t e = s.find(sep, pos);
    if (e == std::string::npos) e = s.size();
    out.push_back(s.substr(pos, e - pos));
    pos = e + 1;
  }
  return out;
}

const char* const kPre[] = {"default",     "llama3",    "qwen2", "gpt-2",  "deepseek-llm", "deepseek-coder",
                            "deepseek-v3", "starcoder", "olmo",  "refact", "unknown-pre"};

void built_vocab(const uint8_t* data, size_t size) {
  if (size < 3) return;
  const uint8_t flags = data[0], pre = data[1];
  const std::string rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t cut = rest.find(std::string("\0\0", 2));
  const std::string vocab_part = rest.substr(0, cut);
  const std::string text = cut == std::string::npos ? std::string() : rest.substr(cut + 2);
  std::vector<std::string> tokens = split(vocab_part, '\n', 2048);

  const bool bpe = flags & 2;
  GgufBuilder g;
  g.kv_str("tokenizer.ggml.model", bpe ? "gpt2" : "llama");
  if (flags & 4) g.kv_str("tokenizer.ggml.pre", kPre[pre % (sizeof kPre / sizeof kPre[0])]);
  g.kv_arr_str("tokenizer.ggml.tokens", tokens);
  if (flags & 8) {
    std::vector<int32_t> types;
    for (const std::string& t : tokens) types.push_back(t.empty() ? 1 : static_cast<uint8_t>(t.back()) % 8);
    g.kv_arr_i32("tokenizer.ggml.token_type", types);
  }
  if (flags & 16) {
    std::vector<float> scores;
    for (size_t i = 0; i < tokens.size(); ++i) scores.push_back(-static_cast<float>(i % 97));
    g.kv_arr_f32("tokenizer.ggml.scores", scores);
  }
  if (bpe) {  // merges: each token of two or more bytes split after its first UTF-8 character
    std::vector<std::string> merges;
    for (const std::string& t : tokens) {
      size_t k = 1;
      while (k < t.size() && (static_cast<uint8_t>(t[k]) & 0xC0) == 0x80) ++k;
      if (k < t.size()) merges.push_back(t.substr(0, k) + " " + t.substr(k));
    }
    if (!(flags & 32)) g.kv_arr_str("tokenizer.ggml.merges", merges);
  }
  if (flags & 64) {
    g.kv_u32("tokenizer.ggml.bos_token_id", pre % 7);
    g.kv_u32("tokenizer.ggml.eos_token_id", pre / 7 % 7);
    g.kv_bool("tokenizer.ggml.add_bos_token", flags & 128);
    g.kv_bool("tokenizer.ggml.add_eos_token", pre & 1);
  }
  const std::vector<uint8_t> bytes = g.build();
  static const std::string path = scratch_path("vocab.gguf");
  if (!write_file(path, bytes.data(), bytes.size())) return;
  std::unique_ptr<Tokenizer> t = load(path);
  if (t) exercise(*t, text, false);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  quiet_logs();
  if (size == 0) return 0;
  if (data[0] & 1) {
    built_vocab(data, size);
    return 0;
  }
  static std::unique_ptr<Tokenizer> spm = load(MOELITE_SOURCE_DIR "/tests/data/vocab/ggml-vocab-llama-spm.gguf");
  static std::unique_ptr<Tokenizer> gpt = load(MOELITE_SOURCE_DIR "/tests/data/vocab/ggml-vocab-gpt-2.gguf");
  if (!spm || !gpt) std::abort();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool use_gpt = data[0] & 2;
  exercise(use_gpt ? *gpt : *spm, text, round_trippable(text, !use_gpt));
  return 0;
}
