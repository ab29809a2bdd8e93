// GGUF v2/v3 reader. See gguf.h for the contract.
//
// Error policy (each failure sets a message naming the file, the item and the byte offset):
//   MOELITE_ERR_GGUF_BAD_MAGIC      first four bytes are not "GGUF"
//   MOELITE_ERR_GGUF_BAD_VERSION    version other than 2/3 (v1, future versions, byte-swapped
//                                   big-endian files are reported as such)
//   MOELITE_ERR_GGUF_TRUNCATED      the file ends inside the header, metadata or tensor directory,
//                                   a plausible count/length needs more bytes than remain, or the
//                                   file ends before the tensor data section begins
//   MOELITE_ERR_GGUF_CORRUPT        impossible values: a count or length above kMaxCount (2^40),
//                                   a key longer than 65535 bytes, an empty key or tensor name, a
//                                   tensor name longer than kMaxTensorName, a bool byte other than
//                                   0/1, duplicate keys or tensor names, arrays nested deeper than
//                                   kMaxArrayDepth, a bad general.alignment, n_dims outside 1..4,
//                                   a negative dimension or an element count above INT64_MAX,
//                                   ne[0] not a multiple of the type's block size, a misaligned
//                                   tensor offset
//   MOELITE_ERR_GGUF_UNKNOWN_TYPE   unknown metadata value type (also array element type) or
//                                   tensor type id
//   MOELITE_ERR_GGUF_OUT_OF_BOUNDS  a tensor's data range is (partly) outside the file
//   MOELITE_ERR_GGUF_OVERLAP        two tensors' data ranges overlap
//   MOELITE_ERR_IO                  a read failed
//
// Memory: the header is read through a 64 KiB buffer over pread (the file is never read whole or
// mapped here). No container is sized from a claimed count: counts are first checked against the
// bytes left in the file, then containers are reserved at most kReserveCap ahead and grow with the
// items actually parsed. Memory is therefore proportional to the header bytes consumed: at worst
// (a header made of 14-byte key-values or 12-byte empty nested arrays) a few tens of times the
// header size, typically ~1-3x; raw numeric arrays take exactly their size in the file.
#include "core/gguf/reader.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace moelite::gguf {

namespace {

constexpr uint64_t kMaxCount = uint64_t(1) << 40;  // counts/lengths above this are corrupt, not truncation
constexpr uint64_t kMaxKeyLength = 65535;          // GGUF spec limit for keys
constexpr uint64_t kMaxTensorName = 1024;          // ggml uses 64; stay lenient
constexpr int kMaxArrayDepth = 8;                  // nested arrays deeper than this are corrupt
constexpr uint32_t kDefaultAlignment = 32;
constexpr size_t kBufferSize = 64 * 1024;

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL: return 1;
    case ValueType::UINT16:
    case ValueType::INT16: return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32: return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

// Containers are reserved at most this many elements ahead and then grow with what is actually
// parsed, so memory follows the bytes consumed, never a count the file merely claims (a count
// only has to fit in the rest of the file, which for a large model includes the tensor data).
constexpr uint64_t kReserveCap = 4096;
size_t capped(uint64_t count) { return static_cast<size_t>(std::min(count, kReserveCap)); }

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

// Smallest encoding of one value of type t in the file (string: its length; array: type + count).
uint64_t min_encoded_size(ValueType t) {
  if (t == ValueType::STRING) return 8;
  if (t == ValueType::ARRAY) return 12;
  return scalar_size(t);
}

uint64_t load_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

// Decodes one little-endian scalar of type t from p into v's fields.
void decode_scalar(ValueType t, const uint8_t* p, Value* v) {
  uint64_t bits = load_le(p, scalar_size(t));
  switch (t) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
    case ValueType::BOOL: v->u = bits; break;
    case ValueType::INT8: v->i = static_cast<int8_t>(bits); break;
    case ValueType::INT16: v->i = static_cast<int16_t>(bits); break;
    case ValueType::INT32: v->i = static_cast<int32_t>(bits); break;
    case ValueType::INT64: v->i = static_cast<int64_t>(bits); break;
    case ValueType::FLOAT32: {
      uint32_t b32 = static_cast<uint32_t>(bits);
      float f;
      std::memcpy(&f, &b32, 4);
      v->f = f;
      break;
    }
    case ValueType::FLOAT64: {
      double d;
      std::memcpy(&d, &bits, 8);
      v->f = d;
      break;
    }
    default: break;
  }
}

