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
const KernelTable* kernels_avxvnni() { return nullptr; }
#endif
#if !defined(__aarch64__)
// The NEON files are only compiled for AArch64.
const KernelTable* kernels_neon() { return nullptr; }
const KernelTable* kernels_dotprod() { return nullptr; }
const KernelTable* kernels_i8mm() { return nullptr; }
#endif

namespace {
int isa_rank(const char* name) {
  if (std::strcmp(name, "scalar") == 0) return 0;
  if (std::strcmp(name, "avx2") == 0 || std::strcmp(name, "neon") == 0) return 1;
  if (std::strcmp(name, "avxvnni") == 0) return 2;
  if (std::strcmp(name, "avx512") == 0 || std::strcmp(name, "dotprod") == 0) return 3;
  if (std::strcmp(name, "i8mm") == 0) return 4;
  return 99;
}
}  // namespace

const KernelTable& kernels_capped(const char* cap_name) {
  const int cap = cap_name ? isa_rank(cap_name) : 99;
  // Only one architecture's tables are non-null, so x86-64 and AArch64 never mix.
  const struct {
    int rank;
    const KernelTable* (*get)();
  } order[] = {{4, kernels_i8mm},    {3, kernels_avx512}, {3, kernels_dotprod},
               {2, kernels_avxvnni}, {1, kernels_avx2},   {1, kernels_neon}};
  for (const auto& o : order)
    if (cap >= o.rank)
      if (const KernelTable* t = o.get()) return *t;
  return kernels_scalar();
}

const KernelTable& kernels_best() {
  static const KernelTable& best = kernels_capped(std::getenv("MOELITE_ISA"));
  return best;
}

}  // namespace moelite::cpu
