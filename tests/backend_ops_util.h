// Helpers shared by the backend-operation tests (test_vulkan_ops.cpp, test_cuda_ops.cpp): device
// activations filled and read through the backend interface, random inputs, error measures, and an
// expert source that hands out in-memory experts as the resident source or a budgeted one does.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/quant.h"
#include "core/experts/expert_source.h"
#include "core/moe/expert_executor.h"
#include "tests/random_weights.h"

namespace moelite::test {

struct HostAct {
  Act a;
  Backend* be;
  HostAct(Backend* b, int64_t rows, int64_t cols) : be(b) { EXPECT_EQ(b->alloc_act(rows, cols, &a), MOELITE_OK); }
  ~HostAct() { be->free_act(&a); }
  void set(const std::vector<float>& v) {
    // Written through a one-row identity "weight" would be circular; instead get_rows from an F32 table.
    WeightView t;
    t.type = TensorType::F32;
    t.cols = a.cols;
    t.rows = a.rows;
    t.row_bytes = static_cast<uint64_t>(a.cols) * 4;
    t.data = reinterpret_cast<const uint8_t*>(v.data());
    std::vector<int32_t> ids(static_cast<size_t>(a.rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    // The backend finds its copy of a weight by host address, so the bytes must outlive it (as a
    // model's weights do): kept until the process ends.
    static std::deque<std::vector<float>> kept;
    kept.push_back(v);
    t.data = reinterpret_cast<const uint8_t*>(kept.back().data());
    ASSERT_EQ(be->place_weight(t), MOELITE_OK);
    ASSERT_EQ(be->get_rows(t, ids.data(), static_cast<int32_t>(a.rows), &a), MOELITE_OK);
  }
  std::vector<float> get() {
    std::vector<float> out(static_cast<size_t>(a.rows * a.cols));
    EXPECT_EQ(be->read_rows(a, 0, a.rows, out.data()), MOELITE_OK) << last_error_message();
    return out;
  }
};

inline std::vector<float> randv(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(double(got[i]) - want[i]));
  }
  return err / scale;
}

inline std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

const TensorType kTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
                             TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
                             TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::MXFP4};

// Experts held in memory, handed out as the resident source does or, with resident = false, as a
// budgeted source of two experts at a time (rounds, pins and releases counted).
class FakeExperts final : public ExpertSource {
 public:
  std::vector<ExpertWeights> w;
  bool resident = true;
  int held = 0;
  bool all_resident() const override { return resident; }
  int32_t capacity(int32_t) const override { return resident ? 1 << 20 : 2; }
  Status prepare(int32_t, const std::vector<int32_t>& experts) override {
    held += resident ? 0 : static_cast<int>(experts.size());
    return MOELITE_OK;
  }
  Status acquire_next(int32_t, std::vector<int32_t>* pending, int32_t* e, ExpertWeights* out) override {
    *e = pending->front();
    pending->erase(pending->begin());
    *out = w[static_cast<size_t>(*e)];
    return MOELITE_OK;
  }
  void release(int32_t, int32_t) override { held -= resident ? 0 : 1; }
};

// A weight of `rows` random rows of type t (cols elements each), kept for the process's life (a
// GPU backend finds its device copy by host address, as it does a model's weights).
inline WeightView random_matrix(TensorType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  static std::deque<std::vector<uint8_t>> kept;
  std::vector<uint8_t> bytes;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = random_weights(t, cols, rng);
    bytes.insert(bytes.end(), row.begin(), row.end());
  }
  kept.push_back(std::move(bytes));
  WeightView w;
  w.type = t;
  w.cols = cols;
  w.rows = rows;
  w.row_bytes = kept.back().size() / static_cast<size_t>(rows);
  w.data = kept.back().data();
  return w;
}

// The weight's values by the scalar reference dequantization.
inline std::vector<float> dequantized(const WeightView& w) {
  std::vector<float> deq(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r)
    cpu::kernels_scalar().dequant[static_cast<uint32_t>(w.type)](w.data + r * w.row_bytes, deq.data() + r * w.cols,
                                                                 w.cols);
  return deq;
}

// want[t][r] = bias[r] + sum_c deq[r][c] x[t][c], in float64: the reference of a matrix product.
inline std::vector<double> reference_product(const std::vector<float>& deq, const std::vector<float>& x,
                                             const std::vector<float>& bias, int64_t rows, int64_t cols, int64_t n) {
  std::vector<double> want(static_cast<size_t>(n * rows));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double acc = bias[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c)
        acc += double(deq[static_cast<size_t>(r * cols + c)]) * x[static_cast<size_t>(t * cols + c)];
      want[static_cast<size_t>(t * rows + r)] = acc;
    }
  return want;
}

