#include "core/experts/expert_reads.h"

#include <algorithm>

#include "base/options.h"

namespace moelite {

namespace {

constexpr uint64_t kBlock = platform::kDirectIoAlignment;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t round_down(uint64_t v, uint64_t a) { return v / a * a; }

}  // namespace

ExpertReads::ExpertReads(const Model& model) : model_(&model) {
  layers_.resize(model.layers.size());
  packed_ = model.packed.present();
  path_ = packed_ ? model.packed.path : model.path;
  if (packed_) {
    max_reads_ = 1;
    for (size_t l = 0; l < model.layers.size(); ++l) {
      const PackedLayer& p = model.packed.layers[l];
      Layer& L = layers_[l];
      L.record_bytes = p.record_bytes;
      for (int c = 0; c < 3; ++c) {
        L.bytes[c] = p.chunk_bytes[c];
        L.slot_offset[c] = p.chunk_offset[c];
      }
      L.records_at = p.offset;
      slot_bytes_ = std::max(slot_bytes_, p.record_bytes);
      if (p.record_bytes > kWholeRecordReadMax) max_reads_ = 3;
    }
    set_submission_shape();
    return;
  }
  // Each matrix's region has room for its read widened to blocks: it may start up to a block before
  // the matrix and end up to a block after.
  uint64_t region[3] = {0, 0, 0};
  for (const LayerWeights& lw : model.layers) {
    if (!lw.experts.present()) continue;
    const ExpertWeights w = lw.experts.expert(0);
    for (int c = 0; c < 3; ++c) region[c] = std::max(region[c], round_up(w.matrix(c).bytes(), kBlock) + kBlock);
  }
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!model.layers[l].experts.present()) continue;
    const ExpertWeights w = model.layers[l].experts.expert(0);
    for (int c = 0; c < 3; ++c) {
      layers_[l].bytes[c] = w.matrix(c).bytes();
      layers_[l].slot_offset[c] = c == 0 ? 0 : layers_[l].slot_offset[c - 1] + region[c - 1];
    }
  }
  slot_bytes_ = region[0] + region[1] + region[2];
  set_submission_shape();
}

void ExpertReads::set_submission_shape() {
  if (int64_t v = 0; option_int(Option::IoBytesInFlight, &v)) bytes_in_flight_ = static_cast<uint64_t>(v);
  uint64_t largest = 0, largest_read = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (packed_ && L.record_bytes <= kWholeRecordReadMax) {
      largest = std::max(largest, L.record_bytes);
      largest_read = std::max(largest_read, L.record_bytes);
      continue;
    }
    largest = std::max(largest, L.bytes[0] + L.bytes[1] + L.bytes[2]);
    // A read from the model file may be widened to blocks: up to a block more at each end.
    for (int c = 0; c < 3; ++c)
      largest_read =
          std::max(largest_read, packed_ ? round_up(L.bytes[c], kBlock) : round_up(L.bytes[c], kBlock) + kBlock);
  }
  const size_t most = kLoaderReadsPerSubmission / static_cast<size_t>(max_reads_);
  experts_per_submission_ = std::clamp<size_t>(largest ? bytes_in_flight_ / largest : most, 1, most);
  reads_in_flight_ = static_cast<int32_t>(std::clamp<uint64_t>(largest_read ? bytes_in_flight_ / largest_read : 1, 1,
                                                               experts_per_submission_ * max_reads_));
}

uint64_t ExpertReads::expert_bytes(int32_t layer) const {
  const Layer& L = layers_[static_cast<size_t>(layer)];
  return L.bytes[0] + L.bytes[1] + L.bytes[2];
}

void ExpertReads::append_reads(int32_t layer, int32_t expert, int fd, bool direct, uint8_t* slot,
                               std::vector<platform::ReadRange>* reads, std::vector<uint8_t>* matrices_in) const {
  const Layer& L = layers_[static_cast<size_t>(layer)];
  if (packed_) {
    const uint64_t record = L.records_at + L.record_bytes * static_cast<uint64_t>(expert);
    if (L.record_bytes <= kWholeRecordReadMax) {
      // Everything up to the end of down; the record's tail is padding.
      reads->push_back({fd, record, slot, L.record_bytes, L.slot_offset[2] + L.bytes[2]});
      matrices_in->push_back(3);
      return;
    }
    for (int c = 0; c < 3; ++c) {
      reads->push_back({fd, record + L.slot_offset[c], slot + L.slot_offset[c], round_up(L.bytes[c], kBlock), L.bytes[c]});
      matrices_in->push_back(static_cast<uint8_t>(c + 1));
    }
    return;
  }
  const ExpertWeights w = model_->layers[static_cast<size_t>(layer)].experts.expert(expert);
  for (int c = 0; c < 3; ++c) {
    reads->push_back(platform::file_read_range(fd, w.matrix(c).file_offset, L.bytes[c], slot + L.slot_offset[c], direct));
    matrices_in->push_back(static_cast<uint8_t>(c + 1));
  }
}

uint64_t ExpertReads::matrix_offset(int32_t layer, const ExpertWeights& w, int c, bool direct) const {
  const Layer& L = layers_[static_cast<size_t>(layer)];
  if (packed_ || !direct) return L.slot_offset[c];
  const uint64_t off = w.matrix(c).file_offset;
  return L.slot_offset[c] + (off - round_down(off, kBlock));
}

}  // namespace moelite
