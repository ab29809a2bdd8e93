// Test helper: emits GGUF files byte by byte, valid by default, with hooks for every malformation
// the reader must reject (raw key-value bytes, overridden counts/version/magic, explicit tensor
// offsets, arbitrary n_dims/ne/type values).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/types.h"

namespace moelite::testing_gguf {

// Little-endian byte writer.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& u8(uint8_t v) {
    b.push_back(v);
    return *this;
  }
  Bytes& u16(uint16_t v) { return le(v, 2); }
  Bytes& u32(uint32_t v) { return le(v, 4); }
  Bytes& u64(uint64_t v) { return le(v, 8); }
  Bytes& i64(int64_t v) { return le(static_cast<uint64_t>(v), 8); }
  Bytes& f32(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    return u32(x);
  }
  Bytes& f64(double f) {
    uint64_t x;
    std::memcpy(&x, &f, 8);
    return u64(x);
  }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
  Bytes& le(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b.push_back(static_cast<uint8_t>(v >> (8 * k)));
    return *this;
  }
};

// GGUF metadata value type ids.
enum : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kStr = 8,
  kArr = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;           // n_dims = ne.size(), written as given
  uint32_t type = 0;                 // tensor type id, written as given
  uint64_t offset = UINT64_MAX;      // UINT64_MAX: next aligned offset after the previous tensor
  uint64_t data_bytes = UINT64_MAX;  // UINT64_MAX: computed from type and ne; 0: write no data
};

class GgufBuilder {
 public:
  uint8_t magic[4] = {'G', 'G', 'U', 'F'};
  uint32_t version = 3;
  int64_t n_tensors_override = -1;  // >= 0: written instead of the real count
  uint64_t n_kv_override = 0;
  bool use_n_kv_override = false;
  uint64_t alignment = 32;      // used for layout; add general.alignment yourself to change the file's
  bool pad_after_last = false;  // pad the file after the last tensor's data to the alignment

  // Each key-value is appended as pre-encoded bytes (key string + type + value).
  std::vector<std::vector<uint8_t>> kvs;
  std::vector<TensorSpec> tensors;

  void kv_raw(const std::vector<uint8_t>& bytes) { kvs.push_back(bytes); }
  void kv_u8(const std::string& k, uint8_t v) { kvs.push_back(Bytes().str(k).u32(kU8).u8(v).b); }
  void kv_i8(const std::string& k, int8_t v) { kvs.push_back(Bytes().str(k).u32(kI8).u8(static_cast<uint8_t>(v)).b); }
  void kv_u16(const std::string& k, uint16_t v) { kvs.push_back(Bytes().str(k).u32(kU16).u16(v).b); }
  void kv_i16(const std::string& k, int16_t v) {
    kvs.push_back(Bytes().str(k).u32(kI16).u16(static_cast<uint16_t>(v)).b);
  }
  void kv_u32(const std::string& k, uint32_t v) { kvs.push_back(Bytes().str(k).u32(kU32).u32(v).b); }
  void kv_i32(const std::string& k, int32_t v) {
    kvs.push_back(Bytes().str(k).u32(kI32).u32(static_cast<uint32_t>(v)).b);
  }
  void kv_u64(const std::string& k, uint64_t v) { kvs.push_back(Bytes().str(k).u32(kU64).u64(v).b); }
  void kv_i64(const std::string& k, int64_t v) { kvs.push_back(Bytes().str(k).u32(kI64).i64(v).b); }
  void kv_f32(const std::string& k, float v) { kvs.push_back(Bytes().str(k).u32(kF32).f32(v).b); }
  void kv_f64(const std::string& k, double v) { kvs.push_back(Bytes().str(k).u32(kF64).f64(v).b); }
  void kv_bool(const std::string& k, bool v) { kvs.push_back(Bytes().str(k).u32(kBool).u8(v ? 1 : 0).b); }
  void kv_str(const std::string& k, const std::string& v) { kvs.push_back(Bytes().str(k).u32(kStr).str(v).b); }
  void kv_arr_str(const std::string& k, const std::vector<std::string>& v) {
    Bytes b;
    b.str(k).u32(kArr).u32(kStr).u64(v.size());
    for (const auto& s : v) b.str(s);
    kvs.push_back(b.b);
  }
  void kv_arr_i32(const std::string& k, const std::vector<int32_t>& v) {
    Bytes b;
    b.str(k).u32(kArr).u32(kI32).u64(v.size());
    for (int32_t x : v) b.u32(static_cast<uint32_t>(x));
    kvs.push_back(b.b);
  }
  void kv_arr_f32(const std::string& k, const std::vector<float>& v) {
    Bytes b;
    b.str(k).u32(kArr).u32(kF32).u64(v.size());
    for (float x : v) b.f32(x);
    kvs.push_back(b.b);
  }

