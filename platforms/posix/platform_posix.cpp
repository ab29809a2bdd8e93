#include "platforms/platform.h"

#include "platforms/fault_inject.h"

#include <functional>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
// Values from the Linux uapi (arch/arm64/include/uapi/asm/hwcap.h), for older C libraries.
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#endif

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <set>
#include <utility>

namespace moelite::platform {

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}
File::File(File&& o) noexcept : fd_(o.fd_), size_(o.size_), path_(std::move(o.path_)), direct_(o.direct_) {
  o.fd_ = -1;
}
File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    direct_ = o.direct_;
    o.fd_ = -1;
  }
  return *this;
}

Status File::open_direct(const std::string& path, File* out) {
#if defined(O_DIRECT)
  File f;
  MOELITE_TRY(open(path, &f));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0)
    return fail(MOELITE_ERR_NOT_IMPLEMENTED, "direct I/O on '%s' is not available: %s", path.c_str(), strerror(errno));
  ::close(f.fd_);
  f.fd_ = fd;
  f.direct_ = true;
  *out = std::move(f);
  return MOELITE_OK;
#else
  return fail(MOELITE_ERR_NOT_IMPLEMENTED, "direct I/O is not available on this platform");
#endif
}

void File::drop_cache(uint64_t offset, uint64_t n) const {
#if defined(POSIX_FADV_DONTNEED)
  posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
#endif
}

Status File::open(const std::string& path, File* out) {
  if (fault::should_fail(fault::Kind::kOpen))
    return fail(MOELITE_ERR_IO, "cannot open '%s': injected fault (open)", path.c_str());
  // Non-blocking: a FIFO at the path opens at once (and is refused below) instead of waiting for
  // a writer for ever.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    Status st = (e == ENOENT || e == ENOTDIR || e == EACCES) ? MOELITE_ERR_FILE_NOT_FOUND : MOELITE_ERR_IO;
    return fail(st, "cannot open '%s': %s", path.c_str(), strerror(e));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    ::close(fd);
    return fail(MOELITE_ERR_IO, "cannot stat '%s': %s", path.c_str(), strerror(e));
  }
  if (S_ISDIR(sb.st_mode)) {
    ::close(fd);
    return fail(MOELITE_ERR_FILE_NOT_FOUND, "'%s' is a directory, not a model file", path.c_str());
  }
  if (!S_ISREG(sb.st_mode)) {  // a FIFO, a device (/dev/zero), a socket: no size, no mapping
    ::close(fd);
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "'%s' is not a regular file (%s)", path.c_str(),
                S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISCHR(sb.st_mode) ? "a character device"
                : S_ISBLK(sb.st_mode) ? "a block device" : "a socket");
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  File f;
  f.fd_ = fd;
  f.size_ = static_cast<uint64_t>(sb.st_size);
  f.path_ = path;
  *out = std::move(f);
  return MOELITE_OK;
}

Status read_whole_file(const std::string& path, const char* what, uint64_t max_bytes, std::string* out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return fail(MOELITE_ERR_FILE_NOT_FOUND, "cannot open %s '%s': %s", what, path.c_str(), strerror(errno));
  char buf[65536];
  size_t got;
  uint64_t read = 0;
  bool too_large = false;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
    if (read + got > max_bytes) {
      too_large = true;
      break;
    }
    out->append(buf, got);
    read += got;
  }
  const bool err = ferror(f);
  fclose(f);
  if (err) return fail(MOELITE_ERR_IO, "reading '%s' failed", path.c_str());
  if (too_large)
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "%s '%s' is larger than %llu bytes", what, path.c_str(),
                (unsigned long long)max_bytes);
  return MOELITE_OK;
}

