#include "base/status.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace moelite {

namespace {
// Fixed buffers, no allocation: fail() runs on out-of-memory paths and inside the C API's last
// catch, where a throwing allocation would escape through the C ABI. Longer texts are truncated.
constexpr size_t kMessageBytes = 2048;
thread_local char t_last_error[kMessageBytes];
// ApiErrorScope's copy of the message as it was when the outermost API call began.
thread_local int t_api_depth = 0;
thread_local bool t_saved = false;
thread_local char t_saved_error[kMessageBytes];

void save_before_write() {
  if (t_api_depth > 0 && !t_saved) {
    memcpy(t_saved_error, t_last_error, kMessageBytes);
    t_saved = true;
  }
}

struct LogSink {
  std::mutex mu;
  moelite_log_fn fn = nullptr;
  void* user = nullptr;
};
LogSink& sink() {
  static LogSink s;
  return s;
}
std::atomic<int> g_min_level{MOELITE_LOG_WARN};

void vformat(char* out, const char* fmt, va_list ap) {
  if (vsnprintf(out, kMessageBytes, fmt, ap) < 0) snprintf(out, kMessageBytes, "%s", fmt);
}
}  // namespace

Status fail(Status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  // Into a scratch buffer first: the arguments often include the previous message itself
  // (fail(st, "%s: %s", what, last_error_message())).
  thread_local char scratch[kMessageBytes];
  vformat(scratch, fmt, ap);
  va_end(ap);
  save_before_write();
  memcpy(t_last_error, scratch, kMessageBytes);
  log_msg(MOELITE_LOG_DEBUG, "error %d: %s", static_cast<int>(status), t_last_error);
  return status;
}

void clear_error() {
  save_before_write();
  t_last_error[0] = '\0';
}

ApiErrorScope::ApiErrorScope() {
  if (t_api_depth++ == 0) t_saved = false;
}

ApiErrorScope::~ApiErrorScope() {
  if (--t_api_depth == 0 && t_saved && !failed_) memcpy(t_last_error, t_saved_error, kMessageBytes);
  if (t_api_depth == 0) t_saved = false;
}
const char* last_error_message() { return t_last_error; }

bool log_enabled(moelite_log_level level) { return level >= g_min_level.load(std::memory_order_relaxed); }

void log_msg(moelite_log_level level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  va_list ap;
  va_start(ap, fmt);
  char text[kMessageBytes];
  vformat(text, fmt, ap);
  va_end(ap);
  LogSink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fn) {
    s.fn(level, text, s.user);
  } else {
    static const char* names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "moelite %s: %s\n", names[level < 4 ? level : 3], text);
  }
}

}  // namespace moelite

extern "C" MOELITE_API void moelite_set_log_callback(moelite_log_fn fn, void* user_data, moelite_log_level min_level) {
  using namespace moelite;
  LogSink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  s.fn = fn;
  s.user = fn ? user_data : nullptr;
  g_min_level.store(fn ? min_level : MOELITE_LOG_WARN, std::memory_order_relaxed);
}

extern "C" MOELITE_API const char* moelite_last_error(void) { return moelite::last_error_message(); }
