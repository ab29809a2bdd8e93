// Tokenizers: llama.cpp's shared vocabulary vectors (SPM and GPT-2 BPE) must match exactly;
// pre-tokenizer rules on hand-written strings; special tokens; robustness against invalid
// UTF-8, out-of-range ids and malformed vocabulary metadata.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/status.h"
#include "core/tokenizer/pretokenize.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"
#include "tests/gguf_builder.h"

namespace {

using moelite::PreTokenizer;
using moelite::Status;
using moelite::TokenAttr;
using moelite::Tokenizer;
using moelite::gguf::Reader;
using namespace moelite::testing_gguf;

const std::string kVocabDir = MOELITE_SOURCE_DIR "/tests/data/vocab/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Vector {
  std::string input;
  std::vector<int32_t> ids;
};

// .inp: inputs each followed by "\n__ggml_vocab_test__\n"; .out: one line of ids per input.
std::vector<Vector> load_vectors(const std::string& base) {
  const std::string inp = read_file(base + ".inp");
  const std::string outp = read_file(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Vector> v;
  size_t pos = 0;
  while (pos < inp.size()) {
    size_t e = inp.find(sep, pos);
    if (e == std::string::npos) break;
    v.push_back({inp.substr(pos, e - pos), {}});
    pos = e + sep.size();
  }
  std::istringstream lines(outp);
  std::string line;
  size_t k = 0;
  while (std::getline(lines, line) && k < v.size()) {
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) v[k].ids.push_back(id);
    ++k;
  }
  EXPECT_EQ(k, v.size()) << base;
  return v;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::unique_ptr<Reader> r;
  Status st = Reader::open(path, &r);
  EXPECT_EQ(st, MOELITE_OK) << moelite::last_error_message();
  if (st != MOELITE_OK) return nullptr;
  std::unique_ptr<Tokenizer> t;
  st = Tokenizer::from_gguf(*r, &t);
  EXPECT_EQ(st, MOELITE_OK) << moelite::last_error_message();
  return t;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

class TokenizerVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerVectors, MatchLlamaCpp) {
  const std::string base = kVocabDir + "ggml-vocab-" + GetParam() + ".gguf";
  auto tok = load_tokenizer(base);
  ASSERT_NE(tok, nullptr);
  auto vectors = load_vectors(base);
  ASSERT_EQ(vectors.size(), 46u);
  for (const Vector& v : vectors) {
    std::vector<int32_t> got = tok->tokenize(v.input, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids_str(got), ids_str(v.ids)) << "input: '" << v.input << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Vocab, TokenizerVectors, ::testing::Values("llama-spm", "gpt-2"));

// ---- round trips and special tokens on the shared vocabularies

TEST(TokenizerVectors, GptRoundTripsEveryVector) {
  const std::string base = kVocabDir + "ggml-vocab-gpt-2.gguf";
  auto tok = load_tokenizer(base);
  ASSERT_NE(tok, nullptr);
  for (const Vector& v : load_vectors(base)) {
    auto ids = tok->tokenize(v.input, false, false);
    EXPECT_EQ(tok->detokenize(ids, false), v.input);
    EXPECT_EQ(tok->detokenize(ids, true), v.input);
  }
}

TEST(TokenizerVectors, SpmRoundTripsEveryVectorModuloLeadingSpace) {
  const std::string base = kVocabDir + "ggml-vocab-llama-spm.gguf";
  auto tok = load_tokenizer(base);
  ASSERT_NE(tok, nullptr);
  for (const Vector& v : load_vectors(base)) {
    auto ids = tok->tokenize(v.input, false, false);
    EXPECT_EQ(tok->detokenize(ids, false), v.input);  // the added '▁' prefix is dropped again
    if (!v.input.empty()) EXPECT_EQ(tok->detokenize(ids, false, /*remove_leading_space=*/false), " " + v.input);
    auto with_bos = tok->tokenize(v.input, true, false);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], 1);
    EXPECT_EQ(tok->detokenize(with_bos, false), v.input);
  }
}

