// The CPU backend's copies of weights in memory of its own, found by the address of the weight's
// file bytes.
//
// Which weights: those whose bytes are the model file's mapping (WeightView::mapped) and so stay
// put for the model's life: dense weights (on first use) and every routed expert when no expert
// store is in use (at load). Expert-store slots are refilled with other experts and are memory of
// the store's own; an owned copy (no mapping) is not doubled. After copying, the mapped pages are
// released, so the process holds each weight once.
//
// Two layouts:
// - grouped: the rows interleaved in groups of eight (interleaved_rows.h) for the type's group
//   kernel (Q4_K, Q5_K on x86). The copy holds the first rows / 8 * 8 rows; the last rows % 8 are
//   read from the file bytes. MOELITE_GROUPED_ROWS=0 makes these row copies instead.
// - rows: the file's bytes as they are, for every other type. Same kernels, same bits; what
//   changes is the memory a product streams: anonymous memory in huge pages instead of the page
//   cache's small pages (decode reads every byte of its weights once a token, and a page-cache
//   mapping misses the TLB once per 4 KiB). MOELITE_WEIGHT_COPIES=0 computes these weights from
//   the mapping (processes that map one model file then share its pages).
//
// Where copies live: carved one after another from chunks of at least kChunkBytes, aligned to and
// advised for huge pages (platform::advise_huge_pages; MOELITE_HUGE_PAGES=0 leaves them small),
// because a copy alone (a matrix of a few MB) would seldom hold a whole huge page. Of the part of a
// chunk no copy filled, the process holds at most the rest of one huge page (2 of 64 MiB).
//
// Thread safety: every method may be called from any thread; the backend and its peers share
// one instance. Copies live until the instance is destroyed (after the last peer).
#pragma once
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/threadpool.h"
#include "base/status.h"

namespace moelite::cpu {

// A weight's copy: at most one of the two is set; both null where the weight has none (it is then
// computed from its own bytes).
struct WeightCopy {
  const uint8_t* grouped = nullptr;  // the grouped layout, for the table's group kernel
  const uint8_t* rows = nullptr;     // the row layout: stands in for WeightView::data
};

class WeightCopies {
 public:
  static constexpr size_t kChunkBytes = size_t{64} << 20;
  WeightCopies() = default;
  ~WeightCopies();
  WeightCopies(const WeightCopies&) = delete;
  WeightCopies& operator=(const WeightCopies&) = delete;

  // The copy of `w`, made now if there is none yet (grouped rows repacked over `pool`); none when
  // `w` does not qualify or no memory could be had for it (the file's bytes are then computed
  // from: same results, only slower; a weight whose copy could not be allocated is not tried again).
  WeightCopy get_or_make(const KernelTable& k, const WeightView& w, ThreadPool* pool);
  // The copy of `w` if one was made, else none (never makes one).
  WeightCopy find(const WeightView& w) const;
  uint64_t bytes() const;

 private:
  struct Copy {
    uint8_t* data;
    bool grouped;
    int64_t rows, cols;  // of the view it was made for: another view at the same address is not it
    TensorType type;
  };
  // Whether `w` gets a copy (see above) for table `k`, and whether that copy is grouped.
  static bool eligible(const KernelTable& k, const WeightView& w);
  static bool grouped_for(const KernelTable& k, const WeightView& w);
  // c's data if `c` was made for `w` (none too when its allocation failed).
  static WeightCopy copy_of(const Copy& c, const WeightView& w);
  // `bytes` of copy memory (64-byte aligned) from the current chunk or a new one; null without
  // memory. Called under mu_.
  uint8_t* carve(size_t bytes);
  mutable std::mutex mu_;
  std::unordered_map<const uint8_t*, Copy> copies_;  // file bytes -> copy
  std::vector<uint8_t*> chunks_;                     // what carve() allocated; freed with the instance
  uint8_t* chunk_free_ = nullptr;                    // the current chunk's first byte no copy holds
  size_t chunk_left_ = 0;                            // bytes from chunk_free_ to the chunk's end
  uint64_t bytes_ = 0;
  bool logged_grouped_ = false, logged_rows_ = false;
};

// `w` as the backend computes it with its copy `c`: on the row copy where there is one (the view
// then points there, as owned memory), with the grouped copy in `*grouped` (else null).
inline void compute_on(const WeightCopy& c, WeightView* w, const uint8_t** grouped) {
  *grouped = c.grouped;
  if (c.rows) {
    w->data = c.rows;
    w->mapped = false;
  }
}

}  // namespace moelite::cpu
