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
