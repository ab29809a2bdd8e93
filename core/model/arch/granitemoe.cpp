// Granite MoE (IBM Granite 3.x MoE, granitemoe in GGUF): the Mixtral-style block with four
// multipliers from the file -- embedding_scale on the token embeddings, residual_scale on each
// attention and MoE output before it joins the residual stream, attention.scale in place of
// 1/sqrt(head_dim), and logit_scale dividing the logits -- and an optional shared expert without a
// gate (expert_shared_feed_forward_length). Normal (adjacent-pair) rope, top-k weights renormalised.
// Facts as llama.cpp's granite model reads them (docs/moe-archs.md).
#include <string>

#include "core/model/arch/arch.h"
#include "core/model/tensor_binder.h"

namespace moelite {

namespace {

// An optional positive multiplier `{arch}.suffix`; absent or 0 (llama.cpp's "not set") leaves 1.
Status multiplier(const gguf::Reader& g, const std::string& arch, const char* suffix, bool required, float* out) {
  const std::string key = arch + "." + suffix;
  if (!g.find(key)) {
    if (required) return fail(MOELITE_ERR_MISSING_METADATA, "metadata key '%s' is required but absent", key.c_str());
    return MOELITE_OK;
  }
  double v;
  if (!g.get_float(key, &v) || !(v >= 0.0 && v <= kMaxMultiplier))
    return fail(MOELITE_ERR_BAD_METADATA, "metadata key '%s' must be a number in [0, %g]", key.c_str(), kMaxMultiplier);
  if (v > 0.0) *out = static_cast<float>(v);
  return MOELITE_OK;
}

Status read_granitemoe(const gguf::Reader& g, const ArchDescriptor& arch, HParams* hp) {
  MOELITE_TRY(standard_read_hparams(g, arch, hp));
  const std::string a = arch.name;
  MOELITE_TRY(multiplier(g, a, "logit_scale", true, &hp->logit_scale));
  MOELITE_TRY(multiplier(g, a, "residual_scale", false, &hp->residual_scale));
  MOELITE_TRY(multiplier(g, a, "embedding_scale", false, &hp->embedding_scale));
  float attention = 0.0f;
  MOELITE_TRY(multiplier(g, a, "attention.scale", false, &attention));
  hp->attention_scale = attention;
  return MOELITE_OK;
}

Status bind_granitemoe(TensorBinder& b, const ArchDescriptor& arch, const HParams& hp, int32_t l, LayerWeights* w) {
  // Per-pair rope frequency factors (Llama-3.1-style rope_freqs) would change every angle.
  if (l == 0 && (b.has("rope_freqs.weight") || b.has("blk.0.rope_freqs.weight")))
    return fail(MOELITE_ERR_UNSUPPORTED_TYPE, "rope frequency factors (rope_freqs.weight) are not supported");
  return standard_bind_layer(b, arch, hp, l, w);
}

}  // namespace

extern const ArchDescriptor kArch_granitemoe = {
    /*name=*/"granitemoe",
    /*rope_style=*/RopeStyle::Normal,
    /*norm_topk=*/true,
    /*qk_norm=*/QkNorm::None,
    /*shared_expert=*/true,  // Granite MoE Shared: ffn_*_shexp, added without a gate
    /*expert_activation=*/FfnActivation::SwiGLU,
    /*rope_factors=*/false,
    /*read_hparams=*/read_granitemoe,
    /*bind_layer=*/bind_granitemoe,
    /*block=*/BlockKind::Standard,
};

}  // namespace moelite
