#include "core/expert_cache/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace moelite {

namespace {

// Shared bookkeeping: last use and use count per key; ties always fall back to least recent.
class Tracked : public CachePolicy {
 public:
  void on_access(ExpertKey k, uint64_t now) override {
    Info& i = info_[k.packed()];
    i.last = now;
    i.count++;
  }
  void on_evict(ExpertKey k) override { info_.erase(k.packed()); }

 protected:
  struct Info {
    uint64_t last = 0;
    uint64_t count = 0;
    double score = 0;        // decayed frequency at time `scored_at`
    uint64_t scored_at = 0;
  };
  const Info& info(ExpertKey k) const {
    static const Info none;
    auto it = info_.find(k.packed());
    return it == info_.end() ? none : it->second;
  }
  // Index of the candidate minimising (primary, last use).
  template <typename Primary>
  size_t argmin(const std::vector<ExpertKey>& c, Primary primary) const {
    size_t best = 0;
    for (size_t i = 1; i < c.size(); ++i) {
      const auto a = primary(c[i]), b = primary(c[best]);
      if (a < b || (a == b && info(c[i]).last < info(c[best]).last)) best = i;
    }
    return best;
  }
  std::unordered_map<uint64_t, Info> info_;
};

class Lru final : public Tracked {
 public:
  const char* name() const override { return "lru"; }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t) override {
    return argmin(c, [](ExpertKey) { return 0; });
  }
};

// Counts survive eviction: frequency is a property of the expert, not of its residency.
class Lfu final : public Tracked {
 public:
  const char* name() const override { return "lfu"; }
  void on_access(ExpertKey k, uint64_t now) override {
    Tracked::on_access(k, now);
    ++counts_[k.packed()];
  }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t) override {
    return argmin(c, [&](ExpertKey k) { return counts_[k.packed()]; });
  }

 private:
  std::unordered_map<uint64_t, uint64_t> counts_;
};

// Decayed frequency: each use adds 1 and halves every `half_life` logical time steps, so a burst
// of old uses fades while a steadily used expert stays.
class Decay final : public Tracked {
 public:
  explicit Decay(double half_life) : half_life_(half_life) {}
  const char* name() const override { return "decay"; }
  void on_access(ExpertKey k, uint64_t now) override {
    Tracked::on_access(k, now);
    Score& s = scores_[k.packed()];
    s.value = value(s, now) + 1.0;
    s.at = now;
  }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t now) override {
    return argmin(c, [&](ExpertKey k) { return value(scores_[k.packed()], now); });
  }

 private:
  struct Score {
    double value = 0;
    uint64_t at = 0;
  };
  double value(const Score& s, uint64_t now) const {
    return s.value * std::exp2(-static_cast<double>(now - s.at) / half_life_);
  }
  double half_life_;
  std::unordered_map<uint64_t, Score> scores_;
};

// A fixed hot set stays; everything else is evicted first (least recent first).
class Static final : public Tracked {
 public:
  const char* name() const override { return "static"; }
  void set_hot(const std::vector<ExpertKey>& hot) override {
    hot_.clear();
    for (const ExpertKey& k : hot) hot_.insert(k.packed());
  }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t) override {
    return argmin(c, [&](ExpertKey k) { return hot_.count(k.packed()) ? 1 : 0; });
  }

 private:
  std::unordered_set<uint64_t> hot_;
};

// Belady: evict the expert whose next use lies furthest ahead (never used again: infinitely far);
// optimal when the future is known exactly.
class Belady final : public Tracked {
 public:
  const char* name() const override { return "belady"; }
  void set_future(const std::unordered_map<uint64_t, std::vector<uint64_t>>* f) override { future_ = f; }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t now) override {
    // argmin of the negated next use = argmax of next use; ties (e.g. both never) to LRU.
    return argmin(c, [&](ExpertKey k) { return -static_cast<double>(next_use(k, now)); });
  }

 private:
  uint64_t next_use(ExpertKey k, uint64_t now) const {
    if (!future_) return std::numeric_limits<uint64_t>::max();
    auto it = future_->find(k.packed());
    if (it == future_->end()) return std::numeric_limits<uint64_t>::max();
    auto nxt = std::upper_bound(it->second.begin(), it->second.end(), now);
    return nxt == it->second.end() ? std::numeric_limits<uint64_t>::max() : *nxt;
  }
  const std::unordered_map<uint64_t, std::vector<uint64_t>>* future_ = nullptr;
};

}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {"lru", "lfu", "decay", "static", "belady"};
  return names;
}

Status make_policy(const std::string& name, std::unique_ptr<CachePolicy>* out) {
  if (name == "lru") out->reset(new Lru);
  else if (name == "lfu") out->reset(new Lfu);
  else if (name == "decay") out->reset(new Decay(64.0));
  else if (name == "static") out->reset(new Static);
  else if (name == "belady") out->reset(new Belady);
  else
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown expert cache policy '%s' (available: lru, lfu, decay, static, belady)",
                name.c_str());
  return MOELITE_OK;
}

}  // namespace moelite
