// Measures how fast this machine streams memory into the cores, for comparing decode speed with
// its bound (bytes a token must read / bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cli.h"

namespace cli {

double measure_read_bandwidth(int threads, size_t bytes) {
  const size_t n = bytes / sizeof(uint64_t);
  uint64_t* buf = static_cast<uint64_t*>(aligned_alloc(64, n * sizeof(uint64_t)));
  if (!buf) return 0.0;
  // Touch every page in the threads that will read them (first-touch placement).
  std::vector<std::thread> pool;
  auto span = [&](int t) { return std::make_pair(n * t / threads, n * (t + 1) / threads); };
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      auto [a, b] = span(t);
      for (size_t i = a; i < b; ++i) buf[i] = i;
    });
  for (auto& th : pool) th.join();
  double best = 0.0;
  volatile uint64_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    pool.clear();
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        auto [a, b] = span(t);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        size_t i = a;
        for (; i + 8 <= b; i += 8) {
          s0 += buf[i] ^ buf[i + 4];
          s1 += buf[i + 1] ^ buf[i + 5];
          s2 += buf[i + 2] ^ buf[i + 6];
          s3 += buf[i + 3] ^ buf[i + 7];
        }
        for (; i < b; ++i) s0 += buf[i];
        sums[static_cast<size_t>(t)] = s0 + s1 + s2 + s3;
      });
    for (auto& th : pool) th.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (uint64_t s : sums) sink = sink + s;
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / dt / 1e9);
  }
  free(buf);
  return best;
}

}  // namespace cli

#include <fcntl.h>
#include <unistd.h>

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

}  // namespace cli
