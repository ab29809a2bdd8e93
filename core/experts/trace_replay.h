// Replaying a routing trace through the cache policies: what hit rate and loads per token each
// policy would give at a capacity, with Belady's optimum as the bound.
//
// Trace format (JSON lines, as `moelite trace record` writes and other engines can produce):
//   optional header  {"n_layers":L,"n_experts":E,"top_k":K}
//   one line per (token, layer)  {"token":T,"layer":L,"experts":[...],"weights":[...]}
// Weights and unknown keys are ignored; without a header the sizes are inferred from the data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/experts/cache_policy.h"

namespace moelite {

struct TraceEntry {
  int64_t token = 0;
  int32_t layer = 0;
  std::vector<int32_t> experts;
};

struct Trace {
  int32_t n_layers = 0, n_experts = 0, top_k = 0;
  std::vector<TraceEntry> entries;
};

// MOELITE_ERR_INVALID_ARGUMENT naming the line for malformed input.
Status parse_trace(const std::string& text, Trace* out);

// Reads and parses a trace file: MOELITE_ERR_FILE_NOT_FOUND when it cannot be opened,
// MOELITE_ERR_IO when reading fails, MOELITE_ERR_INVALID_ARGUMENT when it is larger than
// kMaxTraceFileBytes or malformed (the message names the file).
constexpr uint64_t kMaxTraceFileBytes = uint64_t{1} << 30;
Status load_trace(const std::string& path, Trace* out);

// "N" experts, or "P%" of the experts: floor(P% of one layer's experts), or of all layers' experts
// when global, and never below top_k (a smaller cache could not hold one token's experts).
Status parse_capacity(const std::string& text, const Trace& trace, bool global, int64_t* out);

struct ReplayResult {
  std::string policy;
  int64_t capacity = 0;
  bool global = false;
  uint64_t accesses = 0, hits = 0, loads = 0, tokens = 0;
  std::vector<double> per_layer_hit_rate;
  double hit_rate() const { return accesses ? double(hits) / double(accesses) : 0.0; }
  double loads_per_token() const { return tokens ? double(loads) / double(tokens) : 0.0; }
};

// Each (token, layer) entry's experts are pinned together; a miss is one load (cold misses
// count). Per-layer mode: each layer has its own cache of `capacity`; global: one shared cache.
// `options` tunes the policy under test (decay's half-life, Belady's lookahead). The first
// `warmup_entries` entries only warm the caches: they are replayed but neither their accesses nor
// their tokens are counted (a steady state: replay a sequence twice, warm up with the first pass).
Status replay(const Trace& trace, const std::string& policy, int64_t capacity, bool global, ReplayResult* out,
              const PolicyOptions& options = PolicyOptions{}, size_t warmup_entries = 0);

// Per-layer LRU hit rates at every capacity in one pass (Mattson's stack algorithm): LRU with a
// token's experts pinned together keeps, at any capacity c >= the experts of one entry, exactly
// the c most recently used experts of the layer, so an access hits at capacity c iff fewer than c
// other experts of its layer were used after its last use (counted before the entry's own
// accesses). out[l][c] for c = 0..n_experts equals replay(trace, "lru", c, false) where that runs
// (c >= the largest entry); rates below that are filled in by the same rule. O(accesses x
// n_experts) instead of one replay per capacity. The first `warmup_entries` entries only warm the
// stacks (as in replay()); `counted`, when given, receives each layer's counted accesses, the
// denominators of its rates.
Status lru_hit_curves(const Trace& trace, std::vector<std::vector<double>>* out, size_t warmup_entries = 0,
                      std::vector<uint64_t>* counted = nullptr);

}  // namespace moelite