// Floats handed to a backend as model data (norm weights, biases) must outlive it, since a GPU
// backend finds its copy by host address: kept for the process's life.
inline const std::vector<float>& kept_floats(std::vector<float> v) {
  static std::deque<std::vector<float>> kept;
  kept.push_back(std::move(v));
  return kept.back();
}

// RMSNorm (with a residual add), per-head RMSNorm in place, RMSNorm without weights and RoPE in
// both pairings (with a tail of unrotated dimensions) on `dev`, against the CPU backend.
inline void expect_float_ops_match_cpu(Backend* dev, Backend* cpu) {
  std::mt19937 rng(5);
  const int64_t n = 5, head_dim = 32, n_head = 4, cols = head_dim * n_head;
  const std::vector<float> xv = randv(static_cast<size_t>(n * cols), rng, -3, 3),
                           yv = randv(static_cast<size_t>(n * cols), rng);
  const std::vector<float>& wn = kept_floats(randv(static_cast<size_t>(cols), rng, 0.5f, 1.5f));
  auto both = [&](const std::function<void(Backend*, HostAct&, HostAct&)>& op) {
    HostAct dx(dev, n, cols), dy(dev, n, cols), cx(cpu, n, cols), cy(cpu, n, cols);
    dx.set(xv), dy.set(yv), cx.set(xv), cy.set(yv);
    op(dev, dx, dy);
    op(cpu, cx, cy);
    return std::make_pair(dx.get(), widen(cx.get()));
  };
  auto r = both([&](Backend* b, HostAct& x, HostAct& y) {
    ASSERT_EQ(b->rms_norm(x.a, wn.data(), cols, 1e-6f, &y.a), MOELITE_OK);
    ASSERT_EQ(b->add(&x.a, y.a), MOELITE_OK);
  });
  EXPECT_LT(max_rel(r.first, r.second), 1e-6) << "rms_norm + add";
  r = both([&](Backend* b, HostAct& x, HostAct&) {
    ASSERT_EQ(b->rms_norm(x.a, wn.data(), head_dim, 1e-6f, &x.a), MOELITE_OK);
  });
  EXPECT_LT(max_rel(r.first, r.second), 1e-6) << "per-head rms_norm in place";
  r = both(
      [&](Backend* b, HostAct& x, HostAct&) { ASSERT_EQ(b->rms_norm(x.a, nullptr, cols, 1e-5f, &x.a), MOELITE_OK); });
  EXPECT_LT(max_rel(r.first, r.second), 1e-6) << "rms_norm without weights";
  r = both([&](Backend* b, HostAct& x, HostAct&) { ASSERT_EQ(b->scale(&x.a, 0.22f), MOELITE_OK); });
  std::vector<double> scaled(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) scaled[i] = double{xv[i] * 0.22f};
  EXPECT_EQ(r.first, std::vector<float>(scaled.begin(), scaled.end())) << "scale";  // one rounding: exact
  EXPECT_EQ(widen(r.first), r.second) << "scale";
  r = both([&](Backend* b, HostAct& x, HostAct&) { ASSERT_EQ(b->add_bias(&x.a, wn.data()), MOELITE_OK); });
  std::vector<float> biased(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) biased[i] = xv[i] + wn[i % static_cast<size_t>(cols)];
  EXPECT_EQ(r.first, biased) << "add_bias";  // one rounding: exact
  EXPECT_EQ(widen(r.first), r.second) << "add_bias";
  const int32_t pos[] = {0, 1, 7, 100, 3000};
  for (RopeStyle style : {RopeStyle::Normal, RopeStyle::Neox}) {
    RopeParams rp;
    rp.style = style;
    rp.n_rot = 24;  // fewer than head_dim: the tail stays
    rp.freq_base = 10000.0f;
    r = both([&](Backend* b, HostAct& x, HostAct&) { ASSERT_EQ(b->rope(&x.a, head_dim, rp, pos), MOELITE_OK); });
    EXPECT_LT(max_rel(r.first, r.second), 1e-6) << "rope " << static_cast<int>(style);
    rp.scaling.type = RopeScalingType::Yarn;  // the shared angle table carries the scaling too
    rp.scaling.factor = 8.0f;
    rp.scaling.n_ctx_orig = 64;
    r = both([&](Backend* b, HostAct& x, HostAct&) { ASSERT_EQ(b->rope(&x.a, head_dim, rp, pos), MOELITE_OK); });
    EXPECT_LT(max_rel(r.first, r.second), 1e-6) << "yarn rope " << static_cast<int>(style);
    rp.scaling = RopeScaling{};
  }
}

