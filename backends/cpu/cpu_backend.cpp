#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "platforms/platform.h"

namespace moelite::cpu {

namespace {

float* rows_of(const Act& a) { return static_cast<float*>(a.handle); }

struct KvStorage {
  float* k = nullptr;
  float* v = nullptr;
};

// Row-chunk size for splitting a matrix of `rows` outputs over `threads`: several chunks per
// thread so dynamic scheduling evens out, but chunks long enough that a task is not all overhead.
int64_t row_chunk(int64_t rows, int threads) {
  int64_t chunk = rows / (static_cast<int64_t>(threads) * 4);
  return std::clamp<int64_t>(chunk, 1, 64);
}

// Weight rows stream from DRAM once per token in decode. The hardware prefetchers lose the stream
// at every 4 KiB page boundary of the file mapping, so each task also asks for the row it will need
// `kPrefetchRows` rows ahead, keeping enough misses in flight to approach full bandwidth.
int g_prefetch_rows = [] {
  const char* e = getenv("MOELITE_PREFETCH_ROWS");
  return e ? atoi(e) : 2;
}();

inline void prefetch_row(const uint8_t* p, uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 0);
}

// Tokens per task in batched products: the activations of one chunk stay in L2 while each weight
// row is reused from L1 across them.
constexpr int64_t kTokenChunk = 32;

}  // namespace

CpuBackend::CpuBackend(int32_t n_threads)
    : k_(kernels_best()), pool_(n_threads), name_(std::string("cpu (") + kernels_best().isa + ")") {
  attn_scores_.resize(static_cast<size_t>(pool_.size()));
}

CpuBackend::~CpuBackend() = default;

Status CpuBackend::place_weight(WeightView* w) {
  if (!w->data) return fail(MOELITE_ERR_INTERNAL, "CPU backend got a weight without host bytes");
  return check_weight(*w);
}

Status CpuBackend::check_weight(const WeightView& w) {
  if (!k_.vec_dot[static_cast<uint32_t>(w.type)])
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "no CPU kernel for weight type %s", type_name(w.type));
  return MOELITE_OK;
}

Status CpuBackend::alloc_act(int64_t rows, int64_t cols, Act* out) {
  if (rows <= 0 || cols <= 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "empty activation");
  void* p = platform::aligned_alloc_bytes(static_cast<size_t>(rows * cols) * sizeof(float), 64);
  if (!p) return fail(MOELITE_ERR_OUT_OF_MEMORY, "activation of %lld x %lld floats", (long long)rows, (long long)cols);
  memset(p, 0, static_cast<size_t>(rows * cols) * sizeof(float));
  out->handle = p;
  out->rows = rows;
  out->cols = cols;
  return MOELITE_OK;
}

void CpuBackend::free_act(Act* a) {
  platform::aligned_free(a->handle);
  *a = Act{};
}

Act CpuBackend::view_rows(const Act& a, int64_t row0, int64_t n) {
  return Act{rows_of(a) + row0 * a.cols, n, a.cols};
}

void CpuBackend::read_rows(const Act& a, int64_t row0, int64_t n, float* dst) {
  memcpy(dst, rows_of(a) + row0 * a.cols, static_cast<size_t>(n * a.cols) * sizeof(float));
}

Status CpuBackend::alloc_kv(int32_t n_layers, int32_t n_ctx, int64_t kv_dim, KvCache* out) {
  const size_t bytes = static_cast<size_t>(n_layers) * n_ctx * kv_dim * sizeof(float);
  auto* s = new (std::nothrow) KvStorage;
  if (!s) return fail(MOELITE_ERR_OUT_OF_MEMORY, "KV cache");
  s->k = static_cast<float*>(platform::aligned_alloc_bytes(bytes, 64));
  s->v = static_cast<float*>(platform::aligned_alloc_bytes(bytes, 64));
  if (!s->k || !s->v) {
    platform::aligned_free(s->k);
    platform::aligned_free(s->v);
    delete s;
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "KV cache of %zu bytes", 2 * bytes);
  }
  out->handle = s;
  out->n_layers = n_layers;
  out->n_ctx = n_ctx;
  out->kv_dim = kv_dim;
  return MOELITE_OK;
}

