// GGUF (v2/v3) reader: header, metadata, tensor directory, validated before anything trusts it.
//
// Parsing reads the file through pread (platform::File), never through a mapping, so a malformed
// header is rejected before any pointer into the file exists. Every count and length is checked
// against the bytes that remain, every size computation is overflow-checked, and each failure
// has its own status (see moelite_status: MOELITE_ERR_GGUF_*).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "platforms/platform.h"

namespace moelite::gguf {

// clang-format off: a table of ids, kept compact
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
// clang-format on
const char* value_type_name(ValueType t);

// One metadata value. Scalars live in the union-like fields, strings in `str`; arrays keep their
// element type, count and either `strings` (string arrays) or raw little-endian element bytes in
// `raw` (numeric and bool arrays). Nested arrays are legal GGUF; they are kept in `nested`
// (tokenizer files do not use them).
struct Value {
  ValueType type = ValueType::UINT8;
  uint64_t u = 0;                          // unsigned scalars and bool
  int64_t i = 0;                           // signed scalars
  double f = 0.0;                          // float scalars
  std::string str;                         // STRING
  ValueType elem_type = ValueType::UINT8;  // ARRAY
  uint64_t count = 0;                      // ARRAY
  std::vector<uint8_t> raw;                // ARRAY of numeric/bool
  std::vector<std::string> strings;        // ARRAY of STRING
  std::vector<Value> nested;               // ARRAY of ARRAY

  bool is_integer() const;
  bool is_float() const;
  // Integer value of any integer or bool scalar (false if not an integer or out of int64 range).
  bool as_int(int64_t* out) const;
  // Numeric value of any integer or float scalar.
  bool as_double(double* out) const;
  // Element k of a numeric array as double/int64 (false if out of range or not numeric).
  bool array_double(uint64_t k, double* out) const;
  bool array_int(uint64_t k, int64_t* out) const;
};

struct KeyValue {
  std::string key;
  Value value;
};

constexpr int kMaxDims = 4;

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] innermost (contiguous)
  TensorType type = TensorType::F32;
  uint64_t offset = 0;       // relative to the start of the data section, as stored
  uint64_t file_offset = 0;  // absolute offset in the file
  uint64_t size_bytes = 0;   // bytes of data
  uint64_t n_elements = 0;
  uint64_t row_bytes = 0;  // bytes of one ne[0] row
};

class Reader {
 public:
  // Opens and validates `path`. On failure returns the status (message set via fail()) and leaves
  // *out untouched. Statuses: FILE_NOT_FOUND (missing path or a directory), IO, OUT_OF_MEMORY,
  // GGUF_BAD_MAGIC, GGUF_BAD_VERSION (not 2/3, incl. big-endian files), GGUF_TRUNCATED (the file
  // ends inside the header/directory, a plausible count or length needs more bytes than remain,
  // or the file ends before the data section), GGUF_CORRUPT (impossible counts/lengths > 2^40,
  // bad bool, duplicate key or tensor name, bad general.alignment, bad n_dims/ne, ne[0] not a
  // multiple of the block size, misaligned offset), GGUF_UNKNOWN_TYPE (value, array element or
  // tensor type), GGUF_OUT_OF_BOUNDS (tensor data outside the file), GGUF_OVERLAP.
  // A file without tensors may end right after its directory (no data-section padding needed).
  static Status open(const std::string& path, std::unique_ptr<Reader>* out);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_.size(); }
  const platform::File& file() const { return file_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;  // nullptr if absent

  // Typed lookups: true if present with a compatible type (any integer type for ints, any
  // numeric type for floats). Out-of-range integers count as incompatible.
  bool get_int(const std::string& key, int64_t* out) const;
  bool get_float(const std::string& key, double* out) const;
  bool get_bool(const std::string& key, bool* out) const;
  bool get_string(const std::string& key, std::string* out) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent

 private:
  platform::File file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::pair<std::string, size_t>> kv_index_;      // sorted by key
  std::vector<std::pair<std::string, size_t>> tensor_index_;  // sorted by name
  friend class Parser;
};

}  // namespace moelite::gguf
