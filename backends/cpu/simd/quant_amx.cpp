// Intel AMX kernels: the avx512 table with Q8_0 products, Q4_K / Q5_K batches of 5 to 16 tokens
// (its group kernels over the grouped copies, and rows in row layout) and Q2_K / Q3_K / Q6_K
// batches, on int8 tile registers. Compiled with -mamx-tile -mamx-int8, the avx512 flags and
// -ffp-contract=off; nothing here runs before kernels_amx() has checked the CPU and the OS's grant
// of the tile state.
//
// One TDPBSSD multiplies a 16 x 32 int8 tile of weights (16 rows, one Q8_0 block each: the tile is
// loaded straight from the rows, row_bytes apart, so no repacking at load) with an 8 x 64 tile of
// 16 tokens' activation codes (the "VNNI" layout: row k holds each token's codes 4k..4k+3, packed
// once per chunk of tokens) into 16 x 16 exact int32 block sums. The float part then follows the
// scalar reference for every (row, token): s = s + (d_w * d_a) * sum, block after block, with a
// multiply and an add (no fused multiply-add), so the results are the scalar table's bit for bit.
// The avx512 table's VNNI kernels keep per-lane partial sums across blocks instead, which a tile
// cannot reproduce; so this table's Q8_0 vec_dot (decode) uses the same per-block order too,
// with the block sums formed by vpdpbusd, and batched and token-by-token evaluation stay equal.
#include <immintrin.h>

// GCC 12's AVX-512 headers build "undefined" vectors as `__m512i __Y = __Y;`, which its own
// -Wuninitialized then reports at every inlined use (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "backends/cpu/interleaved_rows.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/simd/rows_entry.h"
#include "backends/cpu/simd/tables.h"
#include "backends/cpu/simd/x86_k16.h"
#include "backends/cpu/simd/x86_kquant.h"
#include "base/quant_ref.h"

namespace moelite::cpu {
namespace {

using blocks::Q8_0;
using blocks::kQKK;
using blocks::Q8_K;

constexpr int kBlock = 32;
// Packed activations per block: 8 rows x (16 tokens x 4 codes), then the 16 tokens' scales.
constexpr size_t kPackedCodes = 8 * 64;
constexpr size_t kPackedBlock = kPackedCodes + kMatrixTokens * sizeof(float);

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Exact sum of 32 int8 x int8 products: |w| (unsigned) times a with w's sign, in int32 lanes.
// Activation codes are in [-127, 127] (quantize_act), so negating one never overflows.
inline __m256i block_lanes(const int8_t* w, const int8_t* a) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), _mm256_sign_epi8(av, wv));
}

// The scalar reference's order: s = s + (d_w * d_a) * sum_b, block after block. Four blocks' lane
// sums are reduced together (three horizontal adds and one add of the halves give the four block
// sums, exact integers), then each block's term is formed and added in order.
void dot_q8_0(int64_t n, float* out, const void* w_row, const void* a_row) {
  const Q8_0* x = static_cast<const Q8_0*>(w_row);
  const Q8_0* y = static_cast<const Q8_0*>(a_row);
  const int64_t nb = n / kBlock;
  float s = 0.0f;
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    const __m256i l0 = block_lanes(x[b].qs, y[b].qs), l1 = block_lanes(x[b + 1].qs, y[b + 1].qs);
    const __m256i l2 = block_lanes(x[b + 2].qs, y[b + 2].qs), l3 = block_lanes(x[b + 3].qs, y[b + 3].qs);
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(l0, l1), _mm256_hadd_epi32(l2, l3));
    const __m128i sums = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    alignas(16) float f[4];
    _mm_store_ps(f, _mm_cvtepi32_ps(sums));
    for (int i = 0; i < 4; ++i) s = s + (fp16(x[b + i].d) * fp16(y[b + i].d)) * f[i];
  }
  for (; b < nb; ++b) {
    const __m256i l = block_lanes(x[b].qs, y[b].qs);
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
    const __m128i p = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
    const int sum = _mm_cvtsi128_si32(_mm_add_epi32(p, _mm_shuffle_epi32(p, 0xb1)));
    s = s + (fp16(x[b].d) * fp16(y[b].d)) * static_cast<float>(sum);
  }
  *out = s;
}

size_t packed_bytes_q8_0(int64_t n) { return static_cast<size_t>(n / kBlock) * kPackedBlock; }

// Per block: codes row k = token j's codes 4k..4k+3 at bytes 4j..4j+3 (TDPBSSD's B operand), then
// the tokens' scales as floats. Tokens past `count` are zeros.
void pack_q8_0(const void* a_rows, size_t a_stride, int count, int64_t n, void* out) {
  const int64_t nb = n / kBlock;
  uint8_t* o = static_cast<uint8_t*>(out);
  std::memset(o, 0, packed_bytes_q8_0(n));
  for (int j = 0; j < count; ++j) {
    const Q8_0* a = reinterpret_cast<const Q8_0*>(static_cast<const uint8_t*>(a_rows) + static_cast<size_t>(j) * a_stride);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = o + static_cast<size_t>(b) * kPackedBlock;
      for (int k = 0; k < 8; ++k) std::memcpy(blk + k * 64 + j * 4, a[b].qs + 4 * k, 4);
      const float d = fp16(a[b].d);
      std::memcpy(blk + kPackedCodes + j * sizeof(float), &d, sizeof(float));
    }
  }
}

// The tile configuration (palette 1): tiles 0-1 int32 sums (16 x 16), 2-3 weights (16 rows x 32
// codes), 4-5 packed activations (8 x 64). Two of each so two blocks are in flight.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// The two configurations differ only in the tokens per tile: `token_bytes` 64 (16 tokens) or 4.
TileConfig tile_config_for(uint16_t token_bytes) {
  TileConfig c;
  for (int t : {0, 1}) c.colsb[t] = token_bytes, c.rows[t] = 16;
  for (int t : {2, 3}) c.colsb[t] = 32, c.rows[t] = 16;
  for (int t : {4, 5}) c.colsb[t] = token_bytes, c.rows[t] = 8;
  return c;
}
// The configuration this thread's tiles hold (nullptr: none, the tiles released). LDTILECFG is
// microcoded and slow, so a kernel called many times in a row (the Q4_K and Q5_K group kernels,
// once per 8 rows) loads its configuration only when another one is loaded.
thread_local const TileConfig* t_loaded_config = nullptr;
void use_config(const TileConfig& c) {
  if (t_loaded_config == &c) return;
  _tile_loadconfig(&c);
  t_loaded_config = &c;
}
// Leave the tiles in their init state: a thread that holds tile data costs the OS an 8 KiB save
// at every context switch.
void release_tiles() {
  _tile_release();
  t_loaded_config = nullptr;
}
const TileConfig& tile_config() {
  static const TileConfig cfg = tile_config_for(64);
  return cfg;
}
// One token (decode): tiles 0-1 int32 sums (16 rows x 1), 2-3 weights (16 x 32 codes), 4-5 the
// token's codes (8 x 4: the first column of the packed layout, read with the same 64-byte stride).
const TileConfig& tile_config_one_token() {
  static const TileConfig cfg = tile_config_for(4);
  return cfg;
}

// acc[r] (16 tokens) = acc[r] + (d_w[r] * d_a) * sums[r], for the 16 rows of one block (sums: 16
// rows of 16 int32).
inline void accumulate_block(__m512 (&acc)[kMatrixRows], const int32_t* sums, const uint8_t* w_block, size_t w_stride,
                             const uint8_t* da) {
  const __m512 d_a = _mm512_loadu_ps(da);
  for (int r = 0; r < kMatrixRows; ++r) {
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(fp16(w_block + static_cast<size_t>(r) * w_stride)), d_a);
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(sums + r * kMatrixTokens));
    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(scale, sum));
  }
}