void CpuBackend::free_kv(KvCache* kv) {
  auto* s = static_cast<KvStorage*>(kv->handle);
  if (s) {
    platform::aligned_free(s->k);
    platform::aligned_free(s->v);
    delete s;
  }
  *kv = KvCache{};
}

void CpuBackend::get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) {
  DequantRowFn dequant = k_.dequant[static_cast<uint32_t>(table.type)];
  for (int32_t t = 0; t < n; ++t)
    dequant(table.data + static_cast<uint64_t>(tokens[t]) * table.row_bytes, rows_of(*out) + t * out->cols, table.cols);
}

void CpuBackend::rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) {
  const int64_t groups_per_row = x.cols / group;
  const int64_t total = x.rows * groups_per_row;
  const float* src = rows_of(x);
  float* dst = rows_of(*out);
  auto body = [&](int64_t g, int) { rms_norm_row(src + g * group, w, group, eps, dst + g * group); };
  if (total * group < 16384) {
    for (int64_t g = 0; g < total; ++g) body(g, 0);
  } else {
    pool_.parallel_for(total, body);
  }
}

const uint8_t* CpuBackend::quantize_rows(const float* x, int64_t rows, int64_t cols,
                                         TensorType weight_type, std::vector<uint8_t>* buf) {
  const TensorType dt = dot_type(weight_type);
  if (dt == TensorType::F32) return reinterpret_cast<const uint8_t*>(x);
  const size_t row_bytes = activation_row_bytes(weight_type, cols);
  if (buf->size() < row_bytes * static_cast<size_t>(rows)) buf->resize(row_bytes * static_cast<size_t>(rows));
  QuantizeRowFn quantize = k_.quantize_act[static_cast<uint32_t>(dt)];
  uint8_t* dst = buf->data();
  auto body = [&](int64_t r, int) { quantize(x + r * cols, dst + r * row_bytes, cols); };
  if (rows < 4) {
    for (int64_t r = 0; r < rows; ++r) body(r, 0);
  } else {
    pool_.parallel_for(rows, body);
  }
  return dst;
}

void CpuBackend::matmul_rows(const WeightView& w, const uint8_t* act, size_t act_stride, int64_t n,
                             float* out, int64_t out_stride) {
  VecDotMultiFn dot = k_.vec_dot_multi[static_cast<uint32_t>(w.type)];
  const int64_t rc = row_chunk(w.rows, pool_.size());
  const int64_t n_rc = (w.rows + rc - 1) / rc;
  const int64_t n_tc = (n + kTokenChunk - 1) / kTokenChunk;
  pool_.parallel_for(n_rc * n_tc, [&](int64_t task, int) {
    const int64_t r0 = (task % n_rc) * rc, r1 = std::min(w.rows, r0 + rc);
    const int64_t t0 = (task / n_rc) * kTokenChunk, t1 = std::min(n, t0 + kTokenChunk);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wrow = w.data + static_cast<uint64_t>(r) * w.row_bytes;
      if (r + g_prefetch_rows < r1) prefetch_row(wrow + g_prefetch_rows * w.row_bytes, w.row_bytes);
      // kMultiDot tokens per call decode the weight row once per group; the result of each
      // token is bit-identical to a single vec_dot, so batching never changes the output.
      for (int64_t t = t0; t < t1; t += kMultiDot) {
        const int count = static_cast<int>(std::min<int64_t>(kMultiDot, t1 - t));
        float o[kMultiDot];
        dot(w.cols, o, wrow, act + t * act_stride, act_stride, count);
        for (int j = 0; j < count; ++j) out[(t + j) * out_stride + r] = o[j];
      }
    }
  });
}

