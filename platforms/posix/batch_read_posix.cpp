#include "platforms/batch_read.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cinttypes>

#if MOELITE_HAVE_URING
#include <liburing.h>
#endif

namespace moelite::platform {

namespace {

// Finishes range `r` from `done` bytes on with pread (also the whole fallback path).
Status pread_rest(const ReadRange& r, uint64_t done, uint64_t* total) {
  while (done < r.needed) {
    ssize_t got = ::pread(r.fd, static_cast<uint8_t*>(r.dst) + done, static_cast<size_t>(r.len - done),
                          static_cast<off_t>(r.offset + done));
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
  Status read_all(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done,
                  uint64_t* read) override {
    *read = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      MOELITE_TRY(pread_rest(ranges[i], 0, read));
      on_done(i);
    }
    return MOELITE_OK;
  }
};

#if MOELITE_HAVE_URING
class UringReader final : public BatchReader {
 public:
  ~UringReader() override { io_uring_queue_exit(&ring_); }
  bool init(unsigned depth) { return io_uring_queue_init(depth, &ring_, 0) == 0; }
  const char* name() const override { return "io_uring"; }

  Status read_all(const std::vector<ReadRange>& ranges, const std::function<void(size_t)>& on_done,
                  uint64_t* read) override {
    *read = 0;
    size_t submitted = 0, completed = 0;
    Status status = MOELITE_OK;
    while (completed < ranges.size()) {
      // Keep as many ranges in flight as the ring holds.
      while (submitted < ranges.size()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;
        const ReadRange& r = ranges[submitted];
        io_uring_prep_read(sqe, r.fd, r.dst, static_cast<unsigned>(r.len), r.offset);
        io_uring_sqe_set_data64(sqe, submitted);
        ++submitted;
      }
      io_uring_submit(&ring_);
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) return fail(MOELITE_ERR_IO, "io_uring wait failed: %s", strerror(-rc));
      const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      ++completed;
      const ReadRange& r = ranges[i];
      // Short reads (and errors, to get errno's message) finish synchronously.
      Status st = res >= 0 && static_cast<uint64_t>(res) >= r.needed
                      ? (*read += static_cast<uint64_t>(res), MOELITE_OK)
                      : pread_rest(r, res > 0 ? static_cast<uint64_t>(res) : 0, read);
      if (st != MOELITE_OK && status == MOELITE_OK) status = st;  // keep draining the ring
      if (st == MOELITE_OK) on_done(i);
    }
    return status;
  }

 private:
  io_uring ring_{};
};
#endif

}  // namespace

std::unique_ptr<BatchReader> BatchReader::create(unsigned queue_depth) {
  // MOELITE_IO=pread forces the fallback (tests, comparisons).
  const char* forced = getenv("MOELITE_IO");
  if (forced && strcmp(forced, "pread") == 0) return std::make_unique<PreadReader>();
#if MOELITE_HAVE_URING
  auto r = std::make_unique<UringReader>();
  if (r->init(queue_depth)) return r;  // else: kernel or sandbox without io_uring
#endif
  (void)queue_depth;
  return std::make_unique<PreadReader>();
}

}  // namespace moelite::platform
