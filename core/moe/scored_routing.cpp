#include "core/moe/scored_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moelite {

bool needs_scored_routing(const HParams& hp, const std::vector<float>& selection_bias) {
  return hp.gating_func != ExpertGatingFunc::Softmax || hp.n_expert_groups > 1 || !selection_bias.empty();
}

namespace {

// a ranks before b: the higher value, then the lower index; NaN ranks last.
bool ranks_before(const float* v, int32_t a, int32_t b) {
  const bool na = std::isnan(v[a]), nb = std::isnan(v[b]);
  if (na != nb) return nb;
  return v[a] > v[b] || (v[a] == v[b] && a < b) || (na && a < b);
}

}  // namespace

void route_scores(const HParams& hp, const float* logits, int32_t n, const float* bias, Routing* r) {
  const int32_t E = hp.n_expert, k = hp.n_expert_used;
  r->n_tokens = n;
  r->k = k;
  r->ids.assign(static_cast<size_t>(n) * static_cast<size_t>(k), -1);
  r->weights.assign(r->ids.size(), 0.0f);
  std::vector<float> score(static_cast<size_t>(E)), select(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  const int32_t groups = hp.n_expert_groups > 1 ? hp.n_expert_groups : 1, per_group = E / groups;
  std::vector<float> group_score(static_cast<size_t>(groups));
  std::vector<int32_t> group_order(static_cast<size_t>(groups));
  std::vector<uint8_t> allowed(static_cast<size_t>(groups), 1);
  for (int32_t t = 0; t < n; ++t) {
    const float* l = logits + static_cast<size_t>(t) * static_cast<size_t>(E);
    if (hp.gating_func == ExpertGatingFunc::Sigmoid) {
      for (int32_t e = 0; e < E; ++e) score[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      float mx = -INFINITY;
      for (int32_t e = 0; e < E; ++e) mx = std::max(mx, l[e]);
      double sum = 0.0;
      for (int32_t e = 0; e < E; ++e) sum += score[static_cast<size_t>(e)] = std::exp(l[e] - mx);
      for (float& v : score) v = static_cast<float>(v / sum);
    }
    for (int32_t e = 0; e < E; ++e)
      select[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + (bias ? bias[e] : 0.0f);
    if (groups > 1) {
      for (int32_t g = 0; g < groups; ++g) {  // the sum of the group's two best
        const float* v = select.data() + static_cast<size_t>(g) * static_cast<size_t>(per_group);
        float a = -INFINITY, b = -INFINITY;
        for (int32_t j = 0; j < per_group; ++j) {
          if (std::isnan(v[j])) continue;
          if (v[j] > a) {
            b = a;
            a = v[j];
          } else if (v[j] > b) {
            b = v[j];
          }
        }
        group_score[static_cast<size_t>(g)] = a + b;
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::stable_sort(group_order.begin(), group_order.end(),
                       [&](int32_t a, int32_t b) { return ranks_before(group_score.data(), a, b); });
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int32_t j = 0; j < hp.n_group_used; ++j) allowed[static_cast<size_t>(group_order[static_cast<size_t>(j)])] = 1;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const bool pa = allowed[static_cast<size_t>(a / per_group)] != 0, pb = allowed[static_cast<size_t>(b / per_group)] != 0;
      if (pa != pb) return pa;
      return ranks_before(select.data(), a, b);
    });
    int32_t* ids = r->ids.data() + static_cast<size_t>(t) * static_cast<size_t>(k);
    float* w = r->weights.data() + static_cast<size_t>(t) * static_cast<size_t>(k);
    float sum = 0.0f;
    for (int32_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      if (std::isnan(select[static_cast<size_t>(e)]) || !allowed[static_cast<size_t>(e / per_group)]) continue;
      ids[j] = e;
      w[j] = score[static_cast<size_t>(e)];
      sum += w[j];
    }
    if (hp.norm_topk) {
      const float denom = std::max(sum, 6.103515625e-5f);
      for (int32_t j = 0; j < k; ++j) w[j] /= denom;
    }
  }
}

}  // namespace moelite
