#include <algorithm>
#include <numeric>

#include "core/experts/guess_gate.h"
#include "core/experts/predictor.h"
#include "core/model/model.h"
#include "core/model/profile.h"

namespace moelite {

std::vector<std::string> predictor_list(const std::string& names) {
  std::vector<std::string> out;
  for (size_t begin = 0; begin <= names.size();) {
    const size_t comma = std::min(names.find(',', begin), names.size());
    out.push_back(names.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return out;
}

std::vector<int32_t> top_indices(const float* scores, int32_t n, int32_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

uint64_t correlation_table_bytes(int32_t n_layer, int32_t n_expert) {
  return static_cast<uint64_t>(std::max(0, n_layer - 1)) * static_cast<uint64_t>(n_expert) *
         static_cast<uint64_t>(n_expert) * sizeof(float);
}

namespace {
// Index of counts[i][j], in size_t: i * n overflows int32 from 46341 experts on.
size_t cell(int32_t i, int32_t j, int32_t n) {
  return static_cast<size_t>(i) * static_cast<size_t>(n) + static_cast<size_t>(j);
}
}  // namespace

CorrelationTable::CorrelationTable(int32_t n_expert, std::vector<float> counts)
    : n_(n_expert), counts_(std::move(counts)), row_sum_(static_cast<size_t>(n_expert), 0.0f) {
  counts_.resize(static_cast<size_t>(n_) * static_cast<size_t>(n_), 0.0f);
  for (int32_t i = 0; i < n_; ++i)
    for (int32_t j = 0; j < n_; ++j) row_sum_[static_cast<size_t>(i)] += counts_[cell(i, j, n_)];
}

void CorrelationTable::add(const int32_t* from, int32_t n_from, const int32_t* to, int32_t n_to) {
  for (int32_t a = 0; a < n_from; ++a) {
    if (from[a] < 0 || from[a] >= n_) continue;
    for (int32_t b = 0; b < n_to; ++b) {
      if (to[b] < 0 || to[b] >= n_) continue;
      counts_[cell(from[a], to[b], n_)] += 1.0f;
      row_sum_[static_cast<size_t>(from[a])] += 1.0f;
    }
  }
}

void CorrelationTable::scores(const int32_t* from, int32_t n_from, float* out) const {
  std::fill(out, out + n_, 0.0f);
  int32_t used = 0;
  for (int32_t a = 0; a < n_from; ++a) {
    if (from[a] < 0 || from[a] >= n_) continue;
    ++used;
    const float denom = row_sum_[static_cast<size_t>(from[a])] + static_cast<float>(n_);
    for (int32_t j = 0; j < n_; ++j) out[j] += (counts_[cell(from[a], j, n_)] + 1.0f) / denom;
  }
  if (used > 1)
    for (int32_t j = 0; j < n_; ++j) out[j] /= static_cast<float>(used);
}

namespace {

// Predictions are made per decode token (a few at most); a prefill batch needs most experts anyway.
// A score is a guess's confidence, below certainty (guess_gate.h).
void push_top(const float* scores, int32_t n, int32_t k, int32_t layer, std::vector<Prediction>* out) {
  for (int32_t e : top_indices(scores, n, k)) out->push_back({{layer, e}, guess_confidence(scores[e])});
}

class NextGate final : public ExpertPredictor {
 public:
  explicit NextGate(int32_t depth) : depth_(depth) {}
  const char* name() const override { return "next-gate"; }
  std::unique_ptr<ExpertPredictor> clone() const override { return std::make_unique<NextGate>(depth_); }
  Status after_layer(const Model& m, int32_t l, const LayerObservation& seen, std::vector<Prediction>* out) override {
    Backend& be = *seen.backend;
    const HParams& hp = m.hp;
    const Act& x = seen.x;
    Act tmp = seen.scratch, logits = seen.logits;
    for (int32_t d = 1; d <= depth_ && l + d < hp.n_layer; ++d) {
      const LayerWeights& next = m.layers[static_cast<size_t>(l + d)];
      MOELITE_TRY(be.rms_norm(x, next.ffn_norm.data(), hp.n_embd, hp.rms_eps, &tmp));
      MOELITE_TRY(be.matmul(next.router, tmp, next.router_bias.empty() ? nullptr : next.router_bias.data(), &logits));
      Routing guess;
      MOELITE_TRY(be.route(logits, hp.n_expert_used, false, &guess));
      for (size_t i = 0; i < guess.ids.size(); ++i)
        out->push_back({{l + d, guess.ids[i]}, guess_confidence(guess.weights[i])});
    }
    return MOELITE_OK;
  }

 private:
  int32_t depth_;
};

class Learned final : public ExpertPredictor {
 public:
  // The maps are the profile's (the runtime keeps it as long as any context of the model).
  Learned(const Profile& p, int32_t k) : maps_(p.learned), stride_(p.learned_stride), k_(k) {}
  const char* name() const override { return "learned"; }
  std::unique_ptr<ExpertPredictor> clone() const override { return std::make_unique<Learned>(*this); }
  bool wants_hidden() const override { return true; }
  Status after_layer(const Model& m, int32_t l, const LayerObservation& seen, std::vector<Prediction>* out) override {
    const float* hidden = seen.hidden;
    if (l >= static_cast<int32_t>(maps_.size()) || maps_[static_cast<size_t>(l)].empty() || l + stride_ >= m.hp.n_layer)
      return MOELITE_OK;
    const LinearMap& map = maps_[static_cast<size_t>(l)];
    scores_.resize(static_cast<size_t>(map.rows));
    for (int32_t t = 0; t < seen.n_tokens; ++t) {
      map.apply(hidden + static_cast<size_t>(t) * static_cast<size_t>(map.n_in), scores_.data());
      push_top(scores_.data(), map.rows, k_, l + stride_, out);
    }
    return MOELITE_OK;
  }

 private:
  const std::vector<LinearMap>& maps_;
  int32_t stride_, k_;
  std::vector<float> scores_;
};

class FirstLayer final : public ExpertPredictor {
 public:
  // layer: the first layer with experts (after deepseek2's leading dense blocks).
  FirstLayer(const Profile& p, int32_t k, int32_t layer) : map_(p.first_layer), k_(k), layer_(layer) {}
  const char* name() const override { return "first-layer"; }
  std::unique_ptr<ExpertPredictor> clone() const override { return std::make_unique<FirstLayer>(*this); }
  bool wants_final() const override { return true; }
  Status after_layer(const Model&, int32_t, const LayerObservation&, std::vector<Prediction>*) override {
    return MOELITE_OK;
  }
  void after_token(const float* final_state, std::vector<Prediction>* out) override {
    scores_.resize(static_cast<size_t>(map_.rows));
    map_.apply(final_state, scores_.data());
    push_top(scores_.data(), map_.rows, k_, layer_, out);
  }

 private:
  const LinearMap& map_;  // the profile's
  int32_t k_, layer_;
  std::vector<float> scores_;
};

class Correlation final : public ExpertPredictor {
 public:
  Correlation(const Model& m, const Profile* p) : k_(m.hp.n_expert_used), n_(m.hp.n_expert) {
    for (int32_t l = 0; l + 1 < m.hp.n_layer; ++l) {
      std::vector<float> seed;
      if (p && static_cast<size_t>(l) < p->correlation.size()) seed = p->correlation[static_cast<size_t>(l)];
      tables_.emplace_back(n_, std::move(seed));
    }
  }
  const char* name() const override { return "correlation"; }
  std::unique_ptr<ExpertPredictor> clone() const override {
    auto c = std::make_unique<Correlation>(*this);  // the counts learned so far, then its own
    c->prev_ids_.clear();
    c->prev_layer_ = -1;
    return c;
  }
  Status after_layer(const Model& m, int32_t l, const LayerObservation& seen, std::vector<Prediction>* out) override {
    const Routing& r = *seen.routing;
    // Learn online from the transition that just completed (layer l-1 -> l) of the same tokens.
    if (l > 0 && prev_layer_ == l - 1 && prev_ids_.size() == r.ids.size() && prev_k_ == r.k)
      for (int32_t t = 0; t < r.n_tokens; ++t)
        tables_[static_cast<size_t>(l - 1)].add(prev_ids_.data() + t * r.k, r.k, r.ids.data() + t * r.k, r.k);
    prev_ids_ = r.ids;
    prev_k_ = r.k;
    prev_layer_ = l;
    if (l + 1 >= m.hp.n_layer) return MOELITE_OK;
    scores_.resize(static_cast<size_t>(n_));
    for (int32_t t = 0; t < r.n_tokens; ++t) {
      tables_[static_cast<size_t>(l)].scores(r.ids.data() + t * r.k, r.k, scores_.data());
      push_top(scores_.data(), n_, k_, l + 1, out);
    }
    return MOELITE_OK;
  }

 private:
  int32_t k_, n_;
  std::vector<CorrelationTable> tables_;
  std::vector<int32_t> prev_ids_;
  int32_t prev_k_ = 0, prev_layer_ = -1;
  std::vector<float> scores_;
};

class PreGate final : public ExpertPredictor {
 public:
  const char* name() const override { return "pregate"; }
  std::unique_ptr<ExpertPredictor> clone() const override { return std::make_unique<PreGate>(); }
  Status after_layer(const Model&, int32_t l, const LayerObservation& seen, std::vector<Prediction>* out) override {
    if (seen.next_routing)
      for (size_t i = 0; i < seen.next_routing->ids.size(); ++i)
        out->push_back({{l + 1, seen.next_routing->ids[i]}, kCertain});  // the routing itself
    return MOELITE_OK;
  }
};

// Several predictors at once ("learned,first-layer"): each covers the layers it predicts best.
class Composite final : public ExpertPredictor {
 public:
  explicit Composite(std::vector<std::unique_ptr<ExpertPredictor>> parts) : parts_(std::move(parts)) {
    for (const auto& p : parts_) name_ += (name_.empty() ? "" : ",") + std::string(p->name());
  }
  const char* name() const override { return name_.c_str(); }
  std::unique_ptr<ExpertPredictor> clone() const override {
    std::vector<std::unique_ptr<ExpertPredictor>> parts;
    for (const auto& p : parts_) parts.push_back(p->clone());
    return std::make_unique<Composite>(std::move(parts));
  }
  bool wants_hidden() const override {
    return std::any_of(parts_.begin(), parts_.end(), [](const auto& p) { return p->wants_hidden(); });
  }
  bool wants_final() const override {
    return std::any_of(parts_.begin(), parts_.end(), [](const auto& p) { return p->wants_final(); });
  }
  Status after_layer(const Model& m, int32_t l, const LayerObservation& seen, std::vector<Prediction>* out) override {
    for (auto& p : parts_) {
      LayerObservation mine = seen;
      if (!p->wants_hidden()) mine.hidden = nullptr;
      MOELITE_TRY(p->after_layer(m, l, mine, out));
    }
    return MOELITE_OK;
  }
  void after_token(const float* final_state, std::vector<Prediction>* out) override {
    for (auto& p : parts_)
      if (p->wants_final()) p->after_token(final_state, out);
  }

 private:
  std::vector<std::unique_ptr<ExpertPredictor>> parts_;
  std::string name_;
};

}  // namespace

const char* predictor_names() {
  return "none, next-gate, first-layer, learned, correlation, pregate, or a comma-separated list of them";
}

Status check_predictor_name(const std::string& name) {
  if (name == "none") return MOELITE_OK;
  const std::vector<std::string> names = predictor_list(name);
  for (const std::string& one : names) {
    const bool known = one == "next-gate" || one == "correlation" || one == "pregate" || one == "learned" ||
                       one == "first-layer" || (one == "none" && names.size() == 1);
    if (!known)
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown expert predictor '%s' in '%s' (available: %s)", one.c_str(),
                  name.c_str(), predictor_names());
  }
  return MOELITE_OK;
}

Status make_predictor(const std::string& name, int32_t depth, const Model& m, const Profile* profile,
                      std::unique_ptr<ExpertPredictor>* out) {
  const int32_t k = m.hp.n_expert_used;
  if (out) out->reset();
  if (name == "none") return MOELITE_OK;
  if (name.find(',') != std::string::npos) {
    std::vector<std::unique_ptr<ExpertPredictor>> parts;
    for (const std::string& one : predictor_list(name)) {
      std::unique_ptr<ExpertPredictor> part;
      if (one == "none" || one.empty())
        return fail(MOELITE_ERR_INVALID_ARGUMENT, "predictor list '%s' names '%s'", name.c_str(), one.c_str());
      MOELITE_TRY(make_predictor(one, depth, m, profile, out ? &part : nullptr));
      parts.push_back(std::move(part));
    }
    if (out) *out = std::make_unique<Composite>(std::move(parts));
    return MOELITE_OK;
  }
  // Built only when asked for: the checks below are what a load without a budget still runs.
  std::unique_ptr<ExpertPredictor> built;
  if (name == "next-gate") {
    if (out) built = std::make_unique<NextGate>(std::max(1, depth));
  } else if (name == "correlation") {
    const uint64_t bytes = correlation_table_bytes(m.hp.n_layer, m.hp.n_expert);
    if (bytes > kMaxCorrelationBytes)
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "predictor 'correlation' would need %.0f MiB of co-activation tables for %d experts x %d layers "
                  "(the limit is %.0f MiB); use next-gate or learned",
                  bytes / 1048576.0, m.hp.n_expert, m.hp.n_layer, kMaxCorrelationBytes / 1048576.0);
    if (out) built = std::make_unique<Correlation>(m, profile);
  } else if (name == "pregate") {
    bool any = false;
    for (const LayerWeights& lw : m.layers) any = any || lw.pregate.valid();
    if (!any)
      return fail(MOELITE_ERR_INVALID_ARGUMENT,
                  "predictor 'pregate' needs a model with pre-gate routers "
                  "(blk.N.ffn_pregate_inp.weight); this one has none");
    if (out) built = std::make_unique<PreGate>();
  } else if (name == "learned" || name == "first-layer") {
    if (!profile)
      return fail(MOELITE_ERR_BAD_PROFILE,
                  "predictor '%s' needs a calibration profile with its fitted weights "
                  "(moelite calibrate; moelite_model_params_set_profile)",
                  name.c_str());
    if (name == "learned") {
      bool any = false;
      for (const LinearMap& lm : profile->learned) any = any || !lm.empty();
      if (!any) return fail(MOELITE_ERR_BAD_PROFILE, "the calibration profile holds no learned predictor weights");
      if (out) built = std::make_unique<Learned>(*profile, k);
    } else {
      if (profile->first_layer.empty())
        return fail(MOELITE_ERR_BAD_PROFILE, "the calibration profile holds no first-layer predictor weights");
      if (out) built = std::make_unique<FirstLayer>(*profile, k, m.hp.n_dense_lead);
    }
  } else {
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "unknown expert predictor '%s' (available: %s)", name.c_str(),
                predictor_names());
  }
  if (out) *out = std::move(built);
  return MOELITE_OK;
}

}  // namespace moelite
