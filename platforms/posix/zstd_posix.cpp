#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <new>

#include "base/options.h"
#include "platforms/zstd.h"

namespace moelite::platform {

namespace {

// The few functions of zstd's stable API used here, by their documented signatures (zstd.h).
struct ZstdApi {
  size_t (*compress_bound)(size_t) = nullptr;
  size_t (*compress)(void*, size_t, const void*, size_t, int) = nullptr;
  void* (*cctx_create)() = nullptr;
  size_t (*cctx_free)(void*) = nullptr;
  size_t (*cctx_set_parameter)(void*, int, int) = nullptr;
  size_t (*compress2)(void*, void*, size_t, const void*, size_t) = nullptr;
  size_t (*decompress)(void*, size_t, const void*, size_t) = nullptr;
  unsigned (*is_error)(size_t) = nullptr;
  const char* (*error_name)(size_t) = nullptr;
  std::string missing;  // why it is unavailable ("" when loaded)
};

constexpr int kCompressionLevel = 100;  // ZSTD_c_compressionLevel (zstd.h)
constexpr int kChecksumFlag = 201;      // ZSTD_c_checksumFlag (zstd.h)

const ZstdApi& api() {
  static ZstdApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = option_text(Option::ZstdLibrary);
    const char* name = env ? env : "libzstd.so.1";
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      a.missing = std::string(name) + ": " + (e ? e : "cannot be loaded");
      return;
    }
    auto sym = [&](const char* s, auto* fn) {
      *reinterpret_cast<void**>(fn) = dlsym(lib, s);
      if (!*reinterpret_cast<void**>(fn) && a.missing.empty()) a.missing = std::string(name) + " lacks " + s;
    };
    sym("ZSTD_compressBound", &a.compress_bound);
    sym("ZSTD_compress", &a.compress);
    sym("ZSTD_createCCtx", &a.cctx_create);
    sym("ZSTD_freeCCtx", &a.cctx_free);
    sym("ZSTD_CCtx_setParameter", &a.cctx_set_parameter);
    sym("ZSTD_compress2", &a.compress2);
    sym("ZSTD_decompress", &a.decompress);
    sym("ZSTD_isError", &a.is_error);
    sym("ZSTD_getErrorName", &a.error_name);
  });
  return a;
}

}  // namespace

bool zstd_available(std::string* why) {
  const ZstdApi& a = api();
  if (why) *why = a.missing;
  return a.missing.empty();
}

Status zstd_compress(const void* src, size_t n, int level, std::vector<uint8_t>* out) {
  const ZstdApi& a = api();
  if (!a.missing.empty()) return fail(MOELITE_ERR_NOT_IMPLEMENTED, "zstd is unavailable (%s)", a.missing.c_str());
  out->resize(a.compress_bound(n));
  void* cctx = a.cctx_create();
  if (!cctx) return fail(MOELITE_ERR_OUT_OF_MEMORY, "zstd: creating a compression context");
  size_t got = a.cctx_set_parameter(cctx, kCompressionLevel, level);
  if (!a.is_error(got)) got = a.cctx_set_parameter(cctx, kChecksumFlag, 1);
  if (!a.is_error(got)) got = a.compress2(cctx, out->data(), out->size(), src, n);
  a.cctx_free(cctx);
  if (a.is_error(got)) return fail(MOELITE_ERR_OUT_OF_MEMORY, "zstd compression failed: %s", a.error_name(got));
  out->resize(got);
  return MOELITE_OK;
}

Status zstd_decompress(const void* src, size_t n, void* dst, size_t expected, moelite_status corrupt_status) {
  const ZstdApi& a = api();
  if (!a.missing.empty())
    return fail(MOELITE_ERR_NOT_IMPLEMENTED, "the file is zstd-compressed and zstd is unavailable (%s)", a.missing.c_str());
  const size_t got = a.decompress(dst, expected, src, n);
  if (a.is_error(got)) return fail(corrupt_status, "zstd: %s", a.error_name(got));
  if (got != expected)
    return fail(corrupt_status, "zstd: the data decompresses to %zu bytes, the header says %zu", got, expected);
  return MOELITE_OK;
}

}  // namespace moelite::platform
