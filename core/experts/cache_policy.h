// Replacement policies for cached experts, shared by the live expert store and by trace replay.
//
// A policy only ranks: the cache tells it about accesses and evictions and asks it to pick a
// victim among the evictable residents (pinned experts, needed by the token being computed, are
// never offered).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace moelite {

struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;
  uint64_t packed() const { return (uint64_t(uint32_t(layer)) << 32) | uint32_t(expert); }
  bool operator==(const ExpertKey& o) const { return layer == o.layer && expert == o.expert; }
};

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  virtual const char* name() const = 0;
  // `key` became resident at logical time `now` (its load). Optional: a cache that does not call
  // it (the live store today) gets the same decisions, since every load is followed by an access.
  virtual void on_insert(ExpertKey key, uint64_t now) {}
  // `key` was used at logical time `now` (a hit, or right after its load).
  virtual void on_access(ExpertKey key, uint64_t now) = 0;
  // The experts of `layer` are about to be used: the victims chosen until the next call make room
  // for that layer's (or, for speculative loads, for later layers'). Only cyclic looks at it.
  virtual void on_serve(int32_t layer) {}
  // `key` left the cache. Frequencies (lfu, decay, static) survive it; recency does not.
  virtual void on_evict(ExpertKey key) {}
  // Index into `candidates` (non-empty: the evictable residents, never a pinned expert) of the
  // expert to evict. An index rather than a key because the store maps it straight back to its
  // slot list; victim() gives the key.
  virtual size_t choose_victim(const std::vector<ExpertKey>& candidates, uint64_t now) = 0;
  ExpertKey victim(const std::vector<ExpertKey>& candidates, uint64_t now) {
    return candidates[choose_victim(candidates, now)];
  }
  // A key's rank for callers that keep the residents ordered (trace replay): the policy's victim
  // among any candidates is the one with the smallest (primary, last). Only policies whose rank of
  // a key changes solely when that key is inserted, accessed or evicted give it (lru, lfu, static
  // with given counts, belady without a lookahead window); the others return false and must be
  // asked through choose_victim. Last uses are distinct, so the order is total.
  struct Rank {
    double primary = 0;
    uint64_t last = 0;
    bool operator<(const Rank& o) const { return primary < o.primary || (primary == o.primary && last < o.last); }
  };
  virtual bool stable_rank(ExpertKey key, Rank* out) const { return false; }
  // What is known of the future: for each key, the sorted logical times it will be used (from the
  // trace itself in replay, from predictions in a live store). Only Belady looks at it.
  virtual void set_future(const std::unordered_map<uint64_t, std::vector<uint64_t>>* future) {}
  // Keys to keep resident (a hot set from a calibration profile or from the trace). Only the
  // static policy looks at it.
  virtual void set_hot(const std::vector<ExpertKey>& hot) {}
  // Use counts to derive the static policy's hot set from: the `hot_size` most used keys (0: as
  // many as are resident when a victim is chosen). Without this (or set_hot) the static policy
  // learns the counts from the accesses it sees. Map: ExpertKey::packed() -> count; vector: the
  // count of (layer, expert) at [layer * n_experts + expert]. Others ignore both.
  void set_frequencies(const std::unordered_map<uint64_t, uint64_t>& counts, size_t hot_size = 0) {
    set_frequency_table(counts, hot_size);
  }
  void set_frequencies(const std::vector<uint64_t>& counts, int32_t n_experts, size_t hot_size = 0);

 protected:
  virtual void set_frequency_table(const std::unordered_map<uint64_t, uint64_t>& counts, size_t hot_size) {}
};

// Tunables of the policies that have any; the defaults are what the store and replay use.
struct PolicyOptions {
  // decay: logical time steps (accesses) after which a use counts half. Must be > 0 and finite.
  double half_life = 64.0;
  // belady: only next uses within (now, now + lookahead] are seen; later ones count as never, as
  // with a predictor that sees a fixed window ahead. 0 = no limit (the whole known future).
  uint64_t lookahead = 0;
};

// cyclic (the furthest expected next use: the turns until its layer's, plus a geometric wait from
// its reuse rate per pass over the layers; ties: least recent); lru; lfu (ties: least recent); decay (score = sum over uses of 0.5^((now - t) / half_life),
// ties: least recent); static (non-hot first, least recent among them); belady (next use
// furthest ahead, never or beyond the lookahead = infinitely far; ties: least recent).
// MOELITE_ERR_INVALID_ARGUMENT naming the available ones for other names, or for a bad option.
Status make_policy(const std::string& name, const PolicyOptions& options, std::unique_ptr<CachePolicy>* out);
Status make_policy(const std::string& name, std::unique_ptr<CachePolicy>* out);
const std::vector<std::string>& policy_names();

// A predictor's guess (predictor.h): a (layer, expert) it expects to be used soon and how sure it
// is, in [0, kCertain]. kCertain is kept for what is not a guess (a pre-gate router's routing, the
// prefill lookahead's "the whole next layer"): a predictor's scores stay below it, and the store's
// gate (guess_gate.h) learns what each lower confidence is worth.
constexpr float kCertain = 1.0f;
struct Prediction {
  ExpertKey key;
  float confidence = kCertain;
};

}  // namespace moelite
