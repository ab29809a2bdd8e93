#include "core/experts/trace_replay.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/experts/cache_policy.h"
#include "platforms/platform.h"

namespace moelite {

namespace {

// A small JSON reader for the trace's flat objects: numbers, arrays of numbers, and (skipped)
// strings, booleans, null and nested values.
class LineParser {
 public:
  explicit LineParser(const std::string& s) : s_(s) {}

  // Fills `nums` (scalar numbers) and `arrays` (numeric arrays) by key. False on syntax errors.
  bool object(std::map<std::string, double>* nums, std::map<std::string, std::vector<double>>* arrays) {
    ws();
    if (!eat('{')) return false;
    ws();
    if (eat('}')) return end();
    for (;;) {
      std::string key;
      ws();
      if (!string(&key)) return false;
      ws();
      if (!eat(':')) return false;
      ws();
      if (peek() == '[') {
        std::vector<double> arr;
        bool numeric = true;
        if (!array(&arr, &numeric)) return false;
        if (numeric) (*arrays)[key] = arr;
      } else if (peek() == '-' || std::isdigit(static_cast<unsigned char>(peek()))) {
        double v;
        if (!number(&v)) return false;
        (*nums)[key] = v;
      } else if (!skip_value(0)) {
        return false;
      }
      ws();
      if (eat(',')) continue;
      if (eat('}')) return end();
      return false;
    }
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool end() {
    ws();
    return i_ == s_.size();
  }
  bool string(std::string* out) {
    if (!eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && ++i_ >= s_.size()) return false;
      out->push_back(s_[i_++]);
    }
    return eat('"');
  }
  bool number(double* v) {
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    *v = strtod(begin, &end);
    if (end == begin) return false;
    i_ += static_cast<size_t>(end - begin);
    return true;
  }
  bool array(std::vector<double>* out, bool* numeric) {
    if (!eat('[')) return false;
    ws();
    if (eat(']')) return true;
    for (;;) {
      ws();
      double v;
      if (peek() == '-' || std::isdigit(static_cast<unsigned char>(peek()))) {
        if (!number(&v)) return false;
        out->push_back(v);
      } else {
        *numeric = false;
        if (!skip_value(1)) return false;
      }
      ws();
      if (eat(',')) continue;
      return eat(']');
    }
  }
  bool skip_value(int depth) {
    if (depth > 16) return false;
    ws();
    const char c = peek();
    if (c == '"') {
      std::string ignored;
      return string(&ignored);
    }
    if (c == '[' || c == '{') {
      const char close = c == '[' ? ']' : '}';
      ++i_;
      ws();
      if (eat(close)) return true;
      for (;;) {
        ws();
        if (c == '{') {
          std::string ignored;
          if (!string(&ignored)) return false;
          ws();
          if (!eat(':')) return false;
        }
        if (!skip_value(depth + 1)) return false;
        ws();
        if (eat(',')) continue;
        return eat(close);
      }
    }
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, strlen(lit), lit) == 0) {
        i_ += strlen(lit);
        return true;
      }
    double v;
    return number(&v);
  }

  const std::string& s_;
  size_t i_ = 0;
};

// Bounds that keep every count in range (and the per-layer tables small) whatever the input.
constexpr double kMaxLayers = 1 << 16, kMaxExperts = 1 << 24, kMaxToken = 9007199254740992.0;  // 2^53

bool whole_below(double v, double limit) { return v >= 0 && v < limit && v == std::floor(v); }

}  // namespace

