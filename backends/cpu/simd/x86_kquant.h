// Pieces of the K-quant kernels that the avx2, avx512 and amx files share: 128-bit operations that
// every one of those instruction sets runs the same way. Each file compiles these with its own flags, so they sit
// in an anonymous namespace (see rows_entry.h for why).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace moelite::cpu {
namespace {  // NOLINT(google-build-namespaces)

// Software prefetch into L1 of every cache line of *p (the K-quant kernels' weights a few blocks
// ahead; a prefetch past the end of a buffer never faults).
template <typename T>
inline __attribute__((always_inline)) void prefetch_lines(const T* p) {
  const char* bytes = reinterpret_cast<const char*>(p);
#pragma GCC unroll 32
  for (size_t o = 0; o < sizeof(T); o += 64) _mm_prefetch(bytes + o, _MM_HINT_T0);
}

// The avx512 and amx K-quant row kernels' weights, prefetched into L1 about 2 KiB ahead of the
// super-block being decoded (Q6_K 9 blocks, Q4_K 14, Q3_K 18, Q2_K 24; past a row's end that is the
// next row's start, past the weights nothing). Decode streams every weight row from DRAM once per
// token, and these kernels do enough work per byte that the hardware prefetcher alone leaves the
// stream short. Measured on an Intel Xeon with AMX (2 threads, bench-shaped models, decode tok/s,
// alternating runs): avx512 Q6_K 30-31 -> 44-45 with 8 blocks ahead (16: 44-45, 24: 44-51), Q3_K
// 40-41 -> 52 (16: 45-50, 24: 55-56), Q4_K in row layout (the expert store's slots) 31-35 -> 43-52
// with 14 ahead (8: 38-44); 4 blocks ahead gained half as much. (The avx2 table's kernels keep
// their own distance, kRowPrefetchAhead, measured on a Zen 3.)
constexpr size_t kRowPrefetchBytes = 2048;
template <typename Block>
inline __attribute__((always_inline)) void prefetch_row_ahead(const Block* x) {
  prefetch_lines(x + kRowPrefetchBytes / sizeof(Block));
}

// Q3_K packed scales -> 16 int8 scales with the -32 offset applied (see unpack_scales_q3k).
inline __m128i q3k_scales(const uint8_t p[12]) {
  uint32_t a[3];
  std::memcpy(a, p, 12);
  const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
  const __m128i s = _mm_setr_epi32(static_cast<int>((a[0] & m4) | ((a[2] & m2) << 4)),
                                   static_cast<int>((a[1] & m4) | (((a[2] >> 2) & m2) << 4)),
                                   static_cast<int>(((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4)),
                                   static_cast<int>(((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)));
  return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

// Q4_K/Q5_K packed scales -> bytes 0..7 scales, 8..15 mins (see unpack_scales_q4k). Built in
// scalar registers: storing four u32 and reloading them as one vector would stall on store
// forwarding (measured: a third of the Q4_K throughput). The avx2 kernel uses this one: its
// vector ports are the busy ones, and q4k_scales_mins_vec below made it 8 % slower (Zen 5).
inline __m128i q4k_scales_mins(const uint8_t p[12]) {
  uint32_t a[3];
  std::memcpy(a, p, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  return _mm_setr_epi32(static_cast<int>(a[0] & m6), static_cast<int>((a[2] & m4) | (((a[0] >> 6) & m2) << 4)),
                        static_cast<int>(a[1] & m6), static_cast<int>(((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4)));
}

// The same bytes, in vector registers from one 16-byte load: the 12 scale bytes and the first 4
// bytes after them (qs or qh: a block always has them). With b the scale bytes:
//   scale j < 4: b[j] & 63          scale j >= 4: (b[j + 4] & 15) | (b[j - 4] >> 6) << 4
//   min j < 4:   b[j + 4] & 63      min j >= 4:   (b[j + 4] >> 4) | (b[j] >> 6) << 4
// For the avx512 kernel, where the scalar version's extracts and lane inserts were a large part
// of the loop (perf annotate of a Q4_K decode).
inline __m128i q4k_scales_mins_vec(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  // low: [b0..3 | b8..11 | b4..7 | b8..11], the bytes whose low bits each output starts from;
  // top: [0 | b0..3 | 0 | b4..7], the bytes whose top two bits become bits 4..5.
  const __m128i low = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i top = _mm_shuffle_epi8(b, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  // Mins 4..7 take the high nibble of b[8..11]. 16-bit shifts move bits across the bytes of a
  // pair; the masks below drop what came from the neighbour.
  const __m128i low_sel = _mm_blendv_epi8(low, _mm_srli_epi16(low, 4),
                                          _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1));
  const __m128i low_bits = _mm_and_si128(low_sel, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15,
                                                                15, 15, 15));
  const __m128i top_bits = _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30));  // (x >> 6) << 4
  return _mm_or_si128(low_bits, top_bits);
}

}  // namespace
}  // namespace moelite::cpu
