// Fuzz target: the CLI's option parser (samples/cli/options.cpp). The input is a command line,
// arguments separated by NUL bytes; the first byte picks one of the command shapes the CLI uses
// (model options, generation options, a command without a model). Checked: no crash or hang; an
// error always has a message; an accepted option is stored under all its aliases; switches hold
// "1"; numbers read back in range; sizes obey parse_size's promises (bytes in [1, 2^62]); every
// value is accepted as an expert budget or refused with a message.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "moelite.h"
#include "samples/cli/options.h"

namespace {

const std::vector<cli::Command>& commands() {
  using cli::Option;
  static const std::vector<cli::Command> all = {
      {"run", "-m MODEL -p PROMPT", "fuzz",
       cli::with_groups({{{"-p"}, "PROMPT", ""}, {{"-f"}, "FILE", ""}, {{"-c"}, "CTX", ""}},
                        {&cli::generate_options(), &cli::model_options()})},
      {"info", "-m MODEL", "fuzz", cli::with_groups({{{"--json"}, "", ""}}, {&cli::model_options()})},
      {"trace replay", "-f TRACE --capacity N", "fuzz",
       {{{"-f"}, "TRACE", ""}, {{"--capacity"}, "N|P%", ""}, {{"--global"}, "", ""}, {{"--lookahead"}, "N", ""}}},
  };
  return all;
}

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "invariant broken: %s\n", what);
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const cli::Command& cmd = commands()[data[0] % commands().size()];
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(cur);
  if (args.size() > 64) return 0;
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());

  cli::Args parsed;
  std::string error;
  const cli::ParseResult r = parsed.parse(static_cast<int>(argv.size()), argv.data(), cmd, &error);
  check((r == cli::ParseResult::Error) == !error.empty(), "an error comes with a message, and only then");
  if (r == cli::ParseResult::Error) return 0;
  for (const auto& o : cmd.options) {
    for (const auto& name : o.names) {
      if (!parsed.has(name)) continue;
      for (const auto& alias : o.names) check(parsed.has(alias), "every alias holds the value");
      if (o.value.empty()) check(parsed.get(name) == "1", "a switch holds 1");
      int64_t n = 0;
      std::string e;
      if (parsed.get_int(name, 0, &n, &e)) check(n >= INT32_MIN && n <= INT32_MAX, "integers fit int32");
      double d = 0;
      if (parsed.get_double(name, 0, &d, &e)) check(std::isfinite(d), "numbers are finite");
      uint64_t bytes = 0;
      if (cli::parse_size(name, parsed.get(name), &bytes, &e))
        check(bytes >= 1 && bytes <= (uint64_t{1} << 62), "bytes lie in [1, 2^62]");
      // A budget: accepted or refused with a message, never anything else.
      moelite_model_params* mp = moelite_model_params_create();
      if (mp) {
        const moelite_status st = moelite_model_params_set_expert_budget_text(mp, parsed.get(name).c_str());
        check(st == MOELITE_OK || (st == MOELITE_ERR_INVALID_ARGUMENT && *moelite_last_error()),
              "a budget's text is accepted or refused with a message");
        moelite_model_params_free(mp);
      }
    }
  }
  return 0;
}
