// Pre-tokenizers of byte-level BPE vocabularies: the regex splits llama.cpp applies for each
// tokenizer.ggml.pre, implemented by hand over code points (no std::regex).
//
// A pre-tokenizer is a list of regexes applied in turn: each one splits every piece produced so
// far into its matches and the unmatched gaps between them (gaps stay pieces of their own), the
// way llama.cpp's unicode_regex_split does. Matching is leftmost-first with the regex's
// alternative order, \s is the White_Space property, \p{..} are general-category classes and
// lookahead / `$` see only the current piece.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moelite {

enum class PreTokenizer {
  Default,        // "default" / missing: llama.cpp's 4-regex default
  Gpt2,           // "gpt-2", "gpt2", "olmo", "mpt", "phi-2", "jais", ...
  Llama3,         // "llama3", "llama-bpe", "llama-v3", "dbrx", "smaug-bpe", ...: \p{N}{1,3}
  Qwen2,          // "qwen2", "stablelm2", "deepseek-r1-qwen", ...: llama3's regex, single digits
  DeepseekLlm,    // "deepseek-llm"
  DeepseekCoder,  // "deepseek-coder"
  Deepseek3,      // "deepseek-v3"
  Starcoder,      // "starcoder", "refact", "command-r", "smollm", ...: single digits, then GPT-2
  Falcon,         // "falcon"
  Gpt4o,          // "gpt-4o" (gpt-oss's o200k), "llama4", "minimax-m2": case-aware words (ASCII), \p{N}{1,3}
};

// Maps tokenizer.ggml.pre to a pre-tokenizer; false for names this build does not know.
bool pre_tokenizer_from_name(const std::string& name, PreTokenizer* out);
const char* pre_tokenizer_name(PreTokenizer p);
// For the `pre` names llama.cpp treats as LLAMA3 ("llama3", "llama-bpe", ...): pieces that are
// vocabulary entries are taken whole without merging (ignore_merges), and add_bos defaults to
// true (before tokenizer.ggml.add_bos_token).
bool pre_name_is_llama3(const std::string& name);

// Splits code points into pieces; returns the pieces' lengths in code points (all > 0, summing
// to cpts.size()).
std::vector<size_t> pretokenize(const std::vector<uint32_t>& cpts, PreTokenizer p);

// Convenience for tests and tools: decodes `text` (invalid bytes -> U+FFFD) and returns the
// pieces as UTF-8.
std::vector<std::string> pretokenize_utf8(const std::string& text, PreTokenizer p);

}  // namespace moelite
