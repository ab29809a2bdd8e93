// DeepSeek-V2/V3 (deepseek2 in GGUF; also DeepSeek-V2-Lite, GLM-4.x-Flash, Kanana, GigaChat3):
//
// Multi-head latent attention (MLA), computed the "absorbed" way so that the KV cache keeps one
// row of kv_lora_rank + n_rot floats per position instead of n_head * (key + value) floats:
//   q_h      = Wq · n(x)  (or Wq_b · rms(Wq_a · n(x)) with a q low-rank path), [q_nope_h | q_rope_h]
//   [c | kr] = Wkv_a · n(x);  c = rms(c) (the latent), kr = rope(kr) (one rope key for all heads)
//   query_h  = [K_b,h · q_nope_h | rope(q_rope_h)]   key = value source = [c | kr]
//   o_h      = softmax(query_h · key * scale) · c    (the value is the key's first kv_lora_rank floats)
//   out      = Wo · [V_b,h · o_h]_h
// which equals attention with k_h = [K_b,h^T c | kr], v_h = V_b,h c -- the "decompressed" form
// the numpy reference computes (tests/reference/reference_forward.py). K_b and V_b come from
// attn_k_b/attn_v_b, or from the older fused attn_kv_b, whose key part is transposed once at load.
// Scale: mscale^2 / sqrt(head_dim) with mscale = attn_factor * (1 + 0.1 * log_mul * ln(factor))
// under YaRN, as llama.cpp computes it.
//
// The FFN: leading_dense_block_count dense SwiGLU blocks, then MoE blocks with shared experts
// (no gate) and routing by softmax or sigmoid scores (expert_gating_func), a selection bias
// (exp_probs_b) that picks but does not weigh, optional group-limited selection, optional
// renormalisation, then expert_weights_scale. Normal (adjacent-pair) rope on the rope dims.
// Multi-token-prediction blocks (nextn_predict_layers, GLM) are left out of the forward pass.
// Facts as llama.cpp's deepseek2 model reads them (docs/moe-archs.md).
#include <cmath>
#include <string>

#include "base/quant_ref.h"
#include "core/model/arch/arch.h"
#include "core/model/tensor_binder.h"