void CpuBackend::matmul(const WeightView& w, const Act& x, const float* bias, Act* out) {
  const uint8_t* act = quantize_rows(rows_of(x), x.rows, x.cols, w.type, &qbuf_);
  const TensorType dt = dot_type(w.type);
  const size_t stride = dt == TensorType::F32 ? static_cast<size_t>(x.cols) * sizeof(float)
                                              : activation_row_bytes(w.type, x.cols);
  float* y = rows_of(*out);
  matmul_rows(w, act, stride, x.rows, y, out->cols);
  if (bias) {
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t r = 0; r < w.rows; ++r) y[t * out->cols + r] += bias[r];
  }
}

void CpuBackend::add(Act* x, const Act& y) {
  float* a = rows_of(*x);
  const float* b = rows_of(y);
  const int64_t n = x->rows * x->cols;
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void CpuBackend::rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) {
  const int64_t heads = x->cols / head_dim;
  float* data = rows_of(*x);
  std::vector<float> cos_v(static_cast<size_t>(p.n_rot / 2)), sin_v(cos_v.size());
  for (int64_t t = 0; t < x->rows; ++t) {
    rope_angles(p, positions[t], cos_v.data(), sin_v.data());  // once per token, shared by its heads
    for (int64_t h = 0; h < heads; ++h) rope_apply(data + t * x->cols + h * head_dim, p, cos_v.data(), sin_v.data());
  }
}

void CpuBackend::attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v,
                           int32_t pos0, int32_t n_head, int32_t n_head_kv, int64_t head_dim, Act* out) {
  auto* s = static_cast<KvStorage*>(kv->handle);
  const int64_t kv_dim = kv->kv_dim;
  float* k_layer = s->k + static_cast<int64_t>(layer) * kv->n_ctx * kv_dim;
  float* v_layer = s->v + static_cast<int64_t>(layer) * kv->n_ctx * kv_dim;
  const int64_t n = q.rows;
  memcpy(k_layer + pos0 * kv_dim, rows_of(k), static_cast<size_t>(n * kv_dim) * sizeof(float));
  memcpy(v_layer + pos0 * kv_dim, rows_of(v), static_cast<size_t>(n * kv_dim) * sizeof(float));
  for (auto& sc : attn_scores_)
    if (sc.size() < static_cast<size_t>(kv->n_ctx)) sc.resize(static_cast<size_t>(kv->n_ctx));
  const int32_t group = n_head / n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const float* qd = rows_of(q);
  float* od = rows_of(*out);
  pool_.parallel_for(n * n_head, [&](int64_t task, int thread) {
    const int64_t t = task / n_head, h = task % n_head;
    attend_head(qd + t * q.cols + h * head_dim, k_layer, v_layer, kv_dim, (h / group) * head_dim,
                head_dim, pos0 + static_cast<int32_t>(t) + 1, scale, attn_scores_[thread].data(),
                od + t * out->cols + h * head_dim, k_.vec_dot[static_cast<uint32_t>(TensorType::F32)]);
  });
}

void CpuBackend::route(const Act& logits, int32_t k, bool renormalize, Routing* r) {
  const int64_t n = logits.rows, n_expert = logits.cols;
  r->n_tokens = static_cast<int32_t>(n);
  r->k = k;
  r->ids.resize(static_cast<size_t>(n * k));
  r->weights.resize(static_cast<size_t>(n * k));
  std::vector<float> probs(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n; ++t) {
    memcpy(probs.data(), rows_of(logits) + t * n_expert, static_cast<size_t>(n_expert) * sizeof(float));
    softmax_row(probs.data(), n_expert);
    int32_t* ids = r->ids.data() + t * k;
    float* w = r->weights.data() + t * k;
    top_k(probs.data(), static_cast<int32_t>(n_expert), k, ids, w);
    if (renormalize) {
      float sum = 0.0f;
      for (int32_t j = 0; j < k; ++j) sum += w[j];
      for (int32_t j = 0; j < k; ++j) w[j] /= sum;
    }
  }
}

