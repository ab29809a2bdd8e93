#include "core/text/chat_template.h"

#include <ctime>

namespace moelite {

namespace {

// The system message gpt-oss's own template writes before every conversation (no tools, default
// identity and reasoning effort), with today's local date as its strftime_now("%Y-%m-%d") does.
std::string harmony_system_text() {
  char date[16] = "1970-01-01";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (localtime_r(&now, &local)) std::strftime(date, sizeof date, "%Y-%m-%d", &local);
  return std::string(
             "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
             "Current date: ") +
         date +
         "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
         "every message.";
}

}  // namespace

ChatTemplate detect_chat_template(const std::string& src) {
  auto has = [&](const char* s) { return src.find(s) != std::string::npos; };
  if (has("<|im_start|>")) return ChatTemplate::ChatML;  // Qwen1.5/2/3 (MoE too)
  if (has("<|start_header_id|>")) return ChatTemplate::Llama3;
  if (has("<|user|>") && has("<|assistant|>")) return ChatTemplate::Tulu;    // OLMoE-Instruct
  if (has("[INST]")) return ChatTemplate::Mistral;                           // Mixtral-Instruct
  if (has("<|start|>") && has("<|channel|>")) return ChatTemplate::Harmony;  // gpt-oss
  if (has("'Assistant: ' + message['content'] + eos_token")) return ChatTemplate::DeepSeek2;
  if (has("<｜Assistant｜>") && has("<｜User｜>") && has("<｜end▁of▁sentence｜>")) return ChatTemplate::DeepSeek3;
  return ChatTemplate::Plain;
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML: return "chatml";
    case ChatTemplate::Mistral: return "mistral";
    case ChatTemplate::Llama3: return "llama3";
    case ChatTemplate::Tulu: return "tulu";
    case ChatTemplate::Harmony: return "harmony";
    case ChatTemplate::DeepSeek2: return "deepseek2";
    case ChatTemplate::DeepSeek3: return "deepseek3";
    case ChatTemplate::Plain: return "plain";
  }
  return "plain";
}

