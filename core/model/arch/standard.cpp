// The standard pieces of an architecture (core/model/arch/arch.h): the hyperparameter reader and
// the tensor binder of the pre-norm MoE block most architectures share. Its forward pass is
// core/forward/standard_block.cpp.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <limits>
#include <string>

#include "core/model/arch/arch.h"
#include "core/model/tensor_binder.h"

namespace moelite {

namespace {

std::string blk(int32_t layer, const char* suffix) { return "blk." + std::to_string(layer) + "." + suffix; }

constexpr double kInf = std::numeric_limits<double>::infinity();

// YaRN's magnitude factor for a scale s and a multiplier m: 1 + 0.1 m ln s (1 for s <= 1).
double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

}  // namespace

Status read_rope_scaling(const gguf::Reader& g, const ArchDescriptor& arch, int32_t n_ctx_train, RopeScaling* out) {
  const std::string a = arch.name;
  RopeScaling sc;
  // rope.scaling.attn_factor scales cos and sin whatever the type, none included (Phi-3 files
  // carry it alone, beside their LongRoPE factors).
  MOELITE_TRY(optional_float(g, a, "rope.scaling.attn_factor", 0.0, kMaxMultiplier, 1.0, &sc.attn_factor));
  std::string type = "none";
  const std::string type_key = a + ".rope.scaling.type";
  if (g.find(type_key) && !g.get_string(type_key, &type))
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' must be a string", type_key.c_str());
  // llama.cpp's names. An unknown one is refused rather than read as none: the file asks for a
  // context extension that would otherwise silently not be applied.
  const bool longrope = type == "longrope";
  if (type != "none" && type != "linear" && type != "yarn" && !longrope)
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = '%s' is not a rope scaling type (none, linear, yarn%s)",
                type_key.c_str(), type.c_str(), arch.rope_factors ? ", longrope" : "");
  // LongRoPE's angles come from the rope_factors tensors, which only some architectures read.
  if (longrope && !arch.rope_factors)
    return fail(MOELITE_ERR_UNSUPPORTED_ARCH,
                "metadata key '%s' = 'longrope' is not supported by architecture '%s' (none, linear, yarn)",
                type_key.c_str(), a.c_str());
  std::string factor_key = a + ".rope.scaling.factor";
  float factor = 0.0f;
  MOELITE_TRY(float_key_in(g, factor_key, -kInf, kInf, 0.0, &factor));
  if (factor == 0.0f) {  // the older key
    factor_key = a + ".rope.scale_linear";
    MOELITE_TRY(float_key_in(g, factor_key, -kInf, kInf, 0.0, &factor));
  }
  if (type != "none" && factor != 0.0f && factor != 1.0f) {
    if (longrope)
      return fail(MOELITE_ERR_UNSUPPORTED_ARCH,
                  "metadata key '%s' = %g with rope.scaling.type 'longrope' is not supported", factor_key.c_str(),
                  static_cast<double>(factor));
    if (!(factor > 1.0f && factor <= 1024.0f))
      return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' = %g is outside (1, 1024]", factor_key.c_str(),
                  static_cast<double>(factor));
    sc.factor = factor;
    if (type == "linear") {
      sc.type = RopeScalingType::Linear;
    } else {
      sc.type = RopeScalingType::Yarn;
      MOELITE_TRY(optional_int(g, a, "rope.scaling.original_context_length", 1, MOELITE_MAX_CONTEXT, n_ctx_train,
                               &sc.n_ctx_orig));
      // Rotations over the original context: positive, or the ramp's log turns NaN.
      MOELITE_TRY(optional_float(g, a, "rope.scaling.yarn_beta_fast", 0.0, kMaxMultiplier, 32.0, &sc.beta_fast));
      MOELITE_TRY(optional_float(g, a, "rope.scaling.yarn_beta_slow", 0.0, kMaxMultiplier, 1.0, &sc.beta_slow));
      float log_mul = 0.0f;
      MOELITE_TRY(optional_float(g, a, "rope.scaling.yarn_log_multiplier", -kInf, kInf, 0.0, &log_mul));
      // With a log multiplier (DeepSeek's mscale_all_dim) the magnitude is mscale(s, 1) / mscale(s, m)
      // rather than mscale(s, 1); rope_angles applies mscale(s, 1), so the rest goes in attn_factor.
      if (log_mul != 0.0f) {
        sc.attn_factor *= static_cast<float>(1.0 / yarn_mscale(factor, log_mul));
        if (!(sc.attn_factor > 0.0f && sc.attn_factor <= kMaxMultiplier))
          return fail(MOELITE_ERR_BAD_METADATA,
                      "metadata key '%s.rope.scaling.yarn_log_multiplier' = %g gives the attention factor %g, "
                      "outside (0, %g]",
                      a.c_str(), static_cast<double>(log_mul), static_cast<double>(sc.attn_factor), kMaxMultiplier);
      }
    }
  }
  *out = sc;
  return MOELITE_OK;
}

