#include "core/forward/eval_state.h"

namespace moelite {

Status attend_segments(EvalState& s, int32_t layer, const Act& q, const Act& k, const Act& v, int32_t n_head,
                       int32_t n_head_kv, int64_t head_dim, const AttentionSpec& spec, Act* out) {
  Backend& be = *s.backend;
  if (s.segments.size() == 1) {  // one sequence: the batch's rows as they are, no views
    const AttentionSegment& g = s.segments.front();
    return be.attention(g.kv, layer, q, k, v, g.pos0, n_head, n_head_kv, head_dim, spec, out);
  }
  for (const AttentionSegment& g : s.segments) {
    const Act qs = be.view_rows(q, g.row0, g.n), ks = be.view_rows(k, g.row0, g.n), vs = be.view_rows(v, g.row0, g.n);
    Act os = be.view_rows(*out, g.row0, g.n);
    MOELITE_TRY(be.attention(g.kv, layer, qs, ks, vs, g.pos0, n_head, n_head_kv, head_dim, spec, &os));
  }
  return MOELITE_OK;
}

}  // namespace moelite
