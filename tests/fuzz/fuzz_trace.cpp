// Routing traces (JSON lines, `moelite trace replay`): parsing, capacities, and replay through
// every policy, per layer and global. The first line of the input may be "#CAP <text>" (a
// capacity as the CLI takes it); otherwise 50% is used.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/experts/cache_policy.h"
#include "core/experts/trace_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string cap = "50%";
  if (text.compare(0, 5, "#CAP ") == 0) {
    const size_t nl = text.find('\n');
    cap = text.substr(5, nl == std::string::npos ? std::string::npos : nl - 5);
    text = nl == std::string::npos ? std::string() : text.substr(nl + 1);
  }
  moelite::Trace t;
  if (moelite::parse_trace(text, &t) != MOELITE_OK) return 0;
  for (bool global : {false, true}) {
    int64_t capacity = 0;
    if (moelite::parse_capacity(cap, t, global, &capacity) != MOELITE_OK) continue;
    moelite::PolicyOptions opts;
    opts.lookahead = size % 3 == 0 ? 0 : size % 17;
    opts.half_life = 1.0 + static_cast<double>(size % 100);
    uint64_t bound_loads = 0;
    for (const std::string& name : moelite::policy_names()) {
      moelite::ReplayResult r;
      const moelite::Status st = moelite::replay(t, name, capacity, global, &r, opts);
      if (st == MOELITE_ERR_INTERNAL) std::abort();
      if (st != MOELITE_OK) continue;
      if (r.hits > r.accesses || r.loads + r.hits != r.accesses) std::abort();
      // Belady with the whole future is optimal: no policy loads less.
      moelite::ReplayResult best;
      if (bound_loads == 0 && moelite::replay(t, "belady", capacity, global, &best) == MOELITE_OK)
        bound_loads = best.loads;
      if (r.loads < bound_loads) {
        std::fprintf(stderr, "%s loads %llu < belady's %llu\n", name.c_str(), (unsigned long long)r.loads,
                     (unsigned long long)bound_loads);
        std::abort();
      }
    }
  }
  return 0;
}
