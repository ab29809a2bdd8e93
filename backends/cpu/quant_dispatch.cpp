// Picks the kernel table for this CPU once. MOELITE_ISA caps the choice so tests and benchmarks
// can compare tables on one machine; an unknown value is ignored (the best table is used).
#include <cstdlib>
#include <cstring>

#include "backends/cpu/quant.h"

namespace moelite::cpu {

#if !MOELITE_X86
// The x86 SIMD files are only compiled for x86-64.
const KernelTable* kernels_avx2() { return nullptr; }
const KernelTable* kernels_avx512() { return nullptr; }
#endif
#if !defined(__aarch64__)
const KernelTable* kernels_neon() { return nullptr; }
#endif

namespace {
int isa_rank(const char* name) {
  if (std::strcmp(name, "scalar") == 0) return 0;
  if (std::strcmp(name, "avx2") == 0 || std::strcmp(name, "neon") == 0) return 1;
  if (std::strcmp(name, "avx512") == 0) return 2;
  return 99;
}
}  // namespace

const KernelTable& kernels_best() {
  static const KernelTable* best = [] {
    const char* env = std::getenv("MOELITE_ISA");
    const int cap = env ? isa_rank(env) : 99;
    if (cap >= 2)
      if (const KernelTable* t = kernels_avx512()) return t;
    if (cap >= 1)
      if (const KernelTable* t = kernels_avx2()) return t;
    if (cap >= 1)
      if (const KernelTable* t = kernels_neon()) return t;
    return &kernels_scalar();
  }();
  return *best;
}

}  // namespace moelite::cpu
