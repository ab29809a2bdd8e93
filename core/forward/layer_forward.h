// One transformer layer of the forward pass, for the block kind its architecture declares
// (core/model/arch/arch.h, ArchDescriptor::block). The blocks differ in attention and in what
// surrounds the experts; the mixture-of-experts half is one for all (moe_block.h).
#pragma once
#include "core/forward/eval_state.h"
#include "core/model/model.h"

namespace moelite {

// Layer `layer` over the batch in `s`: s.x (the residual stream) in and out.
[[nodiscard]] Status forward_layer(const Model& model, EvalState& s, int32_t layer);

// The pre-norm block most architectures share (standard_block.cpp).
[[nodiscard]] Status standard_block_forward(const Model& model, EvalState& s, int32_t layer);
// deepseek2's multi-head latent attention, and a dense FFN in its leading layers
// (latent_attention_block.cpp).
[[nodiscard]] Status latent_attention_block_forward(const Model& model, EvalState& s, int32_t layer);

}  // namespace moelite
