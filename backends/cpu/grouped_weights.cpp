#include "backends/cpu/grouped_weights.h"
#include "base/options.h"

#include <cstdlib>

#include "platforms/platform.h"

namespace moelite::cpu {

namespace {

// MOELITE_GROUPED_ROWS=0 keeps every weight in row layout (for comparing the two; the results are
// the same bits either way).
bool grouping_enabled() {
  static const bool on = [] {
    bool grouped = true;
    option_flag(Option::GroupedRows, &grouped);
    return grouped;
  }();
  return on;
}

}  // namespace

const uint8_t* GroupedWeights::copy_of(const Copy& c, const WeightView& w) {
  return c.rows == w.rows && c.cols == w.cols && c.type == w.type ? c.data : nullptr;
}

GroupedWeights::~GroupedWeights() {
  for (auto& kv : copies_) platform::aligned_free(kv.second.data);
}

bool GroupedWeights::eligible(const KernelTable& k, const WeightView& w) {
  const RowGroups& g = k.groups[static_cast<uint32_t>(w.type)];
  return grouping_enabled() && g.dot && w.mapped && w.data && w.rows >= kGroupRows;
}

const uint8_t* GroupedWeights::find(const WeightView& w) const {
  if (!w.mapped) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = copies_.find(w.data);
  return it == copies_.end() ? nullptr : copy_of(it->second, w);
}

const uint8_t* GroupedWeights::get_or_make(const KernelTable& k, const WeightView& w, ThreadPool* pool) {
  if (!eligible(k, w)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = copies_.find(w.data); it != copies_.end()) return copy_of(it->second, w);
  const RowGroups& g = k.groups[static_cast<uint32_t>(w.type)];
  const int64_t n_groups = w.rows / kGroupRows;
  const size_t group_bytes = g.group_bytes(w.cols);
  const size_t bytes = group_bytes * static_cast<size_t>(n_groups);
  auto* copy = static_cast<uint8_t*>(platform::aligned_alloc_bytes(bytes, 64));
  try {
    // Without memory the entry is kept, empty: this weight stays in row layout for good instead of
    // asking the allocator again at each of its matrix products.
    copies_.emplace(w.data, Copy{copy, w.rows, w.cols, w.type});
  } catch (...) {  // the map's node allocation
    platform::aligned_free(copy);
    return nullptr;
  }
  if (!copy) {
    log_msg(MOELITE_LOG_DEBUG, "cpu: no memory for a grouped copy of %zu bytes; the row layout is used", bytes);
    return nullptr;
  }
  const uint64_t row_bytes = w.row_bytes;
  const uint8_t* src = w.data;
  const int64_t cols = w.cols;
  pool->parallel_for(n_groups, [&](int64_t i, int) {
    g.repack(src + static_cast<uint64_t>(i) * kGroupRows * row_bytes, row_bytes, cols, copy + static_cast<size_t>(i) * group_bytes);
  });
  // The copy replaces the rows it holds: their mapped pages leave the resident set (the last
  // rows % 8, still read from the mapping, share at most one page with them).
  platform::Mapping::release_pages(w.data, static_cast<uint64_t>(n_groups) * kGroupRows * row_bytes);
  bytes_ += bytes;
  if (!logged_) {
    logged_ = true;
    log_msg(MOELITE_LOG_INFO,
            "cpu (%s): %s weights laid out in groups of %d rows for its group kernel (copies of the mapped "
            "bytes, which are released; MOELITE_GROUPED_ROWS=0 keeps the row layout)",
            k.isa, type_name(w.type), kGroupRows);
  }
  return copy;
}

uint64_t GroupedWeights::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace moelite::cpu
