// Reads a gpt-oss reply as it streams. gpt-oss answers in harmony messages,
//   <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>
// (the first message's "<|start|>assistant" is the end of the prompt). Text on the "final" channel
// is the answer: what `moelite chat` prints on stdout and keeps in the conversation, as gpt-oss's
// template expects its history. The other channels (analysis: the model's reasoning; commentary:
// tool preambles) are shown apart and never sent back.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>

namespace moelite_cli {

class HarmonyReply {
 public:
  enum class Part { Hidden, Thinking, Answer };

  // Whether a token's text is one of harmony's markers (the caller checks that the token is a
  // special one, so typed text that spells a marker stays text).
  static bool is_marker(const char* t) {
    for (const char* m : {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                          "<|constrain|>"})
      if (std::strcmp(t, m) == 0) return true;
    return false;
  }

  // One generated token: `marker` is its text when it is a marker, else null; the text it
  // released to the stream belongs where the returned Part says (a marker's own text: Hidden).
  Part feed(const char* marker, const char* text, size_t len) {
    if (marker) {
      seen_marker_ = true;
      if (std::strcmp(marker, "<|channel|>") == 0) {
        state_ = State::Channel;
        channel_.clear();
      } else if (std::strcmp(marker, "<|message|>") == 0) {
        state_ = State::Body;
      } else if (std::strcmp(marker, "<|constrain|>") != 0) {  // start, end, return, call
        state_ = State::Header;
      }
      return Part::Hidden;
    }
    switch (state_) {
      case State::Channel:
        channel_.append(text, len);
        return Part::Hidden;
      case State::Body:
        if (channel_.compare(0, 5, "final") != 0) return Part::Thinking;
        answer_.append(text, len);
        return Part::Answer;
      case State::Header:
        // A model that never writes a marker does not speak harmony: all it says is the answer.
        if (seen_marker_) return Part::Hidden;
        answer_.append(text, len);
        return Part::Answer;
    }
    return Part::Hidden;
  }

  const std::string& answer() const { return answer_; }

 private:
  enum class State { Header, Channel, Body } state_ = State::Header;  // after the prompt's "<|start|>assistant"
  std::string channel_, answer_;
  bool seen_marker_ = false;
};

}  // namespace moelite_cli
