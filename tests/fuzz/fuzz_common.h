// Shared helpers of the libFuzzer targets: a per-process scratch file, silent logging, and the
// rule that a status of MOELITE_ERR_INTERNAL (an exception the C API caught, a broken invariant) is
// a bug the fuzzer must report, like a crash.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "moelite.h"

namespace moelite_fuzz {

// A file named after the process (libFuzzer's -jobs/-workers run several processes at once).
inline std::string scratch_path(const char* tag) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/moelite_fuzz_" + tag + "_" + std::to_string(::getpid());
}

inline bool write_file(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

inline void quiet_logs() {
  static bool done = false;
  if (!done) moelite_set_log_callback([](moelite_log_level, const char*, void*) {}, nullptr, MOELITE_LOG_NONE);
  done = true;
}

inline void check(moelite_status st, const char* what) {
  if (st == MOELITE_ERR_INTERNAL) {
    std::fprintf(stderr, "%s: MOELITE_ERR_INTERNAL: %s\n", what, moelite_last_error());
    std::abort();
  }
}

}  // namespace moelite_fuzz