// Attention of one query head in double, written from the definition: the query at `pos` sees
// positions [max(0, pos - window + 1), pos] (all of [0, pos] for window 0) of keys/values stored
// one row per position; the sink (if any) joins the softmax denominator.
inline void naive_attention_head(const std::vector<float>& q_head, const std::vector<float>& keys,
                                 const std::vector<float>& values, int64_t kv_dim, int64_t kv_off, int64_t head_dim,
                                 int32_t pos, int32_t window, const float* sink, double scale, double* out) {
  const int32_t first = window > 0 ? std::max(0, pos - window + 1) : 0;
  std::vector<double> w;
  double mx = sink ? *sink : -INFINITY;
  for (int32_t p = first; p <= pos; ++p) {
    double d = 0;
    for (int64_t c = 0; c < head_dim; ++c) d += double{q_head[static_cast<size_t>(c)]} * keys[static_cast<size_t>(p * kv_dim + kv_off + c)];
    w.push_back(d * scale);
    mx = std::max(mx, w.back());
  }
  double sum = sink ? std::exp(*sink - mx) : 0.0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  for (int64_t c = 0; c < head_dim; ++c) {
    double acc = 0;
    for (int32_t p = first; p <= pos; ++p)
      acc += w[static_cast<size_t>(p - first)] * values[static_cast<size_t>(p * kv_dim + kv_off + c)];
    out[c] = acc / sum;
  }
}

// Causal GQA attention of a prompt of `prompt` tokens and then batches of 5 more, each attending to
// what came before, on `dev` and on the CPU backend, both against the definition in double: once
// over the whole context, once with a sliding window of 8 and per-head sinks in a cache of only
// window - 1 + prompt slots, which the later batches wrap around more than once.
inline void expect_attention_matches_cpu(Backend* dev, Backend* cpu, int32_t prompt, int32_t n_ctx) {
  const int32_t n_head = 4, n_head_kv = 2, head_dim = 16, window = 8, n_total = std::min(n_ctx, 2 * prompt + 20);
  const int64_t q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim;
  const float sinks[n_head] = {0.5f, -1.0f, 2.0f, -30.0f};
  std::mt19937 rng(3);
  const std::vector<float> q_all = randv(static_cast<size_t>(n_total * q_dim), rng, -2, 2);
  const std::vector<float> k_all = randv(static_cast<size_t>(n_total * kv_dim), rng, -2, 2);
  const std::vector<float> v_all = randv(static_cast<size_t>(n_total * kv_dim), rng);
  auto rows = [](const std::vector<float>& a, int64_t cols, int64_t r0, int64_t n) {
    return std::vector<float>(a.begin() + r0 * cols, a.begin() + (r0 + n) * cols);
  };
  for (const bool windowed : {false, true}) {
    AttentionSpec spec;
    if (windowed) spec.window = window, spec.sinks = sinks;
    const int32_t slots = windowed ? std::min(n_ctx, window - 1 + prompt) : n_ctx;
    std::vector<double> want(static_cast<size_t>(n_total * q_dim));
    for (int32_t t = 0; t < n_total; ++t)
      for (int32_t h = 0; h < n_head; ++h) {
        std::vector<float> qh(q_all.begin() + t * q_dim + h * head_dim, q_all.begin() + t * q_dim + (h + 1) * head_dim);
        naive_attention_head(qh, k_all, v_all, kv_dim, (h / (n_head / n_head_kv)) * head_dim, head_dim, t,
                             spec.window, windowed ? &sinks[h] : nullptr, 1.0 / std::sqrt(double{head_dim}),
                             want.data() + static_cast<size_t>(t * q_dim + h * head_dim));
      }
    for (Backend* b : {dev, cpu}) {
      KvCache kv;
      ASSERT_EQ(b->alloc_kv(n_ctx, {n_ctx, slots}, kv_dim, true, &kv), MOELITE_OK);
      std::vector<float> got;
      for (int32_t pos0 = 0; pos0 < n_total;) {
        const int32_t n = std::min(pos0 == 0 ? prompt : 5, n_total - pos0);
        HostAct q(b, n, q_dim), k(b, n, kv_dim), v(b, n, kv_dim), o(b, n, q_dim);
        q.set(rows(q_all, q_dim, pos0, n));
        k.set(rows(k_all, kv_dim, pos0, n));
        v.set(rows(v_all, kv_dim, pos0, n));
        ASSERT_EQ(b->attention(&kv, 1, q.a, k.a, v.a, pos0, n_head, n_head_kv, head_dim, spec, &o.a), MOELITE_OK);
        const std::vector<float> out = o.get();
        got.insert(got.end(), out.begin(), out.end());
        pos0 += n;
      }
      b->free_kv(&kv);
      EXPECT_LT(max_rel(got, want), 1e-5) << b->name() << (windowed ? " window + sinks" : " full");
    }
  }
}

