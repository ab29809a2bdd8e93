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

bool parse_chat_template_name(const std::string& name, ChatTemplate* out) {
  for (ChatTemplate t : {ChatTemplate::ChatML, ChatTemplate::Mistral, ChatTemplate::Llama3, ChatTemplate::Tulu,
                         ChatTemplate::Plain}) {
    if (name == chat_template_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

Status chat_template_from_option(const std::string& option, ChatTemplate* out) {
  if (parse_chat_template_name(option, out)) return MOELITE_OK;
  const ChatTemplate t = detect_chat_template(option);
  if (t == ChatTemplate::Plain)
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "chat template not recognised: give a family (chatml, mistral, llama3, tulu, plain) or a template "
                "source that uses one of their markers (<|im_start|>, [INST], <|start_header_id|>, <|user|>)");
  *out = t;
  return MOELITE_OK;
}

void ChatText::add_template(const std::string& s) {
  if (s.empty()) return;
  const size_t begin = text.size();
  text += s;
  if (!template_ranges.empty() && template_ranges.back().second == begin) {
    template_ranges.back().second = text.size();  // adjacent template text: one range
  } else {
    template_ranges.emplace_back(begin, text.size());
  }
}

ChatText format_chat_ranges(ChatTemplate t, const std::vector<ChatMessage>& msgs, bool add_assistant,
                            const std::string& eos_text) {
  // Roles come from the caller too, so they are message text, never template.
  ChatText out;
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  switch (t) {
    case ChatTemplate::ChatML:
      for (const auto& m : msgs) {
        tpl("<|im_start|>");
        msg(m.role);
        tpl("\n");
        msg(m.content);
        tpl("<|im_end|>\n");
      }
      if (add_assistant) tpl("<|im_start|>assistant\n");
      break;
    case ChatTemplate::Llama3:
      for (const auto& m : msgs) {
        tpl("<|start_header_id|>");
        msg(m.role);
        tpl("<|end_header_id|>\n\n");
        msg(m.content);
        tpl("<|eot_id|>");
      }
      if (add_assistant) tpl("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case ChatTemplate::Tulu:
      for (size_t i = 0; i < msgs.size(); ++i) {
        const auto& m = msgs[i];
        if (m.role == "assistant") {
          tpl("<|assistant|>\n");
          msg(m.content);
          tpl(eos_text + (i + 1 < msgs.size() ? "\n" : ""));
        } else {
          // <|system|> and <|user|> are tokens of their own: the template writes them whole. Other
          // roles stay text, so a role cannot smuggle in a marker.
          if (m.role == "system" || m.role == "user") {
            tpl("<|" + m.role + "|>\n");
          } else {
            tpl("<|");
            msg(m.role);
            tpl("|>\n");
          }
          msg(m.content);
          tpl("\n");
        }
      }
      if (add_assistant) tpl("<|assistant|>\n");
      break;
    case ChatTemplate::Mistral: {
      // The system message has no slot of its own: it opens the first user turn. BOS comes from
      // the tokenizer, so it is not written here.
      std::vector<const std::string*> system;
      for (const auto& m : msgs) {
        if (m.role == "system") {
          system.push_back(&m.content);
        } else if (m.role == "user") {
          tpl("[INST] ");
          for (const std::string* s : system) {
            msg(*s);
            tpl("\n\n");
          }
          system.clear();
          msg(m.content);
          tpl(" [/INST]");
        } else {
          tpl(" ");
          msg(m.content);
          tpl(eos_text);
        }
      }
      break;
    }
    case ChatTemplate::Plain:
      for (const auto& m : msgs) {
        msg(m.role);
        tpl(": ");
        msg(m.content);
        tpl("\n");
      }
      if (add_assistant) tpl("assistant: ");
      break;
  }
  return out;
}

}  // namespace moelite