TEST(TokenizerSpecial, GptEndOfText) {
  auto tok = load_tokenizer(kVocabDir + "ggml-vocab-gpt-2.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_STREQ(tok->kind(), "gpt2 (bpe: gpt2)");
  EXPECT_EQ(tok->n_tokens(), 50257);
  EXPECT_EQ(tok->bos(), 50256);
  EXPECT_EQ(tok->eos(), 50256);
  EXPECT_EQ(tok->attr(50256), TokenAttr::Control);
  EXPECT_TRUE(tok->is_end_of_generation(50256));
  EXPECT_FALSE(tok->is_end_of_generation(198));
  EXPECT_FALSE(tok->is_end_of_generation(-1));
  EXPECT_FALSE(tok->is_end_of_generation(1 << 30));

  const std::string text = "Hello<|endoftext|> world";
  auto parsed = tok->tokenize(text, false, true);
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0], 15496);  // "Hello"
  EXPECT_EQ(parsed[1], 50256);
  EXPECT_EQ(parsed[2], 995);    // " world"
  auto plain = tok->tokenize(text, false, false);
  EXPECT_GT(plain.size(), 3u);
  for (int32_t id : plain) EXPECT_NE(id, 50256);
  EXPECT_EQ(tok->detokenize(plain, false), text);
  EXPECT_EQ(tok->detokenize(parsed, false), "Hello world");  // control tokens render as nothing
  EXPECT_EQ(tok->detokenize(parsed, true), text);
  EXPECT_EQ(tok->token_to_piece(50256, false), "");
  EXPECT_EQ(tok->token_to_piece(50256, true), "<|endoftext|>");
  EXPECT_EQ(tok->tokenize(text, true, true), parsed);  // gpt-2: no add_bos_token key -> no BOS
  EXPECT_EQ(tok->tokenize("<|endoftext|><|endoftext|>", false, true), (std::vector<int32_t>{50256, 50256}));
}

TEST(TokenizerSpecial, SpmControlTokensAndSpacePrefix) {
  auto tok = load_tokenizer(kVocabDir + "ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_STREQ(tok->kind(), "llama (spm)");
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_TRUE(tok->is_end_of_generation(2));
  EXPECT_FALSE(tok->is_end_of_generation(1));
  EXPECT_EQ(tok->attr(0), TokenAttr::Unknown);
  EXPECT_EQ(tok->attr(3), TokenAttr::Byte);
  EXPECT_EQ(tok->text(1), "<s>");
  EXPECT_EQ(tok->text(-1), "");
  EXPECT_EQ(tok->text(32000), "");

  auto hello = tok->tokenize("Hello", false, false);  // "▁Hello"
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(hello[0], 15043);
  // After a special token a raw fragment gets the space prefix again (llama.cpp).
  auto ids = tok->tokenize("<s>Hello</s>Hello", false, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 15043, 2, 15043}));
  // Without parse_special the markup is text.
  auto plain = tok->tokenize("<s>Hello", false, false);
  for (int32_t id : plain) EXPECT_GT(id, 2);
  EXPECT_EQ(tok->detokenize(plain, false), "<s>Hello");
  // add_special: BOS (add_bos_token = true), no EOS (add_eos_token = false).
  EXPECT_EQ(tok->tokenize("Hello", true, false), (std::vector<int32_t>{1, 15043}));
  EXPECT_EQ(tok->tokenize("", true, false), (std::vector<int32_t>{1}));
  EXPECT_TRUE(tok->tokenize("", false, false).empty());
  // Pieces: '▁' -> ' ', byte tokens -> their byte, control / unknown only when special.
  EXPECT_EQ(tok->token_to_piece(15043, false), " Hello");
  EXPECT_EQ(tok->token_to_piece(3 + 0x0A, false), "\n");   // <0x0A>
  EXPECT_EQ(tok->token_to_piece(3 + 0xE2, false), "\xE2");  // a partial UTF-8 byte, as is
  EXPECT_EQ(tok->token_to_piece(1, false), "");
  EXPECT_EQ(tok->token_to_piece(1, true), "<s>");
  EXPECT_EQ(tok->token_to_piece(0, false), "");
  EXPECT_EQ(tok->token_to_piece(0, true), "<unk>");
  EXPECT_EQ(tok->detokenize({1, 15043, 2}, true), "<s> Hello</s>");
  EXPECT_EQ(tok->detokenize({1, 15043, 2}, false), "Hello");
}

TEST(TokenizerRobustness, OutOfRangeIdsRenderNothing) {
  for (const char* name : {"llama-spm", "gpt-2"}) {
    auto tok = load_tokenizer(kVocabDir + "ggml-vocab-" + name + ".gguf");
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->token_to_piece(-1, true), "");
    EXPECT_EQ(tok->token_to_piece(tok->n_tokens(), true), "");
    EXPECT_EQ(tok->token_to_piece(INT32_MAX, false), "");
    EXPECT_EQ(tok->detokenize({-7, INT32_MAX, tok->n_tokens()}, true), "");
    EXPECT_EQ(tok->attr(-1), TokenAttr::Unused);
  }
}

