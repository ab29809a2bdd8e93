// Reading several byte ranges of a file at once: io_uring where the build has liburing and the
// kernel allows it (all ranges in flight together), plain pread one after another otherwise.
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
  // Never null: falls back to the pread reader when io_uring is unavailable.
  static std::unique_ptr<BatchReader> create(unsigned queue_depth);
  virtual const char* name() const = 0;
  // Reads every range; `on_done(i)` runs (on this thread) as range i completes. Returns
  // MOELITE_ERR_IO with a message naming the failing offset; `read` receives bytes read.
  virtual Status read_all(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done,
                          uint64_t* read) = 0;
};

}  // namespace moelite::platform
