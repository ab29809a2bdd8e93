// Saved sessions: a context's state in a file, and back (Context::save / Context::load).
//
// File layout, little-endian:
//   header (48 bytes): magic "MOELSESS", u32 version (1), u32 compression (0 stored, 1 zstd),
//     u64 model fingerprint, u64 payload bytes, u64 stored bytes (what follows the header),
//     u64 payload checksum
//   payload (zstd frame with its own checksum, or stored as is):
//     u32 layers, u32 has values, u64 kv_dim, u32 n_ctx of the saving context, u32 sequences,
//     then per sequence: u32 id, u32 length n, n x i32 tokens, and per layer: u32 first position
//     held (0, or where a windowed layer's ring starts), then the keys of positions first..n-1
//     (kv_dim floats each) and, with values, their values.
// The model fingerprint hashes the tensor directory and 64 KiB sampled from the weights, so a
// session of another model (or another quantization of it) is refused. Load checks everything,
// decoding into memory first, before it touches the context.
#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "base/hash.h"
#include "core/exec/context.h"
#include "core/gguf/reader.h"
#include "platforms/platform.h"
#include "platforms/zstd.h"

namespace moelite {

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'L', 'S', 'E', 'S', 'S'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kStored = 0, kZstd = 1;
constexpr size_t kHeaderBytes = 48;
constexpr int kZstdLevel = 3;

Status model_fingerprint(const Model& m, uint64_t* out) {
  const gguf::Reader& g = *m.gguf;
  uint64_t h = hash_bytes(m.hp.arch.data(), m.hp.arch.size());
  for (const gguf::TensorInfo& t : g.tensors()) {
    h = hash_bytes(t.name.data(), t.name.size(), h);
    const uint64_t shape[] = {static_cast<uint64_t>(t.type),  static_cast<uint64_t>(t.ne[0]),
                              static_cast<uint64_t>(t.ne[1]), static_cast<uint64_t>(t.ne[2]),
                              static_cast<uint64_t>(t.ne[3]), t.offset};
    h = hash_bytes(shape, sizeof shape, h);
  }
  // Sixteen 4 KiB samples spread over the weights: two fine-tunes of one shape differ in them.
  const uint64_t start = g.data_offset(), size = g.file_size() > start ? g.file_size() - start : 0;
  std::vector<uint8_t> sample(4096);
  for (uint64_t i = 0; i < 16 && size > 0; ++i) {
    const uint64_t n = std::min<uint64_t>(sample.size(), size);
    const uint64_t at = start + (size - n) * i / 15;
    MOELITE_TRY(g.file().read_at(at, sample.data(), n));
    h = hash_bytes(sample.data(), static_cast<size_t>(n), h);
  }
  *out = h;
  return MOELITE_OK;
}

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    const size_t at = out_->size();
    out_->resize(at + sizeof v);
    memcpy(out_->data() + at, &v, sizeof v);
  }
  void bytes(const void* p, size_t n) {
    if (n == 0) return;  // p may be null (an empty vector's data)
    const size_t at = out_->size();
    out_->resize(at + n);
    memcpy(out_->data() + at, p, n);
  }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  template <typename T>
  Status get(T* v, const char* what) {
    if (n_ - at_ < sizeof *v) return bad(what);
    memcpy(v, p_ + at_, sizeof *v);
    at_ += sizeof *v;
    return MOELITE_OK;
  }
  Status span(size_t bytes, const uint8_t** out, const char* what) {
    if (n_ - at_ < bytes) return bad(what);
    *out = p_ + at_;
    at_ += bytes;
    return MOELITE_OK;
  }
  bool done() const { return at_ == n_; }
  Status bad(const char* what) const {
    return fail(MOELITE_ERR_BAD_SESSION, "session '%s': the data ends inside %s", path_.c_str(), what);
  }

 private:
  const uint8_t* p_;
  size_t n_, at_ = 0;
  const std::string& path_;
};

// One sequence as the file holds it: rows point into the decoded payload.
struct SavedSequence {
  uint32_t id = 0, length = 0;
  const uint8_t* tokens = nullptr;
  std::vector<uint32_t> first;               // per layer
  std::vector<const uint8_t*> keys, values;  // per layer, (length - first) rows each
};

}  // namespace

int32_t Context::first_held(const Sequence& seq, int32_t layer) const {
  const int32_t slots = seq.kv.slots[static_cast<size_t>(layer)];
  if (model_.hp.window_of(layer) == 0 || seq.ring_pos.empty()) return 0;
  // The ring: the positions before n_past whose slots still hold them, back to the first gap.
  int32_t first = seq.n_past;
  while (first > 0 && seq.n_past - (first - 1) <= slots &&
         seq.ring_pos[static_cast<size_t>((first - 1) % static_cast<int32_t>(seq.ring_pos.size()))] == first - 1)
    --first;
  return first;
}

