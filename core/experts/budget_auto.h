// The expert budget "auto": sized at load from the memory the process may still take.
//
//   room     = min(MemAvailable, cgroup limit - cgroup usage), read when loading starts
//   headroom = the caller's, or by default max(64 MiB, room / 10)
//   budget   = room - dense weights - KV cache and scratch of one default context - headroom
//
// capped at the bytes of a pool that holds every expert (then every expert stays resident once
// read, and the result says so). Below the store's minimum working set (top-k + 1 expert slots):
// MOELITE_ERR_BUDGET_TOO_SMALL with every term of the sum in the message.
#pragma once
#include <cstdint>

#include "base/status.h"

namespace moelite {

// Default headroom: 10 % of the room, at least 64 MiB (page tables, allocator slack, the
// application's own memory, a GPU driver's context).
constexpr uint64_t kMinAutoHeadroom = uint64_t{64} << 20;
inline uint64_t default_headroom(uint64_t room) { return room / 10 > kMinAutoHeadroom ? room / 10 : kMinAutoHeadroom; }

struct AutoBudgetInputs {
  uint64_t room = 0;           // bytes the process may still allocate when loading starts
  uint64_t dense = 0;          // non-expert weights (read into memory at load, and any device copy)
  uint64_t context = 0;        // KV cache + scratch of one context with default parameters
  uint64_t headroom = 0;       // 0: the default above
  uint64_t minimum = 0;        // the store's minimum working set
  uint64_t all_experts = 0;    // a pool holding every expert
};

struct AutoBudget {
  uint64_t budget = 0;     // what the store gets
  uint64_t room = 0;       // copies of the inputs as used, for moelite_model_get
  uint64_t context = 0;
  uint64_t headroom = 0;
  bool all_resident = false;  // the budget holds every expert
};

// Pure arithmetic (tested without a machine): the budget or MOELITE_ERR_BUDGET_TOO_SMALL.
Status size_auto_budget(const AutoBudgetInputs& in, AutoBudget* out);

}  // namespace moelite
