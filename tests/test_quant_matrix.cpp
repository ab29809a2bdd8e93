// The matrix tile (Intel AMX, quant.h's MatrixTile) against the scalar reference, bit for bit: the
// amx table sums each Q8_0 block exactly and adds the scaled blocks in the scalar order, so its
// vec_dot and its 16 x 16 tile must equal kernels_scalar()'s dot for every (row, token), at every
// token count, row length and stride. Skipped (with the reason) on CPUs without AMX-INT8 or where
// the OS does not grant the tile state; the dispatch and presence checks run everywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/interleaved_rows.h"
#include "backends/cpu/quant.h"
#include "platforms/platform.h"
#include "tests/random_weights.h"

namespace moelite::cpu {
namespace {

constexpr uint32_t tid(TensorType t) { return static_cast<uint32_t>(t); }

// Activations spread over a wide range, some rows with a large outlier (a small scale for the rest
// of their blocks), quantized by the scalar table.
std::vector<uint8_t> random_q8_0_row(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = nd(rng);
  if (rng() % 3 == 0) x[rng() % x.size()] = 50.0f;
  std::vector<uint8_t> q(activation_row_bytes(TensorType::Q8_0, n));
  kernels_scalar().quantize_act[tid(TensorType::Q8_0)](x.data(), q.data(), n);
  return q;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Packs the tokens at every count 1..16 (into an unaligned buffer), runs the tile over `groups`
// groups of 16 rows and checks each output bitwise against want[row * kMatrixTokens + token], and
// that no column past kMatrixTokens is written (the tile may write meaningless ones up to it).
void check_tile_at_every_count(const MatrixTile& m, int64_t n, const uint8_t* w0, size_t w_stride, const uint8_t* a0,
                               size_t a_stride, int groups, const std::vector<float>& want, int* checked) {
  const int rows = groups * kMatrixRows;
  std::vector<uint8_t> packed(m.packed_bytes(n) + 64);
  for (int count = 1; count <= kMatrixTokens; ++count) {
    m.pack(a0, a_stride, count, n, packed.data() + 1);
    constexpr size_t kOutStride = kMatrixTokens + 3;
    std::vector<float> got(rows * kOutStride, -1234.5f);
    m.dot(n, got.data(), kOutStride, w0, w_stride, packed.data() + 1, groups, count);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < count; ++j) {
        const float expect = want[r * kMatrixTokens + j];
        ASSERT_EQ(bits(got[r * kOutStride + j]), bits(expect))
            << "count " << count << " row " << r << " token " << j << ": " << got[r * kOutStride + j] << " vs "
            << expect;
        ++*checked;
      }
      for (size_t j = kMatrixTokens; j < kOutStride; ++j)
        ASSERT_EQ(got[r * kOutStride + j], -1234.5f) << "wrote past the tile in row " << r;
    }
  }
}

TEST(QuantKernelsMatrix, AmxTableWhereTheCpuAndOsHaveIt) {
  const platform::CpuFeatures& f = platform::cpu_features();
  EXPECT_EQ(kernels_amx() != nullptr, f.amx_int8 && kernels_avx512() != nullptr);
  if (kernels_amx()) {
    EXPECT_STREQ(kernels_capped(nullptr).isa, "amx");
    EXPECT_STREQ(kernels_capped("amx").isa, "amx");
    EXPECT_STREQ(kernels_capped("avx512").isa, "avx512");  // the cap still reaches the VNNI table
  }
  std::printf("AMX-INT8 usable: %s\n", f.amx_int8 ? "yes" : "no");
}

// Only the amx table has a matrix tile: for Q8_0, Q4_K and Q5_K in row layout, Q2_K, Q3_K and Q6_K,
// with all three entries.
TEST(QuantKernelsMatrix, PresentOnlyWhereExpected) {
  std::vector<const KernelTable*> tables{&kernels_scalar()};
  for (const KernelTable* t : {kernels_avx2(), kernels_avxvnni(), kernels_avx512(), kernels_amx(), kernels_neon(),
                               kernels_dotprod(), kernels_i8mm()})
    if (t) tables.push_back(t);
  for (const KernelTable* k : tables)
    for (uint32_t i = 0; i < kTensorTypeIdLimit; ++i) {
      const MatrixTile& m = k->matrix[i];
      const bool expected = std::string(k->isa) == "amx" &&
                            (i == tid(TensorType::Q8_0) || i == tid(TensorType::Q4_K) || i == tid(TensorType::Q5_K) ||
                             i == tid(TensorType::Q2_K) || i == tid(TensorType::Q3_K) || i == tid(TensorType::Q6_K));
      EXPECT_EQ(m.dot != nullptr, expected) << k->isa << " type " << i;
      EXPECT_EQ(m.pack != nullptr, expected) << k->isa << " type " << i;
      EXPECT_EQ(m.packed_bytes != nullptr, expected) << k->isa << " type " << i;
    }
}

// Activations for the K-quants (Q8_K), quantized by the scalar table: normal values, or every
// value +1 / -1 (all codes +127 / -127) for the rows given.
std::vector<uint8_t> random_q8_k_row(int64_t n, std::mt19937& rng, float fill = 0.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = fill != 0.0f ? fill : nd(rng);
  std::vector<uint8_t> q(activation_row_bytes(TensorType::Q6_K, n));
  kernels_scalar().quantize_act[tid(TensorType::Q8_K)](x.data(), q.data(), n);
  return q;
}

// A tile's kMatrixTokens tokens for the K-quant tests: Q8_K rows a_stride apart after `off` bytes,
// random except token 2 (every code +127) and token 9 (every code -127).
std::vector<uint8_t> q8_k_token_rows(int64_t n, std::mt19937& rng, size_t off, size_t a_stride) {
  std::vector<uint8_t> rows(off + a_stride * kMatrixTokens);
  for (int j = 0; j < kMatrixTokens; ++j) {
    const auto a = random_q8_k_row(n, rng, j == 2 ? 1.0f : j == 9 ? -1.0f : 0.0f);
    std::memcpy(rows.data() + off + j * a_stride, a.data(), a.size());
  }
  return rows;
}

// Q8_0, Q2_K, Q3_K and Q6_K: the amx table sums each block (super-block) exactly and adds them in
// the scalar order, for its tiles.
TEST(QuantKernelsMatrix, AmxVecDotIsTheScalarDotBitwise) {
  const KernelTable* k = kernels_amx();
  if (!k) GTEST_SKIP() << "no AMX-INT8 here (or the OS does not grant the tile state)";
  const KernelTable& ref = kernels_scalar();
  std::mt19937 rng(7);
  int checked = 0;
  for (const TensorType t : {TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K, TensorType::Q6_K}) {
    const bool q8 = t == TensorType::Q8_0;
    for (int64_t n : {32, 64, 96, 128, 160, 224, 256, 512, 768, 1024, 1280, 1792, 2048, 2080, 4096}) {
      if (n % type_info(tid(t))->block_size) continue;
      for (int rep = 0; rep < 8; ++rep) {
        const auto w = test::random_weights(t, n, rng);
        const auto a = q8 ? random_q8_0_row(n, rng) : random_q8_k_row(n, rng);
        float expect = 0, got = 0;
        ref.vec_dot[tid(t)](n, &expect, w.data(), a.data());
        k->vec_dot[tid(t)](n, &got, w.data(), a.data());
        ASSERT_EQ(bits(got), bits(expect))
            << "type " << tid(t) << " n=" << n << " rep " << rep << ": " << got << " vs " << expect;
        ++checked;
      }
    }
  }
  std::printf("amx vec_dot: %d rows equal the scalar dot bitwise\n", checked);
}

// Two groups of 16 weight rows in one call, w_stride apart (more than a row: rows of a larger
// matrix, unaligned), tokens a_stride apart; every count 1..16; rows with the extreme codes -128,
// 127 and -127 and a block of scale 0 among the random ones. Meaningless values in the columns
// from `count` to 16 are allowed (the contract), nothing past them.
TEST(QuantKernelsMatrix, TileIsTheScalarDotBitwise) {
  const KernelTable* k = kernels_amx();
  if (!k) GTEST_SKIP() << "no AMX-INT8 here (or the OS does not grant the tile state)";
  const KernelTable& ref = kernels_scalar();
  const TensorType t = TensorType::Q8_0;
  const MatrixTile& m = k->matrix[tid(t)];
  ASSERT_NE(m.dot, nullptr);
  std::mt19937 rng(11);
  int checked = 0;
  for (int64_t n : {32, 64, 96, 2048, 2080}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const size_t wb = test::weight_row_bytes(t, n), w_stride = wb + 6, off = 3;
    constexpr int kGroups = 2, kRows = kGroups * kMatrixRows;
    std::vector<uint8_t> w_buf(off + w_stride * kRows, 0x5A);
    for (int r = 0; r < kRows; ++r) {
      auto w = test::random_weights(t, n, rng);
      auto* blk = reinterpret_cast<blocks::Q8_0*>(w.data());
      if (r == 3) std::memset(blk[0].qs, 0x80, 32);  // all -128
      if (r == 4) std::memset(blk[n / 32 - 1].qs, 0x7f, 32);
      if (r == 5) std::memset(blk[0].d, 0, 2);  // a block of scale 0
      if (r == 20) std::memset(blk[0].qs, 0x81, 32);  // all -127, in the second group
      std::memcpy(w_buf.data() + off + r * w_stride, w.data(), wb);
    }
    const size_t ab = activation_row_bytes(t, n), a_stride = ab + 2;
    std::vector<uint8_t> a_buf(off + a_stride * kMatrixTokens);
    for (int j = 0; j < kMatrixTokens; ++j) {
      const auto a = random_q8_0_row(n, rng);
      std::memcpy(a_buf.data() + off + j * a_stride, a.data(), ab);
    }
    const uint8_t* w0 = w_buf.data() + off;
    const uint8_t* a0 = a_buf.data() + off;
    std::vector<float> want(kRows * kMatrixTokens);
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kMatrixTokens; ++j)
        ref.vec_dot[tid(t)](n, &want[r * kMatrixTokens + j], w0 + r * w_stride, a0 + j * a_stride);
    check_tile_at_every_count(m, n, w0, w_stride, a0, a_stride, kGroups, want, &checked);
    if (HasFatalFailure()) return;
  }
  std::printf("amx matrix tile: %d outputs equal the scalar dot bitwise\n", checked);
}

