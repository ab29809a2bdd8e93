// Entry points shared by the SIMD kernel files: a kernel written once for K activation rows,
// Fn<K>::run(n, out, w, a, stride), becomes the table's vec_dot (K = 1) and multi-dot (K = count).
// Each file instantiates these with its own kernels and its own compiler flags (-mavx2, -mavx512f,
// ...), so everything here sits in an anonymous namespace: an inline function with external
// linkage instantiated in two files would be one symbol, and the linker could keep the AVX-512 copy
// for the AVX2 table (SIGILL on a CPU without AVX-512).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/quant.h"

namespace moelite::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

// Row j of rows `stride` bytes apart, as Block.
template <typename Block>
inline const Block* act_row(const void* a, size_t stride, int j) {
  return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(a) + static_cast<size_t>(j) * stride);
}

template <template <int> class Fn>
void dot_one(int64_t n, float* out, const void* w, const void* a) {
  Fn<1>::run(n, out, w, a, 0);
}
template <template <int> class Fn>
void dot_multi(int64_t n, float* out, const void* w, const void* a, size_t stride, int count) {
  switch (count) {
    case 1: Fn<1>::run(n, out, w, a, stride); break;
    case 2: Fn<2>::run(n, out, w, a, stride); break;
    case 3: Fn<3>::run(n, out, w, a, stride); break;
    default: Fn<4>::run(n, out, w, a, stride); break;
  }
}
static_assert(kMultiDot == 4, "dot_multi dispatches counts 1..4");

}  // namespace
}  // namespace moelite::cpu