Status Context::save(const std::string& path) const {
  const HParams& hp = model_.hp;
  Backend& be = *state_.backend;
  std::unique_lock<std::mutex> turn = backend_turn();  // other contexts may share `be`
  const KvCache& shape = seqs_.front().kv;
  const size_t row = static_cast<size_t>(shape.kv_dim);
  std::vector<uint8_t> payload;
  std::vector<float> keys, values;
  Writer w(&payload);
  w.put<uint32_t>(static_cast<uint32_t>(hp.n_layer));
  w.put<uint32_t>(shape.values ? 1 : 0);
  w.put<uint64_t>(static_cast<uint64_t>(shape.kv_dim));
  w.put<uint32_t>(static_cast<uint32_t>(n_ctx_));
  w.put<uint32_t>(static_cast<uint32_t>(seqs_.size()));
  for (size_t q = 0; q < seqs_.size(); ++q) {
    const Sequence& seq = seqs_[q];
    w.put<uint32_t>(static_cast<uint32_t>(q));
    w.put<uint32_t>(static_cast<uint32_t>(seq.n_past));
    for (int32_t t : seq.tokens) w.put<int32_t>(t);
    for (int32_t l = 0; l < hp.n_layer; ++l) {
      const int32_t first = first_held(seq, l), slots = seq.kv.slots[static_cast<size_t>(l)];
      w.put<uint32_t>(static_cast<uint32_t>(first));
      const size_t n = static_cast<size_t>(seq.n_past - first);
      keys.resize(n * row);
      values.resize(shape.values ? n * row : 0);
      // Positions first..n_past-1 in slot order: one run, or two where the ring wraps.
      for (int32_t p = first; p < seq.n_past;) {
        const int32_t slot = p % slots, run = std::min(seq.n_past - p, slots - slot);
        const size_t at = static_cast<size_t>(p - first) * row;
        MOELITE_TRY(be.read_kv(seq.kv, l, slot, run, keys.data() + at, shape.values ? values.data() + at : nullptr));
        p += run;
      }
      w.bytes(keys.data(), keys.size() * sizeof(float));
      w.bytes(values.data(), values.size() * sizeof(float));
    }
  }
  turn = std::unique_lock<std::mutex>();  // the rest does not touch the backend
  uint32_t compression = kStored;
  std::vector<uint8_t> packed;
  if (platform::zstd_available()) {
    MOELITE_TRY(platform::zstd_compress(payload.data(), payload.size(), kZstdLevel, &packed));
    compression = kZstd;
  }
  const std::vector<uint8_t>& stored = compression == kZstd ? packed : payload;
  uint64_t fingerprint = 0;
  MOELITE_TRY(model_fingerprint(model_, &fingerprint));
  std::vector<uint8_t> header;
  Writer h(&header);
  for (char c : kMagic) h.put<char>(c);
  h.put<uint32_t>(kVersion);
  h.put<uint32_t>(compression);
  h.put<uint64_t>(fingerprint);
  h.put<uint64_t>(payload.size());
  h.put<uint64_t>(stored.size());
  h.put<uint64_t>(hash_bytes(payload.data(), payload.size()));
  const platform::WritePiece pieces[] = {{header.data(), header.size()}, {stored.data(), stored.size()}};
  return platform::write_file_atomic(path, pieces, 2);
}