namespace moelite {

namespace {

std::string blk(int32_t layer, const char* suffix) { return "blk." + std::to_string(layer) + "." + suffix; }

Status float_key(const gguf::Reader& g, const std::string& key, double fallback, double* out) {
  *out = fallback;
  if (g.find(key) && (!g.get_float(key, out) || !std::isfinite(*out)))
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' must be a finite number", key.c_str());
  return MOELITE_OK;
}

// YaRN as llama.cpp applies it to deepseek2. The file's yarn_log_multiplier is 0.1 * DeepSeek's
// mscale_all_dim (the converter's factor, which llama.cpp divides out again). With it, cos and sin
// keep the file's attn_factor (the YaRN magnitude cancels) and the attention scale carries
// mscale^2; without it, both carry YaRN's 1 + 0.1 ln(factor).
Status read_mla_scaling(const gguf::Reader& g, const std::string& a, HParams* hp) {
  double rope_attn, log_mul_raw;
  MOELITE_TRY(float_key(g, a + ".rope.scaling.attn_factor", 1.0, &rope_attn));
  MOELITE_TRY(float_key(g, a + ".rope.scaling.yarn_log_multiplier", 0.0, &log_mul_raw));
  const double log_mul = log_mul_raw / 0.1;
  RopeScaling& sc = hp->rope.scaling;
  const double s = sc.type == RopeScalingType::None ? 1.0 : static_cast<double>(sc.factor);
  const double yarn_mscale = 1.0 + 0.1 * std::log(s);
  const bool yarn = sc.type == RopeScalingType::Yarn;
  // rope_angles multiplies a YaRN table by 1 + 0.1 ln(factor) itself.
  sc.attn_factor = static_cast<float>(yarn && log_mul != 0.0 ? rope_attn / yarn_mscale : rope_attn);
  const double original = rope_attn * (yarn && log_mul != 0.0 ? 1.0 : yarn_mscale);
  const double mscale = original * (1.0 + 0.1 * log_mul * std::log(s));
  const double scale = mscale * mscale / std::sqrt(static_cast<double>(hp->head_dim));
  if (!(scale > 0.0 && scale < 1e30) || !(sc.attn_factor > 0.0f && sc.attn_factor < 1e30f))
    return fail(MOELITE_ERR_BAD_METADATA, "%s.rope.scaling: attention factor %g and log multiplier %g give no usable scale",
                a.c_str(), rope_attn, log_mul_raw);
  hp->attention_scale = static_cast<float>(scale);
  hp->rope_windowed = hp->rope;
  return MOELITE_OK;
}

Status read_deepseek2(const gguf::Reader& g, const ArchDescriptor& arch, HParams* hp) {
  const std::string a = arch.name;
  MOELITE_TRY(standard_read_hparams(g, arch, hp));
  // GLM-4.x files append multi-token-prediction blocks after the model's own (block_count counts
  // them): they draft tokens for speculative decoding and are not part of the forward pass.
  int32_t nextn = 0;
  MOELITE_TRY(optional_int(g, a, "nextn_predict_layers", 0, hp->n_layer - 1, 0, &nextn));
  hp->n_layer -= nextn;
  hp->n_nextn = nextn;
  // Files converted for MLA state the latent cache's widths in key_length/value_length and the
  // per-head sizes in the *_mla keys; older files state the per-head sizes directly.
  const bool mla_keys = g.find(a + ".attention.key_length_mla") || g.find(a + ".attention.value_length_mla");
  if (mla_keys) {
    MOELITE_TRY(required_int(g, a, "attention.key_length_mla", 2, MOELITE_MAX_HEAD_DIM, &hp->head_dim));
    MOELITE_TRY(required_int(g, a, "attention.value_length_mla", 1, MOELITE_MAX_HEAD_DIM, &hp->head_dim_v));
  }
  MOELITE_TRY(required_int(g, a, "rope.dimension_count", 2, hp->head_dim - 1, &hp->n_rot));
  if (hp->n_rot % 2 != 0) return fail(MOELITE_ERR_BAD_METADATA, "rope.dimension_count %d must be even", hp->n_rot);
  hp->rope.n_rot = hp->n_rot;
  MOELITE_TRY(required_int(g, a, "attention.kv_lora_rank", 1, MOELITE_MAX_HEAD_DIM - hp->n_rot, &hp->kv_lora_rank));
  MOELITE_TRY(optional_int(g, a, "attention.q_lora_rank", 0, MOELITE_MAX_WIDTH, 0, &hp->q_lora_rank));
  if (hp->n_head_kv != hp->n_head && hp->n_head_kv != 1)
    return fail(MOELITE_ERR_BAD_METADATA, "deepseek2: head_count_kv %d (MLA shares one latent among all heads)",
                hp->n_head_kv);
  MOELITE_TRY(optional_int(g, a, "leading_dense_block_count", 0, hp->n_layer - 1, 0, &hp->n_dense_lead));
  if (hp->n_dense_lead > 0) {
    MOELITE_TRY(required_int(g, a, "feed_forward_length", 1, MOELITE_MAX_WIDTH, &hp->n_ff_dense));
  }
  if (!g.find(a + ".expert_feed_forward_length"))  // read by the standard reader, optional there
    return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s.expert_feed_forward_length' is required but absent",
                a.c_str());
  int32_t n_shared = 0;
  MOELITE_TRY(optional_int(g, a, "expert_shared_count", 0, 64, 0, &n_shared));
  hp->n_ff_shared = n_shared * hp->n_ff_expert;
  int32_t gating = 0;
  MOELITE_TRY(optional_int(g, a, "expert_gating_func", 0, 1000, 0, &gating));
  if (gating == 0) {
    // Absent: softmax, as DeepSeek-V2/V2.5 files were converted before the key existed -- except
    // GLM-4.7-Flash files that lack it: sigmoid-gated, recognised as llama.cpp recognises them (47
    // or 48 layers and a 154880-token vocabulary), so that they compute what llama.cpp computes.
    int64_t n_vocab = 0;
    const gguf::Value* tokens = g.find("tokenizer.ggml.tokens");
    if (tokens && tokens->type == gguf::ValueType::ARRAY) n_vocab = static_cast<int64_t>(tokens->count);
    if (g.find(a + ".vocab_size")) g.get_int(a + ".vocab_size", &n_vocab);
    const bool glm47_flash = (hp->n_layer == 47 || hp->n_layer == 48) && n_vocab == 154880;
    hp->gating_func = glm47_flash ? ExpertGatingFunc::Sigmoid : ExpertGatingFunc::Softmax;
  } else if (gating == 1) {
    hp->gating_func = ExpertGatingFunc::Softmax;
  } else if (gating == 2) {
    hp->gating_func = ExpertGatingFunc::Sigmoid;
  } else {
    return fail(MOELITE_ERR_UNSUPPORTED_ARCH, "expert_gating_func %d is not supported (1 softmax, 2 sigmoid)", gating);
  }
  MOELITE_TRY(optional_int(g, a, "expert_group_count", 0, hp->n_expert, 0, &hp->n_expert_groups));
  MOELITE_TRY(optional_int(g, a, "expert_group_used_count", 0, hp->n_expert, 0, &hp->n_group_used));
  if (hp->n_expert_groups > 1) {
    const int32_t per_group = hp->n_expert / hp->n_expert_groups;
    if (hp->n_expert % hp->n_expert_groups != 0 || per_group < 2 || hp->n_group_used < 1 ||
        hp->n_group_used >= hp->n_expert_groups || int64_t{hp->n_group_used} * per_group < hp->n_expert_used)
      return fail(MOELITE_ERR_BAD_METADATA,
                  "expert groups: %d experts in %d groups with %d used cannot pick %d experts (groups must divide the "
                  "experts, hold at least 2, and the used ones at least expert_used_count)",
                  hp->n_expert, hp->n_expert_groups, hp->n_group_used, hp->n_expert_used);
  } else {
    hp->n_expert_groups = hp->n_group_used = 0;
  }
  return read_mla_scaling(g, a, hp);
}

// Per-head views of a stack of n_head matrices `stride` bytes apart (the first described by `m0`).
void head_views(const WeightView& m0, uint64_t stride, int32_t n_head, std::vector<WeightView>* out) {
  out->assign(static_cast<size_t>(n_head), m0);
  for (int32_t h = 0; h < n_head; ++h) {
    WeightView& v = (*out)[static_cast<size_t>(h)];
    v.file_offset += stride * static_cast<uint64_t>(h);
    if (v.data) v.data += stride * static_cast<uint64_t>(h);
  }
}

// Old files: attn_kv_b (kv_lora_rank cols; per head qk_nope key rows then head_dim_v value rows).
// The value rows are V_b as they are; the key rows are K_b^T, transposed once into F32.
Status bind_fused_kv_b(TensorBinder& b, const HParams& hp, int32_t l, MlaWeights* w) {
  const int64_t nope = hp.qk_nope(), dv = hp.head_dim_v, per_head = nope + dv, r = hp.kv_lora_rank;
  WeightView kv_b;
  MOELITE_TRY(b.matrix(blk(l, "attn_kv_b.weight"), r, int64_t{hp.n_head} * per_head, &kv_b));
  const DequantRowFn dequant = dequant_row_fn(kv_b.type);
  if (!dequant) return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "layer %d: attn_kv_b's type cannot be dequantized", l);
  float* k_b;
  MOELITE_TRY(b.owned_floats(static_cast<size_t>(hp.n_head) * static_cast<size_t>(r * nope), &k_b));
  std::vector<float> row(static_cast<size_t>(r));
  w->k_b.resize(static_cast<size_t>(hp.n_head));
  w->v_b.resize(static_cast<size_t>(hp.n_head));
  for (int32_t h = 0; h < hp.n_head; ++h) {
    float* kh = k_b + static_cast<size_t>(h) * static_cast<size_t>(r * nope);  // r rows of nope floats
    for (int64_t i = 0; i < nope; ++i) {
      dequant(kv_b.data + static_cast<uint64_t>(h * per_head + i) * kv_b.row_bytes, row.data(), r);
      for (int64_t j = 0; j < r; ++j) kh[j * nope + i] = row[static_cast<size_t>(j)];
    }
    WeightView& kv = w->k_b[static_cast<size_t>(h)];
    kv.type = TensorType::F32;
    kv.cols = nope;
    kv.rows = r;
    kv.row_bytes = static_cast<uint64_t>(nope) * sizeof(float);
    kv.data = reinterpret_cast<const uint8_t*>(kh);
    WeightView& vv = w->v_b[static_cast<size_t>(h)];
    vv = kv_b;
    vv.rows = dv;
    const uint64_t skip = static_cast<uint64_t>(h * per_head + nope) * kv_b.row_bytes;
    vv.data += skip;
    vv.file_offset += skip;
  }
  return MOELITE_OK;
}