namespace {

// Writes every piece to fd: 0 or the errno of the first failure.
int write_pieces(int fd, const WritePiece* pieces, size_t n_pieces) {
  for (size_t i = 0; i < n_pieces; ++i) {
    const char* p = static_cast<const char*>(pieces[i].data);
    for (size_t left = pieces[i].size; left > 0;) {
      const ssize_t got = ::write(fd, p, left);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return got < 0 ? errno : EIO;
      p += got;
      left -= static_cast<size_t>(got);
    }
  }
  return 0;
}

// The file a write to `path` lands in: `path`, or the end of its chain of symbolic links (relative
// links resolved from their own directory). False when the chain is too long (a loop).
bool follow_links(const std::string& path, std::string* out) {
  std::string at = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat sb;
    if (::lstat(at.c_str(), &sb) != 0 || !S_ISLNK(sb.st_mode)) {
      *out = at;
      return true;
    }
    char buf[4096];
    const ssize_t n = ::readlink(at.c_str(), buf, sizeof buf - 1);
    if (n < 0) {
      *out = at;
      return true;
    }
    buf[n] = 0;
    if (buf[0] == '/') {
      at = buf;
    } else {
      const size_t slash = at.rfind('/');
      at = (slash == std::string::npos ? std::string() : at.substr(0, slash + 1)) + buf;
    }
  }
  return false;
}

// Removes `target.tmp-PID-N` files whose writer PID no longer runs (a write killed half way).
void remove_stale_temporaries(const std::string& target) {
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash == 0 ? 1 : slash);
  const std::string prefix = (slash == std::string::npos ? target : target.substr(slash + 1)) + ".tmp-";
  // Closed on every way out: the strings below may throw (out of memory) between opendir and closedir.
  std::unique_ptr<DIR, int (*)(DIR*)> dir_handle(::opendir(dir.c_str()), ::closedir);
  DIR* d = dir_handle.get();
  if (!d) return;
  auto digits = [](const char* c) {
    if (!*c) return false;
    for (; *c; ++c)
      if (*c < '0' || *c > '9') return false;
    return true;
  };
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const char* rest = name.c_str() + prefix.size();
    char* end = nullptr;
    const long pid = std::strtol(rest, &end, 10);
    if (end == rest || *end != '-' || pid <= 0 || !digits(end + 1) || pid == static_cast<long>(getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) (void)::unlinkat(dirfd(d), name.c_str(), 0);
  }
}

// Writes into an existing special file (a device, a FIFO, a socket) instead of replacing it:
// `produce` writes through the descriptor and returns an errno (0: done) or, with *status set, -1
// for a failure of its own (its message stands).
Status write_into_special(const std::string& path, const std::string& target, mode_t type,
                          const std::function<int(int fd, Status* status)>& produce) {
  // A FIFO opens without blocking: no reader is an error (ENXIO) instead of a wait for ever.
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | (S_ISFIFO(type) ? O_NONBLOCK : 0));
  if (fd < 0)
    return fail(MOELITE_ERR_IO, "cannot write '%s': %s", path.c_str(),
                errno == ENXIO ? "a FIFO with no reader" : strerror(errno));
  if (S_ISFIFO(type)) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // a reader is there: block as pipes do
  }
  Status own = MOELITE_OK;
  int err = produce(fd, &own);
  if (::close(fd) != 0 && !err) err = errno;
  if (err < 0) return own;
  if (err) return fail(MOELITE_ERR_IO, "writing '%s' failed: %s", path.c_str(), strerror(err));
  return MOELITE_OK;
}

// Where a write to `path` lands (write_file_atomic's rule): the end of its chain of links, and what
// is there now (*exists false: nothing yet). MOELITE_ERR_IO for a loop of links or a directory.
Status resolve_output(const std::string& path, std::string* target, struct stat* now, bool* exists) {
  // A special file reached through a link is written through the path itself: the kernel follows
  // links readlink cannot spell (/dev/stdout -> /proc/self/fd/1 -> "pipe:[N]" for a pipe).
  if (::stat(path.c_str(), now) == 0 && !S_ISREG(now->st_mode) && !S_ISDIR(now->st_mode)) {
    *target = path;
    *exists = true;
    return MOELITE_OK;
  }
  if (!follow_links(path, target))
    return fail(MOELITE_ERR_IO, "cannot write '%s': too many levels of symbolic links", path.c_str());
  *exists = ::stat(target->c_str(), now) == 0;
  if (*exists && S_ISDIR(now->st_mode)) return fail(MOELITE_ERR_IO, "cannot write '%s': it is a directory", path.c_str());
  return MOELITE_OK;
}

