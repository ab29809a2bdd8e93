// The conversation of `moelite chat --session FILE`, kept beside the session as FILE.chat.json.
// The session file holds the context's tokens and cache (moelite_context_save); the chat also needs
// its messages as text to format the next turn, so that the next prompt starts with the saved
// tokens and reuses them. Written after the session, by the same rule as every output
// (platform::write_file_atomic).
#pragma once
#include <string>
#include <vector>

namespace cli {

struct ChatTranscript {
  std::vector<std::string> roles, contents;  // "system", "user", "assistant"
};

std::string transcript_path(const std::string& session_path);

// false with `why` when the file cannot be written.
bool save_transcript(const std::string& path, const ChatTranscript& t, std::string* why);

enum class TranscriptStatus { Loaded, Missing, Invalid };
// Invalid (with `why`) for a file that is not a transcript: the chat refuses to start rather than
// replace it.
TranscriptStatus load_transcript(const std::string& path, ChatTranscript* t, std::string* why);

}  // namespace cli
