// Architectures: what distinguishes one MoE family from another.
//
// Most share one pre-norm transformer block and differ only in the traits below. An architecture
// whose file layout differs fills the hooks (its own hyperparameter reader and tensor binder); one
// whose block computes differently (deepseek2's latent attention) names a block kind, which the
// forward pass implements in core/forward/ (layer_forward.h). Loading never runs the forward pass,
// so this folder knows nothing of it.
#pragma once
#include "backends/backend.h"
#include "core/model/model.h"

namespace moelite {

class TensorBinder;

// How a layer computes (core/forward/layer_forward.cpp picks the implementation).
enum class BlockKind {
  Standard,         // pre-norm attention + MoE (+ shared expert): core/forward/standard_block.cpp
  LatentAttention,  // deepseek2's multi-head latent attention, dense leading blocks: latent_attention_block.cpp
};

struct ArchDescriptor {
  const char* name;  // general.architecture
  RopeStyle rope_style;
  bool norm_topk;  // renormalise top-k weights
  QkNorm qk_norm;
  bool shared_expert;  // ffn_*_shexp with a sigmoid gate (qwen2moe)
  FfnActivation expert_activation;  // how routed experts combine gate and up
  bool rope_factors;                // LongRoPE: rope_factors_long/short.weight (n_rot/2 each), if present
  // Hooks; nullptr selects the standard implementation in core/model/arch/standard.cpp.
  Status (*read_hparams)(const gguf::Reader& gguf, const ArchDescriptor& arch, HParams* hp);
  Status (*bind_layer)(TensorBinder& binder, const ArchDescriptor& arch, const HParams& hp, int32_t layer,
                       LayerWeights* out);
  BlockKind block;
};

// nullptr if the architecture is not supported.
const ArchDescriptor* find_arch(const std::string& name);
// "llama (Mixtral-style, with experts), qwen2moe, ..., deepseek2"
const char* supported_arch_list();

// The standard pieces, used by the descriptors and available to new architectures.
Status standard_read_hparams(const gguf::Reader& gguf, const ArchDescriptor& arch, HParams* hp);
Status standard_bind_layer(TensorBinder& binder, const ArchDescriptor& arch, const HParams& hp, int32_t layer,
                           LayerWeights* out);
// Pieces of the standard binder and reader for architectures that differ only in part:
// attn_norm, q/k/v/output with their optional biases and the arch's q/k norms;
Status bind_attention(TensorBinder& binder, const ArchDescriptor& arch, const HParams& hp, int32_t layer,
                      LayerWeights* out);
// the routed experts' matrices: stacked per kind (ffn_*_exps), gate and up stacked together
// (ffn_gate_up_exps), or one tensor per expert;
Status bind_routed_experts(TensorBinder& binder, const HParams& hp, int32_t layer, LayerExperts* out);
// Typed, range-checked keys (core/model/arch/metadata_keys.cpp).
// The integer key "{arch}.suffix" in [lo, hi]: required (MISSING_METADATA when absent or not an
// integer), or optional (fallback when absent); BAD_METADATA outside the range.
Status required_int(const gguf::Reader& gguf, const std::string& arch, const char* suffix, int64_t lo, int64_t hi,
                    int32_t* out);
Status optional_int(const gguf::Reader& gguf, const std::string& arch, const char* suffix, int64_t lo, int64_t hi,
                    int32_t fallback, int32_t* out);
// A number key, as a float, finite and in (lo, hi] (lo and hi may be infinities: hi = +inf is "any
// finite value above lo"): MISSING_METADATA when required and absent or when not a number,
// BAD_METADATA (naming the key and the range) when NaN, infinite or outside. float_key_in takes the
// whole key; absent, it gives `fallback`.
Status float_key_in(const gguf::Reader& gguf, const std::string& key, double lo, double hi, double fallback,
                    float* out);
Status required_float(const gguf::Reader& gguf, const std::string& arch, const char* suffix, double lo, double hi,
                      float* out);
Status optional_float(const gguf::Reader& gguf, const std::string& arch, const char* suffix, double lo, double hi,
                      double fallback, float* out);
// The largest multiplier a file may give (expert_weights_scale, rope attention factor, Granite's
// scales): far above any real model's (DeepSeek-V2's expert_weights_scale is 16, Granite's
// embedding_scale 12), and small enough that the activations it scales stay far from float overflow.
constexpr double kMaxMultiplier = 1e6;
// `{arch}.rope.scaling.*` (none, linear or YaRN; longrope where the architecture reads LongRoPE
// factors). An unknown type is BAD_METADATA naming the key and the accepted values.
Status read_rope_scaling(const gguf::Reader& gguf, const ArchDescriptor& arch, int32_t n_ctx_train, RopeScaling* out);

}  // namespace moelite