// Blocks ahead of the tile loads whose lines each of the 16 rows asks for: the rows are 16 strided
// streams (32 with gate and up), more than the hardware prefetcher follows, and a tile load that
// misses waits for DRAM row by row.
constexpr int64_t kPrefetchBlocks = 8;

// The tile side of one group of kMatrixRows rows, the tile configuration already loaded: for each
// block b, the rows' codes times the packed tokens' into int32 sums stored kSumsStride bytes a row
// apart, then add_block(sums, b). The sums go through memory (a tile's only way to the vector
// registers), in a ring of four: the two blocks stored in one step are read back in the next, so the
// stores have drained by then instead of stalling the loads that follow them at once (bench_kernels,
// 16 tokens: 7.4 -> 10 GB/s of weights).
template <size_t kSumsStride, class AddBlock>
void group_blocks(int64_t nb, const uint8_t* w, size_t w_stride, const uint8_t* p, AddBlock&& add_block) {
  alignas(64) int32_t sums[4][kMatrixRows * kMatrixTokens];
  const auto w_block = [&](int64_t b) { return w + static_cast<size_t>(b) * sizeof(Q8_0); };
  const auto p_block = [&](int64_t b) { return p + static_cast<size_t>(b) * kPackedBlock; };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    if (b + kPrefetchBlocks < nb)  // two blocks are 68 bytes: one or two lines of each row
      for (int r = 0; r < kMatrixRows; ++r) {
        const uint8_t* ahead = w_block(b + kPrefetchBlocks) + static_cast<size_t>(r) * w_stride;
        _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 2 * sizeof(Q8_0) - 1), _MM_HINT_T0);
      }
    const int slot = static_cast<int>(b & 3);  // b even: slots 0-1, then 2-3
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, w_block(b) + 2, w_stride);
    _tile_loadd(4, p_block(b), 64);
    _tile_loadd(3, w_block(b + 1) + 2, w_stride);
    _tile_loadd(5, p_block(b + 1), 64);
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, sums[slot], kSumsStride);
    _tile_stored(1, sums[slot + 1], kSumsStride);
    if (b >= 2) {
      const int prev = slot ^ 2;
      add_block(sums[prev], b - 2);
      add_block(sums[prev + 1], b - 1);
    }
  }
  // The last pair stored, then an odd last block.
  if (b >= 2) {
    const int prev = static_cast<int>((b - 2) & 3);
    add_block(sums[prev], b - 2);
    add_block(sums[prev + 1], b - 1);
  }
  if (b < nb) {
    _tile_zero(0);
    _tile_loadd(2, w_block(b) + 2, w_stride);
    _tile_loadd(4, p_block(b), 64);
    _tile_dpbssd(0, 2, 4);
    _tile_stored(0, sums[0], kSumsStride);
    add_block(sums[0], b);
  }
}

// Block b's 16 token scales in the packed layout (floats, at any address: read unaligned).
const uint8_t* token_scales(const uint8_t* p, int64_t b) {
  return p + static_cast<size_t>(b) * kPackedBlock + kPackedCodes;
}

// One group of kMatrixRows rows against up to 16 tokens: per block and row one 16-token vector.
void matrix_group(int64_t nb, float* out, size_t out_stride, const uint8_t* w, size_t w_stride, const uint8_t* p) {
  __m512 acc[kMatrixRows];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  group_blocks<kMatrixTokens * sizeof(int32_t)>(nb, w, w_stride, p, [&](const int32_t* sums, int64_t b) {
    accumulate_block(acc, sums, w + static_cast<size_t>(b) * sizeof(Q8_0), w_stride, token_scales(p, b));
  });
  for (int r = 0; r < kMatrixRows; ++r) _mm512_storeu_ps(out + static_cast<size_t>(r) * out_stride, acc[r]);
}

// One group of kMatrixRows rows against one token (the one-token configuration): the 16 rows' sums
// of a block are one vector, so the float part is one multiply-multiply-add per block for all 16
// rows (lane r: row r's sum in the scalar order), the rows' block scales gathered.
void matrix_group_one_token(int64_t nb, float* out, size_t out_stride, const uint8_t* w, size_t w_stride,
                            const uint8_t* p) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i row_offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                 _mm512_set1_epi32(static_cast<int>(w_stride)));
  group_blocks<sizeof(int32_t)>(nb, w, w_stride, p, [&](const int32_t* sums, int64_t b) {
    // The dword at each row's block start: d, then two codes; its low half is the fp16 scale.
    const __m512i d_bits = _mm512_i32gather_epi32(row_offsets, w + static_cast<size_t>(b) * sizeof(Q8_0), 1);
    const __m512 d_w = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d_bits));
    float d_a;  // copied: the packed buffer may sit at any address (pack's contract)
    std::memcpy(&d_a, token_scales(p, b), sizeof d_a);
    const __m512 scale = _mm512_mul_ps(d_w, _mm512_set1_ps(d_a));
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(sums));
    acc = _mm512_add_ps(acc, _mm512_mul_ps(scale, sum));
  });
  alignas(64) float rows[kMatrixRows];
  _mm512_store_ps(rows, acc);
  for (int r = 0; r < kMatrixRows; ++r) out[static_cast<size_t>(r) * out_stride] = rows[r];
}

// The tile configuration is loaded once per call (LDTILECFG is microcoded: loaded per group of 16
// rows it took a tenth of a prefill), for all its groups.
void matrix_q8_0(int64_t n, float* out, size_t out_stride, const void* w_rows, size_t w_stride, const void* packed,
                 int64_t groups, int count) {
  const uint8_t* w = static_cast<const uint8_t*>(w_rows);
  const auto group = count == 1 ? matrix_group_one_token : matrix_group;
  use_config(count == 1 ? tile_config_one_token() : tile_config());
  for (int64_t g = 0; g < groups; ++g)
    group(n / kBlock, out + static_cast<size_t>(g) * kMatrixRows * out_stride, out_stride,
          w + static_cast<size_t>(g) * kMatrixRows * w_stride, w_stride, static_cast<const uint8_t*>(packed));
  release_tiles();
}

// ---- Q4_K and Q5_K: the avx512 table's grouped copies (interleaved_rows.h) on tiles ----
//
// A group's codes are already in the layout TDPBSUD wants for its second (unsigned) operand: chunk
// c of a super-block holds, for 4-code position l of a sub-block, the 8 rows' 4 codes side by side
// (qs[c][l][row][4]), the low nibbles for sub-block 2c and the high ones for 2c + 1. So one sub-block
// is an 8 x 32 tile once its nibbles are split into bytes (two ANDs and a shift per 64 bytes), and
// the first operand is up to 16 tokens' 32 activation codes of that sub-block, loaded straight from
// the Q8_K rows with their stride. The 16 x 8 int32 results are exact sub-block sums; the rows'
// 6-bit scales and the mins (against the Q8_K group sums) are applied in integers, and the float
// part is interleaved_rows.h's order: acc = fma(d * da, isum, acc), accm = fma(dmin * da, msum,
// accm), acc - accm. So each output equals the avx512 group and row kernels' (decode) bit for bit.
// Q5_K's group is Q4_K's plus a plane of fifth bits in the same [position][row][4] layout (qh: bit
// 2c of a byte for sub-block 2c, bit 2c + 1 for 2c + 1), ORed into the codes as bit 4, and the same
// float order; its codes reach 31, its sub-block sums 32 x 31 x 127, its scaled sums 8 x 63 times
// that: all within int32.