bool is_int_type(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64: return true;
    default: return false;
  }
}
bool is_unsigned_type(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64 ||
         t == ValueType::BOOL;
}
bool is_float_type(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// A name or key safe to print: at most 80 bytes, non-printable bytes as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  size_t n = std::min<size_t>(s.size(), 80);
  for (size_t k = 0; k < n; ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

bool checked_round_up(uint64_t x, uint64_t align, uint64_t* out) {
  uint64_t r = x % align;
  if (r == 0) {
    *out = x;
    return true;
  }
  uint64_t add = align - r;
  if (x > UINT64_MAX - add) return false;
  *out = x + add;
  return true;
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

// ---- Value helpers

bool Value::is_integer() const { return is_int_type(type); }
bool Value::is_float() const { return is_float_type(type); }

bool Value::as_int(int64_t* out) const {
  if (type == ValueType::BOOL) {
    *out = u ? 1 : 0;
    return true;
  }
  if (!is_int_type(type)) return false;
  if (is_unsigned_type(type)) {
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
  } else {
    *out = i;
  }
  return true;
}

bool Value::as_double(double* out) const {
  if (is_float_type(type)) {
    *out = f;
    return true;
  }
  if (!is_int_type(type)) return false;
  *out = is_unsigned_type(type) ? static_cast<double>(u) : static_cast<double>(i);
  return true;
}

static bool array_element(const Value& v, uint64_t k, Value* elem) {
  if (v.type != ValueType::ARRAY || k >= v.count) return false;
  size_t es = scalar_size(v.elem_type);
  if (es == 0) return false;  // string or nested arrays
  if (k > v.raw.size() / es || (k + 1) * es > v.raw.size()) return false;
  elem->type = v.elem_type;
  decode_scalar(v.elem_type, v.raw.data() + k * es, elem);
  return true;
}

bool Value::array_double(uint64_t k, double* out) const {
  Value e;
  return array_element(*this, k, &e) && e.as_double(out);
}

bool Value::array_int(uint64_t k, int64_t* out) const {
  Value e;
  return array_element(*this, k, &e) && e.as_int(out);
}

// ---- Parser

class Parser {
 public:
  explicit Parser(Reader* r) : r_(r), file_(r->file_), size_(file_.size()), buf_(kBufferSize) {}

  Status run() {
    MOELITE_TRY(parse_header());
    MOELITE_TRY(parse_metadata());
    MOELITE_TRY(parse_tensor_infos());
    return validate_tensors();
  }

 private:
  Reader* r_;
  const platform::File& file_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t buf_off_ = 0;
  size_t buf_len_ = 0;
  std::string ctx_;  // "metadata key #3 'x'", for messages

  const char* path() const { return file_.path().c_str(); }
  uint64_t remaining() const { return size_ - pos_; }

  Status truncated(const char* what, uint64_t need) {
    return fail(MOELITE_ERR_GGUF_TRUNCATED,
                "'%s': %s%s%s at offset %" PRIu64 " needs %" PRIu64 " bytes but the file ends at %" PRIu64
                " (file truncated?)",
                path(), ctx_.c_str(), ctx_.empty() ? "" : ": ", what, pos_, need, size_);
  }

  // Reads n bytes at pos_ into dst, advancing pos_.
  Status read(void* dst, uint64_t n, const char* what) {
    if (n > remaining()) return truncated(what, n);
    uint8_t* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ >= buf_off_ && pos_ < buf_off_ + buf_len_) {
        size_t off = static_cast<size_t>(pos_ - buf_off_);
        size_t take = static_cast<size_t>(std::min<uint64_t>(n, buf_len_ - off));
        std::memcpy(out, buf_.data() + off, take);
        out += take;
        pos_ += take;
        n -= take;
        continue;
      }
      if (n >= buf_.size()) {  // large read: straight into the destination
        MOELITE_TRY(file_.read_at(pos_, out, n));
        pos_ += n;
        return MOELITE_OK;
      }
      size_t fill = static_cast<size_t>(std::min<uint64_t>(buf_.size(), size_ - pos_));
      MOELITE_TRY(file_.read_at(pos_, buf_.data(), fill));
      buf_off_ = pos_;
      buf_len_ = fill;
    }
    return MOELITE_OK;
  }

  Status read_u32(uint32_t* v, const char* what) {
    uint8_t b[4];
    MOELITE_TRY(read(b, 4, what));
    *v = static_cast<uint32_t>(load_le(b, 4));
    return MOELITE_OK;
  }
  Status read_u64(uint64_t* v, const char* what) {
    uint8_t b[8];
    MOELITE_TRY(read(b, 8, what));
    *v = load_le(b, 8);
    return MOELITE_OK;
  }

  // Checks that `count` items of at least `min_size` bytes each can fit in the rest of the file.
  Status check_count(uint64_t count, uint64_t min_size, const char* what) {
    if (count > kMaxCount)
      return fail(MOELITE_ERR_GGUF_CORRUPT,
                  "'%s': %s%s%s count %" PRIu64 " at offset %" PRIu64 " is impossible (limit %" PRIu64 ")", path(),
                  ctx_.c_str(), ctx_.empty() ? "" : ": ", what, count, pos_, kMaxCount);
    // count <= 2^40 and min_size <= 33, so the product cannot overflow.
    uint64_t need = count * min_size;
    if (need > remaining())
      return fail(MOELITE_ERR_GGUF_TRUNCATED,
                  "'%s': %s%s%s count %" PRIu64 " needs at least %" PRIu64 " bytes after offset %" PRIu64
                  " but only %" PRIu64 " remain (file truncated?)",
                  path(), ctx_.c_str(), ctx_.empty() ? "" : ": ", what, count, need, pos_, remaining());
    return MOELITE_OK;
  }

  Status read_string(std::string* s, uint64_t max_len, const char* what) {
    uint64_t start = pos_;
    uint64_t len;
    MOELITE_TRY(read_u64(&len, what));
    if (len > max_len)
      return fail(MOELITE_ERR_GGUF_CORRUPT,
                  "'%s': %s%s%s at offset %" PRIu64 " has length %" PRIu64 " (limit %" PRIu64 ")", path(), ctx_.c_str(),
                  ctx_.empty() ? "" : ": ", what, start, len, max_len);
    if (len > remaining()) return truncated(what, len);
    s->resize(static_cast<size_t>(len));
    return read(s->data(), len, what);
  }

  // -- header
  Status parse_header() {
    uint8_t magic[4] = {0, 0, 0, 0};
    if (size_ < 4) {
      static const uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
      size_t n = static_cast<size_t>(size_);
      if (n) MOELITE_TRY(file_.read_at(0, magic, n));
      if (std::memcmp(magic, kMagic, n) == 0)
        return fail(MOELITE_ERR_GGUF_TRUNCATED, "'%s': file is %s (%" PRIu64 " bytes), no GGUF header", path(),
                    n == 0 ? "empty" : "too short", size_);
      return fail(MOELITE_ERR_GGUF_BAD_MAGIC, "'%s': not a GGUF file (%" PRIu64 " bytes)", path(), size_);
    }
    MOELITE_TRY(read(magic, 4, "magic"));
    if (std::memcmp(magic, "GGUF", 4) != 0) {
      const char* hint = "";
      if (std::memcmp(magic, "tjgg", 4) == 0 || std::memcmp(magic, "lmgg", 4) == 0 ||
          std::memcmp(magic, "fmgg", 4) == 0)
        hint = " (legacy GGML/GGMF/GGJT file; convert it to GGUF)";
      else if (std::memcmp(magic, "FUGG", 4) == 0)
        hint = " (byte-swapped magic)";
      return fail(MOELITE_ERR_GGUF_BAD_MAGIC,
                  "'%s': not a GGUF file: magic bytes %02x %02x %02x %02x, expected 47 47 55 46 (\"GGUF\")%s", path(),
                  magic[0], magic[1], magic[2], magic[3], hint);
    }
    uint32_t version;
    MOELITE_TRY(read_u32(&version, "version"));
    if (version != 2 && version != 3) {
      uint32_t swapped = __builtin_bswap32(version);
      if (swapped >= 1 && swapped <= 3)
        return fail(MOELITE_ERR_GGUF_BAD_VERSION,
                    "'%s': GGUF file is big-endian (version field reads %u byte-swapped); "
                    "only little-endian files are supported",
                    path(), swapped);
      if (version == 1)
        return fail(MOELITE_ERR_GGUF_BAD_VERSION,
                    "'%s': GGUF version 1 is obsolete and not supported (need 2 or 3); re-convert the model", path());
      return fail(MOELITE_ERR_GGUF_BAD_VERSION, "'%s': unsupported GGUF version %u (need 2 or 3)", path(), version);
    }
    r_->version_ = version;
    return MOELITE_OK;
  }

  // -- metadata
  Status read_value(ValueType t, Value* v, int depth) {
    v->type = t;
    if (t == ValueType::STRING) return read_string(&v->str, kMaxCount, "string value");
    if (t != ValueType::ARRAY) {
      uint8_t b[8];
      uint64_t at = pos_;
      MOELITE_TRY(read(b, scalar_size(t), value_type_name(t)));
      if (t == ValueType::BOOL && b[0] > 1)
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: bool value %u at offset %" PRIu64 " (must be 0 or 1)", path(),
                    ctx_.c_str(), b[0], at);
      decode_scalar(t, b, v);
      return MOELITE_OK;
    }
    if (depth >= kMaxArrayDepth)
      return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: arrays nested deeper than %d at offset %" PRIu64, path(),
                  ctx_.c_str(), kMaxArrayDepth, pos_);
    uint64_t at = pos_;
    uint32_t et;
    MOELITE_TRY(read_u32(&et, "array element type"));
    if (!valid_value_type(et))
      return fail(MOELITE_ERR_GGUF_UNKNOWN_TYPE, "'%s': %s: unknown array element type %u at offset %" PRIu64, path(),
                  ctx_.c_str(), et, at);
    v->elem_type = static_cast<ValueType>(et);
    MOELITE_TRY(read_u64(&v->count, "array count"));
    MOELITE_TRY(check_count(v->count, min_encoded_size(v->elem_type), "array"));
    if (v->elem_type == ValueType::STRING) {
      v->strings.reserve(capped(v->count));
      for (uint64_t k = 0; k < v->count; ++k) {
        v->strings.emplace_back();
        MOELITE_TRY(read_string(&v->strings.back(), kMaxCount, "string array element"));
      }
    } else if (v->elem_type == ValueType::ARRAY) {
      v->nested.reserve(capped(v->count));
      for (uint64_t k = 0; k < v->count; ++k) {
        v->nested.emplace_back();
        MOELITE_TRY(read_value(ValueType::ARRAY, &v->nested.back(), depth + 1));
      }
    } else {  // the bytes are in the file (checked above), so this is at most the file size
      uint64_t es = scalar_size(v->elem_type);
      uint64_t data_at = pos_;
      v->raw.resize(static_cast<size_t>(v->count * es));
      MOELITE_TRY(read(v->raw.data(), v->raw.size(), "array data"));
      if (v->elem_type == ValueType::BOOL) {
        for (size_t k = 0; k < v->raw.size(); ++k)
          if (v->raw[k] > 1)
            return fail(MOELITE_ERR_GGUF_CORRUPT,
                        "'%s': %s: bool array element %zu is %u at offset %" PRIu64 " (must be 0 or 1)", path(),
                        ctx_.c_str(), k, v->raw[k], data_at + k);
      }
    }
    return MOELITE_OK;
  }

  Status parse_metadata() {
    uint64_t n_tensors, n_kv;
    MOELITE_TRY(read_u64(&n_tensors, "tensor count"));
    MOELITE_TRY(read_u64(&n_kv, "metadata count"));
    n_tensors_ = n_tensors;
    // A key-value pair takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes,
    // a tensor info at least 8 + 1 (name) + 4 (n_dims) + 8 (ne) + 4 (type) + 8 (offset).
    MOELITE_TRY(check_count(n_tensors, 33, "tensor"));
    MOELITE_TRY(check_count(n_kv, 14, "metadata key-value"));
    r_->kv_.reserve(capped(n_kv));
    for (uint64_t k = 0; k < n_kv; ++k) {
      uint64_t at = pos_;
      ctx_ = "metadata key-value #" + std::to_string(k);
      KeyValue kv;
      MOELITE_TRY(read_string(&kv.key, kMaxKeyLength, "key"));
      if (kv.key.empty())
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s at offset %" PRIu64 " has an empty key", path(), ctx_.c_str(),
                    at);
      ctx_ = "metadata key '" + printable(kv.key) + "'";
      uint64_t type_at = pos_;
      uint32_t t;
      MOELITE_TRY(read_u32(&t, "value type"));
      if (!valid_value_type(t))
        return fail(MOELITE_ERR_GGUF_UNKNOWN_TYPE, "'%s': %s: unknown value type %u at offset %" PRIu64, path(),
                    ctx_.c_str(), t, type_at);
      MOELITE_TRY(read_value(static_cast<ValueType>(t), &kv.value, 0));
      r_->kv_.push_back(std::move(kv));
    }
    ctx_.clear();

    auto& idx = r_->kv_index_;
    idx.reserve(r_->kv_.size());
    for (size_t k = 0; k < r_->kv_.size(); ++k) idx.emplace_back(r_->kv_[k].key, k);
    std::sort(idx.begin(), idx.end());
    for (size_t k = 1; k < idx.size(); ++k)
      if (idx[k].first == idx[k - 1].first)
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': duplicate metadata key '%s' (entries #%zu and #%zu)", path(),
                    printable(idx[k].first).c_str(), idx[k - 1].second, idx[k].second);

    r_->alignment_ = kDefaultAlignment;
    if (const Value* a = r_->find("general.alignment")) {
      int64_t v = 0;
      if (!a->as_int(&v) || a->type == ValueType::BOOL)
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': general.alignment has type %s, expected an integer", path(),
                    value_type_name(a->type));
      if (v <= 0 || (v & (v - 1)) != 0)
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': general.alignment is %" PRId64 ", must be a nonzero power of two",
                    path(), v);
      r_->alignment_ = static_cast<uint64_t>(v);
    }
    return MOELITE_OK;
  }

  // -- tensor directory
  uint64_t n_tensors_ = 0;

  Status parse_tensor_infos() {
    MOELITE_TRY(check_count(n_tensors_, 33, "tensor"));
    auto& ts = r_->tensors_;
    ts.reserve(capped(n_tensors_));
    for (uint64_t k = 0; k < n_tensors_; ++k) {
      uint64_t at = pos_;
      ctx_ = "tensor info #" + std::to_string(k);
      TensorInfo ti;
      MOELITE_TRY(read_string(&ti.name, kMaxTensorName, "name"));
      if (ti.name.empty())
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s at offset %" PRIu64 " has an empty name", path(), ctx_.c_str(),
                    at);
      ctx_ = "tensor '" + printable(ti.name) + "'";
      uint64_t dims_at = pos_;
      MOELITE_TRY(read_u32(&ti.n_dims, "n_dims"));
      if (ti.n_dims < 1 || ti.n_dims > static_cast<uint32_t>(kMaxDims))
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: n_dims %u at offset %" PRIu64 " (must be 1..%d)", path(),
                    ctx_.c_str(), ti.n_dims, dims_at, kMaxDims);
      int64_t n_el = 1;
      for (uint32_t d = 0; d < ti.n_dims; ++d) {
        uint64_t ne_at = pos_;
        uint64_t raw;
        MOELITE_TRY(read_u64(&raw, "dimension"));
        int64_t ne = static_cast<int64_t>(raw);
        if (ne < 0)
          return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: ne[%u] = %" PRId64 " at offset %" PRIu64 " is negative",
                      path(), ctx_.c_str(), d, ne, ne_at);
        ti.ne[d] = ne;
        if (__builtin_mul_overflow(n_el, ne, &n_el))
          return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: element count overflows int64 at ne[%u] = %" PRId64, path(),
                      ctx_.c_str(), d, ne);
      }
      ti.n_elements = static_cast<uint64_t>(n_el);
      uint64_t type_at = pos_;
      uint32_t type;
      MOELITE_TRY(read_u32(&type, "type"));
      const TypeInfo* info = type_info(type);
      if (!info)
        return fail(MOELITE_ERR_GGUF_UNKNOWN_TYPE, "'%s': %s: unknown tensor type id %u at offset %" PRIu64, path(),
                    ctx_.c_str(), type, type_at);
      ti.type = static_cast<TensorType>(type);
      uint64_t off_at = pos_;
      MOELITE_TRY(read_u64(&ti.offset, "offset"));
      if (ti.offset % r_->alignment_ != 0)
        return fail(MOELITE_ERR_GGUF_CORRUPT,
                    "'%s': %s: data offset %" PRIu64 " (at file offset %" PRIu64
                    ") is not a multiple of the alignment %" PRIu64,
                    path(), ctx_.c_str(), ti.offset, off_at, r_->alignment_);
      if (static_cast<uint64_t>(ti.ne[0]) % info->block_size != 0)
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: ne[0] = %" PRId64 " is not a multiple of the %s block size %u",
                    path(), ctx_.c_str(), ti.ne[0], info->name, info->block_size);
      if (!type_row_bytes(ti.type, static_cast<uint64_t>(ti.ne[0]), &ti.row_bytes))
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: row size overflows", path(), ctx_.c_str());
      uint64_t rows = ti.ne[0] == 0 ? 0 : ti.n_elements / static_cast<uint64_t>(ti.ne[0]);
      if (__builtin_mul_overflow(ti.row_bytes, rows, &ti.size_bytes))
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': %s: data size overflows", path(), ctx_.c_str());
      ts.push_back(std::move(ti));
    }
    ctx_.clear();

    auto& idx = r_->tensor_index_;
    idx.reserve(ts.size());
    for (size_t k = 0; k < ts.size(); ++k) idx.emplace_back(ts[k].name, k);
    std::sort(idx.begin(), idx.end());
    for (size_t k = 1; k < idx.size(); ++k)
      if (idx[k].first == idx[k - 1].first)
        return fail(MOELITE_ERR_GGUF_CORRUPT, "'%s': duplicate tensor name '%s' (tensor infos #%zu and #%zu)", path(),
                    printable(idx[k].first).c_str(), idx[k - 1].second, idx[k].second);
    return MOELITE_OK;
  }

  Status validate_tensors() {
    uint64_t header_end = pos_;
    if (!checked_round_up(header_end, r_->alignment_, &r_->data_offset_))
      return fail(MOELITE_ERR_GGUF_CORRUPT,
                  "'%s': data section offset overflows (header ends at %" PRIu64 ", alignment %" PRIu64 ")", path(),
                  header_end, r_->alignment_);
    auto& ts = r_->tensors_;
    if (ts.empty()) return MOELITE_OK;  // metadata-only file: the padding may be absent
    if (r_->data_offset_ > size_)
      return fail(MOELITE_ERR_GGUF_TRUNCATED,
                  "'%s': file ends at %" PRIu64 ", before the tensor data section at offset %" PRIu64
                  " (file truncated?)",
                  path(), size_, r_->data_offset_);
    for (TensorInfo& t : ts) {
      uint64_t end = 0;
      bool overflow = __builtin_add_overflow(r_->data_offset_, t.offset, &t.file_offset) ||
                      __builtin_add_overflow(t.file_offset, t.size_bytes, &end);
      if (overflow || end > size_)
        return fail(MOELITE_ERR_GGUF_OUT_OF_BOUNDS,
                    "'%s': tensor '%s': data [offset %" PRIu64 ", size %" PRIu64
                    "] ends past the end of the file (size %" PRIu64 ")",
                    path(), printable(t.name).c_str(), overflow ? r_->data_offset_ : t.file_offset, t.size_bytes,
                    size_);
    }
    std::vector<size_t> order;
    order.reserve(ts.size());
    for (size_t k = 0; k < ts.size(); ++k)
      if (ts[k].size_bytes > 0) order.push_back(k);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ts[a].file_offset != ts[b].file_offset ? ts[a].file_offset < ts[b].file_offset : a < b;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& p = ts[order[k - 1]];
      const TensorInfo& c = ts[order[k]];
      if (p.file_offset + p.size_bytes > c.file_offset)
        return fail(MOELITE_ERR_GGUF_OVERLAP,
                    "'%s': tensor '%s' data [offset %" PRIu64 ", size %" PRIu64
                    "] overlaps tensor '%s' data [offset %" PRIu64 ", size %" PRIu64 "]",
                    path(), printable(p.name).c_str(), p.file_offset, p.size_bytes, printable(c.name).c_str(),
                    c.file_offset, c.size_bytes);
    }
    return MOELITE_OK;
  }
};

