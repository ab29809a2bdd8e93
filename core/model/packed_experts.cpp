#include "core/model/packed_experts.h"

#include <cinttypes>
#include <cstring>

#include "base/options.h"
#include "core/gguf/reader.h"
#include "core/model/model.h"
#include "platforms/platform.h"

namespace moelite {

namespace {

constexpr uint64_t kBlock = platform::kDirectIoAlignment;
// Bytes of each end of a layer's expert data that the fingerprint covers.
constexpr uint64_t kSampleBytes = 4096;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void add_u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    add(b, 8);
  }
};

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t header_bytes_for(size_t n_layers) {
  return round_up(kPackedHeaderFixedBytes + kPackedLayerRowBytes * n_layers, kBlock);
}

}  // namespace

void plan_packed_layout(const Model& model, PackedExperts* layout, uint64_t* header_bytes, uint64_t* file_bytes) {
  layout->layers.assign(model.layers.size(), PackedLayer());
  uint64_t at = header_bytes_for(model.layers.size());
  *header_bytes = at;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerExperts& le = model.layers[l].experts;
    if (!le.present()) continue;
    PackedLayer& p = layout->layers[l];
    const ExpertWeights w = le.expert(0);
    uint64_t record = 0;
    for (int c = 0; c < 3; ++c) {
      p.chunk_offset[c] = record;
      p.chunk_bytes[c] = w.matrix(c).bytes();
      record += round_up(p.chunk_bytes[c], kBlock);
    }
    p.offset = at;
    p.record_bytes = record;
    at += record * static_cast<uint64_t>(model.hp.n_expert);
  }
  *file_bytes = at;
}

Status packed_source_fingerprint(const Model& model, uint64_t* out) {
  platform::File f;
  MOELITE_TRY(platform::File::open(model.path, &f));
  Fnv h;
  h.add_u64(f.size());
  std::vector<uint8_t> buf;
  try {
    buf.resize(static_cast<size_t>(model.gguf->data_offset()));
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory reading the model's header");
  }
  MOELITE_TRY(f.read_at(0, buf.data(), buf.size()));
  h.add(buf.data(), buf.size());
  uint8_t sample[kSampleBytes];
  for (const LayerWeights& lw : model.layers) {
    const LayerExperts& le = lw.experts;
    if (!le.present()) continue;
    // The first bytes of expert 0's gate and the last of the last expert's down.
    const WeightView first = le.expert(0).gate;
    const WeightView last = le.expert(model.hp.n_expert - 1).down;
    const uint64_t n0 = std::min<uint64_t>(kSampleBytes, first.bytes());
    const uint64_t n1 = std::min<uint64_t>(kSampleBytes, last.bytes());
    MOELITE_TRY(f.read_at(first.file_offset, sample, n0));
    h.add(sample, static_cast<size_t>(n0));
    MOELITE_TRY(f.read_at(last.file_offset + last.bytes() - n1, sample, n1));
    h.add(sample, static_cast<size_t>(n1));
  }
  *out = h.h;
  return MOELITE_OK;
}

std::vector<uint8_t> encode_packed_header(const Model& model, const PackedExperts& layout, uint64_t source_fingerprint,
                                          uint64_t file_bytes) {
  std::vector<uint8_t> h(static_cast<size_t>(header_bytes_for(layout.layers.size())), 0);
  memcpy(h.data(), kPackedMagic, sizeof kPackedMagic);
  put_u32(&h[8], kPackedVersion);
  put_u32(&h[12], static_cast<uint32_t>(layout.layers.size()));
  put_u32(&h[16], static_cast<uint32_t>(model.hp.n_expert));
  put_u32(&h[20], 0);
  put_u64(&h[24], model.gguf->file_size());
  put_u64(&h[32], source_fingerprint);
  put_u64(&h[40], file_bytes);
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    uint8_t* row = &h[kPackedHeaderFixedBytes + kPackedLayerRowBytes * l];
    const PackedLayer& p = layout.layers[l];
    put_u64(row, p.offset);
    put_u64(row + 8, p.record_bytes);
    for (int c = 0; c < 3; ++c) {
      put_u64(row + 16 + 8 * c, p.chunk_offset[c]);
      put_u64(row + 40 + 8 * c, p.chunk_bytes[c]);
    }
  }
  return h;
}