// Calls of fewer tokens take the avx512 group kernel (same bits): with so few tokens the tile's
// setup and the integer passes cost more than they save. bench_kernels (mode 4, 256 x 2048 Q4_K
// rows from L2, one thread, GB/s of weights per call): avx512 10.4 with 4 tokens, 19.3 with 2,
// 24 with 1; tiles 8.1 with 6 tokens, 7.2 with 8, 4.9 with 16. So 5 tokens come out about even
// (4 + 1 on avx512), 6 a sixth faster on tiles, 16 1.9x.
constexpr int kQ45KTileMinTokens = 6;
// The avx512 table's group kernels, set with the table: [0] Q4_K, [1] Q5_K.
VecDotTileFn g_q45k_group_few_tokens[2] = {nullptr, nullptr};
const Q4KGroup8& low_part(const Q4KGroup8& g) { return g; }
const Q4KGroup8& low_part(const Q5KGroup8& g) { return g.low; }

// Tiles 0-3: sums (count tokens x 8 rows of int32), 4-5: activation codes (count x 32), 6-7: the
// rows' codes (8 four-code positions x 8 rows x 4). One configuration per token count.
const TileConfig& q45k_tile_config(int count) {
  static const auto configs = [] {
    std::array<TileConfig, kGroupTokens + 1> c{};
    for (int n = 1; n <= kGroupTokens; ++n)
      for (int t = 0; t < 8; ++t) {
        c[n].colsb[t] = 32;
        c[n].rows[t] = static_cast<uint8_t>(t < 6 ? n : 8);
      }
    return c;
  }();
  return configs[static_cast<size_t>(count)];
}

// The fifth bits of sub-block s (0-7): bit s of each qh byte moved to bit 4 (16-bit shifts; the
// mask drops what crossed from the neighbouring byte).
inline __m512i fifth_bits_of(__m512i qh, int s) {
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  if (s >= 4) return _mm512_and_si512(_mm512_srli_epi16(qh, static_cast<unsigned>(s - 4)), bit4);
  return _mm512_and_si512(_mm512_slli_epi16(qh, static_cast<unsigned>(4 - s)), bit4);
}
template <int c>
void add_fifth_bits(const Q5KGroup8& g, uint8_t (&codes)[8][256]) {
  for (int q = 0; q < 4; ++q) {
    const __m512i qh = _mm512_loadu_si512(reinterpret_cast<const uint8_t*>(g.qh) + 64 * q);
    uint8_t* lo = codes[2 * c] + 64 * q;
    uint8_t* hi = codes[2 * c + 1] + 64 * q;
    _mm512_store_si512(lo, _mm512_or_si512(_mm512_load_si512(lo), fifth_bits_of(qh, 2 * c)));
    _mm512_store_si512(hi, _mm512_or_si512(_mm512_load_si512(hi), fifth_bits_of(qh, 2 * c + 1)));
  }
}

// 16 lanes from two groups' per-row values (the one-group kernel passes its group twice): 8 bytes
// of each as int32, or 8 fp16 of each as floats; lanes 0-7 the first group's rows.
inline __m512i rows_u8_of(const uint8_t* first8, const uint8_t* second8) {
  uint64_t lo, hi;
  std::memcpy(&lo, first8, 8);
  std::memcpy(&hi, second8, 8);
  return _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo)));
}
inline __m512 rows_fp16_of(const uint8_t* first8, const uint8_t* second8) {
  const __m256i h = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(second8)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(first8)));
  return _mm512_cvtph_ps(h);
}

// The 8 sub-block products of a super-block with four sums in flight (tiles 0-3; operands 4-5 and
// 6-7 alternate): a store waits for its product, so each pair is stored a pair later. PRODUCT(t, a,
// b, s) and STORE(t, s) are the kernel's own (tile numbers must be literals for GCC's intrinsics).
#define MOELITE_EIGHT_SUB_BLOCK_PRODUCTS(PRODUCT, STORE) \
  PRODUCT(0, 4, 6, 0);                                   \
  PRODUCT(1, 5, 7, 1);                                   \
  PRODUCT(2, 4, 6, 2);                                   \
  PRODUCT(3, 5, 7, 3);                                   \
  STORE(0, 0);                                           \
  STORE(1, 1);                                           \
  PRODUCT(0, 4, 6, 4);                                   \
  PRODUCT(1, 5, 7, 5);                                   \
  STORE(2, 2);                                           \
  STORE(3, 3);                                           \
  PRODUCT(2, 4, 6, 6);                                   \
  PRODUCT(3, 5, 7, 7);                                   \
  STORE(0, 4);                                           \
  STORE(1, 5);                                           \
  STORE(2, 6);                                           \
  STORE(3, 7)

// The group kernels' products, on tiles 0-7 as both configure them (0-3 sums, 4-5 activation
// codes, 6-7 the rows' codes): sub-block s's activation codes at qs + 32 s (a_stride apart), its
// rows' codes at codes + s * code_bytes (code_row_bytes a row), its sums to sums + s * sums_step
// (sums_row_bytes a row).
inline void sub_block_products(const uint8_t* qs, size_t a_stride, const uint8_t* codes, size_t code_bytes,
                               int code_row_bytes, int32_t* sums, size_t sums_step, int sums_row_bytes) {
#define MOELITE_Q45K_PRODUCT(t, a, b, s)                            \
  _tile_zero(t);                                                    \
  _tile_loadd(a, qs + 32 * (s), a_stride);                          \
  _tile_loadd(b, codes + (s) * code_bytes, code_row_bytes);         \
  _tile_dpbsud(t, a, b)
#define MOELITE_Q45K_STORE(t, s) _tile_stored(t, sums + (s) * sums_step, sums_row_bytes)
  MOELITE_EIGHT_SUB_BLOCK_PRODUCTS(MOELITE_Q45K_PRODUCT, MOELITE_Q45K_STORE);
#undef MOELITE_Q45K_STORE
#undef MOELITE_Q45K_PRODUCT
}

// One super-block's float part for 16 lanes in interleaved_rows.h's order: acc = fma(d * da,
// isum, acc), accm = fma(dmin * da, msum, accm) (acc and accm 64-byte aligned).
inline void accumulate_q45k(float* acc, float* accm, __m512 d, __m512 dmin, __m512 da, __m512i isum,
                            __m512i msum) {
  const __m512 isum_f = _mm512_cvtepi32_ps(isum), msum_f = _mm512_cvtepi32_ps(msum);
  _mm512_store_ps(acc, _mm512_fmadd_ps(_mm512_mul_ps(d, da), isum_f, _mm512_load_ps(acc)));
  _mm512_store_ps(accm, _mm512_fmadd_ps(_mm512_mul_ps(dmin, da), msum_f, _mm512_load_ps(accm)));
}
// out[r * out_stride + m] = acc - accm of token m, row r ([token][rows] accumulators).
inline void store_q45k_results(float* out, size_t out_stride, const float* acc, const float* accm, int count,
                               int rows) {
  for (int m = 0; m < count; ++m)
    for (int r = 0; r < rows; ++r)
      out[static_cast<size_t>(r) * out_stride + m] = acc[m * rows + r] - accm[m * rows + r];
}

