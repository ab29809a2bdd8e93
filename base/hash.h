// A 64-bit hash of bytes, 8 at a time: not cryptographic, it detects corruption and tells files
// apart (saved sessions' payload checksum and model fingerprint). Header-only so tools that write
// such files (tests/fuzz/fuzz_session.cpp) compute exactly what the reader checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace moelite {

inline uint64_t hash_bytes(const void* data, size_t n, uint64_t h = 0x9E3779B97F4A7C15ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  auto mix = [&](uint64_t w) {
    h ^= w;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    mix(w);
  }
  uint64_t tail = n;
  for (; i < n; ++i) tail = (tail << 8) | p[i];
  mix(tail);
  return h;
}

}  // namespace moelite
