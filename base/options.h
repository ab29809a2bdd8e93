// The MOELITE_* environment variables: one table (options.cpp) lists each one's name, kind,
// default, accepted values and meaning, and every read goes through here (mimalloc's options.c is
// the model). None is needed in normal use: options belong in the API's parameter objects; these
// exist for testing, benchmarking and diagnosing. docs/ENVIRONMENT.md is generated from the table
// (tools/gen_environment_doc.sh; the ctest `environment_doc` fails when the two differ).
//
// A malformed value is an error, never a silent fallback: check_options() names the first one, and
// every model load runs it (MOELITE_ERR_INVALID_ARGUMENT). Code that reads an option before any
// load (a kernel table picked at first use) gets the documented default for a malformed value, and
// the load that follows refuses it.
#pragma once
#include <cstdint>
#include <string>

#include "base/status.h"

namespace moelite {

enum class Option : int {
  // CPU backend
  Isa,
  PrefetchRows,
  DecodeTiles,
  MatrixMinTokens,
  GroupedRows,
  WeightCopies,
  // expert store and storage
  HugePages,
  Io,
  IoTimeout,
  IoThreads,
  IoBytesInFlight,
  PrefillLookahead,
  PredictMinPrecision,
  PackedExperts,
  FaultInject,
  ZstdLibrary,
  // Vulkan backend
  VulkanLoader,
  VkDevice,
  VkValidation,
  VkPortable,
  VkAsDiscrete,
  VkMaxBuffer,
  // CUDA backend
  CudaEmulator,
  CudaProducts,
  kCount
};

enum class OptionKind {
  Integer,  // a decimal integer in [lo, hi]
  Number,   // a finite decimal number in [lo, hi]
  Flag,     // 0 or 1
  Choice,   // one of `choices` (a '|'-separated list)
  Text,     // any non-empty text (a path, a library name)
  Custom,   // checked by `check`
};

struct OptionInfo {
  Option id;
  const char* name;  // MOELITE_...
  OptionKind kind;
  double lo, hi;             // Integer, Number
  const char* choices;       // Choice: "a|b|c"
  const char* default_text;  // what applies when the variable is unset, for the docs
  const char* meaning;
  // Custom kinds only: true when `text` is acceptable, else false with what was expected in *why.
  bool (*check)(const char* text, std::string* why);
};

const OptionInfo& option_info(Option o);
// Every option, in table order (for the docs generator and the tests).
const OptionInfo* options_table(int* count);

// The variable's text when it is set and valid, else null (unset, empty or malformed: the caller
// applies its default, and check_options() refuses the malformed value at the next load). Read on
// every call: tests and hosts may change the environment between calls.
const char* option_text(Option o);
// The value when the variable is set and valid; false (and *out untouched) when unset or malformed,
// so the caller applies its own default.
bool option_int(Option o, int64_t* out);
bool option_number(Option o, double* out);
bool option_flag(Option o, bool* out);

// Whether `text` is an acceptable value of `o`; *why says what was expected when it is not.
bool option_value_valid(Option o, const char* text, std::string* why);
// MOELITE_ERR_INVALID_ARGUMENT when `o` is set to a malformed value (the message names it, its value
// and what was expected), else MOELITE_OK: for a reader that must refuse rather than fall back.
Status check_option(Option o);
// check_option for every row, in table order: the first malformed one's error
// ("environment variable MOELITE_IO_TIMEOUT='nan': expected a number in [0.001, 86400] (default: 120)").
Status check_options();

// Whether this process runs under valgrind (it preloads its vgpreload_*.so into the program): the
// one variable outside the table the library reads, here so that every read of the environment
// stays in this file.
bool running_under_valgrind();

}  // namespace moelite