namespace {

// The payload of a session file, after checking its header (magic, version, compression, size),
// that it was saved with `model`, that it holds no more than `limit` bytes, and its checksum.
Status read_payload(const std::string& path, const Model& model, uint64_t limit, std::vector<uint8_t>* payload) {
  platform::File file;
  MOELITE_TRY(platform::File::open(path, &file));
  auto bad = [&](const std::string& what) {
    return fail(MOELITE_ERR_BAD_SESSION, "session '%s': %s", path.c_str(), what.c_str());
  };
  if (file.size() < kHeaderBytes) return bad("shorter than its header");
  uint8_t header[kHeaderBytes];
  MOELITE_TRY(file.read_at(0, header, kHeaderBytes));
  if (memcmp(header, kMagic, sizeof kMagic) != 0) return bad("not a moelite session file");
  uint32_t version, compression;
  uint64_t fingerprint, payload_bytes, stored_bytes, checksum;
  memcpy(&version, header + 8, 4);
  memcpy(&compression, header + 12, 4);
  memcpy(&fingerprint, header + 16, 8);
  memcpy(&payload_bytes, header + 24, 8);
  memcpy(&stored_bytes, header + 32, 8);
  memcpy(&checksum, header + 40, 8);
  if (version != kVersion) return bad("version " + std::to_string(version) + ", this build reads version 1");
  if (compression != kStored && compression != kZstd) return bad("unknown compression " + std::to_string(compression));
  if (stored_bytes != file.size() - kHeaderBytes)
    return bad(stored_bytes > file.size() - kHeaderBytes ? "truncated" : "has bytes after its data");
  uint64_t ours = 0;
  MOELITE_TRY(model_fingerprint(model, &ours));
  if (fingerprint != ours)
    return fail(MOELITE_ERR_SESSION_MISMATCH, "session '%s' was saved with another model than '%s'", path.c_str(),
                model.path.c_str());
  if (payload_bytes > limit)
    return fail(MOELITE_ERR_SESSION_MISMATCH,
                "session '%s' holds more (%" PRIu64 " bytes) than this context can (%" PRIu64
                ": fewer sequences or positions)",
                path.c_str(), payload_bytes, limit);
  if (compression == kStored && stored_bytes != payload_bytes) return bad("sizes disagree");
  std::vector<uint8_t> stored(static_cast<size_t>(stored_bytes));
  MOELITE_TRY(file.read_at(kHeaderBytes, stored.data(), stored_bytes));
  if (compression == kZstd) {
    payload->resize(static_cast<size_t>(payload_bytes));
    MOELITE_TRY(platform::zstd_decompress(stored.data(), stored.size(), payload->data(), payload->size(),
                                          MOELITE_ERR_BAD_SESSION));
    stored.clear();
    stored.shrink_to_fit();
  } else {
    payload->swap(stored);
  }
  if (hash_bytes(payload->data(), payload->size()) != checksum) return bad("checksum mismatch (the file is corrupt)");
  return MOELITE_OK;
}

// The sequences of a checked payload, each checked against the context: ids, lengths, tokens in
// the vocabulary, and every layer's rows (those its next token reads at least, no more than its slots).
Status parse_sequences(const std::string& path, const HParams& hp, const KvCache& shape, size_t n_seqs, int32_t n_ctx,
                       const std::vector<uint8_t>& payload, std::vector<SavedSequence>* out) {
  auto bad = [&](const std::string& what) {
    return fail(MOELITE_ERR_BAD_SESSION, "session '%s': %s", path.c_str(), what.c_str());
  };
  const size_t row = static_cast<size_t>(shape.kv_dim), sides = shape.values ? 2 : 1;
  Reader r(payload.data(), payload.size(), path);
  uint32_t n_layer = 0, values = 0, saved_ctx = 0, n_saved = 0;
  uint64_t kv_dim = 0;
  MOELITE_TRY(r.get(&n_layer, "the shape"));
  MOELITE_TRY(r.get(&values, "the shape"));
  MOELITE_TRY(r.get(&kv_dim, "the shape"));
  MOELITE_TRY(r.get(&saved_ctx, "the shape"));
  MOELITE_TRY(r.get(&n_saved, "the shape"));
  if (n_layer != static_cast<uint32_t>(hp.n_layer) || (values != 0) != shape.values || kv_dim != row)
    return bad("its cache shape is not this model's");
  if (n_saved > n_seqs)
    return fail(MOELITE_ERR_SESSION_MISMATCH, "session '%s' holds %u sequences, the context %zu", path.c_str(), n_saved,
                n_seqs);
  std::vector<SavedSequence>& saved = *out;
  saved.resize(n_saved);
  std::vector<bool> seen(n_seqs, false);
  for (SavedSequence& s : saved) {
    MOELITE_TRY(r.get(&s.id, "a sequence"));
    MOELITE_TRY(r.get(&s.length, "a sequence"));
    if (s.id >= n_seqs || seen[s.id]) return bad("a sequence id is repeated or out of range");
    seen[s.id] = true;
    if (s.length > static_cast<uint32_t>(n_ctx))
      return fail(MOELITE_ERR_SESSION_MISMATCH, "session '%s': sequence %u holds %u tokens, the context %d",
                  path.c_str(), s.id, s.length, n_ctx);
    MOELITE_TRY(r.span(size_t{s.length} * 4, &s.tokens, "the tokens"));
    for (uint32_t i = 0; i < s.length; ++i) {
      int32_t t;
      memcpy(&t, s.tokens + 4 * size_t{i}, 4);
      if (t < 0 || t >= hp.n_vocab) return bad("a token is outside the vocabulary");
    }
    for (int32_t l = 0; l < hp.n_layer; ++l) {
      uint32_t first = 0;
      MOELITE_TRY(r.get(&first, "the cache rows"));
      const uint32_t slots = static_cast<uint32_t>(shape.slots[static_cast<size_t>(l)]);
      const int32_t window = hp.window_of(l);
      // A full layer must hold every position; a windowed one at least what its next token reads.
      const uint32_t needed = window > 0 ? std::min<uint32_t>(s.length, static_cast<uint32_t>(window) - 1) : s.length;
      if (first > s.length || s.length - first < needed) return bad("a layer lacks rows its next token reads");
      if (s.length - first > slots)
        return fail(MOELITE_ERR_SESSION_MISMATCH, "session '%s': layer %d holds %u positions, the context's %u",
                    path.c_str(), l, s.length - first, slots);
      const uint8_t* rows;
      const size_t bytes = size_t{s.length - first} * row * sizeof(float);
      MOELITE_TRY(r.span(bytes * sides, &rows, "the cache rows"));
      s.first.push_back(first);
      s.keys.push_back(rows);
      s.values.push_back(rows + bytes);
    }
  }
  if (!r.done()) return bad("has data after its last sequence");
  return MOELITE_OK;
}

}  // namespace

