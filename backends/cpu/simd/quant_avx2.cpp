#include "backends/cpu/quant.h"
namespace moelite::cpu {
const KernelTable* kernels_avx2() { return nullptr; }
}
