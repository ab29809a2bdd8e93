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

// Logging through the process-wide sink set by moelite_set_log_callback.
void log_msg(moelite_log_level level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
bool log_enabled(moelite_log_level level);

#define MOELITE_TRY(expr)              \
  do {                                 \
    ::moelite::Status _st = (expr);    \
    if (_st != MOELITE_OK) return _st; \
  } while (0)

}  // namespace moelite