Status parse_trace(const std::string& text, Trace* out) {
  Trace t;
  size_t pos = 0, line_no = 0;
  int32_t max_layer = -1, max_expert = -1, max_k = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::map<std::string, double> nums;
    std::map<std::string, std::vector<double>> arrays;
    if (!LineParser(line).object(&nums, &arrays))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu is not a JSON object", line_no);
    if (!arrays.count("experts")) {
      if (nums.count("n_layers") || nums.count("n_experts") || nums.count("top_k")) {  // header
        const std::pair<const char*, double> fields[] = {
            {"n_layers", kMaxLayers}, {"n_experts", kMaxExperts}, {"top_k", kMaxExperts}};
        for (const auto& [name, limit] : fields)
          if (nums.count(name) && !whole_below(nums[name], limit + 1))
            return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu: header \"%s\" must be an integer in [0, %.0f]",
                        line_no, name, limit);
        if (nums.count("n_layers")) t.n_layers = static_cast<int32_t>(nums["n_layers"]);
        if (nums.count("n_experts")) t.n_experts = static_cast<int32_t>(nums["n_experts"]);
        if (nums.count("top_k")) t.top_k = static_cast<int32_t>(nums["top_k"]);
        continue;
      }
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu has no \"experts\" array of numbers", line_no);
    }
    if (!nums.count("token") || !nums.count("layer"))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu needs numeric \"token\" and \"layer\"", line_no);
    const double token = nums["token"], layer = nums["layer"];
    if (!(std::fabs(token) <= kMaxToken) || token != std::floor(token))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu: token %g is not an integer", line_no, token);
    if (!whole_below(layer, kMaxLayers))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu: layer %g is not an integer in [0, %.0f)", line_no,
                  layer, kMaxLayers);
    TraceEntry e;
    e.token = static_cast<int64_t>(token);
    e.layer = static_cast<int32_t>(layer);
    for (double v : arrays["experts"]) {
      if (!whole_below(v, kMaxExperts))
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace line %zu: bad expert id %g", line_no, v);
      e.experts.push_back(static_cast<int32_t>(v));
      max_expert = std::max(max_expert, e.experts.back());
    }
    std::sort(e.experts.begin(), e.experts.end());
    e.experts.erase(std::unique(e.experts.begin(), e.experts.end()), e.experts.end());
    max_layer = std::max(max_layer, e.layer);
    max_k = std::max(max_k, static_cast<int32_t>(e.experts.size()));
    t.entries.push_back(std::move(e));
  }
  if (t.entries.empty()) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the trace has no routing entries");
  t.n_layers = std::max(t.n_layers, max_layer + 1);
  t.n_experts = std::max(t.n_experts, max_expert + 1);
  t.top_k = std::max(t.top_k, max_k);
  *out = std::move(t);
  return MOELITE_OK;
}

Status load_trace(const std::string& path, Trace* out) {
  std::string text;
  MOELITE_TRY(platform::read_whole_file(path, "routing trace", kMaxTraceFileBytes, &text));
  const Status st = parse_trace(text, out);
  if (st != MOELITE_OK) return fail(st, "routing trace '%s': %s", path.c_str(), std::string(last_error_message()).c_str());
  return MOELITE_OK;
}

Status parse_capacity(const std::string& text, const Trace& trace, bool global, int64_t* out) {
  char* end = nullptr;
  const bool percent = !text.empty() && text.back() == '%';
  const std::string number = percent ? text.substr(0, text.size() - 1) : text;
  const double v =
      number.empty() || std::isspace(static_cast<unsigned char>(number[0])) ? -1 : strtod(number.c_str(), &end);
  if (!end || *end || !(v >= 0) || !std::isfinite(v) || (percent && v > 100) ||
      (!percent && (v != std::floor(v) || v > 1e15)))
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "capacity '%s' is neither a whole count of experts nor a percentage (0-100%%)", text.c_str());
  if (percent) {
    const double pool = global ? double(trace.n_layers) * trace.n_experts : double(trace.n_experts);
    // floor(P% x pool), computed as P x pool / 100 so that 29% of 100 is 29, not 28.999...
    *out = std::max<int64_t>(static_cast<int64_t>(std::floor(v * pool / 100.0 + 1e-9)), trace.top_k);
  } else {
    *out = static_cast<int64_t>(v);
  }
  return MOELITE_OK;
}

