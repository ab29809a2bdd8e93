// moelite: command-line front end of the library (built as build/bin/moelite).
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"

static void print_help() {
  printf(
      "moelite %s — Mixture-of-Experts inference under a memory budget\n\n"
      "usage: moelite COMMAND [options]\n\n"
      "commands:\n"
      "  info    -m MODEL [--json]                      model facts (arch, experts, bytes, budget)\n"
      "  info    --platform [-m MODEL] [--json]         this machine: board, cores, memory, cgroup, backends, storage\n"
      "  perplexity -m MODEL -f TEXT [--ctx 256] [--json]  windowed perplexity of a text\n"
      "  trace record -m MODEL (-f TEXT | -p PROMPT -n N) -o TRACE   routing as JSON lines\n"
      "  trace replay -f TRACE --capacity N|P% [--global] [--policy cyclic|lru|lfu|decay|static|belady|all]\n"
      "          [--half-life H] [--lookahead N] [--json]   cache policies on a routing trace, Belady as the bound\n"
      "  calibrate -m MODEL -f CORPUS -o PROFILE [--ctx 256] [--max-tokens N] [--stride S] [--holdout H] [--json]\n"
      "          sensitivities, hit curves and predictors for adaptive gating, prefetch and cache allocation\n"
      "  logits  -m MODEL --tokens 1,2,3 --out FILE [-b N]  float32 logits, n_tokens x n_vocab, row-major\n"
      "  bench   -m MODEL [-p N] [-n N] [-r N] [--n-seq N] [-f TEXT] [--json]  prefill and decode speed\n"
      "  batch   -m MODEL -f REQUESTS.jsonl [-o OUT.jsonl] [--n-seq N] [-b N]  many requests decoded together\n"
      "  run     -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
      "          [--repeat-penalty R] [--seed S] [--stop STR] [-c CTX] [--session FILE]   stream a completion\n"
      "  chat    -m MODEL [--system TEXT] [-c CTX] [--session FILE] [sampling options]  interactive multi-turn chat\n"
      "  tokenize -m MODEL (-p TEXT | -f FILE) [--add-special] [--parse-special]  token ids\n"
      "  pack    -m MODEL [-o OUT] [--json]             the packed expert file (MODEL.experts): one read per expert\n"
      "  version                                        library version\n\n"
      "'moelite COMMAND --help' lists every option of a command. Shared options, by family:\n",
      moelite_version_string());
  fputs(cli::families_text().c_str(), stdout);
  printf("\nEnvironment variables (MOELITE_IO, MOELITE_ISA, ...): docs/ENVIRONMENT.md.\n");
}

static int dispatch(int argc, char** argv);

// Every command's result goes through finish_output: text that could not be written (a full disk,
// a closed pipe, `> /dev/full`) turns a success into exit status 1.
int main(int argc, char** argv) {
  cli::open_standard_descriptors();
  return cli::finish_output(dispatch(argc, argv));
}

static int dispatch(int argc, char** argv) {
  if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  if (!strcmp(cmd, "info")) return cli::cmd_info(argc - 2, argv + 2);
  if (!strcmp(cmd, "logits")) return cli::cmd_logits(argc - 2, argv + 2);
  if (!strcmp(cmd, "bench")) return cli::cmd_bench(argc - 2, argv + 2);
  if (!strcmp(cmd, "run")) return cli::cmd_run(argc - 2, argv + 2);
  if (!strcmp(cmd, "batch")) return cli::cmd_batch(argc - 2, argv + 2);
  if (!strcmp(cmd, "chat")) return cli::cmd_chat(argc - 2, argv + 2);
  if (!strcmp(cmd, "tokenize")) return cli::cmd_tokenize(argc - 2, argv + 2);
  if (!strcmp(cmd, "perplexity")) return cli::cmd_perplexity(argc - 2, argv + 2);
  if (!strcmp(cmd, "calibrate")) return cli::cmd_calibrate(argc - 2, argv + 2);
  if (!strcmp(cmd, "pack")) return cli::cmd_pack(argc - 2, argv + 2);
  if (!strcmp(cmd, "trace")) {
    if (argc > 2 && !strcmp(argv[2], "record")) return cli::cmd_trace_record(argc - 3, argv + 3);
    if (argc > 2 && !strcmp(argv[2], "replay")) return cli::cmd_trace_replay(argc - 3, argv + 3);
    return cli::usage_error(argc > 2 ? std::string("unknown trace subcommand '") + argv[2] + "' (record or replay)"
                                     : std::string("trace needs a subcommand: record or replay"));
  }
  if (!strcmp(cmd, "version")) {
    printf("%s\nallocator %s\n", moelite_version_string(), cli::process_allocator().c_str());
    return 0;
  }
  return cli::usage_error(std::string("unknown command '") + cmd + "'");
}
