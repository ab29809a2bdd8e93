// The pre-norm MoE transformer block shared by every supported architecture (llama/Mixtral,
// qwen2moe, qwen3moe, olmoe, gpt-oss, granitemoe, phimoe):
//   x += Wo · attention(rope(qk_norm(Wq·n(x) [+bq])), rope(qk_norm(Wk·n(x) [+bk])), Wv·n(x) [+bv]) [+bo]
//        (attention with the layer's sliding window and sinks, if any)
//   x += sum_j w_j · expert_j(n'(x)) [+ [sigmoid(g·n'(x)) ·] shared(n'(x))]
// where n and n' are RMSNorms [+ their bias]. Granite: both additions times residual_scale, the
// embeddings times embedding_scale, the logits divided by logit_scale.
#include "core/forward/layer_forward.h"
#include "core/forward/moe_block.h"

namespace moelite {

Status standard_block_forward(const Model& m, EvalState& s, int32_t l) {
  Backend& be = *s.backend;
  const HParams& hp = m.hp;
  const LayerWeights& w = m.layers[static_cast<size_t>(l)];
  Act x = s.rows(s.x), xn = s.rows(s.xn), q = s.rows(s.q), k = s.rows(s.k), v = s.rows(s.v);
  Act attn = s.rows(s.attn), proj = s.rows(s.proj);

  // Attention.
  MOELITE_TRY(be.rms_norm(x, w.attn_norm.data(), hp.n_embd, hp.rms_eps, &xn));
  if (!w.attn_norm_b.empty()) MOELITE_TRY(be.add_bias(&xn, w.attn_norm_b.data()));
  MOELITE_TRY(be.matmul(w.wq, xn, w.bq.empty() ? nullptr : w.bq.data(), &q));
  MOELITE_TRY(be.matmul(w.wk, xn, w.bk.empty() ? nullptr : w.bk.data(), &k));
  MOELITE_TRY(be.matmul(w.wv, xn, w.bv.empty() ? nullptr : w.bv.data(), &v));
  if (hp.qk_norm == QkNorm::PerHead) {
    MOELITE_TRY(be.rms_norm(q, w.q_norm.data(), hp.head_dim, hp.rms_eps, &q));
    MOELITE_TRY(be.rms_norm(k, w.k_norm.data(), hp.head_dim, hp.rms_eps, &k));
  } else if (hp.qk_norm == QkNorm::Whole) {
    MOELITE_TRY(be.rms_norm(q, w.q_norm.data(), q.cols, hp.rms_eps, &q));
    MOELITE_TRY(be.rms_norm(k, w.k_norm.data(), k.cols, hp.rms_eps, &k));
  }
  AttentionSpec spec;
  spec.scale = hp.attention_scale;
  spec.window = hp.window_of(l);
  spec.sinks = w.sinks.empty() ? nullptr : w.sinks.data();
  const RopeParams& rope = spec.window > 0 ? s.rope_windowed : s.rope;
  MOELITE_TRY(be.rope(&q, hp.head_dim, rope, s.positions.data()));
  MOELITE_TRY(be.rope(&k, hp.head_dim, rope, s.positions.data()));
  MOELITE_TRY(attend_segments(s, l, q, k, v, hp.n_head, hp.n_head_kv, hp.head_dim, spec, &attn));
  MOELITE_TRY(be.matmul(w.wo, attn, w.bo.empty() ? nullptr : w.bo.data(), &proj));
  if (hp.residual_scale != 1.0f) MOELITE_TRY(be.scale(&proj, hp.residual_scale));
  MOELITE_TRY(be.add(&x, proj));

  // Mixture of experts (+ the shared expert).
  Act moe = s.rows(s.moe_out);
  MOELITE_TRY(be.rms_norm(x, w.ffn_norm.data(), hp.n_embd, hp.rms_eps, &xn));
  if (!w.ffn_norm_b.empty()) MOELITE_TRY(be.add_bias(&xn, w.ffn_norm_b.data()));
  Act shared = s.rows(s.shared_out);
  const std::function<Status()> shared_expert = [&] {
    return be.dense_ffn(w.shared, m.expert_ffn, w.shared_gate.empty() ? nullptr : w.shared_gate.data(), xn, &shared);
  };
  MOELITE_TRY(moe_forward(m, s, l, x, xn, &moe, w.has_shared ? &shared_expert : nullptr));
  if (w.has_shared) MOELITE_TRY(be.add(&moe, shared));
  if (hp.residual_scale != 1.0f) MOELITE_TRY(be.scale(&moe, hp.residual_scale));
  return be.add(&x, moe);
}

}  // namespace moelite
