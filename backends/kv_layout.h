// The KV cache's position-to-slot rule and the checks every backend's attention makes, in one
// place so the backends cannot disagree (see KvCache and AttentionSpec in backends/backend.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/backend.h"

namespace moelite {

// A cache's description without its storage: what alloc_kv fills in before it allocates, so the
// copy of `slots` (which may throw) comes before anything that could leak.
inline KvCache kv_cache_shape(int32_t n_ctx, const std::vector<int32_t>& slots, int64_t kv_dim, bool values) {
  KvCache c;
  c.values = values;
  c.n_layers = static_cast<int32_t>(slots.size());
  c.n_ctx = n_ctx;
  c.kv_dim = kv_dim;
  c.slots = slots;
  return c;
}

// The slot of position `pos` in a layer that holds `slots` positions.
inline int64_t kv_slot(int64_t pos, int32_t slots) { return pos % slots; }

// The first position the query at `pos` sees (window 0: all of them).
inline int32_t kv_first_visible(int32_t pos, int32_t window) { return window > 0 ? std::max(0, pos - window + 1) : 0; }

// Whether writing a batch of n positions pos0.. into `layer` leaves every position its queries
// read in the cache, and the layer and positions exist.
inline Status kv_check_batch(const KvCache& kv, int32_t layer, int32_t pos0, int64_t n, const AttentionSpec& spec) {
  if (layer < 0 || layer >= kv.n_layers || static_cast<size_t>(layer) >= kv.slots.size())
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "attention: layer %d is outside the cache's %d layers", layer, kv.n_layers);
  if (pos0 < 0 || n < 1 || pos0 + n > kv.n_ctx)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "attention: positions %d..%lld are outside the cache's %d", pos0,
                static_cast<long long>(pos0 + n - 1), kv.n_ctx);
  const int32_t slots = kv.slots[static_cast<size_t>(layer)];
  // The batch's first query reads back to pos0 - window + 1 while its last write lands on
  // pos0 + n - 1: both must be in the cache at once.
  const int64_t span = spec.window > 0 ? std::min<int64_t>(pos0 + n, int64_t{spec.window} - 1 + n) : pos0 + n;
  if (span > slots)
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "attention: layer %d holds %d positions, a batch of %lld at %d with window %d needs %lld", layer, slots,
                static_cast<long long>(n), pos0, spec.window, static_cast<long long>(span));
  return MOELITE_OK;
}

// Whether slots [slot0, slot0 + n) of `layer` exist (read_kv / write_kv).
inline Status kv_check_slots(const KvCache& kv, int32_t layer, int32_t slot0, int32_t n) {
  if (layer < 0 || layer >= kv.n_layers || static_cast<size_t>(layer) >= kv.slots.size())
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "KV copy: layer %d is outside the cache's %d layers", layer, kv.n_layers);
  if (slot0 < 0 || n < 0 || int64_t{slot0} + n > kv.slots[static_cast<size_t>(layer)])
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "KV copy: slots %d..+%d are outside layer %d's %d", slot0, n, layer,
                kv.slots[static_cast<size_t>(layer)]);
  return MOELITE_OK;
}

// The floats of a value head: head_dim with stored values; with a keys-only cache the stated
// spec.head_dim_v, which the key row must cover.
inline Status kv_value_width(const KvCache& kv, const AttentionSpec& spec, int64_t head_dim, int64_t* out) {
  if (kv.values ? (spec.head_dim_v != 0 && spec.head_dim_v != head_dim)
                : (spec.head_dim_v < 1 || spec.head_dim_v > head_dim))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "attention: value width %lld with head_dim %lld and a %s cache",
                static_cast<long long>(spec.head_dim_v), static_cast<long long>(head_dim),
                kv.values ? "key-and-value" : "keys-only");
  *out = kv.values ? head_dim : spec.head_dim_v;
  return MOELITE_OK;
}

}  // namespace moelite
