// The CPU backend: weights used in place from the file mapping, activations in host memory,
// matrix products through the runtime-dispatched kernels of quant.h, work split over a ThreadPool.
//
// Every output element is computed by exactly one task with a fixed summation order, so results
// do not depend on the thread count or on how tasks were scheduled.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/threadpool.h"

namespace moelite::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int32_t n_threads);
  ~CpuBackend() override;

  const char* name() const override { return name_.c_str(); }
  int32_t n_threads() const override { return pool_.size(); }

  Status place_weight(WeightView* w) override;
  Status check_weight(const WeightView& w) override;
  Status alloc_act(int64_t rows, int64_t cols, Act* out) override;
  void free_act(Act* a) override;
  Act view_rows(const Act& a, int64_t row0, int64_t n) override;
  void read_rows(const Act& a, int64_t row0, int64_t n, float* dst) override;
  Status alloc_kv(int32_t n_layers, int32_t n_ctx, int64_t kv_dim, KvCache* out) override;
  void free_kv(KvCache* kv) override;

  void get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) override;
  void rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) override;
  void matmul(const WeightView& w, const Act& x, const float* bias, Act* out) override;
  void add(Act* x, const Act& y) override;
  void rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) override;
  void attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0,
                 int32_t n_head, int32_t n_head_kv, int64_t head_dim, Act* out) override;
  void route(const Act& logits, int32_t k, bool renormalize, Routing* r) override;
  Status moe_ffn(int32_t layer, const Act& x, const Routing& r, ExpertSource* experts,
                 Act* out) override;
  void dense_ffn(const ExpertWeights& w, const float* gate_inp, const Act& x, Act* out) override;

 private:
  // One SwiGLU FFN applied to some rows of x: input row x_rows[i] contributes
  // scale[i] * FFN(x[x_rows[i]]) to result row out_rows[i] of the job output buffer.
  struct FfnJob {
    ExpertWeights w;
    std::vector<int32_t> x_rows;
    std::vector<int32_t> out_rows;
  };
  // Runs all jobs; results[out_row * n_embd ...] receive the unscaled FFN outputs.
  // `before_down`, if given, runs between the gate/up and the down projections (the expert store
  // uses it to wait for a down matrix still in flight) and may fail.
  Status run_ffn_jobs(const std::vector<FfnJob>& jobs, const Act& x, float* results,
                      const std::function<Status()>& before_down = nullptr);
  // Quantizes the rows of x into `type`'s dot format, returns a pointer to row-major rows.
  const uint8_t* quantize_rows(const float* x, int64_t rows, int64_t cols, TensorType weight_type,
                               std::vector<uint8_t>* buf);
  void matmul_rows(const WeightView& w, const uint8_t* act, size_t act_stride, int64_t n,
                   float* out, int64_t out_stride);

  const KernelTable& k_;
  ThreadPool pool_;
  std::string name_;
  std::vector<uint8_t> qbuf_, qbuf2_;
  std::vector<uint8_t> ffn_xg_gate_, ffn_xg_up_;  // activations gathered per expert job
  std::vector<float> ffn_h_, ffn_y_;
  std::vector<std::vector<float>> attn_scores_;  // per thread
};

}  // namespace moelite::cpu
