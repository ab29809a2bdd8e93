// ARMv8.2 dot-product table ("dotprod"): the quantized types' integer sums with SDOT (16 int8
// products into four int32 lanes per instruction, against vmull + vmlal + vpadal on ARMv8.0).
// This file is compiled with -march=armv8.2-a+dotprod (CMake) and nothing in it runs before
// kernels_dotprod() has seen the feature at run time, so the library still runs on ARMv8.0.
// The float types (F32, F16, BF16) gain nothing from SDOT and keep the neon table's kernels, as do
// the activation quantizers and dequantization.
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/quant_neon_kernels.h"
#include "platforms/platform.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "quant_dotprod_neon.cpp must be compiled with +dotprod (see CMakeLists.txt)"
#endif

namespace moelite::cpu {

// Called only once the CPU is known to have SDOT (quant_dispatch.cpp checks).
const KernelTable* dotprod_table() {
  static const KernelTable table = [] {
    KernelTable t = *neon_table();
    t.isa = "dotprod";
    set_quantized_kernels<IsaDotprod>(t);
    return t;
  }();
  return &table;
}

}  // namespace moelite::cpu
