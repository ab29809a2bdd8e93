// Picks the kernel table for this CPU once. MOELITE_ISA caps the choice so tests and benchmarks
// can compare tables on one machine; a malformed value is refused by the next model load
// (base/options.h), and until then caps nothing.
#include <cstdlib>
#include <cstring>

#include "backends/cpu/quant.h"
#include "backends/cpu/simd/tables.h"
#include "base/options.h"
#include "platforms/platform.h"

namespace moelite::cpu {

// Each SIMD table is built in a file of its own, compiled with that ISA's flags, and nothing in
// such a file may run before the CPU is known to have the instructions: the compiler may use them
// anywhere in a function, prologue included (an ASan build of the AVX-512 file poisons its stack
// frame with zmm stores, before any CPU check in the same function could run). So the checks
// are here, in a file compiled for the baseline, and the files' *_table() functions run after them.
#if MOELITE_X86
namespace {
bool has_avx2(const platform::CpuFeatures& f) { return f.avx2 && f.fma && f.f16c; }
}  // namespace
const KernelTable* kernels_avx2() { return has_avx2(platform::cpu_features()) ? avx2_table() : nullptr; }
const KernelTable* kernels_avx512() {
  const platform::CpuFeatures& f = platform::cpu_features();
  const bool ok = has_avx2(f) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  return ok ? avx512_table() : nullptr;
}
const KernelTable* kernels_amx() {
  const platform::CpuFeatures& f = platform::cpu_features();
  // amx_int8 includes the OS's grant of the tile state (platform_posix.cpp).
  return kernels_avx512() && f.amx_int8 ? amx_table() : nullptr;
}
const KernelTable* kernels_avxvnni() {
  const platform::CpuFeatures& f = platform::cpu_features();
  return has_avx2(f) && f.avxvnni ? avxvnni_table() : nullptr;
}
#else
// The x86 SIMD files are only compiled for x86-64.
const KernelTable* kernels_avx2() { return nullptr; }
const KernelTable* kernels_avx512() { return nullptr; }
const KernelTable* kernels_avxvnni() { return nullptr; }
const KernelTable* kernels_amx() { return nullptr; }
#endif
#if defined(__aarch64__)
const KernelTable* kernels_neon() { return neon_table(); }
const KernelTable* kernels_dotprod() { return platform::cpu_features().dotprod ? dotprod_table() : nullptr; }
const KernelTable* kernels_i8mm() {
  const platform::CpuFeatures& f = platform::cpu_features();
  return f.dotprod && f.i8mm ? i8mm_table() : nullptr;
}
#else
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
  if (std::strcmp(name, "i8mm") == 0 || std::strcmp(name, "amx") == 0) return 4;
  return 99;
}
}  // namespace

const KernelTable& kernels_capped(const char* cap_name) {
  const int cap = cap_name ? isa_rank(cap_name) : 99;
  // Only one architecture's tables are non-null, so x86-64 and AArch64 never mix.
  const struct {
    int rank;
    const KernelTable* (*get)();
  } order[] = {{4, kernels_i8mm},    {4, kernels_amx},    {3, kernels_avx512}, {3, kernels_dotprod},
               {2, kernels_avxvnni}, {1, kernels_avx2},   {1, kernels_neon}};
  for (const auto& o : order)
    if (cap >= o.rank)
      if (const KernelTable* t = o.get()) return *t;
  return kernels_scalar();
}

const KernelTable& kernels_best() {
  static const KernelTable& best = kernels_capped(option_text(Option::Isa));
  return best;
}

}  // namespace moelite::cpu
