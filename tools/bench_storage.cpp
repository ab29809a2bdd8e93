// Storage read bandwidth by read size and queue depth, through the expert store's own reader
// (platform::BatchReader: io_uring, O_DIRECT): the measurement the store's read sizes and queue
// depths are chosen from. Reads 192 MiB at random 4 KiB-aligned offsets of FILE per setting.
// Not part of the build; compile against the static library, e.g.
//   g++ -O2 -std=c++17 -I. -Iinclude tools/bench_storage.cpp build/lib/libmoelite.a -lpthread -luring
// Usage: bench_storage FILE   (prints a line per setting, then one JSON line)
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "platforms/batch_read.h"
#include "platforms/platform.h"

using namespace moelite;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_storage FILE\n");
    return 2;
  }
  platform::File f;
  if (platform::File::open_direct(argv[1], &f) != MOELITE_OK) {
    std::fprintf(stderr, "cannot open %s with O_DIRECT: %s\n", argv[1], last_error_message());
    return 1;
  }
  std::mt19937_64 rng(42);
  std::string json = "[";
  for (uint64_t size : {uint64_t{256} << 10, uint64_t{1} << 20, uint64_t{2176} << 10, uint64_t{4} << 20}) {
    if (f.size() < 2 * size) continue;
    for (unsigned depth : {1u, 2u, 3u, 6u, 12u, 24u}) {
      std::unique_ptr<platform::BatchReader> reader = platform::BatchReader::create(depth);
      const size_t n = (uint64_t{192} << 20) / size;
      void* mem = platform::aligned_alloc_bytes(size * depth, 4096);
      if (!mem) return 1;
      std::vector<platform::ReadRange> ranges(n);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t off = (rng() % ((f.size() - size) / 4096)) * 4096;
        ranges[i] = {f.native_handle(), off, static_cast<uint8_t*>(mem) + (i % depth) * size, size, size};
      }
      uint64_t got = 0;
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = reader->read_all(ranges, [](size_t) {}, &got);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      platform::aligned_free(mem);
      if (st != MOELITE_OK) {
        std::fprintf(stderr, "read failed: %s\n", last_error_message());
        return 1;
      }
      std::printf("%-8s read %5llu KiB, depth %2u: %.2f GB/s\n", reader->name(),
                  static_cast<unsigned long long>(size >> 10), depth, static_cast<double>(got) / s / 1e9);
      char rec[160];
      std::snprintf(rec, sizeof rec, "%s{\"read_kib\": %llu, \"depth\": %u, \"gb_s\": %.3f}", json.size() > 1 ? ", " : "",
                    static_cast<unsigned long long>(size >> 10), depth, static_cast<double>(got) / s / 1e9);
      json += rec;
    }
  }
  std::printf("%s]\n", json.c_str());
  return 0;
}
