// Weight-type kernels of the CPU backend: dequantization, activation quantization and fused dot
// products, with a readable scalar reference for each and SIMD versions chosen at runtime.
//
// Dot products consume activations in the weight type's "dot type" (as ggml does):
//   F32, F16, BF16 weights        -> F32 activations (no activation quantization)
//   Q4_0, Q5_0, Q8_0 weights      -> Q8_0 activations (32 int8 + fp16 scale per block)
//   Q4_1, Q5_1 weights            -> Q8_1 activations (32 int8 + fp16 scale + fp16 d*sum)
//   Q2_K..Q6_K weights            -> Q8_K activations (256 int8 + f32 scale + 16 int16 sums)
// Block layouts are bit-exact with GGUF/ggml so weights are used straight from the file.
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/types.h"

namespace moelite::cpu {

// Activation format consumed by dot products against `weight` rows.
TensorType dot_type(TensorType weight);
// Bytes of one activation row of n elements in dot_type(weight) (n a multiple of the block size).
size_t activation_row_bytes(TensorType weight, int64_t n);

// y = dequantized(src), n elements (a multiple of the type's block size).
using DequantRowFn = void (*)(const void* src, float* y, int64_t n);
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

struct KernelTable {
  const char* isa;                                 // "scalar", "avx2", "avx512"
  DequantRowFn dequant[kTensorTypeIdLimit];        // by weight type; nullptr if unsupported
  QuantizeRowFn quantize_act[kTensorTypeIdLimit];  // by dot type (F32, Q8_0, Q8_1, Q8_K)
  VecDotFn vec_dot[kTensorTypeIdLimit];            // by weight type
  VecDotMultiFn vec_dot_multi[kTensorTypeIdLimit]; // by weight type; set wherever vec_dot is
};

// Multi-dot as a loop over one vec_dot: the fallback for types without a blocked kernel.
template <VecDotFn kDot>
void vec_dot_multi_loop(int64_t n, float* out, const void* w_row, const void* a_rows, size_t a_stride, int count) {
  const uint8_t* a = static_cast<const uint8_t*>(a_rows);
  for (int j = 0; j < count; ++j) kDot(n, out + j, w_row, a + static_cast<size_t>(j) * a_stride);
}
// Sets a table's vec_dot and its multi-dot together, so a table can never pair a kernel with
// another table's multi-dot (which would break the bit-identity above).
template <VecDotFn kDot>
void set_vec_dot(KernelTable& t, TensorType type, VecDotMultiFn multi = vec_dot_multi_loop<kDot>) {
  t.vec_dot[static_cast<uint32_t>(type)] = kDot;
  t.vec_dot_multi[static_cast<uint32_t>(type)] = multi;
}

// The readable scalar reference: every other table is tested against it.
const KernelTable& kernels_scalar();
// SIMD tables; nullptr when not compiled in or when this CPU lacks the instructions. Each
// falls back to the scalar entry for any type it does not accelerate (never nullptr where the
// scalar table has a kernel).
const KernelTable* kernels_avx2();
const KernelTable* kernels_avx512();
// Best table for this CPU. The environment variable MOELITE_ISA=scalar|avx2|avx512 caps the
// choice (for testing and benchmarking).
const KernelTable& kernels_best();

// fp16 / bf16 conversions (scalar, exact: round-to-nearest-even for the narrowing ones).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);


// ---- GGUF block layouts (bit-exact with ggml). Every member is a byte array, so the structs have
// alignment 1 and can overlay any byte offset of a mapped file (GGUF rows are not aligned to
// anything larger than 2, and blocks of 34 or 110 bytes follow each other). fp16 fields are read
// with load_fp16() below. Q8_K is an activation format that only moelite produces, in buffers of
// its own; its float scale and int16 sums are still read with memcpy or unaligned loads.
namespace blocks {
constexpr int kQK = 32;    // elements per block of the legacy types
constexpr int kQKK = 256;  // elements per super-block of the K-quants

struct Q4_0 { uint8_t d[2]; uint8_t qs[16]; };  // x = d * (nibble - 8); low nibbles 0..15, high 16..31
struct Q4_1 { uint8_t d[2]; uint8_t m[2]; uint8_t qs[16]; };  // x = d * nibble + m
struct Q5_0 { uint8_t d[2]; uint8_t qh[4]; uint8_t qs[16]; }; // 5th bit j of element j in qh (LE u32)
struct Q5_1 { uint8_t d[2]; uint8_t m[2]; uint8_t qh[4]; uint8_t qs[16]; };
struct Q8_0 { uint8_t d[2]; int8_t qs[32]; };
struct Q8_1 { uint8_t d[2]; uint8_t s[2]; int8_t qs[32]; };    // s = d * sum(qs)
struct Q2_K { uint8_t scales[16]; uint8_t qs[64]; uint8_t d[2]; uint8_t dmin[2]; };
struct Q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint8_t d[2]; };
struct Q4_K { uint8_t d[2]; uint8_t dmin[2]; uint8_t scales[12]; uint8_t qs[128]; };
struct Q5_K { uint8_t d[2]; uint8_t dmin[2]; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct Q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint8_t d[2]; };
struct Q8_K { uint8_t d[4]; int8_t qs[256]; uint8_t bsums[32]; };  // f32 d; int16 sums of 16 qs

static_assert(sizeof(Q4_0) == 18 && sizeof(Q4_1) == 20 && sizeof(Q5_0) == 22 && sizeof(Q5_1) == 24);
static_assert(sizeof(Q8_0) == 34 && sizeof(Q8_1) == 36);
static_assert(sizeof(Q2_K) == 84 && sizeof(Q3_K) == 110 && sizeof(Q4_K) == 144);
static_assert(sizeof(Q5_K) == 176 && sizeof(Q6_K) == 210 && sizeof(Q8_K) == 292);
}  // namespace blocks

// Unpacked K-quant scales, shared by the scalar reference and the SIMD kernels so the bit
// twiddling lives in one place.
// Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12 bytes.
void unpack_scales_q4k(const uint8_t packed[12], uint8_t sc[8], uint8_t mn[8]);
// Q3_K: 16 six-bit scales packed in 12 bytes, returned with the -32 offset applied.
void unpack_scales_q3k(const uint8_t packed[12], int8_t sc[16]);

}  // namespace moelite::cpu
