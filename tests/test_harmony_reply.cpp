// The CLI's reader of gpt-oss replies (samples/cli/harmony_reply.h) on the message sequences the
// harmony format defines: analysis then final, commentary, a model that never writes a marker.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "samples/cli/harmony_reply.h"

namespace {

using moelite_cli::HarmonyReply;

// Feeds tokens ("<|...|>" markers or text) and returns (thinking, answer) as shown.
std::pair<std::string, std::string> read(const std::vector<std::string>& tokens, HarmonyReply* r) {
  std::string thinking, answer;
  for (const std::string& t : tokens) {
    const bool marker = HarmonyReply::is_marker(t.c_str());
    switch (r->feed(marker ? t.c_str() : nullptr, t.data(), t.size())) {
      case HarmonyReply::Part::Thinking: thinking += t; break;
      case HarmonyReply::Part::Answer: answer += t; break;
      case HarmonyReply::Part::Hidden: break;
    }
  }
  return {thinking, answer};
}

TEST(HarmonyReply, AnalysisIsThinkingAndFinalIsTheAnswer) {
  HarmonyReply r;
  const auto [thinking, answer] =
      read({"<|channel|>", "analysis", "<|message|>", "User", " greets", ".", "<|end|>", "<|start|>", "assistant",
            "<|channel|>", "final", "<|message|>", "Hello", "!", "<|return|>"},
           &r);
  EXPECT_EQ(thinking, "User greets.");
  EXPECT_EQ(answer, "Hello!");
  EXPECT_EQ(r.answer(), "Hello!");
}

TEST(HarmonyReply, CommentaryAndHeadersStayOutOfTheAnswer) {
  HarmonyReply r;
  const auto [thinking, answer] =
      read({"<|channel|>", "commentary", " to=functions.get", "<|constrain|>", "json", "<|message|>", "{}", "<|call|>",
            "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Done", "<|end|>"},
           &r);
  EXPECT_EQ(thinking, "{}");
  EXPECT_EQ(answer, "Done");
}

TEST(HarmonyReply, TextWithoutMarkersIsAllAnswer) {
  HarmonyReply r;
  EXPECT_EQ(read({"plain", " words"}, &r).second, "plain words");
  HarmonyReply typed;  // text that spells a marker but is not the special token stays text
  EXPECT_EQ(typed.feed(nullptr, "<|end|>", 7), HarmonyReply::Part::Answer);
}

}  // namespace