// Multi-head latent attention's form (deepseek2): a keys-only cache of one shared row per position
// (n_head_kv 1), each head's value the first head_dim_v floats of that row; a prompt and then
// batches of 5, on `dev` and the CPU backend, against the definition in double.
inline void expect_latent_attention_matches_cpu(Backend* dev, Backend* cpu, int32_t prompt, int32_t n_ctx) {
  const int32_t n_head = 4, row = 24, head_dim_v = 16, n_total = std::min(n_ctx, 2 * prompt + 20);
  const int64_t q_dim = n_head * row, o_dim = n_head * head_dim_v;
  std::mt19937 rng(5);
  const std::vector<float> q_all = randv(static_cast<size_t>(n_total * q_dim), rng, -2, 2);
  const std::vector<float> k_all = randv(static_cast<size_t>(n_total * row), rng, -2, 2);
  const double scale = 0.3;
  std::vector<double> want(static_cast<size_t>(n_total * o_dim)), full(static_cast<size_t>(row));
  for (int32_t t = 0; t < n_total; ++t)
    for (int32_t h = 0; h < n_head; ++h) {
      std::vector<float> qh(q_all.begin() + t * q_dim + h * row, q_all.begin() + t * q_dim + (h + 1) * row);
      naive_attention_head(qh, k_all, k_all, row, 0, row, t, 0, nullptr, scale, full.data());
      std::copy(full.begin(), full.begin() + head_dim_v, want.begin() + t * o_dim + h * head_dim_v);
    }
  for (Backend* b : {dev, cpu}) {
    KvCache kv;
    ASSERT_EQ(b->alloc_kv(n_ctx, {n_ctx}, row, false, &kv), MOELITE_OK);
    AttentionSpec spec;
    spec.scale = static_cast<float>(scale);
    spec.head_dim_v = head_dim_v;
    std::vector<float> got;
    for (int32_t pos0 = 0; pos0 < n_total;) {
      const int32_t n = std::min(pos0 == 0 ? prompt : 5, n_total - pos0);
      HostAct q(b, n, q_dim), k(b, n, row), o(b, n, o_dim);
      q.set(std::vector<float>(q_all.begin() + pos0 * q_dim, q_all.begin() + (pos0 + n) * q_dim));
      k.set(std::vector<float>(k_all.begin() + pos0 * row, k_all.begin() + (pos0 + n) * row));
      ASSERT_EQ(b->attention(&kv, 0, q.a, k.a, k.a, pos0, n_head, 1, row, spec, &o.a), MOELITE_OK);
      const std::vector<float> out = o.get();
      got.insert(got.end(), out.begin(), out.end());
      pos0 += n;
    }
    // A value width the keys-only cache cannot serve, and one a key-and-value cache must not get.
    HostAct q(b, 1, q_dim), k(b, 1, row), o(b, 1, o_dim);
    AttentionSpec too_wide = spec;
    too_wide.head_dim_v = row + 1;
    EXPECT_EQ(b->attention(&kv, 0, q.a, k.a, k.a, 0, n_head, 1, row, too_wide, &o.a), MOELITE_ERR_INVALID_ARGUMENT);
    b->free_kv(&kv);
    EXPECT_LT(max_rel(got, want), 1e-5) << b->name() << " keys-only cache";
  }
}

