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
#include "backends/cpu/weight_copies.h"

namespace moelite::cpu {

struct ActRows;  // activation rows as the dot kernels read them (cpu_backend.cpp)

// A worker's scratch for the matrix tile (AMX): tokens packed for it and a task's outputs, on two
// sides (gate and up).
struct MatrixScratch {
  std::vector<uint8_t> pack[2];
  std::vector<float> out[2];
};

class CpuBackend final : public Backend {
 public:
  // MOELITE_ERR_SYSTEM_LIMIT when the OS refuses one of the compute threads.
  [[nodiscard]] static Status create(int32_t n_threads, std::unique_ptr<Backend>* out);
  ~CpuBackend() override;

 private:
  CpuBackend(std::unique_ptr<ThreadPool> pool, std::shared_ptr<WeightCopies> copies);
  // An instance with a pool of its own and the weight copies of `copies`.
  static Status create_sharing(int32_t n_threads, std::shared_ptr<WeightCopies> copies, std::unique_ptr<Backend>* out);

 public:
  BackendKind kind() const override { return BackendKind::Cpu; }
  const char* name() const override { return name_.c_str(); }
  int32_t n_threads() const override { return pool_->size(); }
  // Weights are read from their host bytes (or their copies, which the peer shares), so an
  // instance with a pool of its own computes with them as this one does.
  Status create_peer(std::unique_ptr<Backend>* out) override { return create_sharing(n_threads(), copies_, out); }
  void limit_threads(int32_t n) override { pool_->set_participants(n); }

  Status place_weight(const WeightView& w) override;
  Status check_weight(const WeightView& w) override;
  // Makes the copies (weight_copies.h) of a resident expert's matrices.
  Status place_expert(const ExpertWeights& w) override;
  Status alloc_act(int64_t rows, int64_t cols, Act* out) override;
  void free_act(Act* a) override;
  Act view_rows(const Act& a, int64_t row0, int64_t n) override;
  Status read_rows(const Act& a, int64_t row0, int64_t n, float* dst) override;
  Status alloc_kv(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim, bool values,
                  KvCache* out) override;
  void free_kv(KvCache* kv) override;
  Status read_kv(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n, float* keys, float* values) override;
  Status write_kv(KvCache* kv, int32_t layer, int32_t slot0, int32_t n, const float* keys, const float* values) override;
  Status sync() override { return MOELITE_OK; }  // every operation completes before it returns

  Status get_rows(const WeightView& table, const int32_t* tokens, int32_t n, Act* out) override;
  Status rms_norm(const Act& x, const float* w, int64_t group, float eps, Act* out) override;
  Status matmul(const WeightView& w, const Act& x, const float* bias, Act* out) override;
  Status add(Act* x, const Act& y) override;
  Status scale(Act* x, float s) override;
  Status add_bias(Act* x, const float* bias) override;
  Status copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups, int64_t width, Act* out,
                        int64_t out_stride, int64_t out_offset) override;
  Status rope(Act* x, int64_t head_dim, const RopeParams& p, const int32_t* positions) override;
  Status attention(KvCache* kv, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t pos0, int32_t n_head,
                   int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec, Act* out) override;
  Status route(const Act& logits, int32_t k, bool renormalize, Routing* r) override;
  Status dense_ffn(const ExpertWeights& w, const FfnKind& kind, const float* gate_inp, const Act& x, Act* out) override;

  Status moe_begin(const Act& x, const FfnKind& kind, int64_t n_out_rows) override;
  Status expert_gate_up(const ExpertTask* tasks, int32_t n_tasks) override;
  Status expert_down(const ExpertTask* tasks, int32_t n_tasks) override;
  Status expert_round_end() override { return MOELITE_OK; }
  Status moe_combine(const Routing& r, Act* out) override;

