// A loaded model: hyperparameters, weights bound to their architecture's roles, tokenizer and
// chat template. Immutable once Model::load returns: every context and thread reads it without
// locks. What executes it (backend, expert source, predictor, counters) is the Runtime
// (core/exec/runtime.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/status.h"
#include "core/gguf/reader.h"
#include "core/model/packed_experts.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer.h"
#include "platforms/platform.h"

namespace moelite {

struct ArchDescriptor;

enum class QkNorm { None, PerHead /* qwen3moe */, Whole /* olmoe */ };

// How router logits become expert scores (GGUF expert_gating_func): softmax over all experts, or
// each expert's own sigmoid (DeepSeek-V3). Selection may add a bias and limit itself to the best
// expert groups; the weights are always the unbiased scores of the picked experts.
enum class ExpertGatingFunc { Softmax = 1, Sigmoid = 2 };

// Every number comes from GGUF metadata or tensor shapes; nothing is assumed per model name.
struct HParams {
  std::string arch;
  std::string name;
  int32_t n_layer = 0;
  // Blocks the file has after the model's own (GLM's multi-token-prediction blocks, not computed):
  // {arch}.block_count is n_layer + n_nextn.
  int32_t n_nextn = 0;
  int32_t n_embd = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;    // key/query head size
  int32_t head_dim_v = 0;  // value head size
  int32_t n_rot = 0;
  int32_t n_expert = 0;
  int32_t n_expert_used = 0;
  int32_t n_ff_expert = 0;
  int32_t n_ff_shared = 0;  // 0 without a shared expert
  int32_t n_ctx_train = 0;
  int32_t n_vocab = 0;
  float rms_eps = 1e-6f;
  RopeParams rope;
  RopeParams rope_windowed;           // sliding-window layers' (a different base in some models)
  // LongRoPE (phimoe): per-pair angle divisors; a context longer than rope_n_ctx_orig uses the
  // long ones, others the short ones (as llama.cpp). Empty: none.
  std::vector<float> rope_factors_long, rope_factors_short;
  int32_t rope_n_ctx_orig = 0;
  bool norm_topk = false;             // renormalise the top-k router weights to sum 1
  float expert_weights_scale = 1.0f;  // applied to the (renormalised) router weights
  QkNorm qk_norm = QkNorm::None;
  // Granite's multipliers (1 where a model has none): the token embeddings, each block's attention
  // and MoE outputs before they join the residual stream, and the logits (divided by logit_scale).
  float embedding_scale = 1.0f, residual_scale = 1.0f, logit_scale = 1.0f;
  float attention_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  // Multi-head latent attention (deepseek2; kv_lora_rank 0: plain attention). Keys are
  // [qk_nope | n_rot] = head_dim floats per head, values head_dim_v; the cache keeps one row of
  // kv_lora_rank + n_rot floats per position (see core/model/arch/deepseek2.cpp).
  int32_t kv_lora_rank = 0;
  int32_t q_lora_rank = 0;  // 0: q straight from attn_q
  bool mla() const { return kv_lora_rank > 0; }
  int32_t qk_nope() const { return head_dim - n_rot; }
  // Layers [0, n_dense_lead) have a dense FFN (ffn_{gate,up,down}, n_ff_dense wide) and no experts.
  int32_t n_dense_lead = 0;
  int32_t n_ff_dense = 0;
  bool is_moe_layer(int32_t layer) const { return layer >= n_dense_lead; }
  int32_t n_moe_layers() const { return n_layer - n_dense_lead; }
  ExpertGatingFunc gating_func = ExpertGatingFunc::Softmax;
  // Group-limited routing: experts in n_expert_groups equal groups, each scored by the sum of its
  // two best (biased) scores; only the n_group_used best groups' experts may be picked. 0: none.
  int32_t n_expert_groups = 0, n_group_used = 0;
  // Sliding-window attention (gpt-oss): layer l's queries see only their last attn_window[l]
  // positions (0: all). Empty when no layer has a window.
  std::vector<int32_t> attn_window;
  int32_t window_of(int32_t layer) const {
    return attn_window.empty() ? 0 : attn_window[static_cast<size_t>(layer)];
  }
  int32_t max_window() const {
    int32_t w = 0;
    for (int32_t x : attn_window) w = x > w ? x : w;
    return w;
  }
};

// Routed experts of one layer, as stored: either three 3-D tensors (one expert a contiguous slice)
// or, in old Mixtral files, one 2-D tensor per expert and matrix.
struct LayerExperts {
  WeightView gate, up, down;                                 // merged layout: views of expert 0; rows/cols per expert
  uint64_t gate_stride = 0, up_stride = 0, down_stride = 0;  // bytes between experts
  std::vector<ExpertWeights> split;                          // split layout, one per expert
  // Per-expert output biases (gpt-oss), n_expert x rows each, resident for the model's life: an
  // expert the store loads gets its bytes from the file and its biases from here. Empty: none.
  std::vector<float> gate_bias, up_bias, down_bias;
  ExpertWeights expert(int32_t e) const;
  // False in a layer without routed experts (deepseek2's leading dense blocks).
  bool present() const { return gate.rows > 0 || !split.empty(); }
};

// Multi-head latent attention weights of one layer (deepseek2).
struct MlaWeights {
  WeightView wq_a;                // attn_q_a (q_lora_rank rows); invalid: q straight from wq
  std::vector<float> q_a_norm;    // q_lora_rank floats
  WeightView wq;                  // attn_q or attn_q_b: n_head * head_dim rows, each head [nope | rope]
  WeightView wkv_a;               // attn_kv_a_mqa: kv_lora_rank + n_rot rows, [latent | rope key]
  std::vector<float> kv_a_norm;   // kv_lora_rank floats
  // Per head: k_b[h] (kv_lora_rank rows of qk_nope) turns the head's no-rope query into latent
  // space; v_b[h] (head_dim_v rows of kv_lora_rank) turns its attention output back. Views of
  // attn_k_b/attn_v_b, or of the old fused attn_kv_b (v_b) and its transposed copy (k_b).
  std::vector<WeightView> k_b, v_b;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm, q_norm, k_norm;
  std::vector<float> attn_norm_b, ffn_norm_b;  // norms with a bias (phimoe); empty: none
  std::vector<float> bq, bk, bv, bo;  // empty when the model has no attention biases
  std::vector<float> sinks;           // n_head attention-sink logits (gpt-oss); empty: none
  WeightView wq, wk, wv, wo;
  WeightView router;   // ffn_gate_inp: n_expert rows of n_embd
  std::vector<float> router_bias;  // n_expert floats (gpt-oss); empty: none
  WeightView pregate;  // ffn_pregate_inp (pre-gated models): routes layer l+1 from layer
                       // l's MoE input; invalid when absent
  LayerExperts experts;
  bool has_shared = false;
  ExpertWeights shared;            // the shared expert (qwen2moe)
  std::vector<float> exp_probs_b;  // n_expert selection biases (DeepSeek-V3); empty: none
  MlaWeights mla;                  // deepseek2 only
  bool has_dense = false;          // a leading dense block: `dense` instead of router and experts
  ExpertWeights dense;
  std::vector<float> shared_gate;  // ffn_gate_inp_shexp, n_embd floats (empty: no gate)
};

// How a file becomes a Model. What executes it (backend, expert budget, predictor, gating) is the
// Runtime's (core/exec/runtime.h, RuntimeOptions).
struct LoadOptions {
  bool use_mmap = true;
  bool vocab_only = false;
  // Weights bound but not read (the file mapped, experts lazy) and no runtime: the model's facts,
  // metadata and tokenizer without the cost of a load (moelite_model_inspect).
  bool inspect_only = false;
  // Routed experts are located in the file but neither read nor mapped: an expert budget's store
  // reads them on demand. The file is then not mapped at all, and the memory the process may still
  // take is measured before any weight is read (for budget auto).
  bool stream_experts = false;
  // Overrides tokenizer.chat_template: a family name ("chatml", ...) or a template source to
  // recognise (core/text/chat_template.h). Empty: the file's template.
  std::string chat_template;
  moelite_progress_fn progress = nullptr;
  void* progress_user = nullptr;
};

struct Model {
  HParams hp;
  const ArchDescriptor* arch = nullptr;
  std::unique_ptr<gguf::Reader> gguf;
  std::string path;
  platform::Mapping mapping;
  std::vector<void*> owned;  // tensor copies when not mapping (aligned_free'd)