// Q4_K and Q5_K weights in row layout (expert-store slots) on tiles: every output equals the amx
// table's vec_dot of that row (the avx512 kernel, which the group kernels also equal) and the
// readable reference of interleaved_rows.h's order (the rows regrouped by eight), bit for bit. Three
// groups of 16 rows w_stride apart at an odd address; every count 1..16 (below min_tokens the
// drivers do not call the tile, but the kernel must still be right); code fills that reach the
// extremes (all 0x00, 0xFF: codes 0 and 15, with Q5_K's fifth bits all set or clear) and
// activation rows of all +127 / all -127 among the random ones.
TEST(QuantKernelsMatrix, KQuantTileInRowLayoutIsTheTablesVecDotBitwise) {
  const KernelTable* k = kernels_amx();
  if (!k) GTEST_SKIP() << "no AMX-INT8 here (or the OS does not grant the tile state)";
  std::mt19937 rng(23);
  int checked = 0;
  for (const TensorType t : {TensorType::Q4_K, TensorType::Q5_K}) {
    const MatrixTile& m = k->matrix[tid(t)];
    ASSERT_NE(m.dot, nullptr);
    EXPECT_GT(m.min_tokens, 1);
    const bool five = t == TensorType::Q5_K;
    for (int64_t n : {256, 512, 2048}) {
      SCOPED_TRACE(std::string(five ? "Q5_K" : "Q4_K") + " n=" + std::to_string(n));
      const size_t wb = test::weight_row_bytes(t, n), w_stride = wb + 7, off = 5;
      constexpr int kGroups = 3, kRows = kGroups * kMatrixRows;
      std::vector<uint8_t> w_buf(off + w_stride * kRows, 0x5A);
      const size_t block = five ? sizeof(blocks::Q5_K) : sizeof(blocks::Q4_K);
      const size_t qs_at = five ? offsetof(blocks::Q5_K, qs) : offsetof(blocks::Q4_K, qs);
      for (int r = 0; r < kRows; ++r) {
        auto w = test::random_weights(t, n, rng);
        if (r % 7 == 3 || r % 7 == 5)  // every code 0 or every code 15 (and 31 for Q5_K)
          for (int64_t b = 0; b < n / 256; ++b) {
            std::memset(w.data() + b * block + qs_at, r % 7 == 3 ? 0x00 : 0xFF, 128);
            if (five) std::memset(w.data() + b * block + offsetof(blocks::Q5_K, qh), r % 7 == 3 ? 0x00 : 0xFF, 32);
          }
        std::memcpy(w_buf.data() + off + r * w_stride, w.data(), wb);
      }
      const size_t a_stride = activation_row_bytes(t, n) + 3;
      const std::vector<uint8_t> a_buf = q8_k_token_rows(n, rng, off, a_stride);
      const uint8_t* w0 = w_buf.data() + off;
      const uint8_t* a0 = a_buf.data() + off;
      // The reference: each 8 rows regrouped, through interleaved_rows.h's readable dot.
      std::vector<float> ref(kRows * kMatrixTokens);
      std::vector<uint8_t> group(five ? group_bytes_q5_k(n) : group_bytes_q4_k(n));
      for (int r = 0; r < kRows; r += kGroupRows) {
        (five ? repack_q5_k_group8 : repack_q4_k_group8)(w0 + r * w_stride, w_stride, n, group.data());
        (five ? dot_q5_k_group8_reference : dot_q4_k_group8_reference)(n, ref.data() + r * kMatrixTokens,
                                                                         kMatrixTokens, group.data(), 0, a0, a_stride,
                                                                         kMatrixTokens);
      }
      // The table's vec_dot, which must equal the readable reference too.
      std::vector<float> want(kRows * kMatrixTokens);
      for (int r = 0; r < kRows; ++r)
        for (int j = 0; j < kMatrixTokens; ++j) {
          k->vec_dot[tid(t)](n, &want[r * kMatrixTokens + j], w0 + r * w_stride, a0 + j * a_stride);
          ASSERT_EQ(bits(want[r * kMatrixTokens + j]), bits(ref[r * kMatrixTokens + j]))
              << "row " << r << " token " << j;
        }
      check_tile_at_every_count(m, n, w0, w_stride, a0, a_stride, kGroups, want, &checked);
      if (HasFatalFailure()) return;
    }
  }
  std::printf("amx K-quant matrix tile: %d outputs equal the table's vec_dot bitwise\n", checked);
}

