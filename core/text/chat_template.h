// Chat prompt formatting for the template families found in MoE model files. GGUF carries the
// template as Jinja source (tokenizer.chat_template); rather than embedding a Jinja engine, moelite
// recognises the family from marker strings and formats it natively, as llama.cpp does.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace moelite {

// Harmony: gpt-oss's format (<|start|>ROLE<|message|>...<|end|>, channels for the assistant).
// DeepSeek2: "User: ...\n\nAssistant: ..." (DeepSeek-V2/V2-Lite-Chat); DeepSeek3: <｜User｜> and
// <｜Assistant｜> markers (DeepSeek-V3, R1 and their distillations).
enum class ChatTemplate { ChatML, Mistral, Llama3, Tulu, Harmony, DeepSeek2, DeepSeek3, Plain };

struct ChatMessage {
  std::string role;
  std::string content;
};

// The family a template's source belongs to; Plain for unknown or empty sources.
ChatTemplate detect_chat_template(const std::string& jinja_source);
const char* chat_template_name(ChatTemplate t);

// Parses a family name ("chatml", ...) as chat_template_name() spells it.
bool parse_chat_template_name(const std::string& name, ChatTemplate* out);
// A template option: a family name, or a template source whose family is recognised.
// MOELITE_ERR_INVALID_ARGUMENT when it is neither.
Status chat_template_from_option(const std::string& option, ChatTemplate* out);

// A formatted conversation: the text, and which byte ranges of it the template wrote (its markers
// and separators) as opposed to the messages' roles and contents. Tokenizing recognises special
// tokens only in the template's ranges, so message text is always text.
struct ChatText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> template_ranges;  // [begin, end), sorted, disjoint

  void add_template(const std::string& s);
  void add_message_text(const std::string& s) { text += s; }
};

// `eos_text` is the text of the vocabulary's EOS token (Tulu ends assistant turns with it).
ChatText format_chat_ranges(ChatTemplate t, const std::vector<ChatMessage>& messages, bool add_assistant_prompt,
                            const std::string& eos_text);
inline std::string format_chat(ChatTemplate t, const std::vector<ChatMessage>& messages, bool add_assistant_prompt,
                               const std::string& eos_text) {
  return format_chat_ranges(t, messages, add_assistant_prompt, eos_text).text;
}

}  // namespace moelite
