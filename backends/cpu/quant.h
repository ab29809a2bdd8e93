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

#include "core/types.h"

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
using VecDotFn = void (*)(int64_t n, float* out, const void* w_row, const void* a_row);

struct KernelTable {
  const char* isa;                                 // "scalar", "avx2", "avx512"
  DequantRowFn dequant[kTensorTypeIdLimit];        // by weight type; nullptr if unsupported
  QuantizeRowFn quantize_act[kTensorTypeIdLimit];  // by dot type (F32, Q8_0, Q8_1, Q8_K)
  VecDotFn vec_dot[kTensorTypeIdLimit];            // by weight type
};

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

}  // namespace moelite::cpu
