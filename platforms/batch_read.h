// Reading several byte ranges of a file at once: io_uring where the build has liburing and the
// kernel allows it (many ranges in flight together, within the caller's caps), plain pread one
// after another otherwise.
// One reader per thread: readers are not thread-safe.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"

namespace moelite::platform {

struct ReadRange {
  int fd = -1;
  uint64_t offset = 0;
  void* dst = nullptr;
  uint64_t len = 0;     // bytes requested (with direct I/O: aligned, may run past end of file)
  uint64_t needed = 0;  // bytes that must arrive (the rest may lie past end of file)
};

// A read of the `bytes` at `offset` into `dst`: as asked, or, for a file opened with O_DIRECT,
// widened to whole blocks of kDirectIoAlignment (dst then receives the first block's start, which
// may lie before `offset`, and the file may end inside the last block).
ReadRange file_read_range(int fd, uint64_t offset, uint64_t bytes, void* dst, bool direct);

class BatchReader {
 public:
  virtual ~BatchReader() = default;
  // Never null: falls back to the pread reader when io_uring is unavailable. Keeps at most
  // `max_reads` reads in flight.
  static std::unique_ptr<BatchReader> create(unsigned max_reads);
  virtual const char* name() const = 0;
  // Reads every range; `on_done(i)` runs (on this thread) as range i completes. Ranges start in
  // order, each once fewer than max_reads are in flight and its bytes fit beside theirs within
  // `max_bytes_in_flight` (a range always starts when none is in flight): a device that shares its
  // bandwidth among the reads in flight then lands the first ones early instead of all of them
  // together at the end. Returns MOELITE_ERR_IO with a message naming the failing offset; `read`
  // receives bytes read.
  Status read_all(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done, uint64_t* read,
                  uint64_t max_bytes_in_flight = UINT64_MAX) {
    return read_ranges(ranges, on_done, read, max_bytes_in_flight);
  }

 protected:
  virtual Status read_ranges(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done,
                             uint64_t* read, uint64_t max_bytes_in_flight) = 0;
};

}  // namespace moelite::platform
