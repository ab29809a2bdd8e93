// The packed expert file (`moelite pack`): a sidecar beside a GGUF model, MODEL.gguf.experts, that
// holds a copy of every routed expert laid out for the expert store. In the GGUF an expert's gate,
// up and down matrices are slices of three tensors far apart, so loading one costs three reads,
// each widened to whole 4 KiB blocks under O_DIRECT; in the packed file they lie together in one
// 4 KiB-aligned record, and an expert is one read with no widening. That matters where a read's
// latency, not the bytes, sets the cost: small experts (the shipped model's 150 KB, Qwen3-30B-A3B's
// 2.6 MB) on eMMC, SD cards and UFS.
//
// The GGUF stays as it was, valid for every other tool, and the model is still loaded from it: the
// sidecar only changes where the store reads experts from, never what it computes (the bytes are a
// copy). It is used when it matches the model it was made from (its size, its header, metadata and
// tensor directory, and samples of every layer's experts); otherwise it is ignored with a warning.
//
// Layout (little-endian):
//   header  kPackedHeaderFixedBytes of fields (below), then one PackedLayer row per layer (64
//           bytes: offset, record_bytes, chunk_offset[3], chunk_bytes[3]), zero-padded to a
//           multiple of 4 KiB
//   records layer by layer: expert e of layer l at offset(l) + e * record_bytes(l); matrix c (gate,
//           up, down) at chunk_offset[c] inside it, each 4 KiB-aligned and zero-padded
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace moelite {

struct Model;

constexpr char kPackedMagic[8] = {'M', 'O', 'E', 'X', 'P', 'A', 'C', 'K'};
constexpr uint32_t kPackedVersion = 1;
// magic, version, n_layers, n_expert, reserved, source_size, source_fingerprint, file_size
constexpr uint64_t kPackedHeaderFixedBytes = 48;
constexpr uint64_t kPackedLayerRowBytes = 64;
// The packed file's name beside a model: MODEL + this.
constexpr const char* kPackedSuffix = ".experts";

// Where one layer's experts lie in the packed file; record_bytes 0 for a layer without experts.
struct PackedLayer {
  uint64_t offset = 0;
  uint64_t record_bytes = 0;
  uint64_t chunk_offset[3] = {0, 0, 0};
  uint64_t chunk_bytes[3] = {0, 0, 0};
};

struct PackedExperts {
  std::string path;                // empty: the model has no usable packed file
  std::vector<PackedLayer> layers;  // one per model layer
  bool present() const { return !path.empty(); }
};

// The layout `moelite pack` gives `model`'s experts: records in layer order after the header, each
// matrix 4 KiB-aligned. *header_bytes receives the header's size, *file_bytes the whole file's.
void plan_packed_layout(const Model& model, PackedExperts* layout, uint64_t* header_bytes, uint64_t* file_bytes);
// What identifies the GGUF a packed file was made from: FNV-1a over its bytes before the tensor
// data (header, metadata, tensor directory) and over the first and last 4 KiB of every layer's
// expert data. Reads the model's file; MOELITE_ERR_IO when that fails.
Status packed_source_fingerprint(const Model& model, uint64_t* out);
// The header of a packed file for `layout`.
std::vector<uint8_t> encode_packed_header(const Model& model, const PackedExperts& layout, uint64_t source_fingerprint,
                                          uint64_t file_bytes);
// Reads and checks the packed file at `path` against `model`: *out filled when it is usable.
// MOELITE_ERR_FILE_NOT_FOUND when there is none; MOELITE_ERR_BAD_METADATA (not a packed file, or
// another model's) or MOELITE_ERR_IO (unreadable, or cut short), with the reason, when it is unusable.
Status open_packed_experts(const Model& model, const std::string& path, PackedExperts* out);
// Called by Model::load for a model whose experts may be streamed: uses MODEL.experts when it is
// usable, logs a warning naming the reason when one is there but is not.
void attach_packed_experts(Model* model);

}  // namespace moelite