Status standard_read_hparams(const gguf::Reader& g, const ArchDescriptor& arch, HParams* hp) {
  const std::string a = arch.name;
  MOELITE_TRY(required_int(g, a, "block_count", 1, MOELITE_MAX_LAYERS, &hp->n_layer));
  MOELITE_TRY(required_int(g, a, "embedding_length", 1, MOELITE_MAX_WIDTH, &hp->n_embd));
  MOELITE_TRY(required_int(g, a, "attention.head_count", 1, MOELITE_MAX_HEADS, &hp->n_head));
  MOELITE_TRY(optional_int(g, a, "attention.head_count_kv", 1, MOELITE_MAX_HEADS, hp->n_head, &hp->n_head_kv));
  // Each key/value head serves n_head / n_head_kv query heads.
  if (hp->n_head % hp->n_head_kv != 0)
    return fail(MOELITE_ERR_BAD_METADATA,
                "metadata key '%s.attention.head_count' = %d is not a multiple of "
                "'%s.attention.head_count_kv' = %d",
                a.c_str(), hp->n_head, a.c_str(), hp->n_head_kv);
  if (hp->n_embd % hp->n_head != 0 && !g.find(a + ".attention.key_length"))
    return fail(MOELITE_ERR_BAD_METADATA,
                "metadata key '%s.embedding_length' = %d is not a multiple of '%s.attention.head_count' = %d and "
                "'%s.attention.key_length' is absent",
                a.c_str(), hp->n_embd, a.c_str(), hp->n_head, a.c_str());
  MOELITE_TRY(
      optional_int(g, a, "attention.key_length", 1, MOELITE_MAX_HEAD_DIM, hp->n_embd / hp->n_head, &hp->head_dim));
  if (hp->head_dim > MOELITE_MAX_HEAD_DIM)  // the default n_embd / n_head was not range-checked
    return fail(MOELITE_ERR_BAD_METADATA, "head dimension %d (embedding_length / head_count) is above %d", hp->head_dim,
                MOELITE_MAX_HEAD_DIM);
  MOELITE_TRY(optional_int(g, a, "attention.value_length", 1, MOELITE_MAX_HEAD_DIM, hp->head_dim, &hp->head_dim_v));
  MOELITE_TRY(optional_int(g, a, "rope.dimension_count", 2, hp->head_dim, hp->head_dim, &hp->n_rot));
  // Rope turns pairs of dimensions.
  if (hp->n_rot % 2 != 0)
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s.rope.dimension_count' = %d must be even", a.c_str(),
                hp->n_rot);
  MOELITE_TRY(optional_int(g, a, "context_length", 1, MOELITE_MAX_CONTEXT, 4096, &hp->n_ctx_train));
  MOELITE_TRY(required_int(g, a, "expert_count", 1, MOELITE_MAX_EXPERTS, &hp->n_expert));
  MOELITE_TRY(required_int(g, a, "expert_used_count", 1, hp->n_expert, &hp->n_expert_used));
  MOELITE_TRY(optional_int(g, a, "expert_feed_forward_length", 1, MOELITE_MAX_WIDTH, 0, &hp->n_ff_expert));
  MOELITE_TRY(optional_int(g, a, "expert_shared_feed_forward_length", 1, MOELITE_MAX_WIDTH, 0, &hp->n_ff_shared));
  // RMSNorm divides by sqrt(mean(x^2) + eps): eps must be positive (0 divides a zero row by 0) and
  // small (real models: 1e-5 .. 1e-6; one above 1 would swamp the activations it normalises).
  MOELITE_TRY(required_float(g, a, "attention.layer_norm_rms_epsilon", 0.0, 1.0, &hp->rms_eps));
  hp->rope.style = arch.rope_style;
  hp->rope.n_rot = hp->n_rot;
  // Pair i turns at freq_base^(-2i/n_rot), and YaRN divides by ln(freq_base): a base of 1 or below
  // gives no decaying frequencies (real models: 1e4 .. 1e7).
  MOELITE_TRY(optional_float(g, a, "rope.freq_base", 1.0, kInf, 10000.0, &hp->rope.freq_base));
  MOELITE_TRY(read_rope_scaling(g, arch, hp->n_ctx_train, &hp->rope.scaling));
  MOELITE_TRY(optional_int(g, a, "rope.scaling.original_context_length", 1, MOELITE_MAX_CONTEXT, hp->n_ctx_train,
                           &hp->rope_n_ctx_orig));
  hp->rope_windowed = hp->rope;
  // The architecture fixes the renormalisation; files that state it (DeepSeek-style keys) win.
  hp->norm_topk = arch.norm_topk;
  bool norm = hp->norm_topk;
  if (g.find(a + ".expert_weights_norm")) {
    if (!g.get_bool(a + ".expert_weights_norm", &norm))
      return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s.expert_weights_norm' must be a bool", a.c_str());
    hp->norm_topk = norm;
  }
  // Multiplies every routed expert's weight: 0 would silence the experts, a negative value flip them.
  MOELITE_TRY(optional_float(g, a, "expert_weights_scale", 0.0, kMaxMultiplier, 1.0, &hp->expert_weights_scale));
  hp->qk_norm = arch.qk_norm;
  g.get_string("general.name", &hp->name);
  return MOELITE_OK;
}