// All jobs of one call share weight types (the model loader checks that every expert of a layer
// has the gate/up/down types of the first), so activations are quantized once per format.
Status CpuBackend::run_ffn_jobs(const std::vector<FfnJob>& jobs, const Act& x, float* results,
                                const std::function<Status()>& before_down) {
  if (jobs.empty()) return MOELITE_OK;
  const int64_t n_embd = x.cols;
  // Activations in the dot formats of the gate/up weights (usually one format for all).
  const TensorType gate_type = jobs[0].w.gate.type, up_type = jobs[0].w.up.type;
  const uint8_t* xq_gate = quantize_rows(rows_of(x), x.rows, x.cols, gate_type, &qbuf_);
  const uint8_t* xq_up = xq_gate;
  if (dot_type(up_type) != dot_type(gate_type)) xq_up = quantize_rows(rows_of(x), x.rows, x.cols, up_type, &qbuf2_);
  auto stride_of = [&](TensorType t, int64_t cols) {
    return dot_type(t) == TensorType::F32 ? static_cast<size_t>(cols) * sizeof(float) : activation_row_bytes(t, cols);
  };
  const size_t gate_stride = stride_of(gate_type, n_embd), up_stride = stride_of(up_type, n_embd);

  // h rows: one per (job, routed row), n_ff_max floats each.
  int64_t n_ff_max = 0, h_rows = 0;
  std::vector<int64_t> h_offset(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    n_ff_max = std::max(n_ff_max, jobs[j].w.gate.rows);
    h_offset[j] = h_rows;
    h_rows += static_cast<int64_t>(jobs[j].x_rows.size());
  }
  if (ffn_h_.size() < static_cast<size_t>(h_rows * n_ff_max)) ffn_h_.resize(static_cast<size_t>(h_rows * n_ff_max));
  float* h = ffn_h_.data();

  // The multi-row dot kernels take evenly strided activation rows, but a job's tokens are
  // scattered through x. Copy them so row h_offset[j] + i holds token x_rows[i] of job j (the
  // same row numbering as h), in each dot format.
  auto gather = [&](const uint8_t* src, size_t stride, std::vector<uint8_t>* buf) {
    if (buf->size() < stride * static_cast<size_t>(h_rows)) buf->resize(stride * static_cast<size_t>(h_rows));
    uint8_t* dst = buf->data();
    for (size_t j = 0; j < jobs.size(); ++j)
      for (size_t i = 0; i < jobs[j].x_rows.size(); ++i)
        memcpy(dst + static_cast<size_t>(h_offset[j] + static_cast<int64_t>(i)) * stride,
               src + static_cast<size_t>(jobs[j].x_rows[i]) * stride, stride);
    return static_cast<const uint8_t*>(dst);
  };
  const uint8_t* xg_gate = gather(xq_gate, gate_stride, &ffn_xg_gate_);
  const uint8_t* xg_up = xq_up == xq_gate && up_stride == gate_stride ? xg_gate : gather(xq_up, up_stride, &ffn_xg_up_);

  struct Task {
    int32_t job;
    int64_t r0, r1;
  };
  auto make_tasks = [&](auto rows_of_job) {
    std::vector<Task> tasks;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const int64_t rows = rows_of_job(jobs[j]);
      const int64_t rc = row_chunk(rows, pool_.size());
      for (int64_t r0 = 0; r0 < rows; r0 += rc) tasks.push_back({static_cast<int32_t>(j), r0, std::min(rows, r0 + rc)});
    }
    return tasks;
  };

  // Phase 1: h = silu(gate x) * up x for every routed row of every job.
  const std::vector<Task> gate_tasks = make_tasks([](const FfnJob& j) { return j.w.gate.rows; });
  pool_.parallel_for(static_cast<int64_t>(gate_tasks.size()), [&](int64_t ti, int) {
    const Task& task = gate_tasks[static_cast<size_t>(ti)];
    const FfnJob& job = jobs[static_cast<size_t>(task.job)];
    VecDotMultiFn gdot = k_.vec_dot_multi[static_cast<uint32_t>(job.w.gate.type)];
    VecDotMultiFn udot = k_.vec_dot_multi[static_cast<uint32_t>(job.w.up.type)];
    const int64_t cols = job.w.gate.cols;
    const int64_t base = h_offset[static_cast<size_t>(task.job)];
    const int64_t nx = static_cast<int64_t>(job.x_rows.size());
    float* hj = h + base * n_ff_max;
    for (int64_t r = task.r0; r < task.r1; ++r) {
      const uint8_t* grow = job.w.gate.data + static_cast<uint64_t>(r) * job.w.gate.row_bytes;
      const uint8_t* urow = job.w.up.data + static_cast<uint64_t>(r) * job.w.up.row_bytes;
      if (r + g_prefetch_rows < task.r1) {
        prefetch_row(grow + g_prefetch_rows * job.w.gate.row_bytes, job.w.gate.row_bytes);
        prefetch_row(urow + g_prefetch_rows * job.w.up.row_bytes, job.w.up.row_bytes);
      }
      for (int64_t i = 0; i < nx; i += kMultiDot) {
        const int count = static_cast<int>(std::min<int64_t>(kMultiDot, nx - i));
        float g[kMultiDot], u[kMultiDot];
        gdot(cols, g, grow, xg_gate + static_cast<size_t>(base + i) * gate_stride, gate_stride, count);
        udot(cols, u, urow, xg_up + static_cast<size_t>(base + i) * up_stride, up_stride, count);
        for (int j = 0; j < count; ++j) hj[(i + j) * n_ff_max + r] = silu(g[j]) * u[j];
      }
    }
  });

  if (before_down) MOELITE_TRY(before_down());

  // Phase 2: quantize h for the down projections.
  const TensorType down_type = jobs[0].w.down.type;
  const size_t hq_stride = stride_of(down_type, n_ff_max);
  const uint8_t* hq = reinterpret_cast<const uint8_t*>(h);
  if (dot_type(down_type) != TensorType::F32) {
    // Jobs with a shorter n_ff are quantized per job so each row is exactly that job's length.
    const size_t need = hq_stride * static_cast<size_t>(h_rows);
    if (qbuf2_.size() < need) qbuf2_.resize(need);
    QuantizeRowFn quantize = k_.quantize_act[static_cast<uint32_t>(dot_type(down_type))];
    uint8_t* dst = qbuf2_.data();
    std::vector<int64_t> row_ff(static_cast<size_t>(h_rows));
    for (size_t j = 0; j < jobs.size(); ++j)
      for (size_t i = 0; i < jobs[j].x_rows.size(); ++i) row_ff[static_cast<size_t>(h_offset[j]) + i] = jobs[j].w.gate.rows;
    pool_.parallel_for(h_rows, [&](int64_t r, int) {
      quantize(h + r * n_ff_max, dst + static_cast<size_t>(r) * hq_stride, row_ff[static_cast<size_t>(r)]);
    });
    hq = dst;
  }

  // Phase 3: results[out_row] = down h.
  const std::vector<Task> down_tasks = make_tasks([](const FfnJob& j) { return j.w.down.rows; });
  pool_.parallel_for(static_cast<int64_t>(down_tasks.size()), [&](int64_t ti, int) {
    const Task& task = down_tasks[static_cast<size_t>(ti)];
    const FfnJob& job = jobs[static_cast<size_t>(task.job)];
    VecDotMultiFn ddot = k_.vec_dot_multi[static_cast<uint32_t>(job.w.down.type)];
    const int64_t base = h_offset[static_cast<size_t>(task.job)];
    const int64_t nx = static_cast<int64_t>(job.x_rows.size());
    for (int64_t r = task.r0; r < task.r1; ++r) {
      const uint8_t* drow = job.w.down.data + static_cast<uint64_t>(r) * job.w.down.row_bytes;
      if (r + g_prefetch_rows < task.r1) prefetch_row(drow + g_prefetch_rows * job.w.down.row_bytes, job.w.down.row_bytes);
      for (int64_t i = 0; i < nx; i += kMultiDot) {
        const int count = static_cast<int>(std::min<int64_t>(kMultiDot, nx - i));
        float o[kMultiDot];
        ddot(job.w.down.cols, o, drow, hq + static_cast<size_t>(base + i) * hq_stride, hq_stride, count);
        for (int j = 0; j < count; ++j) results[static_cast<int64_t>(job.out_rows[static_cast<size_t>(i + j)]) * n_embd + r] = o[j];
      }
    }
  });
  return MOELITE_OK;
}

