// Shared pieces of the `moelite` command-line tool: argument parsing, model loading, errors.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moelite.h"
#include "options.h"

namespace cli {

// Prints "moelite: error: NAME: message" for a failed status and returns exit code 1.
int report(moelite_status status, const char* what);
// A progress bar on stderr (a moelite_progress_fn).
int progress_bar(float progress, void* user);
int usage_error(const std::string& message);

// Loads -m/--model with the common options (-t/--threads, --backend, --no-mmap). Shows a
// progress bar when stderr is a terminal. Returns 0 on success, else the exit code after
// printing the error.
int load_model(const Args& args, moelite_model** out, bool vocab_only = false);
// Frees a model load_model gave: first ends its --trace-events timeline, saying so when the trace
// cannot be written (then finish_output turns the command's success into exit status 1).
void free_model(moelite_model* model);
// --quality-sample and --quality-target into context parameters; 0 or a usage error's status.
int quality_params_from_args(const Args& args, moelite_context_params* cp);
// The quality meter's line on stderr (nothing when it compared nothing).
void print_quality(moelite_context* ctx);

// The expert budget in one line: none, a fixed size, or auto with the terms it was sized from.
std::string budget_summary(const moelite_model* model);

// Sampling and stopping options shared by `run` and `chat` (-n, --temp, --top-k, --top-p,
// --min-p, --repeat-penalty, --repeat-last-n, --seed, --stop). Returns 0 or an exit code.
int generate_params_from_args(const Args& args, moelite_generate_params* p);

// Flushes stdout and reports a failed write (a full disk, a closed pipe, /dev/full) as exit code 1:
// output that did not arrive is a failure, not a success.
int finish_output(int exit_code);

// The tokens of a text file's bytes as given (no BOS/EOS, no special-token parsing), as
// `perplexity`, `calibrate` and `trace record` read their corpus. Returns 0 or an exit code.
int tokenize_file(moelite_model* model, const std::string& path, std::vector<int32_t>* out);

// Comma-separated token ids.
bool parse_tokens(const std::string& text, std::vector<int32_t>* out, std::string* error);

std::string json_escape(const std::string& s);
// The process allocator: "mimalloc X.Y.Z" when the executable was linked with it, else "libc".
std::string process_allocator();

// The whole file's bytes, unchanged (a FIFO's too: `-f <(command)`), up to kMaxInputFileBytes;
// false with the reason in *why when it cannot be read or is larger (`-f /dev/zero` must end).
constexpr uint64_t kMaxInputFileBytes = uint64_t{256} << 20;
bool read_file(const std::string& path, std::string* out, std::string* why);
// Opens /dev/null on whichever of the standard descriptors 0, 1 and 2 is closed (`moelite chat <&-`),
// so that no file the process opens later takes its number and is read as input or written over.
void open_standard_descriptors();

// Best-of-5 read bandwidth in GB/s streaming `bytes` with `threads` threads (membw.cpp).
double measure_read_bandwidth(int threads, size_t bytes);
// O_DIRECT read speed of a file in GB/s with `threads` concurrent readers (storage_bw.cpp).
double measure_storage_bandwidth(const std::string& path, size_t bytes, int threads);
// The same on a directory's file system: writes a scratch file of `bytes` there, measures, removes
// it. 0 when the directory is not writable.
double measure_directory_storage_bandwidth(const std::string& dir, size_t bytes, int threads);

int cmd_info(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_batch(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_trace_record(int argc, char** argv);
int cmd_trace_replay(int argc, char** argv);
int cmd_calibrate(int argc, char** argv);
int cmd_pack(int argc, char** argv);

}  // namespace cli
