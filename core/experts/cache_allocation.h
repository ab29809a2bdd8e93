// Per-layer cache allocation (AdapMoE's knapsack, generalised): choose each layer's cache size so
// that the expected on-demand expert loads per token are smallest within the memory budget.
//
// Each layer l offers sizes c in [min_size, max_size] at cost c * unit_cost (memory units, e.g.
// slots or KiB, so layers of different expert sizes compete fairly) with an expected loss
// loss[c - min_size] (on-demand loads per token at that size). The exact optimum comes from a
// dynamic programme over (layer, units spent): O(layers x budget x sizes).
#pragma once
#include <cstdint>
#include <vector>

#include "base/status.h"

namespace moelite {

struct AllocationLayer {
  int32_t min_size = 0;
  int32_t max_size = 0;
  int64_t unit_cost = 1;     // memory units one cached expert of this layer takes
  std::vector<double> loss;  // max_size - min_size + 1 values
};

// Bounds of the programme, so that a model and profile of hostile (or merely huge) sizes cannot
// make loading take hours or gigabytes: at most kMaxAllocationCells (layer, units) states kept
// (4 bytes each) and kMaxAllocationSteps inner steps (about a second).
constexpr int64_t kMaxAllocationCells = int64_t{1} << 24;
constexpr int64_t kMaxAllocationSteps = int64_t{1} << 30;
// True when allocate_cache would refuse these inputs for their size.
bool allocation_too_large(const std::vector<AllocationLayer>& layers, int64_t budget_units);

// Fills sizes[l] minimising sum_l loss_l(sizes[l]) subject to sum_l sizes[l] * unit_cost_l <=
// budget_units. Ties go to the allocation found first in layer order with the smaller size.
// MOELITE_ERR_BUDGET_TOO_SMALL when even the minimum sizes exceed the budget;
// MOELITE_ERR_INVALID_ARGUMENT for inconsistent inputs or a programme beyond the bounds above.
Status allocate_cache(const std::vector<AllocationLayer>& layers, int64_t budget_units, std::vector<int32_t>* sizes,
                      double* total_loss = nullptr);

// The loss model used with a calibration profile: expected on-demand loads per token of a layer
// whose cache holds c experts = used_per_token * (1 - hit(c)) * (1 - accuracy), where hit(c) is
// the layer's measured hit curve and accuracy the share of its experts the active predictor
// names in time (0 without one).
double expected_demand_loads(double used_per_token, double hit_rate, double accuracy);

}  // namespace moelite
