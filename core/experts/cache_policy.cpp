#include "core/experts/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <unordered_set>

namespace moelite {

namespace {

// Shared bookkeeping: last use and use count per key; ties always fall back to least recent.
class Tracked : public CachePolicy {
 public:
  void on_insert(ExpertKey k, uint64_t now) override { info_[k.packed()].last = now; }
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
  bool stable_rank(ExpertKey k, Rank* out) const override {
    *out = {0, info(k).last};
    return true;
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
  bool stable_rank(ExpertKey k, Rank* out) const override {
    auto it = counts_.find(k.packed());
    *out = {static_cast<double>(it == counts_.end() ? 0 : it->second), info(k).last};
    return true;
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

// Evaluation visits the layers in a cycle (0, 1, ..., n - 1, then 0 again for the next token or
// step), so an expert can next be wanted at its layer's next turn: the layers after the one being
// served come in this pass, the others in the next. Whether it is wanted then is a guess: from its
// uses, a rate per pass that halves every kReuseHalfLifePasses passes it goes unused, read as a
// chance p of being wanted at each turn. The expected distance to its next use, in layer turns,
// is then turn_in + n (1 / p - 1) (a geometric wait), and the expert furthest off goes: Belady's
// rule with the future estimated. Where one pass wants more experts than the cache holds (several
// sequences under a tight budget) LRU evicts exactly those the next pass wants first and hits
// nothing; the turn keeps the ones wanted soonest, the rate the ones wanted at all (a sequence's
// next token tends to reuse its last one's experts). Ties: least recent. Passes are counted by
// on_serve: a layer no later than the last one served begins a pass.
class Cyclic final : public Tracked {
 public:
  const char* name() const override { return "cyclic"; }
  void on_serve(int32_t layer) override {
    if (layer <= serving_) ++pass_;
    serving_ = layer;
    n_layers_ = std::max(n_layers_, layer + 1);
  }
  void on_access(ExpertKey k, uint64_t now) override {
    Tracked::on_access(k, now);
    Rate& r = rates_[k.packed()];
    r.value = decayed(r) + 1.0;
    r.pass = pass_;
    n_layers_ = std::max(n_layers_, k.layer + 1);
  }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t) override {
    int32_t n = n_layers_;
    for (const ExpertKey& k : c) n = std::max(n, k.layer + 1);
    // A key used every pass settles at 1 / (1 - 2^(-1 / half-life)): that rate is p = 1.
    static const double kSteady = 1.0 / (1.0 - std::exp2(-1.0 / kReuseHalfLifePasses));
    return argmin(c, [&](ExpertKey k) {
      const int32_t turn_in = ((k.layer - serving_ - 1) % n + n) % n;
      auto it = rates_.find(k.packed());
      const double p = std::clamp(it == rates_.end() ? 0.0 : decayed(it->second) / kSteady, 1e-3, 1.0);
      return -(turn_in + n * (1.0 / p - 1.0));  // the furthest expected next use is the smallest
    });
  }

 private:
  static constexpr double kReuseHalfLifePasses = 8.0;
  struct Rate {
    double value = 0;
    uint64_t pass = 0;
  };
  double decayed(const Rate& r) const {
    return r.value * std::exp2(-static_cast<double>(pass_ - r.pass) / kReuseHalfLifePasses);
  }
  std::unordered_map<uint64_t, Rate> rates_;  // kept after eviction: a rate belongs to the expert
  uint64_t pass_ = 0;
  int32_t serving_ = -1, n_layers_ = 1;
};

// A hot set stays; everything else is evicted first (least recent first). The hot set is given
// (set_hot), or the `hot_size` most used keys by given counts (set_frequencies), or by the counts
// of the accesses seen so far; a hot_size of 0 means as many as are resident (tracked from
// inserts, accesses and evictions). Keys tied at the boundary are all hot.
class Static final : public Tracked {
 public:
  const char* name() const override { return "static"; }
  void on_access(ExpertKey k, uint64_t now) override {
    Tracked::on_access(k, now);
    if (learning_) bump(k.packed(), 1);
  }
  void set_hot(const std::vector<ExpertKey>& hot) override {
    std::unordered_map<uint64_t, uint64_t> counts;
    for (const ExpertKey& k : hot) counts[k.packed()] = 1;
    set_frequency_table(counts, counts.size());
  }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t) override {
    const uint64_t threshold = hot_threshold(hot_size_ ? hot_size_ : info_.size());
    return argmin(c, [&](ExpertKey k) {
      auto it = counts_.find(k.packed());
      return it != counts_.end() && it->second >= threshold ? 1 : 0;
    });
  }
  // Stable once the counts are given and the hot set has a fixed size (then the threshold is fixed).
  bool stable_rank(ExpertKey k, Rank* out) const override {
    if (learning_ || hot_size_ == 0) return false;
    if (!fixed_threshold_valid_) {
      fixed_threshold_ = hot_threshold(hot_size_);
      fixed_threshold_valid_ = true;
    }
    auto it = counts_.find(k.packed());
    *out = {it != counts_.end() && it->second >= fixed_threshold_ ? 1.0 : 0.0, info(k).last};
    return true;
  }

 protected:
  void set_frequency_table(const std::unordered_map<uint64_t, uint64_t>& counts, size_t hot_size) override {
    learning_ = false;
    hot_size_ = hot_size;
    fixed_threshold_valid_ = false;
    counts_.clear();
    keys_with_count_.clear();
    for (const auto& [key, n] : counts) bump(key, n);
  }

 private:
  void bump(uint64_t key, uint64_t by) {
    if (by == 0) return;
    uint64_t& n = counts_[key];
    if (n) {
      auto it = keys_with_count_.find(n);
      if (--it->second == 0) keys_with_count_.erase(it);
    }
    n += by;
    keys_with_count_[n]++;
  }
  // Hot: fewer than `hot_size` keys are strictly more used; never-used keys are never hot. Since
  // that holds for a prefix of the counts in descending order, it is "count >= threshold", found
  // once per victim choice (walking at most hot_size + 1 buckets) rather than once per candidate.
  uint64_t hot_threshold(size_t hot_size) const {
    uint64_t threshold = std::numeric_limits<uint64_t>::max();  // nothing hot
    size_t above = 0;
    for (auto b = keys_with_count_.begin(); b != keys_with_count_.end() && above < hot_size; ++b) {
      threshold = b->first;
      above += b->second;
    }
    return threshold;
  }
  bool learning_ = true;
  size_t hot_size_ = 0;
  mutable uint64_t fixed_threshold_ = 0;
  mutable bool fixed_threshold_valid_ = false;
  std::unordered_map<uint64_t, uint64_t> counts_;
  std::map<uint64_t, uint64_t, std::greater<uint64_t>> keys_with_count_;  // count -> keys with it
};

// Belady: evict the expert whose next use lies furthest ahead (never used again: infinitely far);
// optimal when the future is known exactly.
class Belady final : public Tracked {
 public:
  explicit Belady(uint64_t lookahead) : lookahead_(lookahead) {}
  const char* name() const override { return "belady"; }
  void set_future(const std::unordered_map<uint64_t, std::vector<uint64_t>>* f) override { future_ = f; }
  size_t choose_victim(const std::vector<ExpertKey>& c, uint64_t now) override {
    // argmin of the negated next use = argmax of next use; ties (e.g. both never) to LRU.
    return argmin(c, [&](ExpertKey k) { return -static_cast<double>(next_use(k, now)); });
  }
  // Without a window a resident key's next use is the first one after its last use (any use in
  // between would have been an access of it), so it only changes when the key is accessed.
  bool stable_rank(ExpertKey k, Rank* out) const override {
    if (lookahead_) return false;
    const uint64_t last = info(k).last;
    *out = {-static_cast<double>(next_use(k, last)), last};
    return true;
  }

