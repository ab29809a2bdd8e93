// Tokenizer::from_gguf and the shared driver: special-token partitioning, BOS/EOS, and
// token -> bytes for both tokenizer kinds.
#include "core/text/tokenizer.h"

#include <cstdio>

#include "core/text/pretokenize.h"
#include "core/text/tokenizer_bpe.h"
#include "core/text/vocab.h"

namespace moelite {
namespace {

const std::string kEmpty;

class GgufTokenizer final : public Tokenizer {
 public:
  Status init(const gguf::Reader& g, const std::string& model) {
    if (model == "llama") {
      MOELITE_TRY(load_vocab(g, VocabKind::Spm, /*add_bos_default=*/true, &v_));
      kind_ = "llama (spm)";
      spm_by_word_ = spm_words_are_independent(v_);
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        int32_t id = v_.find(name);
        if (id < 0) id = v_.find(std::string(1, static_cast<char>(b)));
        if (id < 0) id = v_.unk;  // llama.cpp would throw here; an unknown token is the kinder answer
        byte_tokens_[b] = id;
      }
    } else {
      std::string pre_name;
      bool has_pre = g.get_string("tokenizer.ggml.pre", &pre_name) && !pre_name.empty();
      if (!has_pre) {
        log_msg(MOELITE_LOG_WARN, "tokenizer: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer");
        pre_ = PreTokenizer::Default;
      } else if (!pre_tokenizer_from_name(pre_name, &pre_)) {
        log_msg(MOELITE_LOG_WARN, "tokenizer: unknown pre-tokenizer '%s'; using the GPT-2 pre-tokenizer",
                pre_name.c_str());
        pre_ = PreTokenizer::Gpt2;
      }
      ignore_merges_ = has_pre && pre_name_is_llama3(pre_name);
      MOELITE_TRY(load_vocab(g, VocabKind::Bpe, /*add_bos_default=*/ignore_merges_, &v_));
      // GLM-4's tokenizer adds no BOS whatever the file says (llama.cpp drops its BOS id too).
      if (pre_name == "glm4" || pre_name == "chatglm-bpe") v_.add_bos = false;
      MOELITE_TRY(bpe_.load(g, v_));
      kind_ = std::string("gpt2 (bpe: ") + pre_tokenizer_name(pre_) + ")";
    }
    finish_vocab(&v_);
    return MOELITE_OK;
  }

  std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const override {
    return tokenize_fragments(text, add_special, partition_special(v_, text, parse_special));
  }

  std::vector<int32_t> tokenize_trusted(const std::string& text, bool add_special,
                                        const ByteRanges& trusted) const override {
    return tokenize_fragments(text, add_special, partition_special(v_, text, true, &trusted));
  }

  std::vector<int32_t> tokenize_fragments(const std::string& text, bool add_special,
                                          const std::vector<Fragment>& frags) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && v_.add_bos && v_.bos >= 0) out.push_back(v_.bos);
    bool prev_special = true;  // SPM: a space goes before the first word and after special tokens
    std::string buf;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      if (v_.kind == VocabKind::Spm) {
        buf.clear();
        if (v_.add_space_prefix && prev_special) buf = "\xE2\x96\x81";
        for (size_t k = f.off; k < f.off + f.len; ++k) {
          if (text[k] == ' ') {
            buf += "\xE2\x96\x81";
          } else {
            buf.push_back(text[k]);
          }
        }
        spm_tokenize(v_, byte_tokens_, spm_by_word_, buf, &out);
      } else {
        bpe_.tokenize(v_, pre_, ignore_merges_, text.substr(f.off, f.len), &out);
      }
      prev_special = false;
    }
    if (add_special && v_.add_eos && v_.eos >= 0) out.push_back(v_.eos);
    return out;
  }

  std::string token_to_piece(int32_t token, bool special) const override {
    if (token < 0 || token >= v_.n()) return std::string();
    TokenAttr a = v_.attr[token];
    if (!special && (a == TokenAttr::Control || a == TokenAttr::Unknown)) return std::string();
    return v_.piece[token];
  }

  std::string detokenize(const std::vector<int32_t>& tokens, bool special, bool remove_leading_space) const override {
    std::string out;
    bool strip = remove_leading_space && v_.add_space_prefix;
    for (int32_t t : tokens) {
      if (t < 0 || t >= v_.n()) continue;
      TokenAttr a = v_.attr[t];
      if (!special && (a == TokenAttr::Control || a == TokenAttr::Unknown)) continue;  // renders as nothing
      const std::string& p = v_.piece[t];
      if (strip && !p.empty() && p[0] == ' ') {
        out.append(p, 1, std::string::npos);
      } else {
        out += p;
      }
      strip = false;
    }
    return out;
  }

  int32_t n_tokens() const override { return v_.n(); }
  int32_t bos() const override { return v_.bos; }
  int32_t eos() const override { return v_.eos; }
  bool is_end_of_generation(int32_t token) const override { return token >= 0 && token < v_.n() && v_.eog[token] != 0; }
  TokenAttr attr(int32_t token) const override {
    return token >= 0 && token < v_.n() ? v_.attr[token] : TokenAttr::Unused;
  }
  const std::string& text(int32_t token) const override {
    return token >= 0 && token < v_.n() ? v_.text[token] : kEmpty;
  }
  const char* kind() const override { return kind_.c_str(); }

 private:
  Vocab v_;
  std::string kind_;
  PreTokenizer pre_ = PreTokenizer::Gpt2;
  bool ignore_merges_ = false;
  BpeModel bpe_;
  int32_t byte_tokens_[256] = {};
  bool spm_by_word_ = false;
};

}  // namespace

Status Tokenizer::from_gguf(const gguf::Reader& gguf, std::unique_ptr<Tokenizer>* out) {
  std::string model;
  if (!gguf.find("tokenizer.ggml.model"))
    return fail(MOELITE_ERR_MISSING_METADATA, "tokenizer: tokenizer.ggml.model is missing");
  if (!gguf.get_string("tokenizer.ggml.model", &model))
    return fail(MOELITE_ERR_MISSING_METADATA, "tokenizer: tokenizer.ggml.model is not a string");
  if (model != "llama" && model != "gpt2")
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "tokenizer: unsupported tokenizer model '%s' (supported: llama, gpt2)",
                model.c_str());
  auto t = std::make_unique<GgufTokenizer>();
  MOELITE_TRY(t->init(gguf, model));
  *out = std::move(t);
  return MOELITE_OK;
}

}  // namespace moelite
