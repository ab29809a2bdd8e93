// The deepseek2 block (core/model/arch/deepseek2.cpp reads and binds its weights):
//
// Multi-head latent attention (MLA), computed the "absorbed" way so that the KV cache keeps one
// row of kv_lora_rank + n_rot floats per position instead of n_head * (key + value) floats:
//   q_h      = Wq · n(x)  (or Wq_b · rms(Wq_a · n(x)) with a q low-rank path), [q_nope_h | q_rope_h]
//   [c | kr] = Wkv_a · n(x);  c = rms(c) (the latent), kr = rope(kr) (one rope key for all heads)
//   query_h  = [K_b,h · q_nope_h | rope(q_rope_h)]   key = value source = [c | kr]
//   o_h      = softmax(query_h · key * scale) · c    (the value is the key's first kv_lora_rank floats)
//   out      = Wo · [V_b,h · o_h]_h
// which equals attention with k_h = [K_b,h^T c | kr], v_h = V_b,h c -- the "decompressed" form
// the numpy reference computes (tests/reference/reference_forward.py).
//
// The FFN: a dense SwiGLU block in the leading layers, then the experts plus the shared experts.
#include "core/forward/layer_forward.h"
#include "core/forward/moe_block.h"

namespace moelite {

namespace {

// For each head h: out[:, h * out_stride + out_offset ...] = mats[h] · x[:, h * x_stride ...],
// through the per-head gather and scatter of copy_columns (each head's input is a column slice).
Status per_head_matmul(Backend& be, const std::vector<WeightView>& mats, const Act& x, int64_t x_stride, Act* in,
                       Act* tmp, Act* out, int64_t out_stride, int64_t out_offset) {
  for (size_t h = 0; h < mats.size(); ++h) {
    const int64_t hh = static_cast<int64_t>(h);
    MOELITE_TRY(be.copy_columns(x, 0, hh * x_stride, 1, in->cols, in, 0, 0));
    MOELITE_TRY(be.matmul(mats[h], *in, nullptr, tmp));
    MOELITE_TRY(be.copy_columns(*tmp, 0, 0, 1, tmp->cols, out, 0, hh * out_stride + out_offset));
  }
  return MOELITE_OK;
}

}  // namespace

Status latent_attention_block_forward(const Model& model, EvalState& s, int32_t l) {
  Backend& be = *s.backend;
  const HParams& hp = model.hp;
  const LayerWeights& w = model.layers[static_cast<size_t>(l)];
  const MlaWeights& m = w.mla;
  MlaScratch& z = s.mla;
  const int64_t H = hp.n_head, r = hp.kv_lora_rank, rot = hp.n_rot, nope = hp.qk_nope(), row = r + rot;
  Act x = s.rows(s.x), xn = s.rows(s.xn), attn = s.rows(s.attn), proj = s.rows(s.proj);
  Act q = s.rows(z.q), q_pe = s.rows(z.q_pe), kv_a = s.rows(z.kv_a), latent = s.rows(z.latent);
  Act k_pe = s.rows(z.k_pe), keys = s.rows(z.keys), queries = s.rows(z.queries), o = s.rows(z.attn_latent);
  Act in_nope = s.rows(z.in_nope), in_latent = s.rows(z.in_latent), out_latent = s.rows(z.out_latent);
  Act out_v = s.rows(z.out_v);

  MOELITE_TRY(be.rms_norm(x, w.attn_norm.data(), hp.n_embd, hp.rms_eps, &xn));
  // Queries: [nope | rope] per head.
  if (m.wq_a.valid()) {
    Act qa = s.rows(z.qa);
    MOELITE_TRY(be.matmul(m.wq_a, xn, nullptr, &qa));
    MOELITE_TRY(be.rms_norm(qa, m.q_a_norm.data(), hp.q_lora_rank, hp.rms_eps, &qa));
    MOELITE_TRY(be.matmul(m.wq, qa, nullptr, &q));
  } else {
    MOELITE_TRY(be.matmul(m.wq, xn, nullptr, &q));
  }
  // The shared key row [latent | rope key].
  MOELITE_TRY(be.matmul(m.wkv_a, xn, nullptr, &kv_a));
  MOELITE_TRY(be.copy_columns(kv_a, 0, 0, 1, r, &latent, 0, 0));
  MOELITE_TRY(be.rms_norm(latent, m.kv_a_norm.data(), r, hp.rms_eps, &latent));
  MOELITE_TRY(be.copy_columns(kv_a, 0, r, 1, rot, &k_pe, 0, 0));
  MOELITE_TRY(be.rope(&k_pe, rot, s.rope, s.positions.data()));
  MOELITE_TRY(be.copy_columns(latent, 0, 0, 1, r, &keys, 0, 0));
  MOELITE_TRY(be.copy_columns(k_pe, 0, 0, 1, rot, &keys, 0, r));
  // Each head's query in the key row's space: [K_b,h · q_nope_h | rope(q_rope_h)].
  MOELITE_TRY(be.copy_columns(q, hp.head_dim, nope, static_cast<int32_t>(H), rot, &q_pe, rot, 0));
  MOELITE_TRY(be.rope(&q_pe, rot, s.rope, s.positions.data()));
  MOELITE_TRY(per_head_matmul(be, m.k_b, q, hp.head_dim, &in_nope, &out_latent, &queries, row, 0));
  MOELITE_TRY(be.copy_columns(q_pe, rot, 0, static_cast<int32_t>(H), rot, &queries, row, r));
  AttentionSpec spec;
  spec.scale = hp.attention_scale;
  spec.head_dim_v = r;
  MOELITE_TRY(attend_segments(s, l, queries, keys, keys, hp.n_head, 1, row, spec, &o));
  // Back from latent space per head, then the output projection.
  MOELITE_TRY(per_head_matmul(be, m.v_b, o, r, &in_latent, &out_v, &attn, hp.head_dim_v, 0));
  MOELITE_TRY(be.matmul(w.wo, attn, nullptr, &proj));
  MOELITE_TRY(be.add(&x, proj));

  // Feed-forward: a dense block, or the experts plus the shared experts.
  Act ffn = s.rows(s.moe_out);
  MOELITE_TRY(be.rms_norm(x, w.ffn_norm.data(), hp.n_embd, hp.rms_eps, &xn));
  if (w.has_dense) {
    MOELITE_TRY(be.dense_ffn(w.dense, FfnKind{}, nullptr, xn, &ffn));
  } else {
    Act shared = s.rows(s.shared_out);
    const std::function<Status()> shared_experts = [&] {
      return be.dense_ffn(w.shared, model.expert_ffn, nullptr, xn, &shared);
    };
    MOELITE_TRY(moe_forward(model, s, l, x, xn, &ffn, w.has_shared ? &shared_experts : nullptr));
    if (w.has_shared) MOELITE_TRY(be.add(&ffn, shared));
  }
  return be.add(&x, ffn);
}

}  // namespace moelite
