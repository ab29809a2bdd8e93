// Internal error reporting: every fallible internal function returns a Status; the message goes
// to the calling thread's last-error slot, which moelite_last_error() exposes.
#pragma once
#include <string>
#include "moelite.h"

namespace moelite {

using Status = moelite_status;

// Records `msg` (printf-style) as the calling thread's last error and returns `status`, so
// failures read as `return fail(MOELITE_ERR_IO, "read %s: %s", path, strerror(errno));`.
Status fail(Status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void clear_error();
const char* last_error_message();

// The public promise of moelite_last_error(): only a *failing* API call changes the message.
// Internal code may fail and recover (a probe, a fallback) and clear the slot; an ApiErrorScope
// at the entry of each API function saves the message before the first such write and puts it
// back when the call succeeds. Nested scopes (API functions calling each other) act once, at the
// outermost. No allocation: it runs on out-of-memory paths.
class ApiErrorScope {
 public:
  ApiErrorScope();
  ~ApiErrorScope();
  ApiErrorScope(const ApiErrorScope&) = delete;
  ApiErrorScope& operator=(const ApiErrorScope&) = delete;
  // The call fails: its message stays.
  Status finish(Status st) {
    failed_ = failed_ || st != MOELITE_OK;
    return st;
  }

 private:
  bool failed_ = false;
};

// Logging through the process-wide sink set by moelite_set_log_callback.
void log_msg(moelite_log_level level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
bool log_enabled(moelite_log_level level);

#define MOELITE_TRY(expr)              \
  do {                                 \
    ::moelite::Status _st = (expr);    \
    if (_st != MOELITE_OK) return _st; \
  } while (0)

}  // namespace moelite
