// How a routed expert is read from storage into a slot, and where its matrices then lie: the one
// owner of that geometry, so the store, the storage probe and the memory plan's slot size agree.
//
// Two sources:
//  - the model file: an expert's gate, up and down matrices are slices of three tensors, so three
//    reads, each widened to whole 4 KiB blocks under O_DIRECT (the matrix then starts up to a block
//    into its read); a slot gives each matrix a region with room for that widening;
//  - the packed expert file (core/model/packed_experts.h, `moelite pack`): an expert is one
//    4 KiB-aligned record holding its three matrices, each 4 KiB-aligned, and lands in a slot
//    exactly as it lies in the file. A record up to kWholeRecordReadMax is one read (small experts:
//    the count of reads, not the bytes, sets their cost); a larger one is read as its three
//    matrices, so gate and up can be computed while down still loads (as from the model file).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "platforms/batch_read.h"

namespace moelite {

// Largest packed record read in one request.
constexpr uint64_t kWholeRecordReadMax = uint64_t{1} << 20;
// Reads a loader submits at once: the demand loads it takes in one submission are this many reads'
// worth of experts (4 from the model file, 12 packed small ones), so a routing's misses all start
// at once, even when the other loaders wait for a CPU behind the compute threads. The storage probe
// (expert_read_probe.h) reads in the same shape.
constexpr size_t kLoaderReadsPerSubmission = 12;

class ExpertReads {
 public:
  // The packed file when the model has one (Model::packed), else the model file.
  explicit ExpertReads(const Model& model);
  const std::string& path() const { return path_; }
  bool packed() const { return packed_; }
  // Bytes of a slot that holds any layer's expert read this way.
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Most reads one expert takes (3, or 1 for packed files of small experts).
  int32_t max_reads_per_expert() const { return max_reads_; }
  // Experts a loader reads in one submission.
  size_t experts_per_submission() const { return kLoaderReadsPerSubmission / static_cast<size_t>(max_reads_); }
  // Appends the reads of expert `expert` of `layer` into the slot memory at `slot` (4 KiB-aligned)
  // to *reads, in order; for each read, *matrices_in gets how many of the expert's leading
  // matrices (gate, up, down) are whole once that read and every earlier one of it have landed.
  // `fd` is the file path() opened, `direct` whether with O_DIRECT.
  void append_reads(int32_t layer, int32_t expert, int fd, bool direct, uint8_t* slot,
                    std::vector<platform::ReadRange>* reads, std::vector<uint8_t>* matrices_in) const;
  // Where matrix c (0 gate, 1 up, 2 down) of an expert of `layer` starts in its slot once read;
  // `w` is the expert as the model binds it (its matrices' offsets in the model file).
  uint64_t matrix_offset(int32_t layer, const ExpertWeights& w, int c, bool direct) const;
  // Bytes of the expert's three matrices (what the model needs, before any widening).
  uint64_t expert_bytes(int32_t layer) const;

 private:
  struct Layer {
    uint64_t bytes[3] = {0, 0, 0};
    uint64_t slot_offset[3] = {0, 0, 0};  // where matrix c's read lands in the slot
    uint64_t records_at = 0;              // packed: where the layer's records begin
    uint64_t record_bytes = 0;            // packed: one expert's record
  };
  const Model* model_;  // the model file's offsets, expert by expert (old files' experts are uneven)
  std::vector<Layer> layers_;
  std::string path_;
  bool packed_ = false;
  uint64_t slot_bytes_ = 0;
  int32_t max_reads_ = 3;
};

}  // namespace moelite
