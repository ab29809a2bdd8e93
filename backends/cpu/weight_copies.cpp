#include "backends/cpu/weight_copies.h"
#include "base/options.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "platforms/platform.h"

namespace moelite::cpu {

namespace {

// A flag of the options table whose default is on.
bool flag_on(Option o) {
  bool on = true;
  option_flag(o, &on);
  return on;
}

// Read once: they are asked at every matrix product. MOELITE_GROUPED_ROWS=0 keeps every weight in
// row layout, MOELITE_WEIGHT_COPIES=0 computes weights without a grouped copy from the file's
// mapping (for comparisons; the results are the same bits either way).
bool grouping_enabled() {
  static const bool on = flag_on(Option::GroupedRows);
  return on;
}

bool row_copies_enabled() {
  static const bool on = flag_on(Option::WeightCopies);
  return on;
}

}  // namespace

WeightCopy WeightCopies::copy_of(const Copy& c, const WeightView& w) {
  if (c.rows != w.rows || c.cols != w.cols || c.type != w.type) return {};
  return c.grouped ? WeightCopy{c.data, nullptr} : WeightCopy{nullptr, c.data};
}

WeightCopies::~WeightCopies() {
  for (uint8_t* chunk : chunks_) platform::aligned_free(chunk);
}

uint8_t* WeightCopies::carve(size_t bytes) {
  constexpr size_t kAlign = 64;
  constexpr size_t kHugePage = size_t{2} << 20;
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (bytes > chunk_left_) {
    const size_t size = std::max(kChunkBytes, (bytes + kHugePage - 1) / kHugePage * kHugePage);
    auto* chunk = static_cast<uint8_t*>(platform::aligned_alloc_bytes(size, kHugePage));
    if (!chunk) return nullptr;
    try {
      chunks_.push_back(chunk);
    } catch (...) {
      platform::aligned_free(chunk);
      return nullptr;
    }
    if (flag_on(Option::HugePages)) (void)platform::advise_huge_pages(chunk, size);
    chunk_free_ = chunk;  // the last chunk's tail is left behind: copies come in model order, few and large
    chunk_left_ = size;
  }
  uint8_t* p = chunk_free_;
  chunk_free_ += bytes;
  chunk_left_ -= bytes;
  return p;
}

bool WeightCopies::grouped_for(const KernelTable& k, const WeightView& w) {
  return grouping_enabled() && k.groups[static_cast<uint32_t>(w.type)].dot && w.rows >= kGroupRows;
}

bool WeightCopies::eligible(const KernelTable& k, const WeightView& w) {
  if (!w.mapped || !w.data || w.rows <= 0) return false;
  return grouped_for(k, w) || (row_copies_enabled() && k.vec_dot[static_cast<uint32_t>(w.type)]);
}

WeightCopy WeightCopies::find(const WeightView& w) const {
  if (!w.mapped) return {};
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = copies_.find(w.data);
  return it == copies_.end() ? WeightCopy{} : copy_of(it->second, w);
}

WeightCopy WeightCopies::get_or_make(const KernelTable& k, const WeightView& w, ThreadPool* pool) {
  if (!eligible(k, w)) return {};
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = copies_.find(w.data); it != copies_.end()) return copy_of(it->second, w);
  const bool grouped = grouped_for(k, w);
  const RowGroups& g = k.groups[static_cast<uint32_t>(w.type)];
  const int64_t n_groups = w.rows / kGroupRows;
  const size_t group_bytes = grouped ? g.group_bytes(w.cols) : 0;
  // A grouped copy holds the whole groups (the rows left over are read from the mapping); a row
  // copy holds every row.
  const uint64_t copied_rows = grouped ? static_cast<uint64_t>(n_groups) * kGroupRows : static_cast<uint64_t>(w.rows);
  const size_t bytes = grouped ? group_bytes * static_cast<size_t>(n_groups) : static_cast<size_t>(w.bytes());
  Copy* entry = nullptr;
  try {
    // Without memory the entry is kept, empty: this weight is computed from its file bytes for good
    // instead of asking the allocator again at each of its matrix products.
    entry = &copies_.emplace(w.data, Copy{nullptr, grouped, w.rows, w.cols, w.type}).first->second;
  } catch (...) {  // the map's node allocation
    return {};
  }
  uint8_t* copy = entry->data = carve(bytes);
  if (!copy) {
    log_msg(MOELITE_LOG_DEBUG, "cpu: no memory for a copy of %zu bytes of a weight; its file bytes are used", bytes);
    return {};
  }
  const uint64_t row_bytes = w.row_bytes;
  const uint8_t* src = w.data;
  if (grouped) {
    const int64_t cols = w.cols;
    pool->parallel_for(n_groups, [&](int64_t i, int) {
      g.repack(src + static_cast<uint64_t>(i) * kGroupRows * row_bytes, row_bytes, cols,
               copy + static_cast<size_t>(i) * group_bytes);
    });
  } else {
    // In pieces over the pool: each thread faults in and copies its part of the mapping.
    constexpr uint64_t kPiece = uint64_t{1} << 20;
    const uint64_t total = w.bytes();
    pool->parallel_for(static_cast<int64_t>((total + kPiece - 1) / kPiece), [&](int64_t i, int) {
      const uint64_t at = static_cast<uint64_t>(i) * kPiece;
      std::memcpy(copy + at, src + at, static_cast<size_t>(std::min(kPiece, total - at)));
    });
  }
  // The copy replaces the rows it holds: their mapped pages leave the resident set (the last
  // rows % 8 of a grouped copy, still read from the mapping, share at most one page with them).
  platform::Mapping::release_pages(w.data, copied_rows * row_bytes);
  bytes_ += bytes;
  bool& logged = grouped ? logged_grouped_ : logged_rows_;
  if (!logged) {
    logged = true;
    if (grouped)
      log_msg(MOELITE_LOG_INFO,
              "cpu (%s): %s weights laid out in groups of %d rows for its group kernel (copies of the mapped "
              "bytes, which are released; MOELITE_GROUPED_ROWS=0 keeps the row layout)",
              k.isa, type_name(w.type), kGroupRows);
    else
      log_msg(MOELITE_LOG_INFO,
              "cpu: mapped %s weights copied into memory of the backend's own, in huge pages where the OS "
              "allows (the mapped bytes are released; MOELITE_WEIGHT_COPIES=0 computes from the mapping)",
              type_name(w.type));
  }
  return grouped ? WeightCopy{copy, nullptr} : WeightCopy{nullptr, copy};
}

uint64_t WeightCopies::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace moelite::cpu
