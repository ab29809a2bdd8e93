// Weight rows interleaved in groups of eight: a layout of the CPU backend's own, made once at load
// (CpuBackend keeps such copies of the weights whose bytes stay put; see docs/ARCHITECTURE.md,
// "The CPU backend", rows interleaved by eight).
//
// Why: a row kernel spends much of its work per row and super-block on things that are the same
// for every row (the activation's loads, the scale unpacking, fp16 conversions, horizontal sums).
// With eight rows side by side in each vector, one broadcast activation word feeds eight rows, the
// scales arrive unpacked, and each row's result ends in its own float lane.
//
// Exactness: a group kernel must give, for each row, the bits of its table's vec_dot of that row
// (the tables' contract for every grouped entry), so a weight computed from its group copy and one
// computed from its file bytes (an expert-store slot) agree, and exact mode holds at any budget.
// For Q4_K (and Q5_K) that fixes the float work per super-block i of a row:
//   isum = sum over sub-blocks s of scale_s * (sum of code * activation code)   (int32, exact)
//   msum = sum over s of min_s * (bsum_2s + bsum_2s+1)                          (int32, exact)
//   acc  = fma(d * da, float(isum), acc)      accm = fma(dmin * da, float(msum), accm)
// and the result is acc - accm. The references below and the avx2/avx512 Q4_K and Q5_K kernels (row
// and group) all follow it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moelite::cpu {

constexpr int kGroupRows = 8;
// Two adjacent groups: the rows a group kernel that takes a pair (RowGroups::dot_pair) covers per call.
constexpr int kGroupPairRows = 2 * kGroupRows;

// One super-block (256 columns) of eight Q4_K rows. 1184 bytes against 8 x 144 in row layout: the
// 6-bit scales and mins are stored unpacked, one byte each (+2.8 %), so no kernel unpacks them.
struct Q4KGroup8 {
  uint8_t d[2 * kGroupRows], dmin[2 * kGroupRows];  // fp16, row r at 2r
  uint8_t scales[8][kGroupRows];                     // [sub-block][row]
  uint8_t mins[8][kGroupRows];                       // [sub-block][row]
  // [chunk c][lane l][row][t] = byte 32c + 4l + t of the row's qs: chunk c holds sub-block 2c in
  // its low nibbles and 2c + 1 in its high ones, so the 8 lanes of one chunk are one sub-block.
  uint8_t qs[4][8][kGroupRows][4];
};
static_assert(sizeof(Q4KGroup8) == 1184, "Q4KGroup8 has no padding");

// One super-block of eight Q5_K rows: the Q4_K group of their low four bits, d, dmin, scales and
// mins (Q5_K's have Q4_K's meaning), then the fifth bits: qh[l][row][t] = byte 4l + t of the row's
// qh, whose bit 2c is the fifth bit of element 64c + 4l + t and bit 2c + 1 that of element
// 64c + 32 + 4l + t, so one vector per lane serves every chunk. 1440 bytes against 8 x 176 (+2.3 %).
// Its float order is Q4_K's.
struct Q5KGroup8 {
  Q4KGroup8 low;
  uint8_t qh[8][kGroupRows][4];
};
static_assert(sizeof(Q5KGroup8) == 1440, "Q5KGroup8 has no padding");

// Bytes of one group of eight Q4_K rows of n columns (n a multiple of 256).
size_t group_bytes_q4_k(int64_t n);
// Eight Q4_K rows of n columns, row_bytes apart, into one group (group_bytes_q4_k(n) bytes).
void repack_q4_k_group8(const void* rows, size_t row_bytes, int64_t n, void* group);
// The readable reference of a group kernel: out[r * out_stride + j] = row r of the group against
// activation row j (Q8_K rows a_stride bytes apart), r < 8, j < count, in the order the header
// describes. w_stride is unused (the VecDotTileFn signature).
void dot_q4_k_group8_reference(int64_t n, float* out, size_t out_stride, const void* group, size_t w_stride,
                               const void* a_rows, size_t a_stride, int count);

// The same three for Q5_K.
size_t group_bytes_q5_k(int64_t n);
void repack_q5_k_group8(const void* rows, size_t row_bytes, int64_t n, void* group);
void dot_q5_k_group8_reference(int64_t n, float* out, size_t out_stride, const void* group, size_t w_stride,
                               const void* a_rows, size_t a_stride, int count);

}  // namespace moelite::cpu