 private:
  // One FFN applied to some rows of x: input row x_rows[i] gives result row out_rows[i].
  struct FfnJob {
    ExpertWeights w;  // on their row copies where they have one (weight_copies.h)
    const int32_t* x_rows;
    const int32_t* out_rows;
    int64_t n_rows;
    const uint8_t* grouped[3] = {nullptr, nullptr, nullptr};  // grouped copies of gate, up, down, or null
  };
  // Phase 1 for all jobs: h = act(gate x + b, up x + b) per routed row, kept in ffn_h_ (rows laid
  // out job after job) until ffn_down.
  // x in up to two dot formats, quantized once and reused by every call that shares it.
  struct QuantizedInput {
    TensorType x_format[2] = {TensorType::F32, TensorType::F32};
    const uint8_t* x_quant[2] = {nullptr, nullptr};
    std::vector<uint8_t> x_buf[2];
  };
  Status ffn_gate_up(const std::vector<FfnJob>& jobs, const Act& x, const FfnKind& kind, QuantizedInput* input);
  // Phase 2, for the jobs of the last ffn_gate_up: results[out_row * n_embd ...] = down h + b.
  Status ffn_down(const std::vector<FfnJob>& jobs, int64_t n_embd, float* results);
  // x's rows in `weight_type`'s dot format, from `cache` or quantized into it.
  Status quantized_input(const Act& x, TensorType weight_type, QuantizedInput* cache, const uint8_t** out);
  // Quantizes the rows of x into `type`'s dot format, returns a pointer to row-major rows.
  Status quantize_rows(const float* x, int64_t rows, int64_t cols, TensorType weight_type, std::vector<uint8_t>* buf,
                       const uint8_t** out);
  // `grouped`: w's grouped copy, or null.
  Status matmul_rows(const WeightView& w, const uint8_t* grouped, const uint8_t* act, size_t act_stride, int64_t n,
                     float* out, int64_t out_stride);
  // *out = the activation rows (act, stride) and, where batches of `step`-row groups of
  // weight_type take the kernels' prepared tile, the same rows prepared into *buf (row r at
  // row_cols[r] elements where given, else cols).
  Status prepare_rows(TensorType weight_type, int step, const uint8_t* act, size_t stride, int64_t rows, int64_t cols,
                      std::vector<uint8_t>* buf, ActRows* out, const int64_t* row_cols = nullptr);
  std::vector<FfnJob> jobs_of(const ExpertTask* tasks, int32_t n) const;
  // Every thread's matrix_scratch_ holds, on `sides` sides (1, or 2 for gate and up), room for
  // the matrix tile's packed tokens of `cols` elements and the outputs of `task_rows` rows.
  Status grow_matrix_scratch(int sides, TensorType weight_type, int64_t cols, int64_t task_rows);

  const KernelTable& k_;
  std::unique_ptr<ThreadPool> pool_;
  std::shared_ptr<WeightCopies> copies_;  // shared with peers
  std::string name_;
  std::vector<uint8_t> qbuf_, qbuf2_;
  std::vector<uint8_t> ffn_xg_gate_, ffn_xg_up_;  // activations gathered per expert job
  std::vector<uint8_t> prep_a_, prep_b_;  // activations in the kernels' prepared layout (prefill)
  std::vector<int64_t> row_ff_;           // ffn_down: each h row's length (its job's n_ff)
  std::vector<MatrixScratch> matrix_scratch_;  // per thread
  std::vector<float> ffn_h_, ffn_y_;
  // The routed-expert pass in progress (moe_begin .. moe_combine).
  struct MoePass {
    Act x;
    FfnKind kind;
    QuantizedInput input;  // x quantized once per pass, not once per expert
  } pass_;
  QuantizedInput dense_input_;
  // Layout of ffn_h_ from the last ffn_gate_up.
  std::vector<int64_t> h_offset_;
  int64_t n_ff_max_ = 0, h_rows_ = 0;
  std::vector<std::vector<float>> attn_scores_;  // per thread
};

}  // namespace moelite::cpu
