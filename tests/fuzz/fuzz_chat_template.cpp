// Chat templates: family detection on arbitrary Jinja source, then formatting of arbitrary
// messages with the detected family and with every family. Input: template source, a NUL, then
// messages as role NUL content NUL ...; the first byte of the template chooses the options.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/text/chat_template.h"

using moelite::ChatMessage;
using moelite::ChatTemplate;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t opts = data[0];
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t cut = in.find('\0');
  const std::string source = in.substr(0, cut);
  std::vector<ChatMessage> messages;
  if (cut != std::string::npos) {
    size_t pos = cut + 1;
    while (pos < in.size() && messages.size() < 64) {
      size_t e = in.find('\0', pos);
      if (e == std::string::npos) e = in.size();
      const std::string field = in.substr(pos, e - pos);
      pos = e + 1;
      if (messages.empty() || !messages.back().content.empty() || (opts & 4)) {
        messages.push_back({field, ""});
      } else {
        messages.back().content = field;
      }
    }
  }
  const std::string eos = opts & 8 ? "</s>" : "";
  const ChatTemplate detected = moelite::detect_chat_template(source);
  (void)moelite::chat_template_name(detected);
  const std::string out = moelite::format_chat(detected, messages, opts & 1, eos);
  // Every message's content appears in the prompt (nothing is dropped or truncated); Mistral
  // folds system messages into the next user turn, so one after the last user turn has no slot.
  for (const ChatMessage& m : messages)
    if (detected != ChatTemplate::Mistral)
      if (out.find(m.content) == std::string::npos) {
        std::fprintf(stderr, "content of a '%s' message is missing from the prompt\n", m.role.c_str());
        std::abort();
      }
  for (ChatTemplate t :
       {ChatTemplate::ChatML, ChatTemplate::Mistral, ChatTemplate::Llama3, ChatTemplate::Tulu, ChatTemplate::Plain}) {
    // The template's ranges are sorted, disjoint, non-empty and inside the text, and what lies
    // outside them is message text only: every byte of it comes from some role or content.
    const moelite::ChatText chat = moelite::format_chat_ranges(t, messages, opts & 2, eos);
    size_t prev_end = 0, outside = 0;
    for (const auto& [b, e] : chat.template_ranges) {
      if (b < prev_end || e <= b || e > chat.text.size()) {
        std::fprintf(stderr, "bad template range [%zu, %zu) after %zu in %zu bytes\n", b, e, prev_end, chat.text.size());
        std::abort();
      }
      outside += b - prev_end;
      prev_end = e;
    }
    outside += chat.text.size() - prev_end;
    size_t message_bytes = 0;
    for (const ChatMessage& m : messages) message_bytes += m.role.size() + m.content.size();
    if (outside > message_bytes) {
      std::fprintf(stderr, "%zu bytes outside the template's ranges, messages hold %zu\n", outside, message_bytes);
      std::abort();
    }
  }
  return 0;
}
