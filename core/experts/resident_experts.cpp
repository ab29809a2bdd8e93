#include "core/experts/expert_source.h"
#include "core/model/model.h"

namespace moelite {

Status ResidentExperts::acquire_next(int32_t layer, std::vector<int32_t>* pending, int32_t* expert,
                                     ExpertWeights* out) {
  *expert = pending->front();
  pending->erase(pending->begin());
  *out = (*layers_)[static_cast<size_t>(layer)].experts.expert(*expert);
  return MOELITE_OK;
}

}  // namespace moelite
