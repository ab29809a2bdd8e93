// `moelite pack`: writes a model's packed expert file (core/model/packed_experts.h), and measures
// what compressing experts with zstd would save, per weight type.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "moelite.h"

namespace moelite {

struct Model;

struct PackResult {
  int64_t experts = 0;         // experts written
  uint64_t bytes_written = 0;  // the whole file
  double seconds = 0.0;
};

// Writes the packed expert file of `model` (inspected or loaded) to `path`, atomically (a partial
// file is never left under that name; an old one stays until the new one is whole). The model's
// own file is never the output (MOELITE_ERR_INVALID_ARGUMENT); a special file or directory is
// MOELITE_ERR_IO; a progress callback returning 0 cancels (MOELITE_ERR_PROGRESS_ABORTED).
Status pack_experts(const Model& model, const std::string& path, moelite_progress_fn progress, void* user,
                    PackResult* out);

// zstd on a sample of the model's experts, one row per weight type of the matrices.
struct CompressionRow {
  TensorType type = TensorType::F32;
  int64_t matrices = 0;       // matrices compressed
  uint64_t raw_bytes = 0;     // their bytes
  uint64_t zstd_bytes = 0;    // compressed (one frame per matrix)
  double decompress_gb_s = 0;  // raw bytes out per second of one thread's ZSTD_decompress
};
// Compresses up to `max_experts` experts spread over the layers at zstd `level`.
// MOELITE_ERR_NOT_IMPLEMENTED without libzstd, MOELITE_ERR_IO when a read fails.
Status measure_expert_compression(const Model& model, int32_t level, int32_t max_experts,
                                  std::vector<CompressionRow>* out);

}  // namespace moelite