Status open_packed_experts(const Model& model, const std::string& path, PackedExperts* out) {
  platform::File f;
  MOELITE_TRY(platform::File::open(path, &f));
  uint8_t fixed[kPackedHeaderFixedBytes];
  if (f.size() < sizeof fixed) return fail(MOELITE_ERR_BAD_METADATA, "it is too short to be a packed expert file");
  MOELITE_TRY(f.read_at(0, fixed, sizeof fixed));
  if (memcmp(fixed, kPackedMagic, sizeof kPackedMagic) != 0)
    return fail(MOELITE_ERR_BAD_METADATA, "it is not a packed expert file (no MOEXPACK magic)");
  if (get_u32(&fixed[8]) != kPackedVersion)
    return fail(MOELITE_ERR_BAD_METADATA, "it is a packed expert file of version %u; this build reads version %u",
                get_u32(&fixed[8]), kPackedVersion);
  const uint32_t n_layers = get_u32(&fixed[12]);
  const uint32_t n_expert = get_u32(&fixed[16]);
  if (n_layers != model.layers.size() || static_cast<int64_t>(n_expert) != model.hp.n_expert)
    return fail(MOELITE_ERR_BAD_METADATA, "it holds %u layers of %u experts; the model has %zu of %d", n_layers,
                n_expert, model.layers.size(), model.hp.n_expert);
  if (get_u64(&fixed[24]) != model.gguf->file_size())
    return fail(MOELITE_ERR_BAD_METADATA, "it was made from a file of %" PRIu64 " bytes; the model has %" PRIu64,
                get_u64(&fixed[24]), model.gguf->file_size());
  if (get_u64(&fixed[40]) != f.size())
    return fail(MOELITE_ERR_IO, "it should hold %" PRIu64 " bytes but holds %" PRIu64 " (cut short or appended to)",
                get_u64(&fixed[40]), f.size());
  const uint64_t header_bytes = header_bytes_for(n_layers);
  if (header_bytes > f.size()) return fail(MOELITE_ERR_IO, "it ends inside its header");
  std::vector<uint8_t> h;
  try {
    h.resize(static_cast<size_t>(header_bytes));
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory reading a packed expert file's header");
  }
  MOELITE_TRY(f.read_at(0, h.data(), h.size()));

  // Every record must be where this model's layout puts it: the file is read into slots sized by
  // that layout, so anything else would read past a slot or misplace a matrix.
  PackedExperts want;
  uint64_t want_header = 0, want_bytes = 0;
  plan_packed_layout(model, &want, &want_header, &want_bytes);
  if (want_header != header_bytes || want_bytes != f.size())
    return fail(MOELITE_ERR_BAD_METADATA, "its layout is not this model's (%" PRIu64 " bytes, expected %" PRIu64 ")",
                f.size(), want_bytes);
  for (size_t l = 0; l < n_layers; ++l) {
    const uint8_t* row = &h[kPackedHeaderFixedBytes + kPackedLayerRowBytes * l];
    const PackedLayer& p = want.layers[l];
    bool same = get_u64(row) == p.offset && get_u64(row + 8) == p.record_bytes;
    for (int c = 0; c < 3; ++c)
      same = same && get_u64(row + 16 + 8 * c) == p.chunk_offset[c] && get_u64(row + 40 + 8 * c) == p.chunk_bytes[c];
    if (!same) return fail(MOELITE_ERR_BAD_METADATA, "layer %zu's experts are not laid out as this model's", l);
  }
  uint64_t fingerprint = 0;
  MOELITE_TRY(packed_source_fingerprint(model, &fingerprint));
  if (fingerprint != get_u64(&fixed[32]))
    return fail(MOELITE_ERR_BAD_METADATA,
                "it was made from another file of the same size (its header, metadata or expert data differ)");
  want.path = path;
  *out = std::move(want);
  return MOELITE_OK;
}

void attach_packed_experts(Model* model) {
  if (bool use = true; option_flag(Option::PackedExperts, &use) && !use) return;
  const std::string path = model->path + kPackedSuffix;
  PackedExperts packed;
  const Status st = open_packed_experts(*model, path, &packed);
  if (st == MOELITE_OK) {
    model->packed = std::move(packed);
    log_msg(MOELITE_LOG_INFO, "experts are read from the packed file '%s'", path.c_str());
    return;
  }
  if (st != MOELITE_ERR_FILE_NOT_FOUND || platform::path_exists(path))
    log_msg(MOELITE_LOG_WARN, "'%s' is not used (experts are read from the model file): %s", path.c_str(),
            last_error_message());
  clear_error();
}

}  // namespace moelite