// copy_columns gathering one head of four (a column slice of every row) and scattering four
// groups into a wider row at a stride and offset, on `dev` against the definition; bad bounds fail.
inline void expect_copy_columns_match_definition(Backend* b) {
  std::mt19937 rng(4);
  const int64_t n = 5;
  const std::vector<float> x = randv(static_cast<size_t>(n * 24), rng);
  HostAct src(b, n, 24), head(b, n, 6), wide(b, n, 40);
  src.set(x);
  ASSERT_EQ(b->copy_columns(src.a, 0, 12, 1, 6, &head.a, 0, 0), MOELITE_OK);  // head 2 of 4 (6 wide)
  wide.set(std::vector<float>(static_cast<size_t>(n * 40), -7.0f));
  ASSERT_EQ(b->copy_columns(src.a, 6, 2, 4, 3, &wide.a, 10, 5), MOELITE_OK);  // 4 groups of 3
  const std::vector<float> got_head = head.get(), got_wide = wide.get();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(got_head[t * 6 + c], x[t * 24 + 12 + c]) << t << "," << c;
    for (int64_t c = 0; c < 40; ++c) {
      const int64_t g = c / 10, in = c % 10 - 5;
      const float want = (in >= 0 && in < 3) ? x[t * 24 + g * 6 + 2 + in] : -7.0f;
      EXPECT_EQ(got_wide[t * 40 + c], want) << t << "," << c;
    }
  }
  EXPECT_EQ(b->copy_columns(src.a, 6, 2, 4, 5, &wide.a, 10, 5), MOELITE_ERR_INVALID_ARGUMENT);  // source too narrow
  EXPECT_EQ(b->copy_columns(src.a, 0, 0, 1, 6, &src.a, 0, 6), MOELITE_ERR_INVALID_ARGUMENT);    // in place
}

// Routing of n tokens over 16 experts, top-4 with a tie (the lower id wins), with and without
// renormalisation, on `dev` against the CPU backend.
// Expert counts below, at and above a warp's 32 lanes (a GPU may give each lane several experts),
// with ties between experts.
inline void expect_routing_matches_cpu(Backend* dev, Backend* cpu, int64_t n) {
  std::mt19937 rng(2);
  for (const int64_t n_expert : {16, 60, 128}) {
  SCOPED_TRACE(n_expert);
  std::vector<float> logits = randv(static_cast<size_t>(n * n_expert), rng, -3, 3);
  logits[3] = logits[5];
  logits[static_cast<size_t>(n_expert + (40 % n_expert))] = logits[static_cast<size_t>(n_expert + 7)];  // row 1
  for (bool renorm : {false, true}) {
    Routing rd, rc;
    HostAct ld(dev, n, n_expert), lc(cpu, n, n_expert);
    ld.set(logits);
    lc.set(logits);
    ASSERT_EQ(dev->route(ld.a, 4, renorm, &rd), MOELITE_OK);
    ASSERT_EQ(cpu->route(lc.a, 4, renorm, &rc), MOELITE_OK);
    EXPECT_EQ(rd.ids, rc.ids);
    ASSERT_EQ(rd.weights.size(), rc.weights.size());
    for (size_t i = 0; i < rd.weights.size(); ++i) EXPECT_NEAR(rd.weights[i], rc.weights[i], 2e-7) << i;
  }
  }
}

// Budgeted experts of float weights (so the CPU backend is an exact-enough reference) for the
// device-tier tests of the GPU backends: `n_expert` experts d -> ff -> d.
struct TierCase {
  static constexpr int64_t n = 4, d = 64, ff = 96;
  FakeExperts ex;
  FfnKind kind;
  std::vector<float> x;
  explicit TierCase(int32_t n_expert) {
    std::mt19937 rng(9);
    for (int32_t e = 0; e < n_expert; ++e)
      ex.w.push_back(ExpertWeights{random_matrix(TensorType::F32, ff, d, rng),
                                   random_matrix(TensorType::F32, ff, d, rng),
                                   random_matrix(TensorType::F32, d, ff, rng)});
    ex.resident = false;
    x = randv(static_cast<size_t>(n * d), rng, -2, 2);
  }
  // Every token routed to `ids` (k = ids.size(), equal weights).
  static Routing routing(const std::vector<int32_t>& ids) {
    Routing r;
    r.n_tokens = static_cast<int32_t>(n);
    r.k = static_cast<int32_t>(ids.size());
    for (int64_t t = 0; t < n; ++t)
      for (int32_t id : ids) {
        r.ids.push_back(id);
        r.weights.push_back(1.0f / static_cast<float>(ids.size()));
      }
    return r;
  }
  std::vector<float> run(Backend* b, const Routing& r) {
    FakeExperts source = ex;  // its own counts: tests run these on several threads
    HostAct xa(b, n, d), o(b, n, d);
    {
      static std::mutex set_mu;  // HostAct::set keeps its table in one list for the process
      std::lock_guard<std::mutex> lock(set_mu);
      xa.set(x);
    }
    EXPECT_EQ(run_routed_experts(*b, source, 0, kind, xa.a, r, &o.a), MOELITE_OK) << last_error_message();
    EXPECT_EQ(source.held, 0) << "every expert is released";
    return o.get();
  }
};

