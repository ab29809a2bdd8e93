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

// The shipped model on the CPU backend with one thread (vocab_only: its tokenizer and chat template
// alone), loaded once by a target's first input; a target cannot run without it.
inline moelite_model* load_shipped_model(bool vocab_only) {
  moelite_model_params* p = moelite_model_params_create();
  moelite_model_params_set_backend(p, MOELITE_BACKEND_CPU);
  moelite_model_params_set_threads(p, 1);
  moelite_model_params_set_vocab_only(p, vocab_only ? 1 : 0);
  moelite_model* m = nullptr;
  if (moelite_model_load(MOELITE_SOURCE_DIR "/models/moelite-tiny-qwen3moe-Q8_0.gguf", p, &m) != MOELITE_OK) {
    std::fprintf(stderr, "cannot load the shipped model: %s\n", moelite_last_error());
    std::abort();
  }
  moelite_model_params_free(p);
  return m;
}

inline void check(moelite_status st, const char* what) {
  if (st == MOELITE_ERR_INTERNAL) {
    std::fprintf(stderr, "%s: MOELITE_ERR_INTERNAL: %s\n", what, moelite_last_error());
    std::abort();
  }
}

}  // namespace moelite_fuzz
