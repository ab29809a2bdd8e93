#include "core/forward/layer_forward.h"

#include "core/model/arch/arch.h"
#include "core/support/timeline.h"

namespace moelite {

namespace {

Status forward_block(const Model& model, EvalState& s, int32_t layer) {
  switch (model.arch->block) {
    case BlockKind::Standard: return standard_block_forward(model, s, layer);
    case BlockKind::LatentAttention: return latent_attention_block_forward(model, s, layer);
  }
  return fail(MOELITE_ERR_UNSUPPORTED_ARCH, "architecture '%s' declares an unknown block kind", model.arch->name);
}

}  // namespace

Status forward_layer(const Model& model, EvalState& s, int32_t layer) {
  if (!s.trace) return forward_block(model, s, layer);
  // On a timeline, the layer's whole span: what its routing and experts leave of it is attention,
  // norms and dense or shared FFNs, which are not recorded one by one.
  const double start = TimelineRecorder::now_us();
  const Status st = forward_block(model, s, layer);
  s.trace->complete("layer", "layer", "evaluation", start, TimelineRecorder::now_us(), {{"layer", layer}});
  return st;
}

}  // namespace moelite