Status bind_deepseek2(TensorBinder& b, const ArchDescriptor& arch, const HParams& hp, int32_t l, LayerWeights* w) {
  const int64_t n_embd = hp.n_embd, H = hp.n_head, r = hp.kv_lora_rank;
  MlaWeights& m = w->mla;
  MOELITE_TRY(b.floats(blk(l, "attn_norm.weight"), n_embd, &w->attn_norm));
  if (hp.q_lora_rank > 0) {
    MOELITE_TRY(b.matrix(blk(l, "attn_q_a.weight"), n_embd, hp.q_lora_rank, &m.wq_a));
    MOELITE_TRY(b.floats(blk(l, "attn_q_a_norm.weight"), hp.q_lora_rank, &m.q_a_norm));
    MOELITE_TRY(b.matrix(blk(l, "attn_q_b.weight"), hp.q_lora_rank, H * hp.head_dim, &m.wq));
  } else {
    if (b.has(blk(l, "attn_q_a.weight")))
      return fail(MOELITE_ERR_BAD_METADATA, "layer %d has attn_q_a but attention.q_lora_rank is absent or 0", l);
    MOELITE_TRY(b.matrix(blk(l, "attn_q.weight"), n_embd, H * hp.head_dim, &m.wq));
  }
  MOELITE_TRY(b.matrix(blk(l, "attn_kv_a_mqa.weight"), n_embd, r + hp.n_rot, &m.wkv_a));
  MOELITE_TRY(b.floats(blk(l, "attn_kv_a_norm.weight"), r, &m.kv_a_norm));
  if (b.has(blk(l, "attn_k_b.weight"))) {
    WeightView k0, v0;
    uint64_t k_stride, v_stride;
    MOELITE_TRY(b.matrix_stack(blk(l, "attn_k_b.weight"), hp.qk_nope(), r, H, &k0, &k_stride, false));
    MOELITE_TRY(b.matrix_stack(blk(l, "attn_v_b.weight"), r, hp.head_dim_v, H, &v0, &v_stride, false));
    head_views(k0, k_stride, hp.n_head, &m.k_b);
    head_views(v0, v_stride, hp.n_head, &m.v_b);
  } else if (b.has(blk(l, "attn_kv_b.weight"))) {
    MOELITE_TRY(bind_fused_kv_b(b, hp, l, &m));
  } else {
    return fail(MOELITE_ERR_MISSING_TENSOR, "layer %d has neither attn_k_b/attn_v_b nor attn_kv_b", l);
  }
  MOELITE_TRY(b.matrix(blk(l, "attn_output.weight"), H * hp.head_dim_v, n_embd, &w->wo));
  MOELITE_TRY(b.floats(blk(l, "ffn_norm.weight"), n_embd, &w->ffn_norm));
  if (!hp.is_moe_layer(l)) {
    w->has_dense = true;
    MOELITE_TRY(b.matrix(blk(l, "ffn_gate.weight"), n_embd, hp.n_ff_dense, &w->dense.gate));
    MOELITE_TRY(b.matrix(blk(l, "ffn_up.weight"), n_embd, hp.n_ff_dense, &w->dense.up));
    MOELITE_TRY(b.matrix(blk(l, "ffn_down.weight"), hp.n_ff_dense, n_embd, &w->dense.down));
    return MOELITE_OK;
  }
  MOELITE_TRY(b.matrix(blk(l, "ffn_gate_inp.weight"), n_embd, hp.n_expert, &w->router));
  MOELITE_TRY(b.floats(blk(l, "exp_probs_b.bias"), hp.n_expert, &w->exp_probs_b, false));
  MOELITE_TRY(bind_routed_experts(b, hp, l, &w->experts));
  if (hp.n_ff_shared > 0) {
    w->has_shared = true;
    MOELITE_TRY(b.matrix(blk(l, "ffn_gate_shexp.weight"), n_embd, hp.n_ff_shared, &w->shared.gate));
    MOELITE_TRY(b.matrix(blk(l, "ffn_up_shexp.weight"), n_embd, hp.n_ff_shared, &w->shared.up));
    MOELITE_TRY(b.matrix(blk(l, "ffn_down_shexp.weight"), hp.n_ff_shared, n_embd, &w->shared.down));
  }
  return MOELITE_OK;
}

}  // namespace

extern const ArchDescriptor kArch_deepseek2 = {
    /*name=*/"deepseek2",
    /*rope_style=*/RopeStyle::Normal,
    /*norm_topk=*/false,  // expert_weights_norm says otherwise where it is set (V3: true)
    /*qk_norm=*/QkNorm::None,
    /*shared_expert=*/true,
    /*expert_activation=*/FfnActivation::SwiGLU,
    /*rope_factors=*/false,
    /*read_hparams=*/read_deepseek2,
    /*bind_layer=*/bind_deepseek2,
    /*block=*/BlockKind::LatentAttention,
};

}  // namespace moelite