Status replay(const Trace& trace, const std::string& policy_name, int64_t capacity, bool global, ReplayResult* out,
              const PolicyOptions& options, size_t warmup_entries) {
  ReplayResult r;
  r.policy = policy_name;
  r.capacity = capacity;
  r.global = global;
  if (capacity < 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "capacity %lld is negative", (long long)capacity);
  for (const TraceEntry& e : trace.entries)
    if (e.layer < 0 || e.layer >= trace.n_layers)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace entry of token %lld has layer %d outside [0, %d)",
                  (long long)e.token, e.layer, trace.n_layers);
  const size_t n_caches = global ? 1 : static_cast<size_t>(trace.n_layers);
  std::vector<std::unique_ptr<CachePolicy>> policies(n_caches);
  for (auto& p : policies) MOELITE_TRY(make_policy(policy_name, options, &p));

  // Logical time = index of the access; the future (for Belady) and the use counts (static's hot
  // set = the `capacity` most used experts of each cache, as a calibration profile would give)
  // come from the whole trace.
  std::unordered_map<uint64_t, std::vector<uint64_t>> future;
  std::vector<std::unordered_map<uint64_t, uint64_t>> freq(n_caches);
  uint64_t t = 0;
  for (const TraceEntry& e : trace.entries)
    for (int32_t x : e.experts) {
      const ExpertKey k{e.layer, x};
      future[k.packed()].push_back(t++);
      freq[global ? 0 : static_cast<size_t>(e.layer)][k.packed()]++;
    }
  for (size_t c = 0; c < n_caches; ++c) {
    policies[c]->set_frequencies(freq[c], static_cast<size_t>(std::max<int64_t>(capacity, 0)));
    policies[c]->set_future(&future);
  }

  // Residents per cache: a vector plus each key's index in it for O(1) lookup and swap-removal.
  // Policies whose rank of a key changes only when that key is used (CachePolicy::stable_rank:
  // lru, lfu, static, belady without a window) also keep the residents ordered by rank, so a miss
  // finds its victim in O(log capacity) (the first unpinned key in order: at most top-k are
  // pinned) instead of walking a candidate list of every resident, which made long traces with
  // large capacities quadratic. The others (decay, windowed belady) rank by the current time and
  // get the candidate list. Either way the victim is the policy's own choice: ranks are total
  // orders (last uses are distinct), so the vector's order never decides anything.
  struct Residents {
    std::vector<ExpertKey> keys;
    std::unordered_map<uint64_t, size_t> index;
    std::set<std::pair<CachePolicy::Rank, uint64_t>> ordered;  // (rank, key) when ranks are stable
    std::unordered_map<uint64_t, CachePolicy::Rank> rank_of;
  };
  CachePolicy::Rank probe;
  const bool ordered = policies[0]->stable_rank(ExpertKey{}, &probe);
  auto rerank = [&](Residents& res, CachePolicy& policy, ExpertKey k) {
    auto it = res.rank_of.find(k.packed());
    if (it != res.rank_of.end()) res.ordered.erase({it->second, k.packed()});
    CachePolicy::Rank rank;
    policy.stable_rank(k, &rank);
    res.rank_of[k.packed()] = rank;
    res.ordered.insert({rank, k.packed()});
  };
  std::vector<Residents> resident(n_caches);
  std::vector<uint64_t> layer_hits(static_cast<size_t>(trace.n_layers)), layer_acc(static_cast<size_t>(trace.n_layers));
  std::unordered_set<int64_t> tokens;
  std::vector<ExpertKey> candidates;
  t = 0;
  for (size_t entry = 0; entry < trace.entries.size(); ++entry) {
    const TraceEntry& e = trace.entries[entry];
    const bool counted = entry >= warmup_entries;
    if (counted) tokens.insert(e.token);
    const size_t c = global ? 0 : static_cast<size_t>(e.layer);
    if (static_cast<int64_t>(e.experts.size()) > capacity)
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "capacity %lld cannot hold the %zu experts token %lld uses in layer %d at once", (long long)capacity,
                  e.experts.size(), (long long)e.token, e.layer);
    std::unordered_set<uint64_t> pinned;
    for (int32_t x : e.experts) pinned.insert(ExpertKey{e.layer, x}.packed());
    policies[c]->on_serve(e.layer);
    for (int32_t x : e.experts) {
      const ExpertKey k{e.layer, x};
      r.accesses += counted;
      layer_acc[static_cast<size_t>(e.layer)] += counted;
      Residents& res = resident[c];
      if (res.index.count(k.packed())) {
        r.hits += counted;
        layer_hits[static_cast<size_t>(e.layer)] += counted;
      } else {
        r.loads += counted;
        if (static_cast<int64_t>(res.keys.size()) >= capacity) {
          ExpertKey victim;
          bool found = false;
          if (ordered) {
            for (auto it = res.ordered.begin(); it != res.ordered.end() && !found; ++it)
              if (!pinned.count(it->second)) {
                victim = res.keys[res.index[it->second]];
                found = true;
              }
          } else {
            candidates.clear();
            for (const ExpertKey& p : res.keys)
              if (!pinned.count(p.packed())) candidates.push_back(p);
            if (!candidates.empty()) {
              victim = policies[c]->victim(candidates, t);
              found = true;
            }
          }
          if (!found)  // cannot happen: capacity >= the entry's experts, one not resident yet
            return fail(MOELITE_ERR_INTERNAL, "replay: no evictable expert at access %llu", (unsigned long long)t);
          if (ordered) {
            res.ordered.erase({res.rank_of[victim.packed()], victim.packed()});
            res.rank_of.erase(victim.packed());
          }
          const size_t at = res.index[victim.packed()];
          res.keys[at] = res.keys.back();
          res.index[res.keys[at].packed()] = at;
          res.keys.pop_back();
          res.index.erase(victim.packed());
          policies[c]->on_evict(victim);
        }
        res.index[k.packed()] = res.keys.size();
        res.keys.push_back(k);
        policies[c]->on_insert(k, t);
      }
      policies[c]->on_access(k, t++);
      if (ordered) rerank(resident[c], *policies[c], k);
    }
  }
  r.tokens = tokens.size();
  for (size_t l = 0; l < layer_acc.size(); ++l)
    r.per_layer_hit_rate.push_back(layer_acc[l] ? double(layer_hits[l]) / double(layer_acc[l]) : 0.0);
  *out = std::move(r);
  return MOELITE_OK;
}