template <bool kFive>
void q45k_group_tiles(int64_t n, float* out, size_t out_stride, const void* group, size_t w_stride,
                      const void* a_rows, size_t a_stride, int count) {
  if (count < kQ45KTileMinTokens) {  // kMultiDot tokens at a time, as the avx512 kernel takes them
    const uint8_t* acts = static_cast<const uint8_t*>(a_rows);
    for (int j = 0; j < count; j += kMultiDot)
      g_q45k_group_few_tokens[kFive](n, out + j, out_stride, group, w_stride, acts + static_cast<size_t>(j) * a_stride,
                                     a_stride, std::min(kMultiDot, count - j));
    return;
  }
  use_config(q45k_tile_config(count));
  using Group = std::conditional_t<kFive, Q5KGroup8, Q4KGroup8>;
  const auto* groups = static_cast<const Group*>(group);
  const uint8_t* a = static_cast<const uint8_t*>(a_rows);
  const auto token = [&](int m) { return a + static_cast<size_t>(m) * a_stride; };
  alignas(64) uint8_t codes[8][256];                   // sub-block s: [position l][row][4 codes]
  // Sub-block s: [token][row], rows of sums for kGroupTokens + 1 tokens (the odd count's partner)
  // rounded up so every sub-block's rows start on a 64-byte line (the two-token loads are aligned).
  constexpr int kSumsStride = (kGroupTokens + 2) * 8;
  static_assert(kSumsStride % 16 == 0, "each sub-block's sums start 64-byte aligned");
  alignas(64) int32_t sums[8][kSumsStride];
  alignas(64) float acc[kGroupTokens * 8], accm[kGroupTokens * 8];  // [token][row]
  std::memset(acc, 0, sizeof acc);
  std::memset(accm, 0, sizeof accm);
  // Tokens are taken two per vector (8 rows each); with an odd count the second of the last pair
  // reads a row of sums no tile writes: zeros, and its results are never stored.
  for (auto& s : sums) std::memset(s + count * 8, 0, 8 * sizeof(int32_t));
  // vpermd indices: lanes 0-7 <- dword s of the first token's group sums, 8-15 <- the second's.
  __m512i pick[8];
  for (int s = 0; s < 8; ++s)
    pick[s] = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8), _mm512_set1_epi32(s));
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const Group& full = groups[i];
    const Q4KGroup8& g = low_part(full);
    for (int c = 0; c < 4; ++c)
      for (int q = 0; q < 4; ++q) {
        const __m512i v = _mm512_loadu_si512(reinterpret_cast<const uint8_t*>(g.qs[c]) + 64 * q);
        _mm512_store_si512(codes[2 * c] + 64 * q, _mm512_and_si512(v, nibble));
        _mm512_store_si512(codes[2 * c + 1] + 64 * q, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
      }
    if constexpr (kFive) {
      add_fifth_bits<0>(full, codes);
      add_fifth_bits<1>(full, codes);
      add_fifth_bits<2>(full, codes);
      add_fifth_bits<3>(full, codes);
    }
    const uint8_t* qs = a + static_cast<size_t>(i) * sizeof(Q8_K) + offsetof(Q8_K, qs);
    sub_block_products(qs, a_stride, codes[0], sizeof codes[0], 32, sums[0], kSumsStride, 32);
    __m512i scale[8], min_twice[8];
    for (int s = 0; s < 8; ++s) {
      scale[s] = rows_u8_of(g.scales[s], g.scales[s]);  // the 8 rows twice: two tokens a vector
      const __m512i mn = rows_u8_of(g.mins[s], g.mins[s]);
      min_twice[s] = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));  // in both 16-bit halves
    }
    const __m512 d = rows_fp16_of(g.d, g.d), dmin = rows_fp16_of(g.dmin, g.dmin);
    const size_t block = static_cast<size_t>(i) * sizeof(Q8_K);
    for (int m = 0; m < count; m += 2) {
      const uint8_t* y0 = token(m) + block;
      const uint8_t* y1 = m + 1 < count ? token(m + 1) + block : y0;
      __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
      // Group sums as 8 dwords per token: dword s = the two 16-bit sums of sub-block s.
      const auto group_sums_of = [](const uint8_t* y) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + offsetof(Q8_K, bsums)));
      };
      const __m512i bsums = _mm512_inserti64x4(_mm512_castsi256_si512(group_sums_of(y0)), group_sums_of(y1), 1);
      for (int s = 0; s < 8; ++s) {
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(sums[s] + m * 8), scale[s]));
        const __m512i group_sums = _mm512_permutexvar_epi32(pick[s], bsums);
        msum = _mm512_add_epi32(msum, _mm512_madd_epi16(min_twice[s], group_sums));
      }
      float da0, da1;
      std::memcpy(&da0, y0, sizeof da0);
      std::memcpy(&da1, y1, sizeof da1);
      const __m512 da = _mm512_insertf32x8(_mm512_set1_ps(da0), _mm256_set1_ps(da1), 1);
      accumulate_q45k(acc + m * 8, accm + m * 8, d, dmin, da, isum, msum);
    }
  }
  store_q45k_results(out, out_stride, acc, accm, count, kGroupRows);
}

// From 5 tokens a call a pair of groups is faster on tiles than through the avx512 kernel
// (bench_kernels mode 4, 256 x 2048 Q4_K rows, in one slow phase of the VM: 4 tokens 6.3-6.7 GB/s
// of weights on tiles against avx512's 5.7-6.3, 5 tokens 6.1-6.2 against 4 + 1 through avx512 at
// about 4.2; 3 tokens 6.7 against 8.9).
constexpr int kQ45KPairTileMinTokens = 5;

// Two adjacent groups per call (RowGroups::dot_pair): their 16 rows side by side in one 8 x 64
// weight operand, so each product is 16 tokens x 16 rows (a product costs the same at 8 or 16
// columns) and the call's fixed costs are paid once for 16 rows. Tiles 0-3: sums (count tokens x
// 16 rows of int32), 4-5: activation codes (count x 32), 6-7: the two groups' codes of a sub-block
// (8 four-code positions x 16 rows x 4). One configuration per token count.
const TileConfig& q45k_pair_tile_config(int count) {
  static const auto configs = [] {
    std::array<TileConfig, kGroupTokens + 1> c{};
    for (int n = 1; n <= kGroupTokens; ++n)
      for (int t = 0; t < 8; ++t) {
        c[n].colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? 32 : 64);
        c[n].rows[t] = static_cast<uint8_t>(t < 6 ? n : 8);
      }
    return c;
  }();
  return configs[static_cast<size_t>(count)];
}

// Sub-block codes of two groups' chunk c (low nibbles: sub-block 2c, high: 2c + 1), with Q5_K's
// fifth bits, into codes[2c] and codes[2c + 1]: row l = the first group's 32 bytes of position l,
// then the second's.
template <bool kFive, class Group>
void unpack_pair_chunk(const Group& first, const Group& second, int c, uint8_t (&codes)[8][8][64]) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  for (int q = 0; q < 4; ++q) {  // positions 2q and 2q + 1
    __m512i lo[2], hi[2];
    const Group* both[2] = {&first, &second};
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(reinterpret_cast<const uint8_t*>(low_part(*both[h]).qs[c]) + 64 * q);
      lo[h] = _mm512_and_si512(v, nibble);
      hi[h] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      if constexpr (kFive) {
        const __m512i qh = _mm512_loadu_si512(reinterpret_cast<const uint8_t*>(both[h]->qh) + 64 * q);
        lo[h] = _mm512_or_si512(lo[h], fifth_bits_of(qh, 2 * c));
        hi[h] = _mm512_or_si512(hi[h], fifth_bits_of(qh, 2 * c + 1));
      }
    }
    // 128-bit lanes 0-1 of each are position 2q, lanes 2-3 position 2q + 1.
    _mm512_store_si512(codes[2 * c][2 * q], _mm512_shuffle_i64x2(lo[0], lo[1], 0x44));
    _mm512_store_si512(codes[2 * c][2 * q + 1], _mm512_shuffle_i64x2(lo[0], lo[1], 0xee));
    _mm512_store_si512(codes[2 * c + 1][2 * q], _mm512_shuffle_i64x2(hi[0], hi[1], 0x44));
    _mm512_store_si512(codes[2 * c + 1][2 * q + 1], _mm512_shuffle_i64x2(hi[0], hi[1], 0xee));
  }
}

