// Chat prompt formatting for the template families found in MoE model files. GGUF carries the
// template as Jinja source (tokenizer.chat_template); rather than embedding a Jinja engine, moelite
// recognises the family from marker strings and formats it natively, as llama.cpp does.
#pragma once
#include <string>
#include <vector>

namespace moelite {

enum class ChatTemplate { ChatML, Mistral, Llama3, Tulu, Plain };

struct ChatMessage {
  std::string role;
  std::string content;
};

// The family a template's source belongs to; Plain for unknown or empty sources.
ChatTemplate detect_chat_template(const std::string& jinja_source);
const char* chat_template_name(ChatTemplate t);

// `eos_text` is the text of the vocabulary's EOS token (Tulu ends assistant turns with it).
std::string format_chat(ChatTemplate t, const std::vector<ChatMessage>& messages, bool add_assistant_prompt,
                        const std::string& eos_text);

}  // namespace moelite