  WeightView tok_embd, output;
  std::vector<float> output_norm;
  std::vector<float> output_norm_b, output_b;  // phimoe's; empty: none
  std::vector<LayerWeights> layers;
  FfnKind expert_ffn;  // how the routed (and shared) experts combine gate and up

  std::unique_ptr<Tokenizer> tokenizer;  // null when the file has no tokenizer metadata
  ChatTemplate chat_template = ChatTemplate::Plain;
  bool chat_template_chosen = false;  // set by the application (LoadOptions::chat_template)
  bool vocab_only = false;    // tokenizer only: no weights, no runtime
  bool inspect_only = false;  // weights bound, never read; no runtime

  uint64_t expert_bytes = 0, dense_bytes = 0;
  uint64_t n_params = 0, n_active_params = 0;
  uint64_t active_bytes = 0;  // see MOELITE_MODEL_ACTIVE_BYTES
  // Budget "auto" only: min(MemAvailable, cgroup room) when loading started, before any weight
  // was read, so the dense weights are subtracted once (core/experts/budget_auto.h).
  uint64_t memory_room_at_load = 0;
  TensorType expert_type = TensorType::F32;
  // The packed expert file beside the model (MODEL.experts, `moelite pack`) when one is there and
  // matches: the expert store then reads experts from it. Looked for by budgeted and inspecting loads.
  PackedExperts packed;

  ~Model();
  // Reads, validates and binds everything; the weights are not placed on any backend yet
  // (Runtime::create does that). With a budget (or budget auto) routed experts are located in
  // the file but never touched through the mapping.
  static Status load(const std::string& path, const LoadOptions& opts, std::unique_ptr<Model>* out);
};

}  // namespace moelite