TEST(TokenizerRobustness, InvalidUtf8NeverCrashes) {
  auto spm = load_tokenizer(kVocabDir + "ggml-vocab-llama-spm.gguf");
  auto gpt = load_tokenizer(kVocabDir + "ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(spm && gpt);
  const std::vector<std::string> cases = {"\xff", "\xC3", "a\xE2\x82", "\xE2\x82" "a", "\x80\x80\x80",
                                          "\xF0\x9F\x98", "\xF8\x88\x80\x80\x80", std::string("a\0b", 3),
                                          "\xED\xA0\x80", "\xF4\x90\x80\x80", "ok \xC0\xAF end"};
  for (const std::string& s : cases) {
    for (bool special : {false, true}) {
      auto a = spm->tokenize(s, special, special);
      for (int32_t id : a) EXPECT_TRUE(id >= 0 && id < spm->n_tokens());
      // SentencePiece keeps every byte (byte fallback).
      EXPECT_EQ(spm->detokenize(spm->tokenize(s, false, special), false), s);
      auto b = gpt->tokenize(s, special, special);
      for (int32_t id : b) EXPECT_TRUE(id >= 0 && id < gpt->n_tokens());
    }
  }
  // Byte-level BPE sees invalid sequences as U+FFFD, one per bad byte (llama.cpp).
  EXPECT_EQ(gpt->detokenize(gpt->tokenize("a\xff" "b", false, false), false), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(gpt->detokenize(gpt->tokenize("\xE2\x82" "a", false, false), false), "\xEF\xBF\xBD\xEF\xBF\xBD" "a");

  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s(rng() % 48, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 ? rng() % 256 : " \n\t'<>|"[rng() % 7]);
    auto a = spm->tokenize(s, true, true);
    for (int32_t id : a) ASSERT_TRUE(id >= 0 && id < spm->n_tokens());
    // (No SPM round trip here: like llama.cpp, spaces become '▁' before the text is cut into
    // UTF-8 characters, so a stray lead byte right before a space swallows part of the '▁'.)
    auto b = gpt->tokenize(s, true, true);
    for (int32_t id : b) ASSERT_TRUE(id >= 0 && id < gpt->n_tokens());
  }
}

TEST(TokenizerRobustness, RandomValidUtf8RoundTrips) {
  auto spm = load_tokenizer(kVocabDir + "ggml-vocab-llama-spm.gguf");
  auto gpt = load_tokenizer(kVocabDir + "ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(spm && gpt);
  std::mt19937 rng(99);
  const uint32_t pools[][2] = {{0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x24F}, {0x370, 0x4FF}, {0x3000, 0x30FF},
                               {0x4E00, 0x4FFF}, {0x1F300, 0x1F64F}, {0x2000, 0x206F}, {0x660, 0x669}};
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint32_t> cps(rng() % 24);
    for (uint32_t& cp : cps) {
      const auto& p = pools[rng() % 9];
      do cp = p[0] + rng() % (p[1] - p[0] + 1); while (cp >= 0xD800 && cp < 0xE000);
    }
    std::string s = moelite::unicode::encode_utf8(cps);
    ASSERT_EQ(gpt->detokenize(gpt->tokenize(s, false, false), false), s);
    ASSERT_EQ(spm->detokenize(spm->tokenize(s, false, false), false), s);
  }
}

// Large input: correctness (round trip) and speed (reported; bound generous for sanitizer builds).
TEST(TokenizerSpeed, OneMegabyteOfEnglish) {
  static const char* kWords[] = {"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
                                 "be", "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at",
                                 "which", "but", "have", "an", "had", "they", "you", "were", "their", "one",
                                 "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will",
                                 "would", "who", "so", "no", "tokenizer", "mixture", "experts", "Lisbon", "quickly",
                                 "don't", "it's", "we'll", "1984", "3.14159", "(see", "below)", "\"quoted\"",
                                 "e-mail", "naïve", "café", "ünïcödé", "2024-05-01", "$100", "well-known", "—"};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < (1u << 20)) {
    text += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
    unsigned r = rng() % 20;
    text += r == 0 ? ".\n\n" : r == 1 ? ", " : r == 2 ? ". " : " ";
  }
  for (const char* name : {"gpt-2", "llama-spm"}) {
    auto tok = load_tokenizer(kVocabDir + "ggml-vocab-" + name + ".gguf");
    ASSERT_NE(tok, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    auto ids = tok->tokenize(text, false, true);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ speed    ] %s: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s)\n", name, text.size(), ids.size(),
                secs, text.size() / secs / 1e6);
    RecordProperty(std::string(name) + "_seconds_per_MB", std::to_string(secs * (1 << 20) / text.size()));
    EXPECT_LT(secs, 30.0);
    EXPECT_EQ(tok->detokenize(ids, false), text);
  }
}

}  // namespace