Status Context::load(const std::string& path) {
  const HParams& hp = model_.hp;
  // The most a session of this context can hold: every sequence full, every layer's slots.
  const KvCache& shape = seqs_.front().kv;
  const size_t row = static_cast<size_t>(shape.kv_dim), sides = shape.values ? 2 : 1;
  uint64_t limit = 64 + static_cast<uint64_t>(seqs_.size()) * (8 + 4 * static_cast<uint64_t>(n_ctx_));
  for (int32_t slots : shape.slots)
    limit += seqs_.size() * (4 + static_cast<uint64_t>(slots) * row * sides * sizeof(float));
  std::vector<uint8_t> payload;
  MOELITE_TRY(read_payload(path, model_, limit, &payload));
  std::vector<SavedSequence> saved;
  MOELITE_TRY(parse_sequences(path, hp, shape, seqs_.size(), n_ctx_, payload, &saved));

  // Everything checked. What the replacement needs is allocated first, so running out of memory
  // leaves the context as it was: the staging rows of the largest layer, each sequence's tokens.
  size_t most_rows = 0;
  for (const SavedSequence& s : saved)
    for (uint32_t first : s.first) most_rows = std::max(most_rows, size_t{s.length - first});
  std::vector<float> keys, vals;
  keys.reserve(most_rows * row);
  if (shape.values) vals.reserve(most_rows * row);
  for (const SavedSequence& s : saved) seqs_[s.id].tokens.reserve(s.length);

  // Replace the state.
  for (Sequence& seq : seqs_) {
    seq.n_past = 0;
    seq.tokens.clear();
    std::fill(seq.ring_pos.begin(), seq.ring_pos.end(), -1);
  }
  logits_.clear();
  logits_rows_ = 0;
  logits_row_of_.clear();
  Backend& be = *state_.backend;
  const std::unique_lock<std::mutex> turn = backend_turn();  // other contexts may share `be`
  for (const SavedSequence& s : saved) {
    Sequence& seq = seqs_[s.id];
    for (int32_t l = 0; l < hp.n_layer; ++l) {
      const int32_t first = static_cast<int32_t>(s.first[static_cast<size_t>(l)]), n = static_cast<int32_t>(s.length);
      const int32_t slots = seq.kv.slots[static_cast<size_t>(l)];
      // Copied out of the byte stream: its floats need not be aligned.
      keys.resize(static_cast<size_t>(n - first) * row);
      vals.resize(shape.values ? keys.size() : 0);
      if (!keys.empty()) memcpy(keys.data(), s.keys[static_cast<size_t>(l)], keys.size() * sizeof(float));
      if (!vals.empty()) memcpy(vals.data(), s.values[static_cast<size_t>(l)], vals.size() * sizeof(float));
      for (int32_t p = first; p < n;) {
        const int32_t slot = p % slots, run = std::min(n - p, slots - slot);
        const size_t at = static_cast<size_t>(p - first) * row;
        const Status st =
            be.write_kv(&seq.kv, l, slot, run, keys.data() + at, shape.values ? vals.data() + at : nullptr);
        if (st != MOELITE_OK) {
          for (Sequence& q : seqs_) {
            q.n_past = 0;
            q.tokens.clear();
          }
          return st;
        }
        p += run;
      }
      if (!seq.ring_pos.empty() && hp.window_of(l) > 0)  // every windowed layer has the same ring
        for (int32_t p = first; p < n; ++p) seq.ring_pos[static_cast<size_t>(p % slots)] = p;
    }
    seq.tokens.resize(s.length);
    if (s.length > 0) memcpy(seq.tokens.data(), s.tokens, size_t{s.length} * 4);
    seq.n_past = static_cast<int32_t>(s.length);
  }
  return MOELITE_OK;
}

}  // namespace moelite