// A GPU backend instance's use of its device tier: matrices found there, copied in, and copied for
// one pass because peers held the slots.
struct TierCounts {
  uint64_t hits = 0, loads = 0, own_copies = 0;
};
using TierCountsOf = std::function<TierCounts(Backend*)>;

// Two instances of one discrete device (`first` and its peer) and a tier of two expert slots
// (set_device_tier_slots(2) before the peer was made). `first` holds expert 1's slot part way through a
// pass (gate/up queued, down not yet) while the peer runs a whole pass over experts 0..3: the peer
// must not read or overwrite that slot, nor wait for `first`, so it copies expert 1's three
// matrices for itself and takes turns with itself on the slot left. Both results as the CPU's;
// after `first`'s round end the slot serves the peer.
inline void expect_peers_share_a_tier_without_waiting(Backend* first, Backend* peer, Backend* cpu,
                                                      const TierCountsOf& counts) {
  TierCase c(4);
  const Routing one = TierCase::routing({1}), all = TierCase::routing({0, 1, 2, 3});
  HostAct xa(first, c.n, c.d), o(first, c.n, c.d);
  xa.set(c.x);
  std::vector<int32_t> rows(static_cast<size_t>(c.n));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
  ExpertTask task;
  task.layer = 0;
  task.expert = 1;
  task.w = c.ex.w[1];
  task.x_rows = rows.data();
  task.out_rows = rows.data();  // k = 1: output row = token
  task.n_rows = static_cast<int32_t>(c.n);
  ASSERT_EQ(first->moe_begin(xa.a, c.kind, c.n), MOELITE_OK);
  ASSERT_EQ(first->expert_gate_up(&task, 1), MOELITE_OK) << last_error_message();

  const std::vector<float> peer_out = c.run(peer, all);
  EXPECT_EQ(counts(peer).own_copies, 3u) << "expert 1's gate, up and down, held by the other instance";

  ASSERT_EQ(first->expert_down(&task, 1), MOELITE_OK);
  ASSERT_EQ(first->expert_round_end(), MOELITE_OK);
  ASSERT_EQ(first->moe_combine(one, &o.a), MOELITE_OK);
  const std::vector<float> held_out = o.get();
  EXPECT_EQ(counts(first).own_copies, 0u);

  EXPECT_LT(max_rel(peer_out, widen(c.run(cpu, all))), 1e-5);
  EXPECT_LT(max_rel(held_out, widen(c.run(cpu, one))), 1e-5);
  const TierCounts before = counts(peer);
  EXPECT_LT(max_rel(c.run(peer, one), widen(c.run(cpu, one))), 1e-5);
  EXPECT_EQ(counts(peer).own_copies, before.own_copies);
  EXPECT_EQ(counts(peer).hits, before.hits + 3) << "expert 1 stayed in its slot";
}

// Instances of one discrete device (a tier of three slots), each on a thread of its own, 60 passes
// each over three of six experts: slots change hands all the time, and whoever finds them held
// copies for itself. Every result as the CPU's.
inline void expect_peers_through_one_tier_compute_what_the_cpu_does(const std::vector<Backend*>& instances,
                                                                    Backend* cpu, const TierCountsOf& counts) {
  TierCase c(6);
  std::vector<Routing> routings;
  std::vector<std::vector<double>> want;
  for (int32_t first = 0; first < 6; ++first) {
    routings.push_back(TierCase::routing({first, (first + 2) % 6, (first + 3) % 6}));
    want.push_back(widen(c.run(cpu, routings.back())));
  }
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> failures;
  for (size_t i = 0; i < instances.size(); ++i)
    threads.emplace_back([&, i] {
      for (int round = 0; round < 60; ++round) {
        const size_t which = (i * 5 + static_cast<size_t>(round)) % routings.size();
        const double rel = max_rel(c.run(instances[i], routings[which]), want[which]);
        if (rel >= 1e-5) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back("instance " + std::to_string(i) + " round " + std::to_string(round) + ": max rel " +
                             std::to_string(rel));
        }
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << failures.front();
  uint64_t loads = 0;
  for (Backend* b : instances) loads += counts(b).loads;
  EXPECT_GT(loads, 0u);
}

}  // namespace moelite::test
