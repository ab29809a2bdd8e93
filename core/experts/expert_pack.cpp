#include "core/experts/expert_pack.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "core/model/model.h"
#include "platforms/platform.h"
#include "platforms/zstd.h"

namespace moelite {

Status pack_experts(const Model& model, const std::string& path, moelite_progress_fn progress, void* user,
                    PackResult* out) {
  if (model.hp.n_expert < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the model has no routed experts to pack");
  if (path.empty()) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the packed expert file needs a path");
  if (platform::same_file(path, model.path))
    return fail(MOELITE_ERR_INVALID_ARGUMENT, "'%s' is the model itself; the packed expert file goes beside it",
                path.c_str());
  PackedExperts layout;
  uint64_t header_bytes = 0, file_bytes = 0;
  plan_packed_layout(model, &layout, &header_bytes, &file_bytes);
  uint64_t fingerprint = 0;
  MOELITE_TRY(packed_source_fingerprint(model, &fingerprint));
  std::vector<uint8_t> header;
  uint64_t largest = 0;
  try {
    header = encode_packed_header(model, layout, fingerprint, file_bytes);
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory for the packed file's header");
  }
  for (const PackedLayer& p : layout.layers) largest = std::max(largest, p.record_bytes);
  platform::AlignedBytes record(static_cast<size_t>(std::max<uint64_t>(largest, 1)), platform::kDirectIoAlignment);
  if (!record.bytes()) return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory for an expert record of %llu bytes",
                             static_cast<unsigned long long>(largest));
  platform::File src;
  MOELITE_TRY(platform::File::open(model.path, &src));

  const double t0 = platform::now_seconds();
  int64_t experts = 0;
  int64_t total = 0;
  for (const PackedLayer& p : layout.layers) total += p.record_bytes > 0 ? model.hp.n_expert : 0;
  const Status st = platform::write_large_file_atomic(path, file_bytes, [&](const platform::WriteFn& write) -> Status {
    MOELITE_TRY(write(header.data(), header.size()));
    uint64_t at = header.size();
    for (size_t l = 0; l < layout.layers.size(); ++l) {
      const PackedLayer& p = layout.layers[l];
      if (p.record_bytes == 0) continue;
      if (at != p.offset) return fail(MOELITE_ERR_INTERNAL, "layer %zu's records would not start where planned", l);
      for (int32_t e = 0; e < model.hp.n_expert; ++e) {
        memset(record.bytes(), 0, static_cast<size_t>(p.record_bytes));  // padding stays zero
        const ExpertWeights w = model.layers[l].experts.expert(e);
        for (int c = 0; c < 3; ++c) {
          const WeightView& v = w.matrix(c);
          MOELITE_TRY(src.read_at(v.file_offset, record.bytes() + p.chunk_offset[c], p.chunk_bytes[c]));
          src.drop_cache(v.file_offset, p.chunk_bytes[c]);  // a copy of gigabytes need not stay cached
        }
        MOELITE_TRY(write(record.bytes(), static_cast<size_t>(p.record_bytes)));
        at += p.record_bytes;
        ++experts;
        if (progress && (experts % 16 == 0 || experts == total) &&
            !progress(static_cast<float>(experts) / static_cast<float>(total), user))
          return fail(MOELITE_ERR_PROGRESS_ABORTED, "packing cancelled by the progress callback");
      }
    }
    if (at != file_bytes) return fail(MOELITE_ERR_INTERNAL, "the packed file came out %llu bytes, not %llu",
                                      static_cast<unsigned long long>(at), static_cast<unsigned long long>(file_bytes));
    return MOELITE_OK;
  });
  MOELITE_TRY(st);
  out->experts = experts;
  out->bytes_written = file_bytes;
  out->seconds = platform::now_seconds() - t0;
  return MOELITE_OK;
}

Status measure_expert_compression(const Model& model, int32_t level, int32_t max_experts,
                                  std::vector<CompressionRow>* out) {
  std::string why;
  if (!platform::zstd_available(&why)) return fail(MOELITE_ERR_NOT_IMPLEMENTED, "zstd is not available: %s", why.c_str());
  if (max_experts < 1) return fail(MOELITE_ERR_INVALID_ARGUMENT, "measuring compression needs at least one expert");
  std::vector<int32_t> layers;
  for (size_t l = 0; l < model.layers.size(); ++l)
    if (model.layers[l].experts.present()) layers.push_back(static_cast<int32_t>(l));
  if (layers.empty()) return fail(MOELITE_ERR_INVALID_ARGUMENT, "the model has no routed experts");
  platform::File src;
  MOELITE_TRY(platform::File::open(model.path, &src));
  const int64_t all = static_cast<int64_t>(layers.size()) * model.hp.n_expert;
  const int64_t n = std::min<int64_t>(all, max_experts);
  std::map<TensorType, CompressionRow> rows;
  std::map<TensorType, double> seconds;
  try {
    std::vector<uint8_t> raw, packed, back;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pick = i * all / n;  // spread evenly over layers and experts
      const int32_t l = layers[static_cast<size_t>(pick / model.hp.n_expert)];
      const int32_t e = static_cast<int32_t>(pick % model.hp.n_expert);
      const ExpertWeights w = model.layers[static_cast<size_t>(l)].experts.expert(e);
      for (int c = 0; c < 3; ++c) {
        const WeightView& v = w.matrix(c);
        raw.resize(static_cast<size_t>(v.bytes()));
        MOELITE_TRY(src.read_at(v.file_offset, raw.data(), raw.size()));
        MOELITE_TRY(platform::zstd_compress(raw.data(), raw.size(), level, &packed));
        back.resize(raw.size());
        const double t0 = platform::now_seconds();
        MOELITE_TRY(platform::zstd_decompress(packed.data(), packed.size(), back.data(), back.size(), MOELITE_ERR_INTERNAL));
        const double dt = platform::now_seconds() - t0;
        if (back != raw) return fail(MOELITE_ERR_INTERNAL, "zstd did not give back the bytes it was given");
        CompressionRow& r = rows[v.type];
        r.type = v.type;
        r.matrices += 1;
        r.raw_bytes += raw.size();
        r.zstd_bytes += packed.size();
        seconds[v.type] += dt;
      }
    }
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory measuring compression");
  }
  out->clear();
  for (auto& [type, r] : rows) {
    r.decompress_gb_s = seconds[type] > 0 ? static_cast<double>(r.raw_bytes) / seconds[type] / 1e9 : 0.0;
    out->push_back(r);
  }
  return MOELITE_OK;
}

}  // namespace moelite
