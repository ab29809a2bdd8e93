#include "backends/cpu/cpu_ops.h"

#include "backends/kv_layout.h"
#include "base/rope_angles.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moelite::cpu {

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void rope_angles(const RopeParams& p, int32_t pos, float* cos_out, float* sin_out) {
  moelite::rope_angles(static_cast<double>(p.freq_base), p.n_rot, p.scaling, pos, cos_out, sin_out);
}

void rope_apply(float* head, const RopeParams& p, const float* cos_v, const float* sin_v) {
  const int32_t half = p.n_rot / 2;
  for (int32_t i = 0; i < half; ++i) {
    const int32_t a = p.style == RopeStyle::Normal ? 2 * i : i;
    const int32_t b = p.style == RopeStyle::Normal ? 2 * i + 1 : i + half;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * cos_v[i] - x1 * sin_v[i];
    head[b] = x0 * sin_v[i] + x1 * cos_v[i];
  }
}

void softmax_row(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void top_k(const float* p, int32_t n, int32_t k, int32_t* ids, float* weights) {
  // Any expert count the loader accepts (MOELITE_MAX_EXPERTS): the order lives in a per-thread
  // buffer that grows to the largest n seen, so routing never allocates per token.
  thread_local std::vector<int32_t> order;
  if (order.size() < static_cast<size_t>(n)) order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.begin() + n, 0);
  std::partial_sort(order.begin(), order.begin() + k, order.begin() + n,
                    [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  for (int32_t j = 0; j < k; ++j) {
    ids[j] = order[static_cast<size_t>(j)];
    weights[j] = p[ids[j]];
  }
}

void attend_head(const float* q, const float* k_cache, const float* v_cache, int64_t kv_dim, int64_t kv_offset,
                 int64_t head_dim, int64_t head_dim_v, const AttendRange& range, float scale, float sink, float* scores, float* out,
                 VecDotFn dot_f32) {
  const int32_t n = range.end - range.first;
  float mx = sink;  // -inf without a sink
  for (int32_t j = 0; j < n; ++j) {
    float dot;
    dot_f32(head_dim, &dot, k_cache + kv_slot(range.first + j, range.slots) * kv_dim + kv_offset, q);
    scores[j] = dot * scale;
    mx = std::max(mx, scores[j]);
  }
  double sum = std::isinf(sink) ? 0.0 : std::exp(double{sink} - mx);
  for (int32_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t d = 0; d < head_dim_v; ++d) out[d] = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    const float w = scores[j] * inv;
    const float* v = v_cache + kv_slot(range.first + j, range.slots) * kv_dim + kv_offset;
    for (int64_t d = 0; d < head_dim_v; ++d) out[d] += w * v[d];
  }
}

}  // namespace moelite::cpu
