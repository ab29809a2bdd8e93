// A block's static shared-memory array under the SIMT emulator, with race checking: what
// MK_SHARED declares when the kernels run on the CPU (kernels/dialect.cuh).
//
// Every element remembers who last wrote it and who read it since, and at which point of the
// block's synchronisation order (simt::SyncClock). Two accesses to one element by different
// threads, at least one a write, are a race unless a __syncthreads (or, within a warp, a __syncwarp)
// completed between them -- whatever order the emulator happened to run the threads in. A race, or
// an index out of bounds, is a kernel fault: launch() fails with MOELITE_ERR_BACKEND naming it,
// which is how a missing barrier shows up in CI instead of on a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "backends/cuda/simt/simt.h"

namespace moelite::simt {

template <class T, size_t N>
class SharedArray {
  struct Shadow {
    int32_t writer = -1, reader = -1;  // thread ids; -1: none in the current epoch
    uint32_t writer_warp = 0, reader_warp = 0;
    uint64_t write_epoch = 0, write_warp_epoch = 0, read_epoch = 0, read_warp_epoch = 0;
    bool many_readers = false;  // more than one thread read it since the last write
    bool readers_one_warp = true;  // ... and all of them in reader_warp (a __syncwarp orders them)
  };

  // Whether an access by (thread, warp) at (epoch, warp_epoch) is ordered before `c`.
  static bool ordered(int32_t thread, uint32_t warp, uint64_t epoch, uint64_t warp_epoch, const SyncClock& c) {
    if (thread < 0 || static_cast<unsigned>(thread) == c.thread || epoch != c.block_epoch) return true;
    return warp == c.warp && warp_epoch != c.warp_epoch;
  }

  void fault(const char* what, size_t i, int32_t other) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "shared-memory race: %s of element %zu by threads %d and %u without a barrier", what,
                  i, other, clock_ ? clock_->thread : 0u);
    report_kernel_fault(msg);
  }

  // The emulator's clock for this OS thread (the array is the OS thread's too); looked up once.
  const SyncClock* clock() {
    if (!clock_) clock_ = live_sync_clock();
    return clock_;
  }

  void on_read(size_t i) {
    const SyncClock* live = clock();
    if (!live || !live->valid) return;
    const SyncClock& c = *live;
    Shadow& s = shadow_[i];
    // This thread read it last, at this same point of the order: the write was checked then, and
    // nothing below would change (the kernels read each staged word several times, once per byte).
    if (s.reader == static_cast<int32_t>(c.thread) && s.read_epoch == c.block_epoch &&
        s.read_warp_epoch == c.warp_epoch)
      return;
    if (!ordered(s.writer, s.writer_warp, s.write_epoch, s.write_warp_epoch, c)) fault("write then read", i, s.writer);
    if (s.reader >= 0 && s.read_epoch == c.block_epoch && static_cast<unsigned>(s.reader) != c.thread) {
      s.many_readers = true;
      s.readers_one_warp = s.readers_one_warp && s.reader_warp == c.warp;
    } else if (s.read_epoch != c.block_epoch) {
      s.many_readers = false;
      s.readers_one_warp = true;
    }
    s.reader = static_cast<int32_t>(c.thread);
    s.reader_warp = c.warp;
    s.read_epoch = c.block_epoch;
    s.read_warp_epoch = c.warp_epoch;
  }

  void on_write(size_t i) {
    const SyncClock* live = clock();
    if (!live || !live->valid) return;
    const SyncClock& c = *live;
    Shadow& s = shadow_[i];
    if (!ordered(s.writer, s.writer_warp, s.write_epoch, s.write_warp_epoch, c)) fault("two writes", i, s.writer);
    // Readers since the last barrier: the last one is known exactly; several are ordered before
    // this write only if they were all lanes of the writer's warp and a __syncwarp of that warp
    // completed after the last of them (a warp's epochs only grow, so the last read is the latest).
    const bool several_ordered = s.readers_one_warp && s.reader_warp == c.warp && s.read_warp_epoch != c.warp_epoch;
    const bool readers_unordered =
        s.read_epoch == c.block_epoch &&
        (s.many_readers ? !several_ordered : !ordered(s.reader, s.reader_warp, s.read_epoch, s.read_warp_epoch, c));
    if (s.reader >= 0 && readers_unordered) fault("read then write", i, s.reader);
    s.writer = static_cast<int32_t>(c.thread);
    s.writer_warp = c.warp;
    s.write_epoch = c.block_epoch;
    s.write_warp_epoch = c.warp_epoch;
    s.reader = -1;
    s.many_readers = false;
    s.readers_one_warp = true;
  }

  T data_[N];
  Shadow shadow_[N];
  const SyncClock* clock_ = nullptr;

 public:
  class Ref {
   public:
    Ref(SharedArray* a, size_t i) : a_(a), i_(i) {}
    operator T() const {  // NOLINT: reads like the element it stands for
      a_->on_read(i_);
      return a_->data_[i_];
    }
    Ref& operator=(T v) {
      a_->on_write(i_);
      a_->data_[i_] = v;
      return *this;
    }
    Ref& operator=(const Ref& other) { return *this = static_cast<T>(other); }
    Ref& operator+=(T v) { return *this = static_cast<T>(*this) + v; }

   private:
    SharedArray* a_;
    size_t i_;
  };

  Ref operator[](size_t i) {
    if (i >= N) {
      char msg[96];
      std::snprintf(msg, sizeof msg, "shared-memory index %zu out of bounds (%zu elements)", i, N);
      report_kernel_fault(msg);
      i = 0;  // the block goes on; launch() reports the fault
    }
    return Ref(this, i);
  }
};

// Bytes of a SharedArray of 32-bit words, read like a `const uint8_t*` (indexing, adding an
// offset); each read is a checked read of the word that holds the byte (little-endian).
template <size_t N>
class SharedBytes {
 public:
  SharedBytes(SharedArray<uint32_t, N>* words, int64_t at) : words_(words), at_(at) {}
  uint8_t operator[](int64_t i) const {
    const int64_t b = at_ + i;
    return static_cast<uint8_t>(static_cast<uint32_t>((*words_)[static_cast<size_t>(b >> 2)]) >> (8 * (b & 3)));
  }
  SharedBytes operator+(int64_t i) const { return SharedBytes(words_, at_ + i); }
  // The 4 bytes at i, little-endian, from the one or two words that hold them (the GPU's
  // stage_u32: an aligned load, or two and a funnel shift).
  uint32_t word(int64_t i) const {
    const int64_t b = at_ + i;
    const uint32_t lo = (*words_)[static_cast<size_t>(b >> 2)];
    if ((b & 3) == 0) return lo;
    const uint32_t hi = (*words_)[static_cast<size_t>((b >> 2) + 1)];
    return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (8 * (b & 3)));
  }

 private:
  SharedArray<uint32_t, N>* words_;
  int64_t at_;
};

// One A per OS thread, made on first use and freed when the thread ends: shared memory too large
// to be a thread_local object of its own (see MK_SHARED_BYTES).
template <class A>
A& thread_shared() {
  static thread_local std::unique_ptr<A> a;
  if (!a) a = std::make_unique<A>();
  return *a;
}

}  // namespace moelite::simt
