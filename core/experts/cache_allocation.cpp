#include "core/experts/cache_allocation.h"

#include <algorithm>
#include <cinttypes>
#include <limits>

namespace moelite {

double expected_demand_loads(double used_per_token, double hit_rate, double accuracy) {
  const double h = std::clamp(hit_rate, 0.0, 1.0), a = std::clamp(accuracy, 0.0, 1.0);
  return used_per_token * (1.0 - h) * (1.0 - a);
}

namespace {
// States and inner steps of the programme (the units above the layers' minimum sizes).
void programme_size(const std::vector<AllocationLayer>& layers, int64_t budget_units, double* cells, double* steps) {
  int64_t minimum = 0;
  for (const AllocationLayer& a : layers) minimum += int64_t{a.min_size} * a.unit_cost;
  const double width = static_cast<double>(std::max<int64_t>(0, budget_units - minimum)) + 1.0;
  *cells = width * static_cast<double>(layers.size());
  *steps = 0.0;
  for (const AllocationLayer& a : layers) *steps += width * (static_cast<double>(a.max_size - a.min_size) + 1.0);
}
}  // namespace

bool allocation_too_large(const std::vector<AllocationLayer>& layers, int64_t budget_units) {
  double cells = 0, steps = 0;
  programme_size(layers, budget_units, &cells, &steps);
  return cells > static_cast<double>(kMaxAllocationCells) || steps > static_cast<double>(kMaxAllocationSteps);
}

Status allocate_cache(const std::vector<AllocationLayer>& layers, int64_t budget_units, std::vector<int32_t>* sizes,
                      double* total_loss) {
  const size_t n = layers.size();
  int64_t minimum = 0;
  for (size_t l = 0; l < n; ++l) {
    const AllocationLayer& a = layers[l];
    if (a.min_size < 0 || a.max_size < a.min_size || a.unit_cost < 1 ||
        a.loss.size() != static_cast<size_t>(a.max_size - a.min_size + 1))
      return fail(MOELITE_ERR_INVALID_ARGUMENT, "cache allocation: layer %zu has inconsistent sizes or losses", l);
    minimum += int64_t{a.min_size} * a.unit_cost;
  }
  if (budget_units < minimum)
    return fail(MOELITE_ERR_BUDGET_TOO_SMALL,
                "cache allocation: the minimum sizes need %" PRId64 " units, the budget is %" PRId64, minimum,
                budget_units);
  // Only the units above the minimum are distributed.
  const int64_t spare = budget_units - minimum;
  const int64_t width = spare + 1;
  if (allocation_too_large(layers, budget_units))
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "cache allocation: %zu layers x %" PRId64 " units is too large a programme (limits: %" PRId64
                " states, %" PRId64 " steps)",
                n, width, kMaxAllocationCells, kMaxAllocationSteps);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[u]: least loss of the layers so far using exactly u spare units; choice[l][u]: extra size.
  std::vector<double> best(static_cast<size_t>(width), kInf), next(static_cast<size_t>(width));
  std::vector<std::vector<int32_t>> choice(n, std::vector<int32_t>(static_cast<size_t>(width), -1));
  best[0] = 0.0;
  for (size_t l = 0; l < n; ++l) {
    const AllocationLayer& a = layers[l];
    std::fill(next.begin(), next.end(), kInf);
    for (int64_t u = 0; u < width; ++u) {
      if (best[static_cast<size_t>(u)] == kInf) continue;
      for (int32_t extra = 0; extra <= a.max_size - a.min_size; ++extra) {
        const int64_t v = u + int64_t{extra} * a.unit_cost;
        if (v >= width) break;
        const double total = best[static_cast<size_t>(u)] + a.loss[static_cast<size_t>(extra)];
        if (total < next[static_cast<size_t>(v)]) {
          next[static_cast<size_t>(v)] = total;
          choice[l][static_cast<size_t>(v)] = extra;
        }
      }
    }
    // Remember where each state came from: store the predecessor through the extra size chosen.
    best.swap(next);
  }
  // The best end state; walk back.
  int64_t end = 0;
  for (int64_t u = 1; u < width; ++u)
    if (best[static_cast<size_t>(u)] < best[static_cast<size_t>(end)]) end = u;
  sizes->assign(n, 0);
  int64_t u = end;
  for (size_t l = n; l-- > 0;) {
    const int32_t extra = choice[l][static_cast<size_t>(u)];
    (*sizes)[l] = layers[l].min_size + extra;
    u -= int64_t{extra} * layers[l].unit_cost;
  }
  if (total_loss) *total_loss = n ? best[static_cast<size_t>(end)] : 0.0;
  return MOELITE_OK;
}

}  // namespace moelite
