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

#include "core/status.h"

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
  // `key` was used at logical time `now` (a hit, or right after its load).
  virtual void on_access(ExpertKey key, uint64_t now) = 0;
  virtual void on_evict(ExpertKey key) {}
  // Index into `candidates` (non-empty) of the expert to evict.
  virtual size_t choose_victim(const std::vector<ExpertKey>& candidates, uint64_t now) = 0;
  // What is known of the future: for each key, the sorted logical times it will be used (from the
  // trace itself in replay, from predictions in a live store). Only Belady looks at it.
  virtual void set_future(const std::unordered_map<uint64_t, std::vector<uint64_t>>* future) {}
  // Keys to keep resident (a hot set from a calibration profile or from the trace). Only the
  // static policy looks at it.
  virtual void set_hot(const std::vector<ExpertKey>& hot) {}
};

// lru, lfu, decay, static, belady. MOELITE_ERR_INVALID_ARGUMENT for other names.
Status make_policy(const std::string& name, std::unique_ptr<CachePolicy>* out);
const std::vector<std::string>& policy_names();

// A predicted future use, for predictors that feed a store's prefetch queue (next issue).
struct Prediction {
  ExpertKey key;
  float confidence = 1.0f;
};

class PrefetchSink {
 public:
  virtual ~PrefetchSink() = default;
  virtual void on_predictions(const std::vector<Prediction>& predictions) = 0;
};

}  // namespace moelite