// Q2_K, Q3_K and Q6_K on tiles (every such weight in batches: they have no grouped layout): every
// output equals the scalar table's dot, and the amx table's vec_dot, bit for bit. Three groups of 16
// rows w_stride apart at an odd address; every count 1..16; rows whose codes are all the lowest or
// all the highest (Q2_K 0 / 3, Q3_K -4 / +3, Q6_K -32 / +31), rows with the extreme scales (Q2_K
// scales and mins 0 / 15, Q3_K -32 / 31, Q6_K -128 / 127); activation rows of all +127 and -127.
TEST(QuantKernelsMatrix, SixteenGroupKQuantTilesAreTheScalarDotBitwise) {
  const KernelTable* k = kernels_amx();
  if (!k) GTEST_SKIP() << "no AMX-INT8 here (or the OS does not grant the tile state)";
  const KernelTable& ref = kernels_scalar();
  std::mt19937 rng(29);
  int checked = 0;
  for (const TensorType t : {TensorType::Q2_K, TensorType::Q3_K, TensorType::Q6_K}) {
    const MatrixTile& m = k->matrix[tid(t)];
    ASSERT_NE(m.dot, nullptr);
    EXPECT_GT(m.min_tokens, 1);
    const bool six = t == TensorType::Q6_K;
    for (int64_t n : {256, 1280, 2048}) {  // 1280: four super-blocks at once and one alone
      SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n));
      const size_t wb = test::weight_row_bytes(t, n), w_stride = wb + 7, off = 5;
      constexpr int kGroups = 3, kRows = kGroups * kMatrixRows;
      std::vector<uint8_t> w_buf(off + w_stride * kRows, 0x5A);
      for (int r = 0; r < kRows; ++r) {
        auto w = test::random_weights(t, n, rng);
        for (int64_t b = 0; b < n / 256; ++b) {
          const uint8_t code_fill = r % 7 == 3 ? 0x00 : 0xFF, scale_fill = r % 2 ? 0x00 : 0xFF;
          if (six) {
            auto& blk = reinterpret_cast<blocks::Q6_K*>(w.data())[b];
            if (r % 7 == 3 || r % 7 == 5) {  // every code 0 or every code 63
              std::memset(blk.ql, code_fill, sizeof blk.ql);
              std::memset(blk.qh, code_fill, sizeof blk.qh);
            }
            if (r % 5 == 1) std::memset(blk.scales, r % 2 ? 0x80 : 0x7F, sizeof blk.scales);  // -128 / 127
          } else if (t == TensorType::Q2_K) {
            auto& blk = reinterpret_cast<blocks::Q2_K*>(w.data())[b];
            if (r % 7 == 3 || r % 7 == 5) std::memset(blk.qs, code_fill, sizeof blk.qs);  // every code 0 or 3
            if (r % 5 == 1) std::memset(blk.scales, scale_fill, sizeof blk.scales);       // scales and mins 0 / 15
          } else {
            auto& blk = reinterpret_cast<blocks::Q3_K*>(w.data())[b];
            if (r % 7 == 3 || r % 7 == 5) {  // every code -4 or every code 3
              std::memset(blk.qs, code_fill, sizeof blk.qs);
              std::memset(blk.hmask, code_fill, sizeof blk.hmask);
            }
            if (r % 5 == 1) std::memset(blk.scales, scale_fill, sizeof blk.scales);  // -32 / 31
          }
        }
        std::memcpy(w_buf.data() + off + r * w_stride, w.data(), wb);
      }
      const size_t a_stride = activation_row_bytes(t, n) + 3;
      const std::vector<uint8_t> a_buf = q8_k_token_rows(n, rng, off, a_stride);
      const uint8_t* w0 = w_buf.data() + off;
      const uint8_t* a0 = a_buf.data() + off;
      std::vector<float> want(kRows * kMatrixTokens);
      for (int r = 0; r < kRows; ++r)
        for (int j = 0; j < kMatrixTokens; ++j) {
          float table = 0;
          ref.vec_dot[tid(t)](n, &want[r * kMatrixTokens + j], w0 + r * w_stride, a0 + j * a_stride);
          k->vec_dot[tid(t)](n, &table, w0 + r * w_stride, a0 + j * a_stride);
          ASSERT_EQ(bits(table), bits(want[r * kMatrixTokens + j])) << "row " << r << " token " << j;
        }
      check_tile_at_every_count(m, n, w0, w_stride, a0, a_stride, kGroups, want, &checked);
      if (HasFatalFailure()) return;
    }
  }
  std::printf("amx Q2_K/Q3_K/Q6_K matrix tiles: %d outputs equal the scalar dot bitwise\n", checked);
}

}  // namespace
}  // namespace moelite::cpu
