// The expert memory plan: the one place that turns an expert budget into slots. Everything that
// sizes expert memory reads it (the store, a GPU backend's device tier, moelite_model_get, the
// CLI's and the server's reports), so one spelling of a budget gives one pool everywhere.
//
//   slot       one expert's gate, up and down matrices as they are read (core/experts/expert_reads.h):
//              from the model file each at a 4 KiB-aligned offset with room for the aligned
//              superset read O_DIRECT needs, from a packed expert file its record as it lies there
//   pool       the slots one budget pays for: one global pool, or a quota per MoE layer
//   reserve    kReserveSlots per pool beyond the experts one layer may hold at once, so the next
//              round of experts can load while the last one is still released
//   minimum    top-k + reserve slots per pool: below it one token's experts cannot be held
//   all        every routed expert plus each pool's reserve: a budget beyond it is not allocated
//
// How the budget becomes slots:
//   bytes      floor(min(bytes, all) / slot_bytes)
//   share P    the reserve + ceil(P x the experts), per pool: 100 % is `all`, so every expert stays
//   auto       bytes sized from the memory left at load (budget_auto.h), then as bytes
// then divided among layers by the cache allocation: "global" (one pool), "uniform" (equal
// quotas), "dp" (the profile's hit curves and predictor accuracy, cache_allocation.h), or "auto"
// (dp where a profile with hit curves is given and every layer's minimum fits, else global).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/experts/budget_auto.h"
#include "core/experts/expert_budget.h"

namespace moelite {

struct Model;
struct Profile;

// Slots kept free beyond one round so a round can load while the previous one is released.
constexpr int32_t kReserveSlots = 1;

// A slot: room for any layer's expert as it is read (core/experts/expert_reads.h).
struct ExpertSlotLayout {
  uint64_t slot_bytes = 0;
};
ExpertSlotLayout expert_slot_layout(const Model& model);

// The size limits of a pool layout: bytes of one slot, the smallest budget a load accepts and the
// most it allocates (see the top of this file).
struct ExpertPoolLimits {
  uint64_t slot_bytes = 0;
  uint64_t minimum = 0;
  uint64_t all = 0;
};
ExpertPoolLimits expert_pool_limits(const Model& model, bool per_layer);

// MOELITE_ERR_INVALID_ARGUMENT unless `name` is auto, global, uniform or dp.
Status check_cache_allocation(const std::string& name);

// Everything the plan depends on besides the model.
struct ExpertMemoryRequest {
  ExpertBudget budget;
  std::string allocation = "auto";   // auto, global, uniform, dp
  const Profile* profile = nullptr;  // hit curves, predictor accuracy, expert use counts (may be null)
  std::string predictors = "none";   // the predictor list in use: the DP weighs loads by its accuracy
  // Budget auto's inputs: one default context's KV cache and scratch, and whether the dense weights
  // count twice (a GPU on unified memory keeps its own copy in the same DRAM).
  uint64_t context_bytes = 0;
  bool dense_counted_twice = false;
};

struct ExpertMemoryPlan {
  ExpertBudget budget;        // as asked
  bool streams = false;       // false: no budget, every expert resident in the file mapping
  uint64_t budget_bytes = 0;  // the budget in bytes (a share or auto resolved); 0 without one
  ExpertSlotLayout layout;
  int64_t n_slots = 0;               // host slots; without a budget, every routed expert
  std::string allocation;            // as resolved: "global", "uniform" or "dp" ("" without a budget)
  std::vector<int32_t> layer_slots;  // per-layer quotas (uniform, dp); empty for one global pool
  // The most expert slots a GPU's device tier may keep (a discrete GPU copies experts from the host
  // slots into device slots of its own): as many as the host pool, so device memory stays within
  // the budget too. Backends without a device tier ignore it. 0 without a budget.
  int64_t device_tier_slots = 0;
  std::vector<uint64_t> expert_counts;  // n_layer x n_expert use counts for the static policy (may be empty)
  ExpertPoolLimits limits;              // of the resolved layout
  AutoBudget auto_budget;               // budget auto's terms (budget.kind == Auto)
  bool per_layer() const { return !layer_slots.empty(); }
  // Every routed expert has a slot (or there is no budget): once read, none is ever evicted.
  bool all_resident = false;
  uint64_t pool_bytes() const { return static_cast<uint64_t>(n_slots) * layout.slot_bytes; }
};

// The plan for `model` (weights bound; the room measured at load for budget auto).
// MOELITE_ERR_BUDGET_TOO_SMALL below the minimum (with it in the message), MOELITE_ERR_BAD_PROFILE
// for "dp" without a profile's hit curves, MOELITE_ERR_INVALID_ARGUMENT for an unknown allocation.
Status plan_expert_memory(const Model& model, const ExpertMemoryRequest& request, ExpertMemoryPlan* out);

// Slots per pool a share of the experts takes: the reserve + ceil(share x experts).
int64_t slots_for_share(double share, int64_t experts);

}  // namespace moelite
