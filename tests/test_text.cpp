// Streaming filter (UTF-8 boundaries, stop strings) and chat-template formatting, checked against
// hand-written expectations from the template formats.
#include <gtest/gtest.h>

#include "core/chat_template.h"
#include "core/generate.h"

using moelite::ChatTemplate;
using moelite::StreamFilter;

namespace {
std::string feed(StreamFilter& f, const std::vector<std::string>& chunks, bool* stopped,
                 std::vector<std::string>* pieces) {
  std::string all;
  *stopped = false;
  for (const auto& c : chunks) {
    std::string out = f.push(c, stopped);
    if (!out.empty()) pieces->push_back(out);
    all += out;
    if (*stopped) return all;
  }
  std::string rest = f.flush();
  if (!rest.empty()) pieces->push_back(rest);
  return all + rest;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}
}  // namespace

TEST(StreamFilter, NeverSplitsUtf8Characters) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, fed one byte at a time.
  const std::string text = "caf\xC3\xA9 \xE2\x82\xAC 5 \xF0\x9F\x98\x80!";
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  StreamFilter f({});
  bool stopped;
  std::vector<std::string> pieces;
  EXPECT_EQ(feed(f, bytes, &stopped, &pieces), text);
  EXPECT_FALSE(stopped);
  for (const auto& p : pieces) EXPECT_TRUE(valid_utf8(p)) << p;
}

TEST(StreamFilter, StopStringAcrossPiecesIsNotEmitted) {
  StreamFilter f({"</end>"});
  bool stopped;
  std::vector<std::string> pieces;
  EXPECT_EQ(feed(f, {"Hello </", "en", "d> ignored"}, &stopped, &pieces), "Hello ");
  EXPECT_TRUE(stopped);
  for (const auto& p : pieces) EXPECT_EQ(p.find('<'), std::string::npos);
}

TEST(StreamFilter, FalseStartOfStopStringIsReleased) {
  StreamFilter f({"STOP"});
  bool stopped;
  std::vector<std::string> pieces;
  EXPECT_EQ(feed(f, {"ST", "ART ", "ST"}, &stopped, &pieces), "START ST");
  EXPECT_FALSE(stopped);
}

TEST(StreamFilter, EarliestOfSeveralStopStrings) {
  StreamFilter f({"bb", "a"});
  bool stopped;
  std::vector<std::string> pieces;
  EXPECT_EQ(feed(f, {"xxbbya"}, &stopped, &pieces), "xx");
  EXPECT_TRUE(stopped);
}

TEST(ChatTemplate, DetectsFamilies) {
  EXPECT_EQ(moelite::detect_chat_template("{{'<|im_start|>' + message['role']}}"), ChatTemplate::ChatML);
  EXPECT_EQ(moelite::detect_chat_template("<|start_header_id|>{{ role }}<|end_header_id|>"), ChatTemplate::Llama3);
  EXPECT_EQ(moelite::detect_chat_template("{{ '<|user|>\\n' }}{{ '<|assistant|>\\n' }}"), ChatTemplate::Tulu);
  EXPECT_EQ(moelite::detect_chat_template("{{ '[INST] ' + content + ' [/INST]' }}"), ChatTemplate::Mistral);
  EXPECT_EQ(moelite::detect_chat_template("{{ something else }}"), ChatTemplate::Plain);
  EXPECT_EQ(moelite::detect_chat_template(""), ChatTemplate::Plain);
}

TEST(ChatTemplate, FormatsEachFamily) {
  const std::vector<moelite::ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(moelite::format_chat(ChatTemplate::ChatML, msgs, true, "<|endoftext|>"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
            "<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(
      moelite::format_chat(ChatTemplate::Llama3, {{"user", "Hi"}}, true, ""),
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(moelite::format_chat(ChatTemplate::Mistral, msgs, true, "</s>"),
            "[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] Bye [/INST]");
  EXPECT_EQ(moelite::format_chat(ChatTemplate::Tulu, msgs, true, "<|endoftext|>"),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!<|endoftext|>\n<|user|>\nBye\n<|assistant|>\n");
  EXPECT_EQ(moelite::format_chat(ChatTemplate::Plain, {{"user", "Hi"}}, true, ""), "user: Hi\nassistant: ");
}

TEST(ChatTemplate, RangesMarkWhatTheTemplateWrote) {
  const moelite::ChatText c = moelite::format_chat_ranges(ChatTemplate::ChatML, {{"user", "hi"}}, true, "");
  EXPECT_EQ(c.text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // "<|im_start|>" | user | "\n" | hi | "<|im_end|>\n<|im_start|>assistant\n" (adjacent: one range)
  const std::vector<std::pair<size_t, size_t>> want = {{0, 12}, {16, 17}, {19, c.text.size()}};
  EXPECT_EQ(c.template_ranges, want);
  // Tulu writes the known roles' markers whole, other roles stay text between "<|" and "|>\n".
  const moelite::ChatText t = moelite::format_chat_ranges(ChatTemplate::Tulu, {{"user", "a"}, {"tool", "b"}}, false, "");
  EXPECT_EQ(t.text, "<|user|>\na\n<|tool|>\nb\n");
  const std::vector<std::pair<size_t, size_t>> want_t = {{0, 9}, {10, 13}, {17, 20}, {21, 22}};
  EXPECT_EQ(t.template_ranges, want_t);
}
