// `moelite trace replay`: a routing trace through the cache policies, with Belady as the bound.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "core/experts/cache_policy.h"
#include "core/experts/trace_replay.h"

namespace cli {

namespace {
const Command kTraceReplayCommand = {"trace replay",
                                     "-f TRACE --capacity N|P% [options]",
                                     "Cache policies on a recorded routing trace, Belady as the bound.",
                                     {{{"-f"}, "TRACE", "trace file (required)"},
                                      {{"--capacity"}, "N|P%", "cache capacity in experts or share (required)"},
                                      {{"--global"}, "", "one pool for all layers"},
                                      {{"--policy"}, "NAME", "cyclic (the store's default), lru, lfu, decay, static, belady or all"},
                                      {{"--half-life"}, "H", "half-life of the decay policy"},
                                      {{"--lookahead"}, "N", "prefetch lookahead"},
                                      {{"--json"}, "", "print JSON"}}};
}  // namespace

int cmd_trace_replay(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kTraceReplayCommand, &args, &rc)) return rc;
  std::string err;
  if (!args.has("-f")) return usage_error("missing -f TRACE.jsonl");
  if (!args.has("--capacity")) return usage_error("missing --capacity N or P%");
  const std::string which = args.get("--policy", "cyclic");
  std::vector<std::string> policies = which == "all" ? moelite::policy_names() : std::vector<std::string>{which};
  // Tunables of the policies under test; the Belady bound always sees the whole future.
  moelite::PolicyOptions options;
  if (args.has("--half-life")) {
    char* end = nullptr;
    const std::string v = args.get("--half-life");
    options.half_life = strtod(v.c_str(), &end);
    if (v.empty() || *end) return usage_error("--half-life expects a number of accesses, got '" + v + "'");
  }
  int64_t lookahead = 0;
  if (!args.get_int("--lookahead", 0, &lookahead, &err)) return usage_error(err);
  if (lookahead < 0) return usage_error("--lookahead must be >= 0 (0: the whole trace)");
  options.lookahead = static_cast<uint64_t>(lookahead);
  {  // Bad options and unknown names are usage errors, found before the trace is read.
    std::unique_ptr<moelite::CachePolicy> probe;
    if (moelite::make_policy("lru", options, &probe) != MOELITE_OK) return usage_error(moelite_last_error());
    if (which != "all" && moelite::make_policy(which, options, &probe) != MOELITE_OK)
      return usage_error(std::string(moelite_last_error()) + " or all");
  }
  std::string text;
  if (std::string why; !read_file(args.get("-f"), &text, &why)) return usage_error(why);
  moelite::Trace trace;
  if (moelite::parse_trace(text, &trace) != MOELITE_OK)
    return report(MOELITE_ERR_INVALID_ARGUMENT, "reading the trace");
  const bool global = args.has("--global");
  int64_t capacity = 0;
  if (moelite::parse_capacity(args.get("--capacity"), trace, global, &capacity) != MOELITE_OK)
    return usage_error(moelite_last_error());

  moelite::ReplayResult bound;
  if (moelite::replay(trace, "belady", capacity, global, &bound) != MOELITE_OK)
    return report(MOELITE_ERR_INVALID_ARGUMENT, "replaying");
  std::vector<moelite::ReplayResult> results;
  for (const std::string& p : policies) {
    if (p == "belady" && options.lookahead == 0) {  // the same run as the bound
      results.push_back(bound);
      continue;
    }
    moelite::ReplayResult r;
    if (moelite::replay(trace, p, capacity, global, &r, options) != MOELITE_OK)
      return report(MOELITE_ERR_INVALID_ARGUMENT, "replaying");
    results.push_back(r);
  }
  // A windowed Belady is listed as "belady@N" so it cannot be mistaken for the bound.
  if (options.lookahead)
    for (auto& r : results)
      if (r.policy == "belady") r.policy = "belady@" + std::to_string(options.lookahead);
  if (args.has("--json")) {
    if (results.size() > 1) printf("[");
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      printf(
          "%s{\"policy\": \"%s\", \"capacity\": %lld, \"global\": %s, \"hit_rate\": %.6f, \"loads\": %llu, "
          "\"loads_per_token\": %.4f, \"accesses\": %llu, \"tokens\": %llu, \"belady_hit_rate\": %.6f, "
          "\"belady_loads_per_token\": %.4f, \"per_layer_hit_rate\": [",
          i ? ", " : "", r.policy.c_str(), (long long)r.capacity, r.global ? "true" : "false", r.hit_rate(),
          (unsigned long long)r.loads, r.loads_per_token(), (unsigned long long)r.accesses,
          (unsigned long long)r.tokens, bound.hit_rate(), bound.loads_per_token());
      for (size_t l = 0; l < r.per_layer_hit_rate.size(); ++l) printf("%s%.4f", l ? ", " : "", r.per_layer_hit_rate[l]);
      printf("]}");
    }
    printf(results.size() > 1 ? "]\n" : "\n");
  } else {
    printf("trace: %zu entries, %llu tokens, %d layers x %d experts, top-%d; capacity %lld experts %s\n",
           trace.entries.size(), (unsigned long long)bound.tokens, trace.n_layers, trace.n_experts, trace.top_k,
           (long long)capacity, global ? "shared by all layers" : "per layer");
    printf("%-11s %9s %10s %10s %16s  %s\n", "policy", "hit rate", "loads", "accesses", "loads per token",
           "hit rate per layer");
    auto row = [](const moelite::ReplayResult& r, const char* note) {
      printf("%-11s %9.4f %10llu %10llu %16.3f  ", r.policy.c_str(), r.hit_rate(), (unsigned long long)r.loads,
             (unsigned long long)r.accesses, r.loads_per_token());
      for (size_t l = 0; l < r.per_layer_hit_rate.size(); ++l) printf("%s%.2f", l ? " " : "", r.per_layer_hit_rate[l]);
      printf("%s\n", note);
    };
    for (const auto& r : results) row(r, "");
    if (which != "all" && (which != "belady" || options.lookahead))
      row(bound, "  <- bound: belady with the whole future known");
    else
      printf("(belady, with the whole trace as its future, is the bound)\n");
  }
  return 0;
}

}  // namespace cli