bool parse_chat_template_name(const std::string& name, ChatTemplate* out) {
  for (ChatTemplate t :
       {ChatTemplate::ChatML, ChatTemplate::Mistral, ChatTemplate::Llama3, ChatTemplate::Tulu, ChatTemplate::Harmony,
        ChatTemplate::DeepSeek2, ChatTemplate::DeepSeek3, ChatTemplate::Plain}) {
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
                "chat template not recognised: give a family (chatml, mistral, llama3, tulu, harmony, deepseek2, "
                "deepseek3, plain) or a template source that uses one of their markers (<|im_start|>, [INST], "
                "<|start_header_id|>, <|user|>, <|start|> with <|channel|>, 'Assistant: ' + message['content'] + "
                "eos_token, <｜User｜> with <｜Assistant｜>)");
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

namespace {

// One writer per family. Roles come from the caller too, so they are message text, never template.
void format_chatml(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                   const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  for (const auto& m : msgs) {
    tpl("<|im_start|>");
    msg(m.role);
    tpl("\n");
    msg(m.content);
    tpl("<|im_end|>\n");
  }
  if (add_assistant) tpl("<|im_start|>assistant\n");
}

void format_llama3(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                   const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  for (const auto& m : msgs) {
    tpl("<|start_header_id|>");
    msg(m.role);
    tpl("<|end_header_id|>\n\n");
    msg(m.content);
    tpl("<|eot_id|>");
  }
  if (add_assistant) tpl("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

void format_tulu(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant, const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
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
}

void format_mistral(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                    const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
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
}

void format_harmony(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                    const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  // gpt-oss's template without tools: its system message, the first system/developer message
  // as the developer's instructions, then user turns and the assistant's final-channel answers
  // (the last one ends with <|return|> when no reply is asked for, as in training data).
  // Differences, for inputs that template refuses or drops: a later system/developer message
  // becomes one more developer message instead of vanishing, and any other role is written
  // as <|start|>ROLE<|message|>...<|end|>.
  tpl("<|start|>system<|message|>" + harmony_system_text() + "<|end|>");
  size_t first = 0;
  auto developer = [&](const std::string& content) {
    if (content.empty()) return;
    tpl("<|start|>developer<|message|># Instructions\n\n");
    msg(content);
    tpl("\n\n<|end|>");
  };
  if (!msgs.empty() && (msgs[0].role == "system" || msgs[0].role == "developer")) {
    developer(msgs[0].content);
    first = 1;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    if (m.role == "user") {
      tpl("<|start|>user<|message|>");
      msg(m.content);
      tpl("<|end|>");
    } else if (m.role == "assistant") {
      tpl("<|start|>assistant<|channel|>final<|message|>");
      msg(m.content);
      tpl(i + 1 == msgs.size() && !add_assistant ? "<|return|>" : "<|end|>");
    } else if (m.role == "system" || m.role == "developer") {
      developer(m.content);
    } else {
      tpl("<|start|>");
      msg(m.role);
      tpl("<|message|>");
      msg(m.content);
      tpl("<|end|>");
    }
  }
  if (add_assistant) tpl("<|start|>assistant");
}

void format_deepseek2(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                      const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  // DeepSeek-V2-Chat's template (as llama.cpp formats it): system text, "User: " turns,
  // "Assistant: " answers ending in EOS, the prompt "Assistant:". Another role is written
  // like a user turn under its own name rather than dropped.
  const std::string eos = eos_text.empty() ? "<｜end▁of▁sentence｜>" : eos_text;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      msg(m.content);
      tpl("\n\n");
    } else if (m.role == "assistant") {
      tpl("Assistant: ");
      msg(m.content);
      tpl(eos);
    } else {
      if (m.role == "user") {
        tpl("User: ");
      } else {
        msg(m.role);
        tpl(": ");
      }
      msg(m.content);
      tpl("\n\n");
    }
  }
  if (add_assistant) tpl("Assistant:");
}

void format_deepseek3(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                      const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  // DeepSeek-V3's template without tools: system text first, <｜User｜> turns, <｜Assistant｜>
  // answers ending in <｜end▁of▁sentence｜>. Another role is a user turn (not dropped).
  for (const auto& m : msgs) {
    if (m.role == "system") {
      msg(m.content);
      tpl("\n\n");
    } else if (m.role == "assistant") {
      tpl("<｜Assistant｜>");
      msg(m.content);
      tpl("<｜end▁of▁sentence｜>");
    } else {
      tpl("<｜User｜>");
      msg(m.content);
    }
  }
  if (add_assistant) tpl("<｜Assistant｜>");
}

void format_plain(ChatText& out, const std::vector<ChatMessage>& msgs, bool add_assistant,
                  const std::string& eos_text) {
  auto tpl = [&](const std::string& s) { out.add_template(s); };
  auto msg = [&](const std::string& s) { out.add_message_text(s); };
  for (const auto& m : msgs) {
    msg(m.role);
    tpl(": ");
    msg(m.content);
    tpl("\n");
  }
  if (add_assistant) tpl("assistant: ");
}

}  // namespace

ChatText format_chat_ranges(ChatTemplate t, const std::vector<ChatMessage>& msgs, bool add_assistant,
                            const std::string& eos_text) {
  ChatText out;
  switch (t) {
    case ChatTemplate::ChatML: format_chatml(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::Llama3: format_llama3(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::Tulu: format_tulu(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::Mistral: format_mistral(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::Harmony: format_harmony(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::DeepSeek2: format_deepseek2(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::DeepSeek3: format_deepseek3(out, msgs, add_assistant, eos_text); break;
    case ChatTemplate::Plain: format_plain(out, msgs, add_assistant, eos_text); break;
  }
  return out;
}

}  // namespace moelite