template <bool kFive>
void q45k_pair_tiles(int64_t n, float* out, size_t out_stride, const void* group, size_t pair_stride,
                     const void* a_rows, size_t a_stride, int count) {
  const uint8_t* second_group = static_cast<const uint8_t*>(group) + pair_stride;
  if (count < kQ45KPairTileMinTokens) {
    q45k_group_tiles<kFive>(n, out, out_stride, group, 0, a_rows, a_stride, count);
    q45k_group_tiles<kFive>(n, out + kGroupRows * out_stride, out_stride, second_group, 0, a_rows, a_stride, count);
    return;
  }
  use_config(q45k_pair_tile_config(count));
  using Group = std::conditional_t<kFive, Q5KGroup8, Q4KGroup8>;
  const auto* first = static_cast<const Group*>(group);
  const auto* second = reinterpret_cast<const Group*>(second_group);
  const uint8_t* a = static_cast<const uint8_t*>(a_rows);
  alignas(64) uint8_t codes[8][8][64];               // sub-block s: [position l][16 rows][4 codes]
  alignas(64) int32_t sums[8][kGroupTokens * 16];    // sub-block s: [token][16 rows]
  alignas(64) float acc[kGroupTokens * 16], accm[kGroupTokens * 16];  // [token][16 rows]
  std::memset(acc, 0, sizeof acc);
  std::memset(accm, 0, sizeof accm);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const Q4KGroup8& g0 = low_part(first[i]);
    const Q4KGroup8& g1 = low_part(second[i]);
    for (int c = 0; c < 4; ++c) unpack_pair_chunk<kFive>(first[i], second[i], c, codes);
    const uint8_t* qs = a + static_cast<size_t>(i) * sizeof(Q8_K) + offsetof(Q8_K, qs);
    sub_block_products(qs, a_stride, codes[0][0], sizeof codes[0], 64, sums[0], kGroupTokens * 16, 64);
    __m512i scale[8], min_twice[8];
    for (int s = 0; s < 8; ++s) {
      scale[s] = rows_u8_of(g0.scales[s], g1.scales[s]);
      const __m512i mn = rows_u8_of(g0.mins[s], g1.mins[s]);
      min_twice[s] = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));  // in both 16-bit halves
    }
    const __m512 d = rows_fp16_of(g0.d, g1.d), dmin = rows_fp16_of(g0.dmin, g1.dmin);
    const size_t block = static_cast<size_t>(i) * sizeof(Q8_K);
    for (int m = 0; m < count; ++m) {
      const uint8_t* y = a + static_cast<size_t>(m) * a_stride + block;
      __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
      for (int s = 0; s < 8; ++s) {
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(sums[s] + m * 16), scale[s]));
        int32_t group_sums;  // the token's two 16-bit group sums of sub-block s
        std::memcpy(&group_sums, y + offsetof(Q8_K, bsums) + 4 * s, 4);
        msum = _mm512_add_epi32(msum, _mm512_madd_epi16(min_twice[s], _mm512_set1_epi32(group_sums)));
      }
      float da_f;
      std::memcpy(&da_f, y, sizeof da_f);
      const __m512 da = _mm512_set1_ps(da_f);
      accumulate_q45k(acc + m * 16, accm + m * 16, d, dmin, da, isum, msum);
    }
  }
  store_q45k_results(out, out_stride, acc, accm, count, kGroupPairRows);
}

// ---- Q4_K and Q5_K in row layout (expert-store slots) on tiles: the matrix tile ----
//
// Routed experts under a budget live in the store's slots, in the file's row layout, so the group
// kernels above never see them and a budgeted prefill computed its experts on the avx512 row
// kernels (bench model, 25 % budget, 256 tokens: 2.0 s of expert compute against 1.1 s for the
// whole resident prefill). In row layout the roles swap: the weights are TDPBUSD's first
// (unsigned) operand, 16 rows x one sub-block's 32 codes, and each row's codes are contiguous once
// its nibbles are split (no transposition: row r's 32 bytes of a chunk give sub-block 2j's codes in
// the low nibbles and 2j + 1's in the high ones, so they go to two buffers, even and odd
// sub-blocks, 128 codes a row each); the second (signed) operand is the tokens' codes of that
// sub-block in the VNNI layout ([position l][token][4]), packed once per chunk of 16 tokens and
// read for every group of rows. The 16 x 16 int32 results are [row][token], so the integer pass
// takes one row's 16 tokens per vector: scales and mins are broadcasts of the row's own values,
// the Q8_K sums of a sub-block pair one packed vector per pair. The float part is the same
// interleaved_rows.h order as every Q4_K/Q5_K kernel, so each output equals the table's vec_dot.
//
// Packed per super-block: codes [8 sub-blocks][8 positions][16 tokens][4] (4096 bytes), the 16
// tokens' scales (floats), then for each sub-block pair j the tokens' two sub-block sums
// (sum of 2j, sum of 2j + 1) as int16 pairs, one int32 per token (4 x 16). Missing tokens: zeros.
constexpr size_t kQ45KPackedCodes = 8 * 8 * kMatrixTokens * 4;
constexpr size_t kQ45KPackedScales = kQ45KPackedCodes;
constexpr size_t kQ45KPackedSums = kQ45KPackedScales + kMatrixTokens * sizeof(float);
constexpr size_t kQ45KPackedBlock = kQ45KPackedSums + 4 * kMatrixTokens * sizeof(int32_t);
static_assert(kQ45KPackedBlock % 64 == 0, "each packed super-block starts on a line");

// Chunks of fewer tokens take the avx512 row kernels (MatrixTile::min_tokens). bench_kernels mode 5
// (256 x 2048 Q4_K rows, one thread): the tile streams 4.1 GB/s of weights whatever the count (it
// always computes 16 token columns), the avx512 row kernel 5.8 with 4 tokens: even at about 6.
constexpr int kQ45KMatrixMinTokens = 6;

size_t packed_bytes_q45k(int64_t n) { return static_cast<size_t>(n / kQKK) * kQ45KPackedBlock; }

void pack_q45k(const void* a_rows, size_t a_stride, int count, int64_t n, void* out) {
  const auto* a = static_cast<const uint8_t*>(a_rows);
  auto* p = static_cast<uint8_t*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, p += kQ45KPackedBlock) {
    std::memset(p, 0, kQ45KPackedBlock);
    for (int t = 0; t < count; ++t) {
      const auto& y = *reinterpret_cast<const Q8_K*>(a + static_cast<size_t>(t) * a_stride + i * sizeof(Q8_K));
      for (int s = 0; s < 8; ++s)
        for (int l = 0; l < 8; ++l) std::memcpy(p + ((s * 8 + l) * kMatrixTokens + t) * 4, y.qs + 32 * s + 4 * l, 4);
      std::memcpy(p + kQ45KPackedScales + 4 * t, y.d, 4);
      int16_t bsums[16];
      std::memcpy(bsums, y.bsums, sizeof bsums);
      for (int j = 0; j < 4; ++j) {
        // Each sum of 32 codes fits int16 (|code| <= 128).
        const auto even = static_cast<uint16_t>(bsums[4 * j] + bsums[4 * j + 1]);
        const auto odd = static_cast<uint16_t>(bsums[4 * j + 2] + bsums[4 * j + 3]);
        const uint32_t pair = even | static_cast<uint32_t>(odd) << 16;
        std::memcpy(p + kQ45KPackedSums + (j * kMatrixTokens + t) * 4, &pair, 4);
      }
    }
  }
}

