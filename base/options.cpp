#include "base/options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moelite {

namespace {

// MOELITE_FAULT_INJECT=kind:n, kind one of the platform layer's fault kinds and n >= 1. The kinds
// are listed here rather than asked of platforms/ (base/ is below it); platforms/fault_inject.cpp
// parses the same spelling and a test checks that the two lists agree.
constexpr const char* kFaultKinds = "open|read|mmap|alloc|uring_submit|uring_complete|uring_busy|read_efault|write";

bool in_list(const char* list, const char* text, size_t len) {
  for (const char* p = list; *p;) {
    const char* bar = std::strchr(p, '|');
    const size_t n = bar ? static_cast<size_t>(bar - p) : std::strlen(p);
    if (n == len && std::strncmp(p, text, n) == 0) return true;
    if (!bar) break;
    p = bar + 1;
  }
  return false;
}

bool check_fault_spec(const char* text, std::string* why) {
  const char* colon = std::strchr(text, ':');
  char* end = nullptr;
  errno = 0;
  const long long n = colon ? std::strtoll(colon + 1, &end, 10) : 0;
  if (colon && in_list(kFaultKinds, text, static_cast<size_t>(colon - text)) && end != colon + 1 && *end == 0 &&
      errno == 0 && n >= 1)
    return true;
  *why = std::string("expected KIND:N with N >= 1 and KIND one of ") + kFaultKinds;
  return false;
}

// The table. Defaults that depend on the machine say so; the reader of each option applies it.
const OptionInfo kOptions[] = {
    {Option::Isa, "MOELITE_ISA", OptionKind::Choice, 0, 0, "scalar|avx2|avxvnni|avx512|amx|neon|dotprod|i8mm",
     "the best the CPU has",
     "caps the CPU kernel table chosen at run time (x86-64: scalar, avx2, avxvnni, avx512, amx; AArch64: scalar, "
     "neon, dotprod, i8mm); tests compare every table with the scalar reference, benchmarks compare ISAs",
     nullptr},
    {Option::PrefetchRows, "MOELITE_PREFETCH_ROWS", OptionKind::Integer, 0, 64, nullptr, "0 on x86-64, 2 elsewhere",
     "weight rows the CPU backend's matmul tasks prefetch ahead, across 4 KiB page boundaries", nullptr},
    {Option::DecodeTiles, "MOELITE_DECODE_TILES", OptionKind::Flag, 0, 1, nullptr, "0 on x86-64, 1 on AArch64",
     "whether single-token matmuls use the kernel table's multi-row tiles (the same bits either way)", nullptr},
    {Option::MatrixMinTokens, "MOELITE_MATRIX_MIN_TOKENS", OptionKind::Integer, 1, 1 << 20, nullptr,
     "the kernel table's own",
     "the fewest activation rows for which a matmul takes the table's matrix tile (AMX); fewer take its dot "
     "products, the same bits",
     nullptr},
    {Option::GroupedRows, "MOELITE_GROUPED_ROWS", OptionKind::Flag, 0, 1, nullptr, "1",
     "0 keeps every weight in row layout instead of the CPU backend's grouped copies (the same bits either way)",
     nullptr},
    {Option::WeightCopies, "MOELITE_WEIGHT_COPIES", OptionKind::Flag, 0, 1, nullptr, "1",
     "0 computes mapped weights that have no grouped copy from the model file's mapping instead of copies in "
     "the CPU backend's own memory (huge pages: faster decode; the mapping: processes that map one model file "
     "share its pages); the same bits either way",
     nullptr},
    {Option::HugePages, "MOELITE_HUGE_PAGES", OptionKind::Flag, 0, 1, nullptr, "1",
     "0 leaves the expert store's slot pool and the CPU backend's weight copies in small pages instead of "
     "asking the kernel for transparent huge pages (Linux, THP in `madvise` or `always` mode): the same bits "
     "either way",
     nullptr},
    {Option::Io, "MOELITE_IO", OptionKind::Choice, 0, 0, "pread|io_uring",
     "io_uring where the kernel allows it; pread under valgrind",
     "how the expert store reads: `pread` forces the plain reader instead of io_uring (comparisons); under "
     "valgrind it is the default, since memcheck cannot see io_uring's reads land and would report each one",
     nullptr},
    {Option::IoTimeout, "MOELITE_IO_TIMEOUT", OptionKind::Number, 0.001, 86400, nullptr, "120",
     "seconds an evaluation waits for an expert read before it fails with MOELITE_ERR_IO; read at every wait", nullptr},
    {Option::IoThreads, "MOELITE_IO_THREADS", OptionKind::Integer, 1, 64, nullptr, "2",
     "the expert store's loader threads; speculative reads (a predictor's guesses, the prefill lookahead) use at "
     "most all but one, so a demand read always finds one free",
     nullptr},
    {Option::IoBytesInFlight, "MOELITE_IO_BYTES_IN_FLIGHT", OptionKind::Integer, 4096, 1ull << 40, nullptr,
     "2097152 (2 MiB)",
     "bytes each expert loader keeps in flight for a layer's few misses and for a guess, started in order "
     "(always at least one read, at most 12), and so the misses it takes at a time; the storage probe reads "
     "the same way, so comparing its GB/s at a few values finds a device's best (a deep NVMe queue may want "
     "more)",
     nullptr},
    {Option::PrefillLookahead, "MOELITE_PREFILL_LOOKAHEAD", OptionKind::Flag, 0, 1, nullptr, "1",
     "0 turns off the prefill lookahead (a prompt's batch names the next layer's experts to the store as soon as "
     "a layer has routed); read on every MoE layer, for measuring",
     nullptr},
    {Option::PredictMinPrecision, "MOELITE_PREDICT_MIN_PRECISION", OptionKind::Number, 0, 1, nullptr, "0.6",
     "the precision a band of a predictor's confidence must have shown (guesses of absent experts its routing then "
     "used) for the expert store to read a guess in it; 0 reads every guess (core/experts/guess_gate.h)",
     nullptr},
    {Option::PackedExperts, "MOELITE_PACKED_EXPERTS", OptionKind::Flag, 0, 1, nullptr, "1",
     "0 ignores a packed expert file beside the model (MODEL.experts, `moelite pack`): the store then reads "
     "experts from the model file; for comparing the two",
     nullptr},
    {Option::FaultInject, "MOELITE_FAULT_INJECT", OptionKind::Custom, 0, 0, nullptr, "off",
     "`kind:n`: the n-th call (1-based, from process start) of that kind at the platform layer fails as the OS "
     "would; kinds open, read, mmap, alloc, uring_submit, uring_complete, uring_busy, read_efault, write",
     check_fault_spec},
    {Option::ZstdLibrary, "MOELITE_ZSTD_LIBRARY", OptionKind::Text, 0, 0, nullptr, "libzstd.so.1",
     "the zstd library saved sessions are compressed with, opened at the first save or load", nullptr},
    {Option::VulkanLoader, "MOELITE_VULKAN_LOADER", OptionKind::Text, 0, 0, nullptr, "libvulkan.so.1",
     "the Vulkan loader the Vulkan backend opens, once per process; one that cannot be opened behaves like a "
     "machine without Vulkan (auto runs on the CPU, vulkan fails naming the file)",
     nullptr},
    {Option::VkDevice, "MOELITE_VK_DEVICE", OptionKind::Integer, 0, 255, nullptr, "the best device",
     "forces one Vulkan device (an index) instead of the best (discrete > integrated > virtual > CPU)", nullptr},
    {Option::VkValidation, "MOELITE_VK_VALIDATION", OptionKind::Flag, 0, 1, nullptr, "0",
     "1 enables the Khronos validation layer; its messages are logged as errors and counted", nullptr},
    {Option::VkPortable, "MOELITE_VK_PORTABLE", OptionKind::Flag, 0, 1, nullptr, "0",
     "1 forces the portable shared-memory reductions even where subgroup arithmetic exists", nullptr},
    {Option::VkAsDiscrete, "MOELITE_VK_AS_DISCRETE", OptionKind::Flag, 0, 1, nullptr, "0",
     "1 treats the Vulkan device as discrete: staging copies, and budgeted experts through the device tier (runs "
     "the discrete-GPU paths on lavapipe)",
     nullptr},
    {Option::VkMaxBuffer, "MOELITE_VK_MAX_BUFFER", OptionKind::Integer, 4096, 4.6e18, nullptr, "the device's limit",
     "bytes: shrinks the storage-buffer range, so weight splitting by rows is tested on small models", nullptr},
    {Option::CudaEmulator, "MOELITE_CUDA_EMULATOR", OptionKind::Choice, 0, 0, "0|1|integrated|discrete", "0",
     "the CUDA backend runs on the emulated device (kernels through the SIMT emulator on the CPU): 1 or integrated "
     "models a unified-memory GPU, discrete a PCIe GPU; only in builds configured with MOELITE_CUDA_EMULATOR=ON",
     nullptr},
    {Option::CudaProducts, "MOELITE_CUDA_PRODUCTS", OptionKind::Choice, 0, 0, "int8|float", "int8",
     "how the CUDA backend multiplies quantized weights: int8 quantizes the activations as the CPU does and takes "
     "integer dot products (dp4a); float decodes each weight to a float (the kernels before int8, for comparing); "
     "read at each model load",
     nullptr},
};
static_assert(sizeof(kOptions) / sizeof(kOptions[0]) == static_cast<size_t>(Option::kCount),
              "one table row per Option");

bool parse_number(const char* text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (end == text || *end != 0 || errno == ERANGE || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parse_integer(const char* text, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != 0 || errno == ERANGE) return false;
  *out = v;
  return true;
}

}  // namespace

const OptionInfo& option_info(Option o) { return kOptions[static_cast<int>(o)]; }

const OptionInfo* options_table(int* count) {
  *count = static_cast<int>(Option::kCount);
  return kOptions;
}

bool option_value_valid(Option o, const char* text, std::string* why) {
  const OptionInfo& info = option_info(o);
  char range[96];
  switch (info.kind) {
    case OptionKind::Integer: {
      int64_t v;
      if (parse_integer(text, &v) && static_cast<double>(v) >= info.lo && static_cast<double>(v) <= info.hi)
        return true;
      std::snprintf(range, sizeof range, "an integer in [%.0f, %.0f]", info.lo, info.hi);
      *why = std::string("expected ") + range;
      return false;
    }
    case OptionKind::Number: {
      double v;
      if (parse_number(text, &v) && v >= info.lo && v <= info.hi) return true;
      std::snprintf(range, sizeof range, "a number in [%g, %g]", info.lo, info.hi);
      *why = std::string("expected ") + range;
      return false;
    }
    case OptionKind::Flag:
      if (std::strcmp(text, "0") == 0 || std::strcmp(text, "1") == 0) return true;
      *why = "expected 0 or 1";
      return false;
    case OptionKind::Choice:
      if (in_list(info.choices, text, std::strlen(text))) return true;
      *why = std::string("expected one of ") + info.choices;
      return false;
    case OptionKind::Text: return true;  // set and non-empty
    case OptionKind::Custom: return info.check(text, why);
  }
  return false;
}

const char* option_text(Option o) {
  const char* t = std::getenv(option_info(o).name);
  std::string why;
  return t && *t && option_value_valid(o, t, &why) ? t : nullptr;
}

bool option_int(Option o, int64_t* out) {
  const char* t = option_text(o);
  return t && parse_integer(t, out);
}

bool option_number(Option o, double* out) {
  const char* t = option_text(o);
  return t && parse_number(t, out);
}

bool option_flag(Option o, bool* out) {
  const char* t = option_text(o);
  if (!t) return false;
  *out = t[0] == '1';
  return true;
}

Status check_option(Option o) {
  const OptionInfo& info = option_info(o);
  const char* raw = std::getenv(info.name);
  std::string why;
  if (!raw || !*raw || option_value_valid(o, raw, &why)) return MOELITE_OK;  // empty: as if unset
  return fail(MOELITE_ERR_INVALID_ARGUMENT, "environment variable %s='%.64s': %s (default: %s)", info.name, raw,
              why.c_str(), info.default_text);
}

Status check_options() {
  for (const OptionInfo& info : kOptions) MOELITE_TRY(check_option(info.id));
  return MOELITE_OK;
}

bool running_under_valgrind() {
  const char* preload = getenv("LD_PRELOAD");
  return preload && strstr(preload, "vgpreload") != nullptr;
}

}  // namespace moelite
