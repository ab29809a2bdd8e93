#include "base/options.h"
#include "base/status.h"
#include "platforms/batch_read.h"
#include "platforms/platform.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>

#include "platforms/fault_inject.h"

#if MOELITE_HAVE_URING
#include <liburing.h>
#endif

namespace moelite::platform {

ReadRange file_read_range(int fd, uint64_t offset, uint64_t bytes, void* dst, bool direct) {
  uint64_t begin = offset, end = offset + bytes;
  if (direct) {
    begin = begin / kDirectIoAlignment * kDirectIoAlignment;
    end = (end + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  }
  return {fd, begin, dst, end - begin, offset + bytes - begin};
}

namespace {

// pread into `dst` through a bounce buffer of plain host memory: for destinations the kernel
// cannot pin for a read (EFAULT), such as a device's memory mapped through its PCIe BAR or some
// drivers' mappings of an integrated GPU's memory, which a backend may give the store as slots.
// Page-aligned, so it also suits a file opened with O_DIRECT.
ssize_t pread_bounced(int fd, void* dst, size_t len, off_t offset) {
  constexpr size_t kPage = 4096;
  void* bounce = aligned_alloc(kPage, (len + kPage - 1) / kPage * kPage);
  if (!bounce) {
    errno = ENOMEM;
    return -1;
  }
  const ssize_t got = ::pread(fd, bounce, len, offset);  // EINTR: the caller's loop retries
  if (got > 0) memcpy(dst, bounce, static_cast<size_t>(got));
  const int err = errno;
  free(bounce);
  errno = err;
  return got;
}

// Finishes range `r` from `done` bytes on with pread (also the whole fallback path).
Status pread_rest(const ReadRange& r, uint64_t done, uint64_t* total) {
  if (done < r.needed && fault::should_fail(fault::Kind::kRead))
    return fail(MOELITE_ERR_IO, "read at offset %" PRIu64 " failed: injected fault (read)", r.offset + done);
  while (done < r.needed) {
    uint8_t* dst = static_cast<uint8_t*>(r.dst) + done;
    const size_t len = static_cast<size_t>(r.len - done);
    ssize_t got;
    if (fault::should_fail(fault::Kind::kReadEfault)) {
      got = -1;
      errno = EFAULT;
    } else {
      got = ::pread(r.fd, dst, len, static_cast<off_t>(r.offset + done));
    }
    if (got < 0 && errno == EFAULT) got = pread_bounced(r.fd, dst, len, static_cast<off_t>(r.offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return fail(MOELITE_ERR_IO, "read at offset %" PRIu64 " failed: %s", r.offset + done,
                  got < 0 ? strerror(errno) : "unexpected end of file");
    done += static_cast<uint64_t>(got);
  }
  *total += done;
  return MOELITE_OK;
}

class PreadReader final : public BatchReader {
 public:
  const char* name() const override { return "pread"; }

 protected:
  Status read_ranges(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done, uint64_t* read,
                     uint64_t /*max_bytes_in_flight: one at a time*/) override {
    *read = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      MOELITE_TRY(pread_rest(ranges[i], 0, read));
      on_done(i);
    }
    return MOELITE_OK;
  }
};

#if MOELITE_HAVE_URING
// Invariant on every return: no read this call submitted is still in flight, so the caller may
// reuse (or free) the destination buffers at once. Submission errors end the call after the
// reads already submitted have completed; the ring is then rebuilt, since reads that were queued
// but never submitted still sit in its submission queue.
class UringReader final : public BatchReader {
 public:
  ~UringReader() override {
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }
  bool init(unsigned depth) {
    depth_ = std::max(1u, depth);
    ring_ok_ = io_uring_queue_init(ring_entries(), &ring_, 0) == 0;
    return ring_ok_;
  }
  const char* name() const override { return "io_uring"; }

 protected:
  Status read_ranges(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done, uint64_t* read,
                     uint64_t max_bytes) override {
    *read = 0;
    if (!ring_ok_ && !rebuild()) return read_with_pread(ranges, on_done, read);
    size_t prepared = 0;     // ranges given a submission-queue entry
    size_t unsubmitted = 0;  // of those, entries the kernel has not taken yet
    size_t in_flight = 0, completed = 0;
    uint64_t bytes_in_flight = 0;  // of the prepared ranges not completed yet
    int busy_retries = 0;
    Status status = MOELITE_OK;
    while (completed < prepared || (status == MOELITE_OK && completed < ranges.size())) {
      if (status == MOELITE_OK) {
        // Within the caps, in order (batch_read.h says why).
        while (prepared < ranges.size() && in_flight + unsubmitted < depth_ &&
               (in_flight + unsubmitted == 0 || bytes_in_flight + ranges[prepared].len <= max_bytes)) {
          io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
          if (!sqe) break;
          const ReadRange& r = ranges[prepared];
          io_uring_prep_read(sqe, r.fd, r.dst, static_cast<unsigned>(r.len), r.offset);
          io_uring_sqe_set_data64(sqe, prepared);
          bytes_in_flight += r.len;
          ++prepared;
          ++unsubmitted;
        }
        if (unsubmitted > 0) {
          const bool injected = fault::should_fail(fault::Kind::kUringSubmit);
          const int rc = injected                                      ? -EIO
                         : fault::should_fail(fault::Kind::kUringBusy) ? -EAGAIN
                                                                       : io_uring_submit(&ring_);
          if (rc > 0) {
            unsubmitted -= std::min(unsubmitted, static_cast<size_t>(rc));
            in_flight += static_cast<size_t>(rc);
            busy_retries = 0;
          } else if (rc == -EAGAIN || rc == -EBUSY || rc == -EINTR || rc == 0) {
            // The kernel is short of resources (or completions must be reaped first): reap if
            // anything is in flight, else back off briefly and retry, for a bounded time.
            if (in_flight == 0) {
              if (++busy_retries > kMaxBusyRetries) {
                status = fail(MOELITE_ERR_IO, "io_uring submission kept failing: %s", strerror(rc < 0 ? -rc : EAGAIN));
              } else {
                usleep(1000);
              }
              continue;
            }
          } else {
            status = injected ? fail(MOELITE_ERR_IO, "io_uring submission failed: injected fault (uring_submit)")
                              : fail(MOELITE_ERR_IO, "io_uring submission failed: %s", strerror(-rc));
          }
        }
      }
      if (in_flight == 0) break;  // nothing to reap: done, or failed before anything was submitted
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) {
        // Reads are in flight into the caller's buffers: never return before they complete.
        if (status == MOELITE_OK) status = fail(MOELITE_ERR_IO, "io_uring wait failed: %s", strerror(-rc));
        usleep(1000);
        continue;
      }
      const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      bytes_in_flight -= ranges[i].len;
      ++completed;
      const bool injected = fault::should_fail(fault::Kind::kUringComplete);
      if (fault::should_fail(fault::Kind::kReadEfault)) res = -EFAULT;
      if (status != MOELITE_OK) continue;  // draining after a failure
      const ReadRange& r = ranges[i];
      Status st;
      if (injected) {
        st = fail(MOELITE_ERR_IO, "io_uring read at offset %" PRIu64 " failed: injected fault (uring_complete)",
                  r.offset);
      } else if (res >= 0 && static_cast<uint64_t>(res) >= r.needed) {
        *read += static_cast<uint64_t>(res);
        st = MOELITE_OK;
      } else {
        // Short reads (and errors, to get errno's message) finish synchronously.
        st = pread_rest(r, res > 0 ? static_cast<uint64_t>(res) : 0, read);
      }
      if (st == MOELITE_OK)
        on_done(i);
      else
        status = st;  // keep draining the ring
    }
    if (unsubmitted > 0) {
      // Entries the kernel never took would be submitted by the next call, into buffers that may
      // be reused by then: drop the ring and start a fresh one next time.
      io_uring_queue_exit(&ring_);
      ring_ok_ = false;
    }
    return status;
  }

 private:
  static constexpr int kMaxBusyRetries = 1000;  // ~1 s of 1 ms back-offs with nothing in flight
  // The ring is not the cap (depth_ is): its entries leave it at submission, not at completion.
  unsigned ring_entries() const { return std::max(depth_, 8u); }
  bool rebuild() {
    ring_ok_ = io_uring_queue_init(ring_entries(), &ring_, 0) == 0;
    return ring_ok_;
  }
  static Status read_with_pread(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done,
                                uint64_t* read) {
    for (size_t i = 0; i < ranges.size(); ++i) {
      MOELITE_TRY(pread_rest(ranges[i], 0, read));
      on_done(i);
    }
    return MOELITE_OK;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  unsigned depth_ = 8;
};
#endif

}  // namespace

std::unique_ptr<BatchReader> BatchReader::create(unsigned max_reads) {
  // MOELITE_IO=pread forces the fallback (tests, comparisons); so does valgrind, unless MOELITE_IO
  // asks for io_uring: memcheck cannot see the kernel fill io_uring's buffers, so each expert read
  // through it would be reported as uninitialised memory (millions of false errors).
  const char* forced = option_text(Option::Io);
  if (forced && strcmp(forced, "pread") == 0) return std::make_unique<PreadReader>();
  if (!forced && running_under_valgrind()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log_msg(MOELITE_LOG_INFO, "under valgrind: expert reads use pread, not io_uring (MOELITE_IO=io_uring keeps it)");
    return std::make_unique<PreadReader>();
  }
#if MOELITE_HAVE_URING
  auto r = std::make_unique<UringReader>();
  if (r->init(max_reads)) return r;  // else: kernel or sandbox without io_uring
#endif
  (void)max_reads;
  return std::make_unique<PreadReader>();
}

}  // namespace moelite::platform
