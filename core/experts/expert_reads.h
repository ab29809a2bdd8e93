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
#include <memory>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "platforms/batch_read.h"

namespace moelite {

// Largest packed record read in one request.
constexpr uint64_t kWholeRecordReadMax = uint64_t{1} << 20;
// Most reads a loader submits at once (12 packed small experts, 4 from the model file).
constexpr size_t kLoaderReadsPerSubmission = 12;
// Bytes of demand reads a loader keeps in flight (MOELITE_IO_BYTES_IN_FLIGHT changes it): reads
// start in order, each when the earlier ones leave room (always one), so a layer's misses land one
// after another and the first computes while the rest are read, and a disk that shares its
// bandwidth among the reads in flight reads no slower: on a virtual disk, 2.2 MB reads gave
// 1.6-2.2 GB/s one or two at a time and 1.2-1.7 eight to twelve at a time, the first landing after
// 1.4-2.4 ms instead of 5-26. That needs the loader to start the next read at once when one lands:
// with the compute workers on every core it waits for the scheduler (a 2 MiB limit alone: decode
// 0.87-1.20x of twelve reads at once, no consistent sign), hence kLoaderSliceNs. Both together,
// bench model, 2 cores, one sequence, against twelve reads at once, interleaved: 1.01-1.16x at a
// 25 % budget (5 rounds), 1.01-1.20x at 50 % with next-gate (3).
// Where a layer's misses are few (ExpertStore::take_batch_locked): many are read for throughput,
// all of a submission at once. A guess (one expert) is read in steps of these bytes too, so that
// demand reads wait for one step of it at most and a refuted guess stops between steps
// (ExpertStore::read_guess).
constexpr uint64_t kLoaderBytesInFlight = uint64_t{2} << 20;
// The time slice a loader asks the scheduler for (platform::prefer_short_slice), 0.1 ms, the
// shortest Linux takes.
constexpr uint64_t kLoaderSliceNs = 100'000;

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
  // Experts a loader takes in one submission: what fits its bytes in flight (at least one), so
  // that the other loaders take the next ones; at most kLoaderReadsPerSubmission reads' worth.
  size_t experts_per_submission() const { return experts_per_submission_; }
  // Experts of kLoaderReadsPerSubmission reads: a submission read all at once.
  size_t most_experts_per_submission() const { return kLoaderReadsPerSubmission / static_cast<size_t>(max_reads_); }
  // Bytes a loader keeps in flight (kLoaderBytesInFlight, or MOELITE_IO_BYTES_IN_FLIGHT).
  uint64_t bytes_in_flight() const { return bytes_in_flight_; }
  // Reads a loader has in flight at once when reading experts of the largest size.
  int32_t reads_in_flight() const { return reads_in_flight_; }
  // A loader's reader (the store's loaders and the storage probe's): at most
  // kLoaderReadsPerSubmission reads in flight; read_all takes bytes_in_flight() for demand reads.
  static std::unique_ptr<platform::BatchReader> loader_reader() {
    return platform::BatchReader::create(kLoaderReadsPerSubmission);
  }
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
  uint64_t bytes_in_flight_ = kLoaderBytesInFlight;
  size_t experts_per_submission_ = 1;
  int32_t reads_in_flight_ = 1;
  void set_submission_shape();  // the three above, once the layers are known
};

}  // namespace moelite
