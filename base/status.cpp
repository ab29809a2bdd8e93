#include "base/status.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace moelite {

namespace {
thread_local std::string t_last_error;

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

std::string vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return fmt;
  std::string s(static_cast<size_t>(n), '\0');
  vsnprintf(s.data(), s.size() + 1, fmt, ap);
  return s;
}
}  // namespace

Status fail(Status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  t_last_error = vformat(fmt, ap);
  va_end(ap);
  log_msg(MOELITE_LOG_DEBUG, "error %d: %s", static_cast<int>(status), t_last_error.c_str());
  return status;
}

void clear_error() { t_last_error.clear(); }
const char* last_error_message() { return t_last_error.c_str(); }

bool log_enabled(moelite_log_level level) { return level >= g_min_level.load(std::memory_order_relaxed); }

void log_msg(moelite_log_level level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  va_list ap;
  va_start(ap, fmt);
  std::string text = vformat(fmt, ap);
  va_end(ap);
  LogSink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fn) {
    s.fn(level, text.c_str(), s.user);
  } else {
    static const char* names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "moelite %s: %s\n", names[level < 4 ? level : 3], text.c_str());
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