// ---- Reader

Status Reader::open(const std::string& path, std::unique_ptr<Reader>* out) {
  std::unique_ptr<Reader> r(new (std::nothrow) Reader());
  if (!r) return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", path.c_str());
  MOELITE_TRY(platform::File::open(path, &r->file_));
  try {
    Parser p(r.get());
    MOELITE_TRY(p.run());
  } catch (const std::bad_alloc&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory reading the GGUF header of '%s'", path.c_str());
  } catch (const std::length_error&) {
    return fail(MOELITE_ERR_OUT_OF_MEMORY, "out of memory reading the GGUF header of '%s'", path.c_str());
  }
  *out = std::move(r);
  return MOELITE_OK;
}

const Value* Reader::find(const std::string& key) const {
  auto it = std::lower_bound(kv_index_.begin(), kv_index_.end(), key,
                             [](const std::pair<std::string, size_t>& e, const std::string& k) { return e.first < k; });
  if (it == kv_index_.end() || it->first != key) return nullptr;
  return &kv_[it->second].value;
}

bool Reader::get_int(const std::string& key, int64_t* out) const {
  const Value* v = find(key);
  return v && v->type != ValueType::BOOL && v->as_int(out);
}

bool Reader::get_float(const std::string& key, double* out) const {
  const Value* v = find(key);
  return v && v->as_double(out);
}

bool Reader::get_bool(const std::string& key, bool* out) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::BOOL) return false;
  *out = v->u != 0;
  return true;
}

bool Reader::get_string(const std::string& key, std::string* out) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::STRING) return false;
  *out = v->str;
  return true;
}

const TensorInfo* Reader::find_tensor(const std::string& name) const {
  auto it = std::lower_bound(tensor_index_.begin(), tensor_index_.end(), name,
                             [](const std::pair<std::string, size_t>& e, const std::string& k) { return e.first < k; });
  if (it == tensor_index_.end() || it->first != name) return nullptr;
  return &tensors_[it->second];
}

}  // namespace moelite::gguf