Status CpuBackend::moe_ffn(int32_t layer, const Act& x, const Routing& r, ExpertSource* experts, Act* out) {
  const int32_t n = r.n_tokens, k = r.k;
  experts->on_routing(layer, r);
  const ExpertGroups groups(r);
  const std::vector<int32_t>& order = groups.order();
  auto job_for = [&](int32_t e, const ExpertWeights& w) {
    FfnJob job;
    job.w = w;
    groups.rows(e, &job.x_rows, &job.out_rows);
    return job;
  };

  const int64_t n_embd = x.cols;
  if (ffn_y_.size() < static_cast<size_t>(n * k * n_embd)) ffn_y_.resize(static_cast<size_t>(n * k * n_embd));
  if (experts->all_resident()) {
    // Everything is in memory: one pass over all of the layer's experts balances best.
    std::vector<FfnJob> jobs;
    jobs.reserve(order.size());
    for (std::vector<int32_t> pending = order; !pending.empty();) {
      int32_t e;
      ExpertWeights w;
      MOELITE_TRY(experts->acquire_next(layer, &pending, &e, &w));
      jobs.push_back(job_for(e, w));
    }
    run_ffn_jobs(jobs, x, ffn_y_.data());
  } else {
    // Budgeted experts: groups of at most capacity() experts; within a group each expert runs as
    // soon as it is resident, so computation overlaps the loads still in flight.
    const size_t group = static_cast<size_t>(std::max(1, experts->capacity(layer)));
    for (size_t g0 = 0; g0 < order.size(); g0 += group) {
      std::vector<int32_t> pending(order.begin() + static_cast<std::ptrdiff_t>(g0),
                                   order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), g0 + group)));
      MOELITE_TRY(experts->prepare(layer, pending));
      while (!pending.empty()) {
        int32_t e;
        ExpertWeights w;
        MOELITE_TRY(experts->acquire_next(layer, &pending, &e, &w));
        std::vector<FfnJob> one(1, job_for(e, w));
        const Status st = run_ffn_jobs(one, x, ffn_y_.data(), [&] { return experts->wait_down(layer, e); });
        experts->release(layer, e);
        if (st != MOELITE_OK) {
          for (int32_t p : pending) experts->release(layer, p);
          return st;
        }
      }
    }
  }

  // Combine in slot order, so the sum never depends on the execution order above.
  float* o = rows_of(*out);
  const float* y = ffn_y_.data();
  for (int32_t t = 0; t < n; ++t) {
    float* ot = o + t * n_embd;
    for (int64_t c = 0; c < n_embd; ++c) ot[c] = 0.0f;
    for (int32_t j = 0; j < k; ++j) {
      if (r.ids[static_cast<size_t>(t * k + j)] < 0) continue;  // dropped by adaptive gating
      const float w = r.weights[static_cast<size_t>(t * k + j)];
      const float* yj = y + static_cast<int64_t>(t * k + j) * n_embd;
      for (int64_t c = 0; c < n_embd; ++c) ot[c] += w * yj[c];
    }
  }
  return MOELITE_OK;
}

void CpuBackend::dense_ffn(const ExpertWeights& w, const float* gate_inp, const Act& x, Act* out) {
  FfnJob job;
  job.w = w;
  for (int32_t t = 0; t < x.rows; ++t) {
    job.x_rows.push_back(t);
    job.out_rows.push_back(t);
  }
  std::vector<FfnJob> jobs(1, std::move(job));
  float* o = rows_of(*out);
  run_ffn_jobs(jobs, x, o);
  if (gate_inp) {
    const float* xd = rows_of(x);
    for (int64_t t = 0; t < x.rows; ++t) {
      double dot = 0.0;
      for (int64_t c = 0; c < x.cols; ++c) dot += static_cast<double>(gate_inp[c]) * xd[t * x.cols + c];
      const float g = sigmoid(static_cast<float>(dot));
      for (int64_t c = 0; c < out->cols; ++c) o[t * out->cols + c] *= g;
    }
  }
}

}  // namespace moelite::cpu
