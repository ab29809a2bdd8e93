// The rule by which backend instances (peers, one per context) share a discrete GPU's device tier
// of expert slots, in one place so the GPU backends cannot disagree. The backends keep each slot's
// device memory and synchronisation; this keeps which expert a slot holds, which instance holds it
// for an expert pass, and the LRU order.
//
// A slot is held by one instance from its first use in an expert pass until the instance releases
// it (once the work that reads it is ordered before any later copy into it: the Vulkan backend
// waits for that work, the CUDA backend records an event the next copy waits for). Only the holder
// copies into a held slot or reads it, so no instance ever waits for another's work, and a slot
// without a holder is complete and idle, for any instance to hit or evict. Waiting for a holder
// could deadlock: it may be waiting for an expert-store slot the waiting instance's context pinned.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moelite {

// What the tier knows of a slot; a backend's slot type derives from it and adds its memory.
struct TierEntry {
  int32_t layer = -1, expert = -1;  // the expert whose matrices the slot holds (-1: none)
  uint64_t last_use = 0;
  const void* holder = nullptr;  // the instance whose pass reads the slot, or none
};

// The outcome of pick_tier_slot for an expert:
//   Use: slot `index` is `holder`'s now. `taken`: it had no holder (copies into it must follow the
//        work of whoever held it last). `reassigned`: it held another expert (its matrices are gone).
//   ReleaseOwnFirst: every slot no peer holds is `holder`'s own: release them, then pick again.
//   OwnCopy: the expert's slot is a peer's, or every slot is: copy the matrix for this pass alone.
struct TierPick {
  enum Kind { Use, ReleaseOwnFirst, OwnCopy } kind = OwnCopy;
  size_t index = 0;
  bool taken = false, reassigned = false;
};

// Picks `holder`'s slot for (layer, expert) and, on Use, marks it held and used. The caller holds
// the tier's lock; `clock` counts uses for the LRU order.
template <class Slot>
TierPick pick_tier_slot(std::vector<Slot>& slots, uint64_t* clock, int32_t layer, int32_t expert, const void* holder) {
  TierPick pick;
  size_t found = slots.size(), lru = slots.size();
  bool hold_some = false;
  for (size_t i = 0; i < slots.size(); ++i) {
    const TierEntry& s = slots[i];
    if (s.layer == layer && s.expert == expert) found = i;
    hold_some |= s.holder == holder;
    if (!s.holder && (lru == slots.size() || s.last_use < slots[lru].last_use)) lru = i;
  }
  if (found < slots.size()) {
    if (slots[found].holder && slots[found].holder != holder) return pick;  // OwnCopy
    pick.index = found;
    pick.taken = !slots[found].holder;
  } else if (lru < slots.size()) {
    pick.index = lru;
    pick.taken = pick.reassigned = true;
    slots[lru].layer = layer;
    slots[lru].expert = expert;
  } else {
    pick.kind = hold_some ? TierPick::ReleaseOwnFirst : TierPick::OwnCopy;
    return pick;
  }
  pick.kind = TierPick::Use;
  slots[pick.index].holder = holder;
  slots[pick.index].last_use = ++*clock;
  return pick;
}

}  // namespace moelite