// A temporary file's name beside `target`, of this process and call: two writers of one path never
// share one, and remove_stale_temporaries recognises it once its process is gone.
std::string temporary_path(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  return target + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

}  // namespace

namespace {

// The regular-file half of write_file_atomic's rule: `produce` writes the bytes into a temporary
// file beside `target`, which is flushed and renamed over it (keeping an old file's owner and
// mode). `reserve` bytes are allocated first where the file system can (posix_fallocate), so a disk
// too small fails before anything is written. `produce` returns an errno (0: done) or, with
// *status set, -1 for a failure of its own (its message stands).
Status replace_regular_file(const std::string& path, const std::string& target, const struct stat& old, bool exists,
                            uint64_t reserve, const std::function<int(int fd, Status* status)>& produce) {
  remove_stale_temporaries(target);
  const std::string tmp = temporary_path(target);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, exists ? 0600 : 0666);
  if (fd < 0) return fail(MOELITE_ERR_IO, "cannot write '%s': %s", tmp.c_str(), strerror(errno));
  int err = 0;
  if (reserve > 0) {
    const int r = ::posix_fallocate(fd, 0, static_cast<off_t>(reserve));
    if (r != 0 && r != EOPNOTSUPP && r != EINVAL) err = r;  // EOPNOTSUPP/EINVAL: not supported there
  }
  Status own = MOELITE_OK;
  if (!err) err = produce(fd, &own);
  if (!err && exists) {
    // The replaced file's owner and permission bits (owner first: a chown may clear set-id bits).
    // Only the superuser may give a file away; anyone else keeps their own, as a copy would.
    if (::fchown(fd, old.st_uid, old.st_gid) != 0 && errno != EPERM) err = errno;
    if (!err && ::fchmod(fd, old.st_mode & 07777) != 0) err = errno;
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (!err && ::rename(tmp.c_str(), target.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    if (err < 0) return own;
    return fail(MOELITE_ERR_IO, "writing '%s' failed: %s", path.c_str(), strerror(err));
  }
  return MOELITE_OK;
}

}  // namespace

Status write_file_atomic(const std::string& path, const WritePiece* pieces, size_t n_pieces) {
  std::string target;
  struct stat old;
  bool exists = false;
  MOELITE_TRY(resolve_output(path, &target, &old, &exists));
  const auto pieces_into = [&](int fd, Status*) { return write_pieces(fd, pieces, n_pieces); };
  if (exists && !S_ISREG(old.st_mode)) return write_into_special(path, target, old.st_mode, pieces_into);
  return replace_regular_file(path, target, old, exists, 0, pieces_into);
}

namespace {

// produce's writes as write_pieces to `fd`; a fault injected as `write` fails them with ENOSPC.
int produce_into(int fd, const std::string& path, const std::function<Status(const WriteFn& write)>& produce,
                 Status* status) {
  int err = 0;
  const WriteFn write = [&](const void* data, size_t n) -> Status {
    const WritePiece piece{data, n};
    if (fault::should_fail(fault::Kind::kWrite)) err = ENOSPC;
    if (!err) err = write_pieces(fd, &piece, 1);
    if (err) return fail(MOELITE_ERR_IO, "writing '%s' failed: %s", path.c_str(), strerror(err));
    return MOELITE_OK;
  };
  *status = produce(write);
  return *status == MOELITE_OK ? 0 : -1;
}

}  // namespace

Status write_large_file_atomic(const std::string& path, uint64_t size,
                               const std::function<Status(const WriteFn& write)>& produce) {
  std::string target;
  struct stat old;
  bool exists = false;
  MOELITE_TRY(resolve_output(path, &target, &old, &exists));
  if (exists && !S_ISREG(old.st_mode))
    return fail(MOELITE_ERR_IO, "cannot write '%s': it is not a regular file", path.c_str());
  return replace_regular_file(path, target, old, exists, size,
                              [&](int fd, Status* status) { return produce_into(fd, path, produce, status); });
}

Status write_streamed_file(const std::string& path, const std::function<Status(const WriteFn& write)>& produce) {
  std::string target;
  struct stat old;
  bool exists = false;
  MOELITE_TRY(resolve_output(path, &target, &old, &exists));
  const auto into = [&](int fd, Status* status) { return produce_into(fd, path, produce, status); };
  if (exists && !S_ISREG(old.st_mode)) return write_into_special(path, target, old.st_mode, into);
  return replace_regular_file(path, target, old, exists, 0, into);
}

bool path_exists(const std::string& path) {
  struct stat sb;
  return ::lstat(path.c_str(), &sb) == 0;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

Status check_writable(const std::string& path) {
  std::string target;
  struct stat old;
  bool exists = false;
  MOELITE_TRY(resolve_output(path, &target, &old, &exists));
  if (exists && S_ISFIFO(old.st_mode)) return MOELITE_OK;
  if (exists && !S_ISREG(old.st_mode)) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(MOELITE_ERR_IO, "cannot write '%s': %s", path.c_str(), strerror(errno));
    ::close(fd);
    return MOELITE_OK;
  }
  // A regular file is replaced by a rename in its directory: a temporary file there must be possible.
  const std::string tmp = temporary_path(target);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return fail(MOELITE_ERR_IO, "cannot write '%s': %s", path.c_str(), strerror(errno));
  ::close(fd);
  ::unlink(tmp.c_str());
  return MOELITE_OK;
}

Status File::read_at(uint64_t offset, void* dst, uint64_t n) const {
  uint8_t* p = static_cast<uint8_t*>(dst);
  if (n > 0 && fault::should_fail(fault::Kind::kRead))
    return fail(MOELITE_ERR_IO, "read of '%s' at offset %llu failed: injected fault (read)", path_.c_str(),
                (unsigned long long)offset);
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : static_cast<size_t>(n);
    ssize_t got = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return fail(MOELITE_ERR_IO, "read of '%s' at offset %llu failed: %s", path_.c_str(), (unsigned long long)offset,
                  strerror(errno));
    }
    if (got == 0)
      return fail(MOELITE_ERR_IO, "read of '%s' at offset %llu hit end of file", path_.c_str(),
                  (unsigned long long)offset);
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return MOELITE_OK;
}

