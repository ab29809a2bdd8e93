// PhiMoE (Phi-3.5-MoE, phimoe in GGUF), as llama.cpp computes it (its phi3 graph): the standard
// block with a bias on every norm (attn_norm, ffn_norm, output_norm: rms_norm(x) * w + b), q/k/v
// and output biases, a biased output head, NeoX rope with LongRoPE factors (rope_factors_long for
// contexts longer than rope.scaling.original_context_length, rope_factors_short otherwise, and
// cos/sin times rope.scaling.attn_factor), softmax routing with the top-k weights renormalised.
// (Hugging Face's PhiMoE uses LayerNorm and sparsemixer routing; moelite follows llama.cpp, whose
// logits are the ones GGUF users get.)
#include <string>

#include "core/model/arch/arch.h"
#include "core/model/tensor_binder.h"

namespace moelite {

namespace {

std::string blk(int32_t layer, const char* suffix) { return "blk." + std::to_string(layer) + "." + suffix; }

Status bind_phimoe(TensorBinder& b, const ArchDescriptor& arch, const HParams& hp, int32_t l, LayerWeights* w) {
  MOELITE_TRY(standard_bind_layer(b, arch, hp, l, w));
  MOELITE_TRY(b.floats(blk(l, "attn_norm.bias"), hp.n_embd, &w->attn_norm_b));
  MOELITE_TRY(b.floats(blk(l, "ffn_norm.bias"), hp.n_embd, &w->ffn_norm_b));
  return MOELITE_OK;
}

}  // namespace

extern const ArchDescriptor kArch_phimoe = {
    /*name=*/"phimoe",
    /*rope_style=*/RopeStyle::Neox,
    /*norm_topk=*/true,
    /*qk_norm=*/QkNorm::None,
    /*shared_expert=*/false,
    /*expert_activation=*/FfnActivation::SwiGLU,
    /*rope_factors=*/true,
    /*read_hparams=*/nullptr,
    /*bind_layer=*/bind_phimoe,
    /*block=*/BlockKind::Standard,
};

}  // namespace moelite
