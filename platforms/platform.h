// The operating-system layer: files, mappings, CPU facts, clocks and memory readings. Core and
// backends call only this; each OS has one implementation directory (posix/ for Linux, Android,
// macOS), so the rest of the code is free of #ifdefs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include "base/status.h"

namespace moelite::platform {

// A read-only file. Moveable, closes on destruction.
class File {
 public:
  File() = default;
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // MOELITE_ERR_FILE_NOT_FOUND when the path is missing or unreadable, MOELITE_ERR_IO otherwise.
  static Status open(const std::string& path, File* out);
  // The same file opened for direct I/O (bypassing the page cache): reads must then use
  // offsets, sizes and buffers aligned to kDirectIoAlignment. MOELITE_ERR_NOT_IMPLEMENTED when
  // the file system refuses O_DIRECT (tmpfs, some overlay file systems).
  static Status open_direct(const std::string& path, File* out);
  bool is_direct() const { return direct_; }
  // Asks the OS to drop its cached copy of a byte range (after a buffered read of data that
  // must not stay resident behind the memory budget's back).
  void drop_cache(uint64_t offset, uint64_t n) const;
  bool is_open() const { return fd_ >= 0; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly n bytes at offset (retrying short reads); MOELITE_ERR_IO on error or EOF.
  Status read_at(uint64_t offset, void* dst, uint64_t n) const;
  int native_handle() const { return fd_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
  bool direct_ = false;
};

// Writes `pieces` one after another to `path`, the one rule for every file moelite writes (saved
// sessions, timelines, calibration profiles):
//  - a regular file (or a new one) is replaced atomically: the pieces go into a temporary file
//    beside it, flushed to storage, renamed over it; a reader never sees a partial file, and on any
//    failure the temporary file is removed and the old file is as it was. The new file keeps the
//    old one's permission bits and owner (a 0600 session stays 0600); a new one is 0666 less the
//    umask;
//  - a symbolic link is followed: its target is replaced (the link stays a link);
//  - a special file (a character device such as /dev/stdout or /dev/null, a FIFO, a socket) is
//    written into, never replaced: a FIFO without a reader is MOELITE_ERR_IO at once, not a hang;
//  - a directory is MOELITE_ERR_IO.
// Temporary files left by a process that died while writing this same path (`PATH.tmp-PID-N`
// whose PID no longer runs) are removed first. MOELITE_ERR_IO with the reason.
struct WritePiece {
  const void* data;
  size_t size;
};
Status write_file_atomic(const std::string& path, const WritePiece* pieces, size_t n_pieces);
// write_file_atomic for a file too large to hold in memory (a packed expert file): `produce` writes
// its bytes in order through `write`. Regular files only (anything else is MOELITE_ERR_IO, never
// replaced); `size` bytes are reserved first where the file system can, so a disk too small fails
// before gigabytes are written. A failure of `produce` (its status) or of a write removes the
// temporary file and leaves the old file as it was.
using WriteFn = std::function<Status(const void* data, size_t size)>;
Status write_large_file_atomic(const std::string& path, uint64_t size,
                               const std::function<Status(const WriteFn& write)>& produce);
// write_file_atomic's whole rule for output produced as it comes, of a size not known beforehand
// (`moelite batch -o`): a regular file is replaced once `produce`
// succeeds (on its failure, or a write's, the old file stays as it was and the temporary goes); a
// special file (a FIFO, /dev/stdout into a pipe, a device) is written into as `produce` writes, so
// a reader there sees each piece at once.
Status write_streamed_file(const std::string& path, const std::function<Status(const WriteFn& write)>& produce);
// Whether anything (a file, a link, a directory) is at `path`.
bool path_exists(const std::string& path);
// Whether `a` and `b` name the same file (after links); false when either is missing.
bool same_file(const std::string& a, const std::string& b);
// Whether write_file_atomic(path, ...) could write, by the same rule, writing nothing: a timeline
// checks its path when it starts, so the run's trace is not lost at its end. A FIFO is not even
// opened (its reader would see the end of its stream when this closed it).
Status check_writable(const std::string& path);

// Appends the whole of a small file (a profile, a trace) to *out. `what` names it in messages
// ("calibration profile"): MOELITE_ERR_FILE_NOT_FOUND when it cannot be opened, MOELITE_ERR_IO
// when a read fails, MOELITE_ERR_INVALID_ARGUMENT when it holds more than max_bytes.
Status read_whole_file(const std::string& path, const char* what, uint64_t max_bytes, std::string* out);

// Alignment of offsets, sizes and buffers for direct I/O (the common logical block size bound).
constexpr uint64_t kDirectIoAlignment = 4096;

// A read-only mapping of a whole file.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  static Status map(const File& file, Mapping* out);
  // Takes the whole pages inside [p, p + n), a range of some Mapping, out of the process's
  // resident set (a backend that keeps its own copy of those bytes): they stay valid and are read
  // back from the file on the next touch. Never for memory that is not a file mapping (anonymous
  // memory would read back as zeros). Best effort: nothing happens where the OS cannot do it.
  static void release_pages(const void* p, uint64_t n);
  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  uint64_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
  // AVX-VNNI: the VEX (256-bit) vpdpbusd of CPUs with or without AVX-512 (Alder Lake and later
  // Intel client cores, AMD Zen 5); set only where AVX2 is usable too.
  bool avxvnni = false;
  // Intel AMX with int8 tiles (AMX-TILE + AMX-INT8): true only where the CPU has them, the OS
  // saves the tile state (XCR0 bits 17-18) and, on Linux, granted this process the tile data
  // (arch_prctl ARCH_REQ_XCOMP_PERM, requested once when the features are first read).
  bool amx_int8 = false;
  // AArch64: neon always; dotprod (SDOT, ARMv8.2) and i8mm (SMMLA, ARMv8.6) read from the
  // kernel's hwcaps at run time on Linux.
  bool neon = false, dotprod = false, i8mm = false;
};
const CpuFeatures& cpu_features();

int physical_core_count();     // >= 1
uint64_t current_rss_bytes();  // 0 if unknown
uint64_t peak_rss_bytes();     // 0 if unknown
double now_seconds();          // monotonic

// Memory aligned to `alignment` (a power of two) for SIMD and direct I/O; nullptr on failure.
void* aligned_alloc_bytes(size_t size, size_t alignment);
void aligned_free(void* p);
// Asks the OS to back the whole huge pages inside [p, p + n) of anonymous memory with huge pages
// (Linux: transparent huge pages, madvise MADV_HUGEPAGE; 2 MiB on x86-64), so that streaming
// through the range misses the TLB once per huge page rather than once per 4 KiB. Bytes outside
// that interior keep small pages, so the memory the process holds never grows past the range.
// Returns whether the OS took the advice; a hint only: nothing changes where it is refused.
bool advise_huge_pages(void* p, size_t n);
// Owns `size` bytes from aligned_alloc_bytes (a scratch buffer freed on every way out); bytes() is
// null when the allocation failed.
class AlignedBytes {
 public:
  AlignedBytes(size_t size, size_t alignment) : p_(static_cast<uint8_t*>(aligned_alloc_bytes(size, alignment))) {}
  ~AlignedBytes() { aligned_free(p_); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  uint8_t* bytes() const { return p_; }

 private:
  uint8_t* p_;
};

}  // namespace moelite::platform