Mapping::~Mapping() {
  if (addr_) munmap(addr_, size_);
}
Mapping::Mapping(Mapping&& o) noexcept : addr_(o.addr_), size_(o.size_) { o.addr_ = nullptr; }
Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (addr_) munmap(addr_, size_);
    addr_ = o.addr_;
    size_ = o.size_;
    o.addr_ = nullptr;
  }
  return *this;
}

Status Mapping::map(const File& file, Mapping* out) {
  if (file.size() == 0) return fail(MOELITE_ERR_IO, "cannot map empty file '%s'", file.path().c_str());
  if (fault::should_fail(fault::Kind::kMmap))
    return fail(MOELITE_ERR_IO, "mmap of '%s' failed: injected fault (mmap)", file.path().c_str());
  void* addr = mmap(nullptr, file.size(), PROT_READ, MAP_SHARED, file.native_handle(), 0);
  if (addr == MAP_FAILED) return fail(MOELITE_ERR_IO, "mmap of '%s' failed: %s", file.path().c_str(), strerror(errno));
  Mapping m;
  m.addr_ = addr;
  m.size_ = file.size();
  *out = std::move(m);
  return MOELITE_OK;
}

void Mapping::release_pages(const void* p, uint64_t n) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = (reinterpret_cast<uint64_t>(p) + page - 1) / page * page;
  const uint64_t end = (reinterpret_cast<uint64_t>(p) + n) / page * page;
  // MADV_DONTNEED on a shared file mapping only unmaps: the page cache keeps the file's pages, and
  // a later read faults them in again.
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