Status bind_attention(TensorBinder& b, const ArchDescriptor& arch, const HParams& hp, int32_t l, LayerWeights* w) {
  const int64_t n_embd = hp.n_embd, q_dim = int64_t{hp.n_head} * hp.head_dim;
  const int64_t k_dim = int64_t{hp.n_head_kv} * hp.head_dim, v_dim = int64_t{hp.n_head_kv} * hp.head_dim_v;
  MOELITE_TRY(b.floats(blk(l, "attn_norm.weight"), n_embd, &w->attn_norm));
  MOELITE_TRY(b.matrix(blk(l, "attn_q.weight"), n_embd, q_dim, &w->wq));
  MOELITE_TRY(b.matrix(blk(l, "attn_k.weight"), n_embd, k_dim, &w->wk));
  MOELITE_TRY(b.matrix(blk(l, "attn_v.weight"), n_embd, v_dim, &w->wv));
  MOELITE_TRY(b.matrix(blk(l, "attn_output.weight"), int64_t{hp.n_head} * hp.head_dim_v, n_embd, &w->wo));
  // Biases are optional everywhere (real qwen2moe checkpoints carry them).
  MOELITE_TRY(b.floats(blk(l, "attn_q.bias"), q_dim, &w->bq, false));
  MOELITE_TRY(b.floats(blk(l, "attn_k.bias"), k_dim, &w->bk, false));
  MOELITE_TRY(b.floats(blk(l, "attn_v.bias"), v_dim, &w->bv, false));
  MOELITE_TRY(b.floats(blk(l, "attn_output.bias"), n_embd, &w->bo, false));
  if (arch.qk_norm == QkNorm::PerHead) {
    MOELITE_TRY(b.floats(blk(l, "attn_q_norm.weight"), hp.head_dim, &w->q_norm));
    MOELITE_TRY(b.floats(blk(l, "attn_k_norm.weight"), hp.head_dim, &w->k_norm));
  } else if (arch.qk_norm == QkNorm::Whole) {
    MOELITE_TRY(b.floats(blk(l, "attn_q_norm.weight"), q_dim, &w->q_norm));
    MOELITE_TRY(b.floats(blk(l, "attn_k_norm.weight"), k_dim, &w->k_norm));
  }
  return MOELITE_OK;
}

