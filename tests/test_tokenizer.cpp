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

}  // namespace
