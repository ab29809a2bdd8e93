// zstd compression through the system's libzstd, loaded at run time (dlopen of libzstd.so.1, or
// MOELITE_ZSTD_LIBRARY): libmoelite links nothing of it, so neither its users nor a cross build need
// zstd's development files, and a system without the library still saves sessions, uncompressed.
// libzstd1 is part of every Debian system (dpkg depends on it). Only the stable one-shot API is used
// (ZSTD_compress / ZSTD_decompress, frame checksums on).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace moelite::platform {

// Whether libzstd could be loaded; *why says why not.
bool zstd_available(std::string* why = nullptr);
// Compresses `n` bytes into *out (a zstd frame with a content checksum). NOT_IMPLEMENTED without
// libzstd; OUT_OF_MEMORY.
Status zstd_compress(const void* src, size_t n, int level, std::vector<uint8_t>* out);
// Decompresses one frame of exactly `expected` bytes into dst. A frame that is corrupt, fails its
// checksum or decodes to another size: `corrupt_status` with zstd's reason.
Status zstd_decompress(const void* src, size_t n, void* dst, size_t expected, moelite_status corrupt_status);

}  // namespace moelite::platform
