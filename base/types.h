// Weight/tensor element types as GGUF numbers them (the ggml type ids), with their block layout.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moelite {

// clang-format off: a table of ids, kept compact
enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};
// clang-format on
constexpr uint32_t kTensorTypeIdLimit = 40;  // ids are < this

struct TypeInfo {
  const char* name;      // "Q4_K"; nullptr for ids that are not (or no longer) assigned
  uint32_t block_size;   // elements per block
  uint32_t block_bytes;  // bytes per block
  bool computable;       // moelite has kernels for it as a weight type
};

// Layout of a type id; nullptr for an id that GGUF does not define (ids of removed types too).
const TypeInfo* type_info(uint32_t type_id);
const char* type_name(TensorType t);
// Bytes of `n_elements` elements (must be a multiple of the block size; returns false on a
// non-multiple or on overflow).
bool type_row_bytes(TensorType t, uint64_t n_elements, uint64_t* out_bytes);

}  // namespace moelite
