// Streaming filter (UTF-8 boundaries, stop strings) and chat-template formatting, checked against
// hand-written expectations from the template formats.
#include <gtest/gtest.h>

#include <ctime>

#include "core/serve/generate.h"
#include "core/text/chat_template.h"

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
  EXPECT_EQ(moelite::detect_chat_template("{{- \"<|start|>assistant<|channel|>final<|message|>\" }}"),
            ChatTemplate::Harmony);
  // DeepSeek-V2-Lite-Chat's and DeepSeek-V3's templates (excerpts of the Hugging Face sources).
  EXPECT_EQ(moelite::detect_chat_template("{{ 'Assistant: ' + message['content'] + eos_token }}"),
            ChatTemplate::DeepSeek2);
  EXPECT_EQ(moelite::detect_chat_template("{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>' + content + "
                                          "'<｜end▁of▁sentence｜>'}}"),
            ChatTemplate::DeepSeek3);
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
  // DeepSeek-V2-Chat's template rendered by hand for these messages (its bos_token aside, which the
  // tokenizer adds): system text + "\n\n", "User: " turns + "\n\n", "Assistant: " + answer + EOS.
  EXPECT_EQ(moelite::format_chat(ChatTemplate::DeepSeek2, msgs, true, "<｜end▁of▁sentence｜>"),
            "Be brief.\n\nUser: Hi\n\nAssistant: Hello!<｜end▁of▁sentence｜>User: Bye\n\nAssistant:");
  // DeepSeek-V3's template: system prompt first, then the turns' markers with nothing between them.
  EXPECT_EQ(moelite::format_chat(ChatTemplate::DeepSeek3, msgs, true, ""),
            "Be brief.\n\n<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>");
}

// gpt-oss's template (the GGUF's tokenizer.chat_template, also openai/gpt-oss-20b on Hugging Face)
// rendered by hand for these messages, no tools, default identity and reasoning effort: its
// build_system_message(), the first system message as the developer's "# Instructions", user
// turns, earlier assistant answers on the final channel ending in <|end|>, and the generation
// prompt "<|start|>assistant"; without a generation prompt the last answer ends in <|return|>.
static std::string harmony_system(const std::string& date) {
  return "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
         "Knowledge cutoff: 2024-06\nCurrent date: " +
         date +
         "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
         "every message.<|end|>";
}

static std::string today() {
  char d[16];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(d, sizeof d, "%Y-%m-%d", &local);
  return d;
}

TEST(ChatTemplate, HarmonyFormatsTurnsAsGptOssTemplate) {
  const std::vector<moelite::ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  std::string got, date;
  for (int attempt = 0; attempt < 2; ++attempt) {  // the date may change between the two reads
    date = today();
    got = moelite::format_chat(ChatTemplate::Harmony, msgs, true, "");
    if (date == today()) break;
  }
  EXPECT_EQ(got, harmony_system(date) +
                     "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                     "<|start|>user<|message|>Hi<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
                     "<|start|>user<|message|>Bye<|end|>"
                     "<|start|>assistant");
  // No system message: no developer message. The last answer, with no reply asked for, returns.
  EXPECT_EQ(moelite::format_chat(ChatTemplate::Harmony, {{"user", "Hi"}, {"assistant", "Yo"}}, false, ""),
            harmony_system(today()) +
                "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Yo<|return|>");
  // An empty system message writes no developer message either (the template tests it for truth).
  EXPECT_EQ(moelite::format_chat(ChatTemplate::Harmony, {{"developer", ""}, {"user", "Hi"}}, true, ""),
            harmony_system(today()) + "<|start|>user<|message|>Hi<|end|><|start|>assistant");
  // Message text is never template: the developer's content and user content are message ranges.
  const moelite::ChatText r = moelite::format_chat_ranges(ChatTemplate::Harmony, {{"user", "<|end|>"}}, true, "");
  const size_t at = r.text.find("<|end|><|end|>");
  ASSERT_NE(at, std::string::npos);
  for (const auto& range : r.template_ranges) EXPECT_FALSE(range.first <= at && at < range.second);
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