 private:
  uint64_t next_use(ExpertKey k, uint64_t now) const {
    if (!future_) return std::numeric_limits<uint64_t>::max();
    auto it = future_->find(k.packed());
    if (it == future_->end()) return std::numeric_limits<uint64_t>::max();
    auto nxt = std::upper_bound(it->second.begin(), it->second.end(), now);
    if (nxt == it->second.end() || (lookahead_ && *nxt - now > lookahead_)) return std::numeric_limits<uint64_t>::max();
    return *nxt;
  }
  uint64_t lookahead_;
  const std::unordered_map<uint64_t, std::vector<uint64_t>>* future_ = nullptr;
};

}  // namespace

void CachePolicy::set_frequencies(const std::vector<uint64_t>& counts, int32_t n_experts, size_t hot_size) {
  std::unordered_map<uint64_t, uint64_t> table;
  if (n_experts > 0)
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i])
        table[ExpertKey{static_cast<int32_t>(i / static_cast<size_t>(n_experts)),
                        static_cast<int32_t>(i % static_cast<size_t>(n_experts))}
                  .packed()] = counts[i];
  set_frequency_table(table, hot_size);
}

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {"cyclic", "lru", "lfu", "decay", "static", "belady"};
  return names;
}

Status make_policy(const std::string& name, const PolicyOptions& options, std::unique_ptr<CachePolicy>* out) {
  // Checked for every name, so a bad option is reported even when the policy would ignore it.
  if (!(options.half_life > 0) || !std::isfinite(options.half_life))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "decay half-life %g must be a positive number", options.half_life);
  if (name == "cyclic")
    out->reset(new Cyclic);
  else if (name == "lru")
    out->reset(new Lru);
  else if (name == "lfu")
    out->reset(new Lfu);
  else if (name == "decay")
    out->reset(new Decay(options.half_life));
  else if (name == "static")
    out->reset(new Static);
  else if (name == "belady")
    out->reset(new Belady(options.lookahead));
  else
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "unknown expert cache policy '%s' (available: cyclic, lru, lfu, decay, static, belady)", name.c_str());
  return MOELITE_OK;
}

Status make_policy(const std::string& name, std::unique_ptr<CachePolicy>* out) {
  return make_policy(name, PolicyOptions{}, out);
}

}  // namespace moelite