// The row-layout matrix kernels' tiles: 0-3 sums (16 rows x 16 tokens of int32), 4-5 the rows'
// codes of one sub-block or group (16 x code_bytes), 6-7 the tokens' codes of it (code_bytes / 4
// positions x 16 tokens x 4). The same for every count: missing tokens were packed as zeros.
TileConfig row_layout_config(int code_bytes) {
  TileConfig t{};
  for (int i = 0; i < 8; ++i) {
    t.colsb[i] = static_cast<uint16_t>(i == 4 || i == 5 ? code_bytes : 64);
    t.rows[i] = static_cast<uint8_t>(i < 6 ? 16 : code_bytes / 4);
  }
  return t;
}
const TileConfig& q45k_matrix_config() {
  static const TileConfig c = row_layout_config(32);  // a sub-block's 32 codes
  return c;
}

// One row's super-block unpacked for the matrix kernel.
struct Q45KRowScales {
  uint8_t scale[8];  // the 6-bit scales of the 8 sub-blocks
  int32_t min_pairs[4];  // mins of sub-blocks 2j and 2j + 1 as two int16 (vpmaddwd's operand)
};
inline Q45KRowScales unpack_row_scales(const uint8_t* packed) {
  const __m128i scales_mins = q4k_scales_mins(packed);  // bytes 0-7 scales, 8-15 mins
  Q45KRowScales r;
  _mm_storel_epi64(reinterpret_cast<__m128i*>(r.scale), scales_mins);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(r.min_pairs), _mm_cvtepu8_epi16(_mm_srli_si128(scales_mins, 8)));
  return r;
}

template <bool kFive>
void q45k_matrix(int64_t n, float* out, size_t out_stride, const void* w_rows, size_t w_stride, const void* packed,
                 int64_t groups, int count) {
  (void)count;  // all 16 token columns are computed (missing tokens packed as zeros)
  use_config(q45k_matrix_config());
  using Block = std::conditional_t<kFive, blocks::Q5_K, blocks::Q4_K>;
  const int64_t nb = n / kQKK;
  const auto* pk = static_cast<const uint8_t*>(packed);
  // Row r's codes of the even sub-blocks (0, 2, 4, 6: 32 each) and of the odd ones.
  alignas(64) uint8_t even[kMatrixRows][128], odd[kMatrixRows][128];
  alignas(64) int32_t sums[8][kMatrixRows * kMatrixTokens];  // sub-block s: [row][token]
  alignas(64) float acc[kMatrixRows][kMatrixTokens], accm[kMatrixRows][kMatrixTokens];
  Q45KRowScales sc[kMatrixRows];
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rows = static_cast<const uint8_t*>(w_rows) + static_cast<size_t>(g) * kMatrixRows * w_stride;
    std::memset(acc, 0, sizeof acc);
    std::memset(accm, 0, sizeof accm);
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t* p = pk + static_cast<size_t>(i) * kQ45KPackedBlock;
      for (int r = 0; r < kMatrixRows; ++r) {
        const Block& b = reinterpret_cast<const Block*>(rows + static_cast<size_t>(r) * w_stride)[i];
        // Q5_K: the row's 32 qh bytes in both halves (each half's codes take their own bit).
        __m512i qh = _mm512_setzero_si512();
        if constexpr (kFive) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
        for (int h = 0; h < 2; ++h) {  // chunks 2h and 2h + 1: sub-blocks 4h, 4h + 2 (low), 4h + 1, 4h + 3 (high)
          const __m512i v = _mm512_loadu_si512(b.qs + 64 * h);
          __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
          if constexpr (kFive) {
            const auto halves = [&](int first, int second) {  // sub-block first's bits, then second's
              return _mm512_mask_blend_epi64(0xf0, fifth_bits_of(qh, first), fifth_bits_of(qh, second));
            };
            lo = _mm512_or_si512(lo, halves(4 * h, 4 * h + 2));
            hi = _mm512_or_si512(hi, halves(4 * h + 1, 4 * h + 3));
          }
          _mm512_store_si512(even[r] + 64 * h, lo);
          _mm512_store_si512(odd[r] + 64 * h, hi);
        }
        sc[r] = unpack_row_scales(b.scales);
      }
      // Sub-block s: the rows' codes at (s even ? even : odd) + 32 (s / 2), 128 bytes a row; the
      // tokens' at p + 512 s.
#define MOELITE_Q45K_MATRIX_PRODUCT(t, a, b, s)                                        \
  _tile_zero(t);                                                                       \
  _tile_loadd(a, ((s) % 2 ? odd[0] : even[0]) + 32 * ((s) / 2), 128);                 \
  _tile_loadd(b, p + (s) * (8 * kMatrixTokens * 4), kMatrixTokens * 4);               \
  _tile_dpbusd(t, a, b)
#define MOELITE_Q45K_MATRIX_STORE(t, s) _tile_stored(t, sums[s], kMatrixTokens * 4)
      MOELITE_EIGHT_SUB_BLOCK_PRODUCTS(MOELITE_Q45K_MATRIX_PRODUCT, MOELITE_Q45K_MATRIX_STORE);
#undef MOELITE_Q45K_MATRIX_STORE
#undef MOELITE_Q45K_MATRIX_PRODUCT
      const __m512 da = _mm512_loadu_ps(reinterpret_cast<const float*>(p + kQ45KPackedScales));
      __m512i pair_sums[4];
      for (int j = 0; j < 4; ++j)
        pair_sums[j] = _mm512_loadu_si512(p + kQ45KPackedSums + static_cast<size_t>(j) * kMatrixTokens * 4);
      for (int r = 0; r < kMatrixRows; ++r) {
        const Block& b = reinterpret_cast<const Block*>(rows + static_cast<size_t>(r) * w_stride)[i];
        __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s)
          isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(sums[s] + r * kMatrixTokens),
                                                           _mm512_set1_epi32(sc[r].scale[s])));
        for (int j = 0; j < 4; ++j)
          msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_set1_epi32(sc[r].min_pairs[j]), pair_sums[j]));
        const __m512 d = _mm512_set1_ps(fp16(b.d)), dmin = _mm512_set1_ps(fp16(b.dmin));
        accumulate_q45k(acc[r], accm[r], d, dmin, da, isum, msum);
      }
    }
    for (int r = 0; r < kMatrixRows; ++r)
      _mm512_storeu_ps(out + (static_cast<size_t>(g) * kMatrixRows + r) * out_stride,
                       _mm512_sub_ps(_mm512_load_ps(acc[r]), _mm512_load_ps(accm[r])));
  }
}

// ---- Q3_K and Q6_K ---------------------------------------------------------------------------
//
// These have no grouped layout, so one matrix tile per type serves every such weight in batches
// (dense ones, resident experts and the store's slots alike). Their 16 groups of 16 codes have
// signed 8-bit scales (x86_k16.h), applied after the integer products: one TDPBSSD per group, the
// first operand 16 rows x the group's 16 codes (stored + kBias, unpacked once per super-block as
// signed code - kBias, so no bsums correction), the second the tokens' 16 codes of that group in the
// VNNI layout ([position l][token][4], packed once per chunk of 16 tokens). The [row][token]
// results are scaled with one row's 16 tokens per vector, exact in int32 (|sum| <= 16 x 16 x 32 x
// 128 x 128).
//
// The float part is the scalar reference's: s = s + (d * d_a) * sum, super-block after super-block
// (no fused multiply-add). The avx2/avx512 kernels keep float lanes across super-blocks instead,
// which a tile cannot reproduce; so this table's vec_dot (decode) and multi-dot for both types sum
// each super-block exactly too (the avx512 Q6_K kernel's integer lanes, reduced), and batched and
// token-by-token evaluation stay equal, to each other and to the scalar table.

