// How fast storage feeds the expert store: O_DIRECT reads of a file (the model, or a scratch file
// on the model's file system), for `bench`'s budget bound and `info --platform`.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cli.h"

namespace cli {

// Read speed of a file bypassing the page cache (O_DIRECT, 4 MiB requests from `threads`
// threads at once, as the expert store's loaders issue them), best of two passes over up to
// `bytes` of it: what the store's misses are limited by.
double measure_storage_bandwidth(const std::string& path, size_t bytes, int threads) {
  int probe = open(path.c_str(), O_RDONLY | O_DIRECT);
  const bool direct = probe >= 0;
  if (probe >= 0) close(probe);
  const size_t chunk = size_t{4} << 20;
  double best = 0.0;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<size_t> done(static_cast<size_t>(threads), 0);
    std::vector<std::thread> pool;
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        int fd = open(path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
        void* buf = aligned_alloc(4096, chunk);
        if (fd >= 0 && buf) {
          if (!direct) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          // Thread t reads chunks t, t + threads, ...: interleaved, like loads of different experts.
          for (size_t off = static_cast<size_t>(t) * chunk; off < bytes; off += static_cast<size_t>(threads) * chunk) {
            ssize_t got = pread(fd, buf, chunk, static_cast<off_t>(off));
            if (got <= 0) break;
            done[static_cast<size_t>(t)] += static_cast<size_t>(got);
          }
        }
        free(buf);
        if (fd >= 0) close(fd);
      });
    for (auto& th : pool) th.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    size_t total = 0;
    for (size_t d : done) total += d;
    if (total > 0) best = std::max(best, static_cast<double>(total) / dt / 1e9);
  }
  return best;
}


double measure_directory_storage_bandwidth(const std::string& dir, size_t bytes, int threads) {
  std::string tmpl = (dir.empty() ? std::string(".") : dir) + "/.moelite-storage-probe-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) return 0.0;
  const std::string path(name.data());
  // Incompressible-looking bytes, written and synced so the reads below come from the device,
  // not from dirty pages; the measurement then drops them from the page cache (or bypasses it).
  const size_t chunk = size_t{1} << 20;
  std::vector<uint64_t> block(chunk / sizeof(uint64_t));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  bool ok = true;
  for (size_t done = 0; ok && done < bytes; done += chunk) {
    for (uint64_t& v : block) v = (x = x * 6364136223846793005ull + 1442695040888963407ull);
    ok = write(fd, block.data(), chunk) == static_cast<ssize_t>(chunk);
  }
  ok = ok && fsync(fd) == 0;
  close(fd);
  const double gbs = ok ? measure_storage_bandwidth(path, bytes, threads) : 0.0;
  unlink(path.c_str());
  return gbs;
}

}  // namespace cli
