// Command-line options of the `moelite` tool: each command declares the options it accepts, and
// the parser refuses anything else. A misspelt option must not run with a default in its place
// (`--budjet 25%` running with every expert resident is a silent wrong result), so unknown
// options, missing values and stray arguments are usage errors, with a suggestion when the
// spelling is close to a known option.
//
// Kept free of the library so the parser can be fuzzed on its own (tests/fuzz/fuzz_cli_options.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cli {

struct Option {
  std::vector<std::string> names;  // aliases, e.g. {"-m", "--model"}; the first is shown first
  std::string value;               // placeholder of the value ("MODEL"), empty for a switch
  std::string help;
};

struct Command {
  std::string name;      // "run", "trace replay"
  std::string synopsis;  // "-m MODEL -p PROMPT [options]"
  std::string summary;   // one line: what the command does
  std::vector<Option> options;
};

// Options that several commands share, in families: what the top-level help lists and what each
// command's own help appends to its options.
struct OptionFamily {
  std::string name;      // "expert memory"
  std::string taken_by;  // which commands take it: "every command that loads a model"
  std::vector<Option> options;
};
const std::vector<OptionFamily>& option_families();
// The families, one paragraph each naming its options (the top-level help's list).
std::string families_text();

// The options every command that loads a model accepts (-m, threads, backend, budget, ...).
const std::vector<Option>& model_options();
// Sampling and stopping options of `run`, `chat` and `trace record`.
const std::vector<Option>& generate_options();
// The quality meter's and governor's options of `run`, `chat` and `perplexity`.
const std::vector<Option>& quality_options();
// A command's options: its own followed by the given groups.
std::vector<Option> with_groups(std::vector<Option> own, const std::vector<const std::vector<Option>*>& groups);

enum class ParseResult { Ok, Help, Error };

// Parsed options of one command. Values are stored under every alias of their option, so
// `get("-m")` and `get("--model")` agree.
class Args {
 public:
  // Accepts "--name VALUE", "--name=VALUE", "-x VALUE" and switches; "-h"/"--help" anywhere gives
  // Help. Error (with a message naming the argument) for an unknown option, a switch given a value,
  // an option without its value, or an argument that is not an option.
  ParseResult parse(int argc, const char* const* argv, const Command& cmd, std::string* error);
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // The last value given for the option (options may be repeated; the last one wins).
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // Every value given for the option, in order (for repeatable options such as --stop).
  std::vector<std::string> get_all(const std::string& name) const;
  // Integer option; false with a message if present but not an integer in [min, max] (by default
  // the int32_t range, where almost every integer option ends up).
  bool get_int(const std::string& name, int64_t fallback, int64_t* out, std::string* error, int64_t min = INT32_MIN,
               int64_t max = INT32_MAX) const;
  // Finite number option; false with a message if present but not one.
  bool get_double(const std::string& name, double fallback, double* out, std::string* error) const;
  // A number option as JSON: the parsed value written out, not the text given ("+1", ".5" and
  // "007" parse but are not JSON numbers); `fallback` when absent or not a number (for options
  // that load_model has already checked).
  std::string json_number(const std::string& name, double fallback) const;
  // Replaces every value of an option with `value` (a command deciding an option for the user,
  // such as moelite batch's planned --budget); erase() removes it.
  void set(const std::string& name, const std::string& value) { values_[name] = {value}; }
  void erase(const std::string& name) { values_.erase(name); }

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// A size in bytes given on the command line ("2GiB", "512MiB", "1.5G", "123456"), parsed by the
// library (moelite_parse_size) so every tool spells sizes alike. False with a message naming the
// option for anything else.
bool parse_size(const std::string& option, const std::string& text, uint64_t* out, std::string* error);

// The command's usage text: synopsis, summary and one line per option.
std::string usage_text(const Command& cmd);

// Parses; on Help prints the usage to stdout and sets *exit_code = 0, on Error prints the message
// to stderr and sets *exit_code = 2. Returns true when the command should go on.
bool parse_command_line(int argc, char** argv, const Command& cmd, Args* args, int* exit_code);

}  // namespace cli
