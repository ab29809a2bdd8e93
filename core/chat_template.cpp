#include "core/chat_template.h"

namespace moelite {

ChatTemplate detect_chat_template(const std::string& src) {
  auto has = [&](const char* s) { return src.find(s) != std::string::npos; };
  if (has("<|im_start|>")) return ChatTemplate::ChatML;  // Qwen1.5/2/3 (MoE too)
  if (has("<|start_header_id|>")) return ChatTemplate::Llama3;
  if (has("<|user|>") && has("<|assistant|>")) return ChatTemplate::Tulu;  // OLMoE-Instruct
  if (has("[INST]")) return ChatTemplate::Mistral;                         // Mixtral-Instruct
  return ChatTemplate::Plain;
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML: return "chatml";
    case ChatTemplate::Mistral: return "mistral";
    case ChatTemplate::Llama3: return "llama3";
    case ChatTemplate::Tulu: return "tulu";
    case ChatTemplate::Plain: return "plain";
  }
  return "plain";
}

std::string format_chat(ChatTemplate t, const std::vector<ChatMessage>& msgs, bool add_assistant,
                        const std::string& eos_text) {
  std::string out;
  switch (t) {
    case ChatTemplate::ChatML:
      for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_assistant) out += "<|im_start|>assistant\n";
      break;
    case ChatTemplate::Llama3:
      for (const auto& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      if (add_assistant) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatTemplate::Tulu:
      for (size_t i = 0; i < msgs.size(); ++i) {
        const auto& m = msgs[i];
        if (m.role == "assistant") {
          out += "<|assistant|>\n" + m.content + eos_text + (i + 1 < msgs.size() ? "\n" : "");
        } else {
          out += "<|" + m.role + "|>\n" + m.content + "\n";
        }
      }
      if (add_assistant) out += "<|assistant|>\n";
      break;
    case ChatTemplate::Mistral: {
      // The system message has no slot of its own: it opens the first user turn. BOS comes from
      // the tokenizer, so it is not written here.
      std::string system;
      for (const auto& m : msgs) {
        if (m.role == "system") {
          system += (system.empty() ? "" : "\n\n") + m.content;
        } else if (m.role == "user") {
          out += "[INST] " + (system.empty() ? "" : system + "\n\n") + m.content + " [/INST]";
          system.clear();
        } else {
          out += " " + m.content + eos_text;
        }
      }
      break;
    }
    case ChatTemplate::Plain:
      for (const auto& m : msgs) out += m.role + ": " + m.content + "\n";
      if (add_assistant) out += "assistant: ";
      break;
  }
  return out;
}

}  // namespace moelite