Status bind_routed_experts(TensorBinder& b, const HParams& hp, int32_t l, LayerExperts* out) {
  LayerExperts& ex = *out;
  const int64_t n_embd = hp.n_embd;
  const int64_t n_ff = hp.n_ff_expert > 0 ? hp.n_ff_expert : -1;
  if (b.has(blk(l, "ffn_gate_up_exps.weight"))) {
    // Gate and up merged per expert (newer conversions): expert e's gate is rows [0, n_ff) of its
    // slice, its up rows [n_ff, 2 n_ff); both views step by the whole slice.
    WeightView both;
    uint64_t stride;
    MOELITE_TRY(b.matrix_stack(blk(l, "ffn_gate_up_exps.weight"), n_embd, n_ff > 0 ? 2 * n_ff : -1, hp.n_expert, &both,
                               &stride));
    if (both.rows % 2 != 0)
      return fail(MOELITE_ERR_BAD_SHAPE, "layer %d: ffn_gate_up_exps has an odd row count %lld", l,
                  static_cast<long long>(both.rows));
    ex.gate = ex.up = both;
    ex.gate.rows = ex.up.rows = both.rows / 2;
    const uint64_t half = static_cast<uint64_t>(ex.gate.rows) * both.row_bytes;
    ex.up.file_offset += half;
    if (ex.up.data) ex.up.data += half;
    ex.gate_stride = ex.up_stride = stride;
    MOELITE_TRY(
        b.matrix_stack(blk(l, "ffn_down_exps.weight"), ex.gate.rows, n_embd, hp.n_expert, &ex.down, &ex.down_stride));
    return MOELITE_OK;
  }
  if (b.has(blk(l, "ffn_gate_exps.weight"))) {
    MOELITE_TRY(b.matrix_stack(blk(l, "ffn_gate_exps.weight"), n_embd, n_ff, hp.n_expert, &ex.gate, &ex.gate_stride));
    MOELITE_TRY(b.matrix_stack(blk(l, "ffn_up_exps.weight"), n_embd, ex.gate.rows, hp.n_expert, &ex.up, &ex.up_stride));
    MOELITE_TRY(
        b.matrix_stack(blk(l, "ffn_down_exps.weight"), ex.gate.rows, n_embd, hp.n_expert, &ex.down, &ex.down_stride));
    return MOELITE_OK;
  }
  if (b.has(blk(l, "ffn_gate.0.weight"))) {
    // Old Mixtral files: one tensor per expert and matrix.
    const int64_t ff = n_ff > 0 ? n_ff : b.dim(blk(l, "ffn_gate.0.weight"), 1);
    for (int32_t e = 0; e < hp.n_expert; ++e) {
      ExpertWeights ew;
      const std::string id = std::to_string(e);
      MOELITE_TRY(b.expert_matrix(blk(l, ("ffn_gate." + id + ".weight").c_str()), n_embd, ff, &ew.gate));
      MOELITE_TRY(b.expert_matrix(blk(l, ("ffn_up." + id + ".weight").c_str()), n_embd, ff, &ew.up));
      MOELITE_TRY(b.expert_matrix(blk(l, ("ffn_down." + id + ".weight").c_str()), ff, n_embd, &ew.down));
      if (e > 0 && (ew.gate.type != ex.split[0].gate.type || ew.up.type != ex.split[0].up.type ||
                    ew.down.type != ex.split[0].down.type))
        return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "layer %d: experts use different weight types", l);
      ex.split.push_back(ew);
    }
    return MOELITE_OK;
  }
  return fail(MOELITE_ERR_MISSING_TENSOR, "layer %d has no routed experts (neither '%s' nor '%s')", l,
              blk(l, "ffn_gate_exps.weight").c_str(), blk(l, "ffn_gate.0.weight").c_str());
}

Status standard_bind_layer(TensorBinder& b, const ArchDescriptor& arch, const HParams& hp, int32_t l, LayerWeights* w) {
  const int64_t n_embd = hp.n_embd;
  MOELITE_TRY(bind_attention(b, arch, hp, l, w));
  MOELITE_TRY(b.floats(blk(l, "ffn_norm.weight"), n_embd, &w->ffn_norm));
  MOELITE_TRY(b.matrix(blk(l, "ffn_gate_inp.weight"), n_embd, hp.n_expert, &w->router));
  // Pre-gated models (Pre-gated MoE, Read-ME): layer l routes layer l+1 from its own MoE input.
  if (l + 1 < hp.n_layer)
    MOELITE_TRY(b.matrix(blk(l, "ffn_pregate_inp.weight"), n_embd, hp.n_expert, &w->pregate, false));
  MOELITE_TRY(bind_routed_experts(b, hp, l, &w->experts));

  if (arch.shared_expert && b.has(blk(l, "ffn_gate_shexp.weight"))) {
    const int64_t ff = hp.n_ff_shared > 0 ? hp.n_ff_shared : b.dim(blk(l, "ffn_gate_shexp.weight"), 1);
    w->has_shared = true;
    MOELITE_TRY(b.matrix(blk(l, "ffn_gate_shexp.weight"), n_embd, ff, &w->shared.gate));
    MOELITE_TRY(b.matrix(blk(l, "ffn_up_shexp.weight"), n_embd, ff, &w->shared.up));
    MOELITE_TRY(b.matrix(blk(l, "ffn_down_shexp.weight"), ff, n_embd, &w->shared.down));
    MOELITE_TRY(b.floats(blk(l, "ffn_gate_inp_shexp.weight"), n_embd, &w->shared_gate, false));
  }
  return MOELITE_OK;
}

}  // namespace moelite