  void tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset = UINT64_MAX,
              uint64_t data_bytes = UINT64_MAX) {
    tensors.push_back({name, std::move(ne), type, offset, data_bytes});
  }

  static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

  // Bytes of data written for a tensor spec (0 when the type or shape makes it unknowable or
  // absurdly large).
  static uint64_t data_size(const TensorSpec& t) {
    if (t.data_bytes != UINT64_MAX) return t.data_bytes;
    const TypeInfo* info = type_info(t.type);
    if (!info || t.ne.empty()) return 0;
    uint64_t n = 1;
    for (int64_t d : t.ne) {
      if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return 0;
    }
    if (n % info->block_size) return 0;
    uint64_t bytes = n / info->block_size * info->block_bytes;
    return bytes > (uint64_t(1) << 30) ? 0 : bytes;  // absurd shapes get no data written
  }

  // Resolved offsets (relative to the data section) and sizes, as build() lays them out.
  std::vector<uint64_t> offsets() const {
    std::vector<uint64_t> out;
    uint64_t next = 0;
    for (const auto& t : tensors) {
      uint64_t off = t.offset != UINT64_MAX ? t.offset : next;
      out.push_back(off);
      uint64_t end = off + data_size(t);
      if (t.offset == UINT64_MAX || round_up(end, alignment) > next) next = round_up(end, alignment);
    }
    return out;
  }

  std::vector<uint8_t> build() const {
    Bytes b;
    b.raw({magic[0], magic[1], magic[2], magic[3]});
    b.u32(version);
    b.u64(n_tensors_override >= 0 ? static_cast<uint64_t>(n_tensors_override) : tensors.size());
    b.u64(use_n_kv_override ? n_kv_override : kvs.size());
    for (const auto& kv : kvs) b.raw(kv);
    std::vector<uint64_t> offs = offsets();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TensorSpec& t = tensors[k];
      b.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
      for (int64_t d : t.ne) b.i64(d);
      b.u32(t.type).u64(offs[k]);
    }
    if (tensors.empty()) return b.b;
    uint64_t data_start = round_up(b.b.size(), alignment);
    b.b.resize(data_start, 0);
    uint64_t end = data_start;
    for (size_t k = 0; k < tensors.size(); ++k)  // tensors without data (size 0) write nothing
      if (data_size(tensors[k]) > 0) end = std::max(end, data_start + offs[k] + data_size(tensors[k]));
    size_t old = b.b.size();
    b.b.resize(end);
    for (size_t k = old; k < b.b.size(); ++k) b.b[k] = static_cast<uint8_t>(k * 131 + 7);
    if (pad_after_last) b.b.resize(round_up(b.b.size(), alignment), 0);
    return b.b;
  }
};

// A temporary file removed on destruction.
class TempFile {
 public:
  explicit TempFile(const std::string& dir, const std::string& tag = "gguf") {
    static std::atomic<int> counter{0};
    std::string d = dir.empty() ? "/tmp/" : dir;
    if (d.back() != '/') d += '/';
    path_ = d + "moelite_test_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)) +
            ".gguf";
  }
  TempFile(const std::string& dir, const std::vector<uint8_t>& bytes) : TempFile(dir) { write(bytes); }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  bool write(const std::vector<uint8_t>& bytes) const { return write(bytes.data(), bytes.size()); }
  bool write(const uint8_t* data, size_t n) const {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) return false;
    bool ok = (n == 0 || std::fwrite(data, 1, n, f) == n);
    return std::fclose(f) == 0 && ok;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace moelite::testing_gguf