Status lru_hit_curves(const Trace& trace, std::vector<std::vector<double>>* out, size_t warmup_entries,
                      std::vector<uint64_t>* counted) {
  const size_t L = static_cast<size_t>(std::max(0, trace.n_layers)), E = static_cast<size_t>(std::max(0, trace.n_experts));
  // Per layer: experts by recency, most recent first (only those used so far), and how many
  // accesses found their expert at each depth.
  std::vector<std::vector<int32_t>> stack(L);
  std::vector<std::vector<uint64_t>> at_depth(L, std::vector<uint64_t>(E + 1, 0));
  std::vector<uint64_t> accesses(L, 0);
  std::vector<int32_t> moved;
  for (size_t entry = 0; entry < trace.entries.size(); ++entry) {
    const TraceEntry& e = trace.entries[entry];
    const uint64_t count = entry >= warmup_entries;  // 0 while warming up
    if (e.layer < 0 || static_cast<size_t>(e.layer) >= L)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace entry of token %lld has layer %d outside [0, %d)",
                  (long long)e.token, e.layer, trace.n_layers);
    std::vector<int32_t>& st = stack[static_cast<size_t>(e.layer)];
    std::vector<uint64_t>& hist = at_depth[static_cast<size_t>(e.layer)];
    moved.clear();
    for (int32_t x : e.experts) {
      if (x < 0 || static_cast<size_t>(x) >= E)
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "trace entry of token %lld names expert %d outside [0, %d)",
                    (long long)e.token, x, trace.n_experts);
      accesses[static_cast<size_t>(e.layer)] += count;
      if (std::find(moved.begin(), moved.end(), x) != moved.end()) {  // a repeat within the entry: resident
        hist[0] += count;
        continue;
      }
      // Depth in the stack as it was before this entry: the entry's experts found so far were
      // only marked, not moved, so the positions are the old ones.
      const auto it = std::find(st.begin(), st.end(), x);
      hist[it == st.end() ? E : static_cast<size_t>(it - st.begin())] += count;
      moved.push_back(x);
    }
    // The entry's experts become the most recent, the last accessed on top.
    std::vector<int32_t> next(moved.rbegin(), moved.rend());
    for (int32_t x : st)
      if (std::find(moved.begin(), moved.end(), x) == moved.end()) next.push_back(x);
    st = std::move(next);
  }
  out->assign(L, std::vector<double>(E + 1, 0.0));
  for (size_t l = 0; l < L; ++l) {
    uint64_t hits = 0;
    for (size_t c = 1; c <= E; ++c) {
      hits += at_depth[l][c - 1];
      (*out)[l][c] = accesses[l] ? static_cast<double>(hits) / static_cast<double>(accesses[l]) : 0.0;
    }
  }
  if (counted) *counted = std::move(accesses);
  return MOELITE_OK;
}

}  // namespace moelite