#if defined(__x86_64__)
namespace {
// AMX-TILE (CPUID.(7,0):EDX bit 24) and AMX-INT8 (bit 25), the tile state enabled by the OS in
// XCR0 (bits 17 XTILECFG and 18 XTILEDATA), and on Linux the per-process permission for the
// tile data (5.16 and later refuse a tile instruction with SIGILL until it is granted). The grant
// is process-wide and permanent, so asking once here, before any table is picked, covers every
// thread; a refusal (older kernel, seccomp) leaves AMX off, never an error.
bool amx_int8_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx >> 24 & 1u) || !(edx >> 25 & 1u)) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx >> 27 & 1u)) return false;  // OSXSAVE
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}
}  // namespace
#endif

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = true;  // every AVX2 CPU has F16C; checked through avx2 below
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512vnni = __builtin_cpu_supports("avx512vnni");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
    // CPUID.(EAX=7, ECX=1):EAX bit 4. Read directly: GCC 12's __builtin_cpu_supports("avxvnni")
    // compiles but answers 0 on CPUs that have it (seen on Zen 5). The YMM state it needs is the
    // OS support avx2 was checked for.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    f.avxvnni = f.avx2 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 4 & 1u);
#if defined(__x86_64__)
    f.amx_int8 = f.avx512f && amx_int8_usable();
#endif
#elif defined(__aarch64__)
    f.neon = true;
#if defined(__linux__)
    // What the running CPU has (the kernel's view), not what the compiler targeted: the
    // dotprod and i8mm tables are compiled in regardless and must only be picked where they run.
    const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    f.dotprod = (hwcap & HWCAP_ASIMDDP) != 0;
    f.i8mm = (hwcap2 & HWCAP2_I8MM) != 0;
#else
    // Elsewhere only what the build targets is known to be there.
#if defined(__ARM_FEATURE_DOTPROD)
    f.dotprod = true;
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8)
    f.i8mm = true;
#endif
#endif
#endif
    return f;
  }();
  return features;
}

int physical_core_count() {
  // Count distinct (package, core) pairs: SMT siblings share a core and do not add bandwidth.
  std::set<std::pair<int, int>> cores;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  for (long cpu = 0; cpu < n; ++cpu) {
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
    int p = -1, c = -1;
    if (!(pkg >> p) || !(core >> c)) return n > 0 ? static_cast<int>(n) : 1;
    cores.insert({p, c});
  }
  if (cores.empty()) return n > 0 ? static_cast<int>(n) : 1;
  return static_cast<int>(cores.size());
}

static uint64_t read_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t klen = strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0) return strtoull(line.c_str() + klen, nullptr, 10) * 1024;
  }
  return 0;
}

uint64_t current_rss_bytes() { return read_status_kb("VmRSS:"); }

uint64_t peak_rss_bytes() {
  uint64_t hwm = read_status_kb("VmHWM:");
  if (hwm) return hwm;
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  return 0;
}

double now_seconds() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void* aligned_alloc_bytes(size_t size, size_t alignment) {
  void* p = nullptr;
  if (fault::should_fail(fault::Kind::kAlloc)) return nullptr;  // callers report OUT_OF_MEMORY
  if (size == 0) size = alignment;
  if (posix_memalign(&p, alignment, size) != 0) return nullptr;
  return p;
}

void aligned_free(void* p) { free(p); }

bool advise_huge_pages(void* p, size_t n) {
#if defined(MADV_HUGEPAGE)
  constexpr uint64_t kHuge = uint64_t{2} << 20;  // the PMD size on x86-64 and 4 KiB-granule AArch64
  const uint64_t begin = (reinterpret_cast<uint64_t>(p) + kHuge - 1) / kHuge * kHuge;
  const uint64_t end = (reinterpret_cast<uint64_t>(p) + n) / kHuge * kHuge;
  if (end <= begin) return false;
  return madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0;
#else
  (void)p;
  (void)n;
  return false;
#endif
}

}  // namespace moelite::platform
