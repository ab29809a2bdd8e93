// gpt-oss (OpenAI's open-weight MoE, 20b and 120b): the standard block with
//   - q/k/v/output biases and per-head attention sinks (a logit that joins each head's softmax);
//   - sliding-window attention on alternating layers (attention.sliding_window positions; the
//     pattern's last layer of each period attends to everything);
//   - YaRN rope (read by the standard reader), NeoX pairing;
//   - "post_attention_norm" as the MoE's input norm;
//   - a router with a bias, the experts picked from its logits and weighted by a softmax over the
//     k picked (the same as softmax, top-k, renormalise);
//   - experts with per-output biases and the clamped SwiGLU (gate <= 7, |up| <= 7,
//     out = gate * sigmoid(1.702 gate) * (up + 1)), usually in MXFP4.
// Facts as llama.cpp's openai-moe model reads them (docs/moe-archs.md).
#include <limits>
#include <string>

#include "core/model/arch/arch.h"
#include "core/model/tensor_binder.h"

namespace moelite {

namespace {

std::string blk(int32_t layer, const char* suffix) { return "blk." + std::to_string(layer) + "." + suffix; }

Status read_gpt_oss(const gguf::Reader& g, const ArchDescriptor& arch, HParams* hp) {
  MOELITE_TRY(standard_read_hparams(g, arch, hp));
  const std::string a = arch.name;
  int64_t window = 0, period = 2;
  const std::string window_key = a + ".attention.sliding_window", period_key = a + ".attention.sliding_window_pattern";
  if (!g.find(window_key))
    return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' is required but absent", window_key.c_str());
  if (!g.get_int(window_key, &window) || window < 1 || window > MOELITE_MAX_CONTEXT)
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' must be an integer in [1, %d]", window_key.c_str(),
                MOELITE_MAX_CONTEXT);
  if (g.find(period_key) && (!g.get_int(period_key, &period) || period < 0 || period > MOELITE_MAX_LAYERS))
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' must be an integer in [0, %d]", period_key.c_str(),
                MOELITE_MAX_LAYERS);
  // Of each period of layers all but the last use the window (period 0: every layer does).
  hp->attn_window.assign(static_cast<size_t>(hp->n_layer), 0);
  for (int32_t l = 0; l < hp->n_layer; ++l)
    if (period == 0 || l % period < period - 1) hp->attn_window[static_cast<size_t>(l)] = static_cast<int32_t>(window);
  // The windowed layers' rope base, as rope.freq_base: finite and above 1.
  return optional_float(g, a, "rope.freq_base_swa", 1.0, std::numeric_limits<double>::infinity(), hp->rope.freq_base,
                        &hp->rope_windowed.freq_base);
}

Status bind_gpt_oss(TensorBinder& b, const ArchDescriptor& arch, const HParams& hp, int32_t l, LayerWeights* w) {
  const int64_t n_embd = hp.n_embd;
  MOELITE_TRY(bind_attention(b, arch, hp, l, w));
  MOELITE_TRY(b.floats(blk(l, "attn_sinks.weight"), hp.n_head, &w->sinks));
  MOELITE_TRY(b.floats(blk(l, "post_attention_norm.weight"), n_embd, &w->ffn_norm));
  MOELITE_TRY(b.matrix(blk(l, "ffn_gate_inp.weight"), n_embd, hp.n_expert, &w->router));
  MOELITE_TRY(b.floats(blk(l, "ffn_gate_inp.bias"), hp.n_expert, &w->router_bias));
  LayerExperts& ex = w->experts;
  MOELITE_TRY(bind_routed_experts(b, hp, l, &ex));
  if (!ex.split.empty())
    return fail(MOELITE_ERR_BAD_SHAPE, "layer %d: gpt-oss experts must be merged (ffn_*_exps) tensors", l);
  MOELITE_TRY(b.float_table(blk(l, "ffn_gate_exps.bias"), ex.gate.rows, hp.n_expert, &ex.gate_bias));
  MOELITE_TRY(b.float_table(blk(l, "ffn_up_exps.bias"), ex.up.rows, hp.n_expert, &ex.up_bias));
  MOELITE_TRY(b.float_table(blk(l, "ffn_down_exps.bias"), n_embd, hp.n_expert, &ex.down_bias));
  return MOELITE_OK;
}

}  // namespace

extern const ArchDescriptor kArch_gpt_oss = {
    /*name=*/"gpt-oss",
    /*rope_style=*/RopeStyle::Neox,
    /*norm_topk=*/true,  // softmax over the k picked logits
    /*qk_norm=*/QkNorm::None,
    /*shared_expert=*/false,
    /*expert_activation=*/FfnActivation::SwiGLUClamped,
    /*rope_factors=*/false,
    /*read_hparams=*/read_gpt_oss,
    /*bind_layer=*/bind_gpt_oss,
    /*block=*/BlockKind::Standard,
};

}  // namespace moelite
