#include "chat_transcript.h"

#include <sys/stat.h>

#include <cerrno>

#include "cli.h"
#include "core/support/json.h"
#include "platforms/platform.h"

namespace cli {

namespace {
constexpr const char* kFormat = "moelite-chat";
constexpr int kVersion = 1;
}  // namespace

std::string transcript_path(const std::string& session_path) { return session_path + ".chat.json"; }

bool save_transcript(const std::string& path, const ChatTranscript& t, std::string* why) {
  namespace json = moelite::json;
  std::string text = "{\"format\": " + json::quote(kFormat) + ", \"version\": " + std::to_string(kVersion) +
                     ", \"messages\": [";
  for (size_t i = 0; i < t.roles.size(); ++i)
    text += std::string(i ? ",\n  " : "\n  ") + "{\"role\": " + json::quote(t.roles[i]) +
            ", \"content\": " + json::quote(t.contents[i]) + "}";
  text += "\n]}\n";
  const moelite::platform::WritePiece piece{text.data(), text.size()};
  if (moelite::platform::write_file_atomic(path, &piece, 1) != MOELITE_OK) {
    *why = moelite_last_error();
    return false;
  }
  return true;
}

TranscriptStatus load_transcript(const std::string& path, ChatTranscript* t, std::string* why) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 && errno == ENOENT) return TranscriptStatus::Missing;
  std::string text;
  if (!read_file(path, &text, why)) return TranscriptStatus::Invalid;
  moelite::json::Value v;
  std::string error;
  if (!moelite::json::parse(text, &v, &error)) {
    *why = "'" + path + "' is not JSON: " + error;
    return TranscriptStatus::Invalid;
  }
  const moelite::json::Value* format = v.find("format");
  const moelite::json::Value* version = v.find("version");
  const moelite::json::Value* messages = v.find("messages");
  if (!format || !format->is_string() || format->string != kFormat || !version || !version->is_number() ||
      version->number != kVersion || !messages || !messages->is_array()) {
    *why = "'" + path + "' is not a moelite chat transcript (version " + std::to_string(kVersion) + ")";
    return TranscriptStatus::Invalid;
  }
  ChatTranscript out;
  for (const moelite::json::Value& m : messages->array) {
    const moelite::json::Value* role = m.find("role");
    const moelite::json::Value* content = m.find("content");
    if (!role || !role->is_string() || !content || !content->is_string() ||
        (role->string != "system" && role->string != "user" && role->string != "assistant") ||
        (role->string == "system" && !out.roles.empty())) {
      *why = "'" + path + "': each message needs a role (system first, then user and assistant) and a content string";
      return TranscriptStatus::Invalid;
    }
    out.roles.push_back(role->string);
    out.contents.push_back(content->string);
  }
  *t = std::move(out);
  return TranscriptStatus::Loaded;
}

}  // namespace cli
