#include "core/forward/layer_forward.h"

#include "core/model/arch/arch.h"

namespace moelite {

Status forward_layer(const Model& model, EvalState& s, int32_t layer) {
  switch (model.arch->block) {
    case BlockKind::Standard: return standard_block_forward(model, s, layer);
    case BlockKind::LatentAttention: return latent_attention_block_forward(model, s, layer);
  }
  return fail(MOELITE_ERR_UNSUPPORTED_ARCH, "architecture '%s' declares an unknown block kind", model.arch->name);
}

}  // namespace moelite