// The totals of four vectors of 16 int32 lanes, side by side (exact integers): 128-bit quarters of
// two vectors added, then of all four (quarter j: vector j's four partial sums), then each
// quarter's lanes. A third of the operations of four separate reductions.
inline __m128i four_totals(const __m512i (&v)[4]) {
  const auto fold = [](__m512i a, __m512i b) {  // [a q0+q2, a q1+q3, b q0+q2, b q1+q3]
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xee));
  };
  const __m512i f01 = fold(v[0], v[1]), f23 = fold(v[2], v[3]);
  __m512i f = _mm512_add_epi32(_mm512_shuffle_i64x2(f01, f23, 0x88), _mm512_shuffle_i64x2(f01, f23, 0xdd));
  f = _mm512_add_epi32(f, _mm512_shuffle_epi32(f, _MM_PERM_BADC));
  f = _mm512_add_epi32(f, _mm512_shuffle_epi32(f, _MM_PERM_CDAB));
  return _mm512_castsi512_si128(
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), f));
}

inline float q8k_scale(const Q8_K& b) {
  float d;
  std::memcpy(&d, b.d, 4);
  return d;
}

// A super-block's term in the scalar order: (d * d_a) * sum, less (dmin * d_a) * min_sum for Q2_K.
template <class Format>
inline float fp16_dmin(const typename Format::Block& x) {
  if constexpr (Format::kMins) return fp16(x.dmin);
  return 0.0f;
}

// One token: four super-blocks' sums reduced together, their terms then added in order.
template <class Format>
inline float dot_k16_block_sums(int64_t n, const typename Format::Block* x, const Q8_K* y) {
  const int64_t nb = n / kQKK;
  float s = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    __m512i lanes[4], min_lanes[4];
    float scale[4], min_scale[4];
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      prefetch_row_ahead(x + i + b);
      const K16Decoded q = k16_decode<Format>(x[i + b]);
      lanes[b] = k16_block_lanes<Format>(q, y[i + b]);
      scale[b] = fp16(x[i + b].d) * q8k_scale(y[i + b]);
      if constexpr (Format::kMins) {
        min_lanes[b] = k16_min_lanes(q, y[i + b]);
        min_scale[b] = fp16_dmin<Format>(x[i + b]) * q8k_scale(y[i + b]);
      }
    }
    // (Vectors built from registers: four scalar stores read back as one vector would stall on
    // store forwarding.)
    __m128 terms = _mm_mul_ps(_mm_setr_ps(scale[0], scale[1], scale[2], scale[3]), _mm_cvtepi32_ps(four_totals(lanes)));
    if constexpr (Format::kMins)
      terms = _mm_sub_ps(terms, _mm_mul_ps(_mm_setr_ps(min_scale[0], min_scale[1], min_scale[2], min_scale[3]),
                                           _mm_cvtepi32_ps(four_totals(min_lanes))));
    alignas(16) float term[4];
    _mm_store_ps(term, terms);
    for (int b = 0; b < 4; ++b) s = s + term[b];
  }
  for (; i < nb; ++i) {
    prefetch_row_ahead(x + i);
    const K16Decoded q = k16_decode<Format>(x[i]);
    const float da = q8k_scale(y[i]);
    const float term =
        (fp16(x[i].d) * da) * static_cast<float>(_mm512_reduce_add_epi32(k16_block_lanes<Format>(q, y[i])));
    if constexpr (Format::kMins)
      s = s +
          (term - (fp16_dmin<Format>(x[i]) * da) * static_cast<float>(_mm512_reduce_add_epi32(k16_min_lanes(q, y[i]))));
    else
      s = s + term;
  }
  return s;
}

// vec_dot and multi-dot: one token through dot_k16_block_sums; two to four with each super-block
// decoded once and the tokens' sums reduced together.
template <class Format>
struct DotK16BlockSums {
  template <int K>
  struct Rows {
    static_assert(K <= 4, "the tokens' sums share one 128-bit vector");
    static void run(int64_t n, float* out, const void* w, const void* a, size_t stride) {
      const auto* x = static_cast<const typename Format::Block*>(w);
      if constexpr (K == 1) {
        out[0] = dot_k16_block_sums<Format>(n, x, act_row<Q8_K>(a, stride, 0));
        return;
      }
      const Q8_K* y[K];
      for (int j = 0; j < K; ++j) y[j] = act_row<Q8_K>(a, stride, j);
      __m128 s = _mm_setzero_ps();  // lane j: token j's sum
      for (int64_t i = 0; i < n / kQKK; ++i) {
        prefetch_row_ahead(x + i);
        const K16Decoded q = k16_decode<Format>(x[i]);
        __m512i lanes[4], min_lanes[4];
        float da[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
        for (int j = 0; j < K; ++j) {
          lanes[j] = k16_block_lanes<Format>(q, y[j][i]);
          if constexpr (Format::kMins) min_lanes[j] = k16_min_lanes(q, y[j][i]);
          da[j] = q8k_scale(y[j][i]);
        }
        for (int j = K; j < 4; ++j) lanes[j] = min_lanes[j] = _mm512_setzero_si512();
        // s + ((d * d_a) * sum [- (dmin * d_a) * min_sum]) in every lane: the scalar reference's operations.
        const __m128 da4 = _mm_setr_ps(da[0], da[1], da[2], da[3]);
        __m128 term = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(fp16(x[i].d)), da4), _mm_cvtepi32_ps(four_totals(lanes)));
        if constexpr (Format::kMins)
          term = _mm_sub_ps(term, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(fp16_dmin<Format>(x[i])), da4),
                                             _mm_cvtepi32_ps(four_totals(min_lanes))));
        s = _mm_add_ps(s, term);
      }
      alignas(16) float r[4];
      _mm_store_ps(r, s);
      for (int j = 0; j < K; ++j) out[j] = r[j];
    }
  };
};

// Packed per super-block: codes [16 groups][4 positions][16 tokens][4] (4096 bytes), the 16 tokens'
// scales (floats), and for Q2_K (kMins) each group pair j's two sums per token as int16 pairs
// (8 x 16 int32). Missing tokens: zeros.
constexpr size_t kK16PackedCodes = 16 * 4 * kMatrixTokens * 4;
constexpr size_t kK16PackedSums = kK16PackedCodes + kMatrixTokens * sizeof(float);
template <bool kMins>
constexpr size_t kK16PackedBlock = kK16PackedSums + (kMins ? 8 * kMatrixTokens * sizeof(int32_t) : 0);
static_assert(kK16PackedBlock<false> % 64 == 0 && kK16PackedBlock<true> % 64 == 0,
              "each packed super-block starts on a line");

// Chunks of fewer tokens take the table's row kernels (MatrixTile::min_tokens). bench_kernels (256 x
// 2048 Q6_K rows, one thread, GB/s of weights per call): the tile 7.5 at any count (mode 5), this
// table's multi-dot 10.5 with 4 tokens (mode 2), its vec_dot 21 (mode 0): 4 + 1 tokens come out
// even, 6 a sixth faster on the tile, 16 2.9x. (At times the VM measured ran the tiles at half
// that speed, the vector kernels not: the physical core's AMX unit is shared with its sibling.)
constexpr int kK16MatrixMinTokens = 6;

template <bool kMins>
size_t packed_bytes_k16(int64_t n) {
  return static_cast<size_t>(n / kQKK) * kK16PackedBlock<kMins>;
}

