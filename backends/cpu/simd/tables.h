// The SIMD kernel tables, each built by a file compiled with its ISA's flags. Call them only once
// the CPU is known to have the instructions: quant_dispatch.cpp checks, then calls them (see there
// for why the checks cannot sit in these files).
#pragma once
#include "backends/cpu/quant.h"

namespace moelite::cpu {

const KernelTable* avx2_table();     // AVX2 + FMA + F16C (quant_avx2.cpp)
const KernelTable* avx512_table();   // + AVX-512 F/BW/VL/DQ/VNNI, built on avx2_table() (quant_avx512.cpp)
const KernelTable* amx_table();      // + AMX-TILE/AMX-INT8, built on avx512_table() (quant_amx.cpp)
const KernelTable* avxvnni_table();  // + AVX-VNNI, built on avx2_table() (quant_avxvnni.cpp)
const KernelTable* neon_table();     // ARMv8.0 NEON (quant_neon.cpp)
const KernelTable* dotprod_table();  // + SDOT, built on neon_table() (quant_dotprod_neon.cpp)
const KernelTable* i8mm_table();     // + SMMLA, built on dotprod_table() (quant_i8mm_neon.cpp)

}  // namespace moelite::cpu
