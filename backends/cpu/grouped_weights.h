// The CPU backend's copies of weights with their rows interleaved in groups of eight
// (interleaved_rows.h), found by the address of the weight's file bytes.
//
// Which weights: those of a type the kernel table has a group kernel for, whose bytes are the
// model file's mapping (WeightView::mapped) and so stay put for the model's life: dense weights
// (on first use) and every routed expert when no expert store is in use (at load). Expert-store
// slots are refilled with other experts and keep the row layout; an owned copy (no mapping) is not
// doubled. A copy holds the first rows / 8 * 8 rows; the last rows % 8 are read from the file
// bytes. After copying, the mapped pages are released, so the process holds each weight once.
//
// Thread safety: every method may be called from any thread; the backend and its peers share
// one instance. Copies live until the instance is destroyed (after the last peer).
#pragma once
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "backends/backend.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/threadpool.h"
#include "base/status.h"

namespace moelite::cpu {

class GroupedWeights {
 public:
  GroupedWeights() = default;
  ~GroupedWeights();
  GroupedWeights(const GroupedWeights&) = delete;
  GroupedWeights& operator=(const GroupedWeights&) = delete;

  // Whether `w` qualifies (see above) for table `k`.
  static bool eligible(const KernelTable& k, const WeightView& w);
  // The grouped copy of `w`, made now if there is none yet (its rows repacked over `pool`);
  // null when `w` does not qualify or no memory could be had for it (the row layout is then
  // used: same results, only slower; a weight whose copy could not be allocated is not tried again).
  const uint8_t* get_or_make(const KernelTable& k, const WeightView& w, ThreadPool* pool);
  // The copy of `w` if one was made, else null (never makes one).
  const uint8_t* find(const WeightView& w) const;
  uint64_t bytes() const;

 private:
  struct Copy {
    uint8_t* data;
    int64_t rows, cols;  // of the view it was made for: another view at the same address is not it
    TensorType type;
  };
  // c.data if `c` was made for `w` (null too when its allocation failed).
  static const uint8_t* copy_of(const Copy& c, const WeightView& w);
  mutable std::mutex mu_;
  std::unordered_map<const uint8_t*, Copy> copies_;  // file bytes -> grouped copy
  uint64_t bytes_ = 0;
  bool logged_ = false;
};

}  // namespace moelite::cpu