template <bool kMins>
void pack_k16(const void* a_rows, size_t a_stride, int count, int64_t n, void* out) {
  const auto* a = static_cast<const uint8_t*>(a_rows);
  auto* p = static_cast<uint8_t*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, p += kK16PackedBlock<kMins>) {
    std::memset(p, 0, kK16PackedBlock<kMins>);
    for (int t = 0; t < count; ++t) {
      const auto& y = *reinterpret_cast<const Q8_K*>(a + static_cast<size_t>(t) * a_stride + i * sizeof(Q8_K));
      for (int g = 0; g < 16; ++g)
        for (int l = 0; l < 4; ++l) std::memcpy(p + ((g * 4 + l) * kMatrixTokens + t) * 4, y.qs + 16 * g + 4 * l, 4);
      std::memcpy(p + kK16PackedCodes + 4 * t, y.d, 4);
      if constexpr (kMins)  // bsums 2j and 2j + 1 side by side: one int32 per token
        for (int j = 0; j < 8; ++j) std::memcpy(p + kK16PackedSums + (j * kMatrixTokens + t) * 4, y.bsums + 4 * j, 4);
    }
  }
}

const TileConfig& k16_matrix_config() {
  static const TileConfig c = row_layout_config(16);  // a group's 16 codes
  return c;
}

template <class Format>
void k16_matrix(int64_t n, float* out, size_t out_stride, const void* w_rows, size_t w_stride, const void* packed,
                int64_t groups, int count) {
  (void)count;  // all 16 token columns are computed (missing tokens packed as zeros)
  use_config(k16_matrix_config());
  using Block = typename Format::Block;
  const int64_t nb = n / kQKK;
  const auto* pk = static_cast<const uint8_t*>(packed);
  alignas(64) int8_t codes[kMatrixRows][kQKK];  // row r's codes - kBias, in element order
  alignas(64) int32_t scales[kMatrixRows][16];
  // Q2_K: the mins of groups 2j and 2j + 1 as two int16.
  alignas(64) int32_t min_pairs[kMatrixRows][8];
  alignas(64) int32_t sums[16][kMatrixRows * kMatrixTokens];  // group g: [row][token]
  alignas(64) float acc[kMatrixRows][kMatrixTokens];
  const __m512i bias = _mm512_set1_epi8(Format::kBias);
  for (int64_t grp = 0; grp < groups; ++grp) {
    const uint8_t* rows = static_cast<const uint8_t*>(w_rows) + static_cast<size_t>(grp) * kMatrixRows * w_stride;
    std::memset(acc, 0, sizeof acc);
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t* p = pk + static_cast<size_t>(i) * kK16PackedBlock<Format::kMins>;
      for (int r = 0; r < kMatrixRows; ++r) {
        const Block& b = reinterpret_cast<const Block*>(rows + static_cast<size_t>(r) * w_stride)[i];
        __m512i q[4];
        Format::codes(b, q);
        for (int c = 0; c < 4; ++c) _mm512_store_si512(codes[r] + 64 * c, _mm512_sub_epi8(q[c], bias));
        _mm512_store_si512(scales[r], _mm512_cvtepi8_epi32(Format::scale_bytes(b)));
        if constexpr (Format::kMins)
          _mm256_store_si256(reinterpret_cast<__m256i*>(min_pairs[r]), _mm256_cvtepu8_epi16(Format::min_bytes(b)));
      }
      // Group g (0-15): the rows' codes at codes + 16 g (kQKK bytes a row), the tokens' at p + 256 g.
      for (int half = 0; half < 2; ++half) {
#define MOELITE_K16_PRODUCT(t, a, b, s)                                              \
  _tile_zero(t);                                                                     \
  _tile_loadd(a, codes[0] + 16 * (8 * half + (s)), kQKK);                            \
  _tile_loadd(b, p + (8 * half + (s)) * (4 * kMatrixTokens * 4), kMatrixTokens * 4); \
  _tile_dpbssd(t, a, b)
#define MOELITE_K16_STORE(t, s) _tile_stored(t, sums[8 * half + (s)], kMatrixTokens * 4)
        MOELITE_EIGHT_SUB_BLOCK_PRODUCTS(MOELITE_K16_PRODUCT, MOELITE_K16_STORE);
#undef MOELITE_K16_STORE
#undef MOELITE_K16_PRODUCT
      }
      const __m512 da = _mm512_loadu_ps(reinterpret_cast<const float*>(p + kK16PackedCodes));
      for (int r = 0; r < kMatrixRows; ++r) {
        const Block& b = reinterpret_cast<const Block*>(rows + static_cast<size_t>(r) * w_stride)[i];
        __m512i isum = _mm512_setzero_si512();
        for (int g = 0; g < 16; ++g)
          isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(sums[g] + r * kMatrixTokens),
                                                           _mm512_set1_epi32(scales[r][g])));
        __m512 term = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(fp16(b.d)), da), _mm512_cvtepi32_ps(isum));
        if constexpr (Format::kMins) {
          __m512i msum = _mm512_setzero_si512();
          for (int j = 0; j < 8; ++j)
            msum = _mm512_add_epi32(msum,
                                    _mm512_madd_epi16(_mm512_set1_epi32(min_pairs[r][j]),
                                                      _mm512_loadu_si512(p + kK16PackedSums + j * kMatrixTokens * 4)));
          term = _mm512_sub_ps(
              term, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(fp16_dmin<Format>(b)), da), _mm512_cvtepi32_ps(msum)));
        }
        _mm512_store_ps(acc[r], _mm512_add_ps(_mm512_load_ps(acc[r]), term));
      }
    }
    for (int r = 0; r < kMatrixRows; ++r)
      _mm512_storeu_ps(out + (static_cast<size_t>(grp) * kMatrixRows + r) * out_stride, _mm512_load_ps(acc[r]));
  }
}

template <class Format>
void set_k16(KernelTable& t, TensorType type) {
  using Rows = DotK16BlockSums<Format>;
  set_vec_dot<dot_one<Rows::template Rows>>(t, type, dot_multi<Rows::template Rows>);
  set_matrix(t, type,
             {pack_k16<Format::kMins>, packed_bytes_k16<Format::kMins>, k16_matrix<Format>, kK16MatrixMinTokens});
}

KernelTable make_table(const KernelTable& base) {
  KernelTable t = base;
  t.isa = "amx";
  set_vec_dot<dot_q8_0>(t, TensorType::Q8_0);
  set_matrix(t, TensorType::Q8_0, {pack_q8_0, packed_bytes_q8_0, matrix_q8_0});
  // Q4_K and Q5_K keep the avx512 layout and kernels; their group kernels run batches on tiles.
  for (const bool five : {false, true}) {
    const TensorType type = five ? TensorType::Q5_K : TensorType::Q4_K;
    RowGroups groups = base.groups[static_cast<uint32_t>(type)];
    if (!groups.dot) continue;
    g_q45k_group_few_tokens[five] = groups.dot;
    groups.dot = five ? q45k_group_tiles<true> : q45k_group_tiles<false>;
    groups.dot_pair = five ? q45k_pair_tiles<true> : q45k_pair_tiles<false>;
    groups.max_count = kGroupTokens;
    set_groups(t, type, groups);
    // Weights in row layout (expert-store slots; no grouped copy) in batches: the matrix tile.
    set_matrix(t, type, {pack_q45k, packed_bytes_q45k, five ? q45k_matrix<true> : q45k_matrix<false>,
                         kQ45KMatrixMinTokens});
  }
  set_k16<Q2KFormat>(t, TensorType::Q2_K);
  set_k16<Q3KFormat>(t, TensorType::Q3_K);
  set_k16<Q6KFormat>(t, TensorType::Q6_K);
  return t;
}

}  // namespace

// Called only once the CPU is known to have AMX-INT8, the OS's grant of the tile data and the
// avx512 table's instructions (quant_dispatch.cpp checks).
const KernelTable* amx_table() {
  static const KernelTable table = make_table(*avx512_table());
  return &table;
}

}  // namespace moelite::cpu
