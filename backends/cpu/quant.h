// Weight-type kernels of the CPU backend: dequantization, activation quantization and fused dot
// products, with a readable scalar reference for each and SIMD versions chosen at runtime.
//
// Dot products consume activations in the weight type's "dot type" (as ggml does):
//   F32, F16, BF16 weights        -> F32 activations (no activation quantization)
//   Q4_0, Q5_0, Q8_0, MXFP4       -> Q8_0 activations (32 int8 + fp16 scale per block)
//   Q4_1, Q5_1 weights            -> Q8_1 activations (32 int8 + fp16 scale + fp16 d*sum)
//   Q2_K..Q6_K weights            -> Q8_K activations (256 int8 + f32 scale + 16 int16 sums)
// Block layouts are bit-exact with GGUF/ggml so weights are used straight from the file.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/interleaved_rows.h"
#include "base/quant_ref.h"
#include "base/types.h"

namespace moelite::cpu {

// Activation format consumed by dot products against `weight` rows.
TensorType dot_type(TensorType weight);
// Bytes of one activation row of n elements in dot_type(weight) (n a multiple of the block size).
size_t activation_row_bytes(TensorType weight, int64_t n);

// dst = quantized(x) in a dot type (Q8_0 / Q8_1 / Q8_K; F32 is a plain copy).
using QuantizeRowFn = void (*)(const float* x, void* dst, int64_t n);
// *out = sum_i w[i] * a[i] over n elements; w one row in the weight type, a in its dot type.
// Quantized activations must come from quantize_act (int8 codes in [-127, 127], consistent Q8_1
// sums and Q8_K bsums): the SIMD kernels rely on both. Rows may start at any byte offset.
using VecDotFn = void (*)(int64_t n, float* out, const void* w_row, const void* a_row);
// out[j] = dot(w_row, a_rows + j * a_stride) for j in [0, count), 1 <= count <= kMultiDot.
// One weight row against several activation rows, so batched products (prefill) decode each
// weight block once instead of once per token. Every table's multi-dot is bit-identical to its
// own vec_dot on each row (same per-row operation sequence; only the weight decoding is shared),
// so batched and token-by-token evaluation give the same logits. a_stride is in bytes.
using VecDotMultiFn = void (*)(int64_t n, float* out, const void* w_row, const void* a_rows, size_t a_stride,
                               int count);
// Activation rows per multi-dot call: 4 weight decodes share the register file with 4 sets of
// accumulators without spilling on AVX-512 (32 registers).
constexpr int kMultiDot = 4;
// Two weight rows against the same activation rows (a "tile"), for ISAs whose int8 instruction
// computes a 2x2 block of dot products (AArch64 SMMLA: rows = 2 weight rows, columns = 2
// activation rows, so every product is wanted):
//   out[r * out_stride + j] = dot(w_rows + r * w_stride, a_rows + j * a_stride)
// for r < kTileRows and j < count, 1 <= count <= kMultiDot. Each output is bit-identical to the
// table's vec_dot of that (weight row, activation row) pair, like multi-dot. w_stride and
// a_stride are in bytes, out_stride in floats. Optional: nullptr where a table has no kernel that
// beats two multi-dots, and then the drivers call vec_dot_multi once per weight row.
using VecDotTileFn = void (*)(int64_t n, float* out, size_t out_stride, const void* w_rows, size_t w_stride,
                              const void* a_rows, size_t a_stride, int count);
constexpr int kTileRows = 2;
// Optional four-row tile (same signature and contract as `tile`, kQuadRows weight rows): where a
// table has one the drivers take rows four at a time, so each activation vector loaded and
// prepared in a call feeds four weight rows (the avx512 Q8_0 kernel).
constexpr int kQuadRows = 4;

// Optional tile over prepared activations, for batched products (prefill): the activation rows
// are first put, once per batch, into a layout of the table's own (prepare), so a tile call does
// only the weight decoding and the multiply-adds; the activation side (shuffles, scale
// spreading, bias sums) is done once per token instead of once per group of weight rows.
//   prepare(a_row, n, out): one activation row in the dot type -> prepared_bytes(n) bytes.
//   tile: the VecDotTileFn contract with `rows` weight rows and prepared activation rows
//     (a_stride apart, in bytes); with rows = 1 (tables without row tiles, e.g. avx2) it is a
//     multi-dot over prepared rows and w_stride is unused. Each output is bit-identical to the
//     table's vec_dot of that weight row and the activation row that was prepared.
using PrepareActFn = void (*)(const void* a_row, int64_t n, void* out);
using PreparedBytesFn = size_t (*)(int64_t n);
struct PreparedTile {
  PrepareActFn prepare = nullptr;
  PreparedBytesFn prepared_bytes = nullptr;
  VecDotTileFn tile = nullptr;  // nullptr: no prepared path for the type
  int rows = 0;                 // weight rows per call: 1 (no tile), kTileRows or kQuadRows
};

// Weight rows interleaved in groups of kGroupRows (interleaved_rows.h), a layout the CPU backend
// makes at load for the weights whose bytes stay put:
//   repack(rows, row_bytes, n, group): kGroupRows rows of n elements, row_bytes apart -> one group
//     of group_bytes(n) bytes;
//   dot: the VecDotTileFn contract over one group (kGroupRows weight rows; w_stride unused), each
//     output bit-identical to the table's vec_dot of that row, so a grouped copy and the file's
//     row bytes give the same results.
using RepackFn = void (*)(const void* rows, size_t row_bytes, int64_t n, void* group);
using GroupBytesFn = size_t (*)(int64_t n);
struct RowGroups {
  RepackFn repack = nullptr;
  GroupBytesFn group_bytes = nullptr;
  VecDotTileFn dot = nullptr;  // nullptr: the type has no grouped layout in this table
  // Activation rows `dot` takes per call: kMultiDot, or up to kGroupTokens where the group kernel
  // runs on matrix tiles (Intel AMX), which want as many tokens per call as there are.
  int max_count = kMultiDot;
  // Optional: two adjacent groups (2 x kGroupRows rows) per call, w_stride the bytes from the first
  // group to the second, the same contract per row as `dot` (out rows 0-7 the first group's, 8-15
  // the second's) and the same max_count; nullptr: one group per call.
  VecDotTileFn dot_pair = nullptr;
};
// The most activation rows any group kernel takes per call (the drivers' output blocks are this
// wide).
constexpr int kGroupTokens = 16;

// Optional matrix tile (Intel AMX): groups of kMatrixRows weight rows (w_stride apart) against up
// to kMatrixTokens activation rows per call, on tile registers. The activation rows are first packed,
// once per chunk of tokens, into the table's own layout (the tile instruction's operand layout),
// and each call then computes the whole kMatrixRows x kMatrixTokens block:
//   pack(a_rows, a_stride, count, n, out): `count` (1..kMatrixTokens) activation rows of n
//     elements in the dot type, a_stride bytes apart -> packed_bytes(n) bytes (missing tokens
//     packed as zeros);
//   dot(n, out, out_stride, w_rows, w_stride, packed, groups, count): out[r * out_stride + j] =
//     dot(weight row r, packed token j) for r < groups * kMatrixRows (rows w_stride apart) and
//     j < count, the count the tokens were packed with; other columns up to kMatrixTokens may be
//     written with meaningless values. Several groups per call: setting the tiles up costs a tenth
//     of a group's work.
// Each output is bit-identical to the table's vec_dot of that pair, like every other entry.
constexpr int kMatrixRows = 16;
constexpr int kMatrixTokens = 16;
using PackActFn = void (*)(const void* a_rows, size_t a_stride, int count, int64_t n, void* out);
using PackedBytesFn = size_t (*)(int64_t n);
using MatrixDotFn = void (*)(int64_t n, float* out, size_t out_stride, const void* w_rows, size_t w_stride,
                             const void* packed, int64_t groups, int count);
struct MatrixTile {
  PackActFn pack = nullptr;
  PackedBytesFn packed_bytes = nullptr;
  MatrixDotFn dot = nullptr;  // nullptr: the type has no matrix tile in this table
  // Chunks of fewer tokens go through the table's multi-dots instead (the same bits): below this
  // the tile's fixed work per group of rows costs more than it saves.
  int min_tokens = 1;
};

struct KernelTable {
  const char* isa;                                  // "scalar", "avx2", "avx512", "amx", "neon", ...
  DequantRowFn dequant[kTensorTypeIdLimit];         // by weight type; nullptr if unsupported
  QuantizeRowFn quantize_act[kTensorTypeIdLimit];   // by dot type (F32, Q8_0, Q8_1, Q8_K)
  VecDotFn vec_dot[kTensorTypeIdLimit];             // by weight type
  VecDotMultiFn vec_dot_multi[kTensorTypeIdLimit];  // by weight type; set wherever vec_dot is
  VecDotTileFn tile[kTensorTypeIdLimit];            // by weight type; nullptr: no tile kernel
  VecDotTileFn tile4[kTensorTypeIdLimit];           // by weight type; nullptr: no four-row tile
  PreparedTile prepared[kTensorTypeIdLimit];        // by weight type; tile == nullptr: none
  RowGroups groups[kTensorTypeIdLimit];             // by weight type; dot == nullptr: none
  MatrixTile matrix[kTensorTypeIdLimit];            // by weight type; dot == nullptr: none
};

// Multi-dot as a loop over one vec_dot: the fallback for types without a blocked kernel.
template <VecDotFn kDot>
void vec_dot_multi_loop(int64_t n, float* out, const void* w_row, const void* a_rows, size_t a_stride, int count) {
  const uint8_t* a = static_cast<const uint8_t*>(a_rows);
  for (int j = 0; j < count; ++j) kDot(n, out + j, w_row, a + static_cast<size_t>(j) * a_stride);
}
// Tile as a loop over one vec_dot: the reference the tests compare tile kernels with. No table
// sets it (the drivers only take the tile path where a table has a real kernel).
template <VecDotFn kDot>
void vec_dot_tile_loop(int64_t n, float* out, size_t out_stride, const void* w_rows, size_t w_stride,
                       const void* a_rows, size_t a_stride, int count) {
  const uint8_t* w = static_cast<const uint8_t*>(w_rows);
  const uint8_t* a = static_cast<const uint8_t*>(a_rows);
  for (int r = 0; r < kTileRows; ++r)
    for (int j = 0; j < count; ++j)
      kDot(n, out + r * out_stride + j, w + r * w_stride, a + static_cast<size_t>(j) * a_stride);
}
// Sets a table's vec_dot, its multi-dot and its tiles (nullptr: none) together, so a table can
// never pair a kernel with another table's multi-dot or tile (which would break the bit-identity
// above), e.g. when it starts as a copy of another table.
template <VecDotFn kDot>
void set_vec_dot(KernelTable& t, TensorType type, VecDotMultiFn multi = vec_dot_multi_loop<kDot>,
                 VecDotTileFn tile = nullptr, VecDotTileFn tile4 = nullptr) {
  t.vec_dot[static_cast<uint32_t>(type)] = kDot;
  t.vec_dot_multi[static_cast<uint32_t>(type)] = multi;
  t.tile[static_cast<uint32_t>(type)] = tile;
  t.tile4[static_cast<uint32_t>(type)] = tile4;
  t.prepared[static_cast<uint32_t>(type)] = PreparedTile{};  // set after its vec_dot (set_prepared)
  t.groups[static_cast<uint32_t>(type)] = RowGroups{};        // likewise (set_groups)
  t.matrix[static_cast<uint32_t>(type)] = MatrixTile{};       // likewise (set_matrix)
}
inline void set_prepared(KernelTable& t, TensorType type, const PreparedTile& prepared) {
  t.prepared[static_cast<uint32_t>(type)] = prepared;
}
inline void set_groups(KernelTable& t, TensorType type, const RowGroups& groups) {
  t.groups[static_cast<uint32_t>(type)] = groups;
}
inline void set_matrix(KernelTable& t, TensorType type, const MatrixTile& matrix) {
  t.matrix[static_cast<uint32_t>(type)] = matrix;
}

// The readable scalar reference: every other table is tested against it.
const KernelTable& kernels_scalar();
// SIMD tables; nullptr when not compiled in or when this CPU lacks the instructions. Each
// falls back to the scalar entry for any type it does not accelerate (never nullptr where the
// scalar table has a kernel).
const KernelTable* kernels_avx2();
const KernelTable* kernels_avx512();
// AVX2 + AVX-VNNI (256-bit vpdpbusd): the avx2 table with its Q8_0, Q4_0 and MXFP4 products on
// vpdpbusd, bit for bit the avx2 table's results. For CPUs with AVX-VNNI and no AVX-512 (Intel
// client cores since Alder Lake); on CPUs with both, avx512 ranks above it.
const KernelTable* kernels_avxvnni();
// The avx512 table with Q8_0 on Intel AMX tiles (AMX-TILE + AMX-INT8, where the OS grants the
// tile state): Q8_0 products, decode included, go through a matrix tile (16 weight rows x up to 16
// tokens per call); every Q8_0 entry of this table sums each block's products exactly and adds the
// scaled blocks in order, as the scalar reference does, so its Q8_0 results are the scalar table's
// bit for bit (and differ from the avx512 table's in the last bits). Other types: the avx512
// kernels.
const KernelTable* kernels_amx();
const KernelTable* kernels_neon();     // AArch64 (ARMv8.0 NEON): always there on AArch64
const KernelTable* kernels_dotprod();  // AArch64 with SDOT (ARMv8.2 dotprod), checked at run time
const KernelTable* kernels_i8mm();     // AArch64 with SMMLA (ARMv8.6 i8mm) and SDOT
// Best table for this CPU: amx > avx512 > avxvnni > avx2 on x86-64, i8mm > dotprod > neon on
// AArch64, else scalar. The environment variable MOELITE_ISA=scalar|avx2|avxvnni|avx512|amx|neon|
// dotprod|i8mm caps the choice (for testing and benchmarking); it is read once.
const KernelTable& kernels_best();
// The best table whose rank is at most that of the ISA named `cap` (ranks: scalar 0, avx2 and
// neon 1, avxvnni 2, avx512 and dotprod 3, amx and i8mm 4); a null or unknown name caps nothing. kernels_best() is
// kernels_capped(option_text(Option::Isa)) (base/options.h).
const KernelTable& kernels_capped(const char* cap);

// The block layouts, conversions and reference dequantizers live in base/ (shared with core and
// every backend); the CPU kernels use them unqualified.
using moelite::DequantRowFn;

}  // namespace moelite::cpu
