// GGUF reader: a valid file round-trips every metadata type and tensor info; each malformation
// gives its specific status (and never crashes); every truncation and random corruption of a
// valid file is rejected or survived without undefined behaviour.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/gguf/reader.h"
#include "tests/gguf_builder.h"

namespace {

using moelite::Status;
using moelite::TensorType;
using moelite::gguf::Reader;
using moelite::gguf::TensorInfo;
using moelite::gguf::Value;
using moelite::gguf::ValueType;
using namespace moelite::testing_gguf;

std::string tmp_dir() { return ::testing::TempDir(); }

Status open_bytes(const std::vector<uint8_t>& bytes, std::unique_ptr<Reader>* out = nullptr) {
  TempFile f(tmp_dir(), bytes);
  std::unique_ptr<Reader> r;
  moelite::clear_error();
  Status st = Reader::open(f.path(), &r);
  if (st == MOELITE_OK) {
    EXPECT_NE(r, nullptr);
  } else {
    EXPECT_EQ(r, nullptr);
    EXPECT_STRNE(moelite::last_error_message(), "") << "status " << st << " without a message";
  }
  if (out) *out = std::move(r);
  return st;
}

std::string last_error() { return moelite::last_error_message(); }

// Nested array value: [[1, 2], ["x"]].
std::vector<uint8_t> nested_kv(const std::string& key) {
  Bytes b;
  b.str(key).u32(kArr).u32(kArr).u64(2);
  b.u32(kI32).u64(2).u32(1).u32(2);
  b.u32(kStr).u64(1).str("x");
  return b.b;
}

// A valid file with every value type, arrays (numeric, bool, string, nested) and three tensors.
GgufBuilder full_builder() {
  GgufBuilder g;
  g.kv_str("general.architecture", "testarch");
  g.kv_u8("t.u8", 200);
  g.kv_i8("t.i8", -5);
  g.kv_u16("t.u16", 60000);
  g.kv_i16("t.i16", -30000);
  g.kv_u32("t.u32", 4000000000u);
  g.kv_i32("t.i32", -2000000000);
  g.kv_f32("t.f32", 1.5f);
  g.kv_bool("t.bool", true);
  g.kv_u64("t.u64", UINT64_MAX);
  g.kv_i64("t.i64", INT64_MIN);
  g.kv_f64("t.f64", -2.25);
  g.kv_str("t.empty_str", "");
  g.kv_arr_str("tokenizer.ggml.tokens", {"<s>", "</s>", "hello", ""});
  g.kv_arr_i32("t.arr_i32", {-1, 0, 7});
  g.kv_arr_f32("t.arr_f32", {0.5f, -3.0f});
  g.kv_raw(Bytes().str("t.arr_bool").u32(kArr).u32(kBool).u64(3).u8(1).u8(0).u8(1).b);
  g.kv_raw(Bytes().str("t.arr_u64").u32(kArr).u32(kU64).u64(2).u64(UINT64_MAX).u64(9).b);
  g.kv_raw(Bytes().str("t.arr_empty").u32(kArr).u32(kU8).u64(0).b);
  g.kv_raw(nested_kv("t.nested"));
  g.tensor("token_embd.weight", {4, 3}, 0);                 // F32, 48 bytes
  g.tensor("blk.0.ffn_up_exps.weight", {64, 2, 2}, 2);      // Q4_0, 4 rows * 36
  g.tensor("blk.0.ffn_down_exps.weight", {256, 1, 2}, 12);  // Q4_K, 2 rows * 144
  return g;
}

// A small valid file (used for the prefix and fuzz loops).
GgufBuilder small_builder() {
  GgufBuilder g;
  g.kv_str("general.architecture", "x");
  g.kv_u32("general.alignment", 32);
  g.kv_bool("b", false);
  g.kv_arr_str("tok", {"a", "bc"});
  g.kv_arr_i32("ints", {1, 2});
  g.kv_raw(nested_kv("nest"));
  g.tensor("a", {8}, 0);
  g.tensor("b", {32, 2}, 8);  // Q8_0
  return g;
}

// A builder with one tensor whose spec the test then changes.
GgufBuilder one_tensor(std::vector<int64_t> ne, uint32_t type, uint64_t offset = UINT64_MAX) {
  GgufBuilder g;
  g.kv_str("general.architecture", "x");
  g.tensor("blk.3.ffn_up_exps.weight", std::move(ne), type, offset);
  return g;
}

// ---------------------------------------------------------------- valid files

TEST(GgufReader, ValidFileRoundTripsMetadata) {
  std::unique_ptr<Reader> r;
  ASSERT_EQ(open_bytes(full_builder().build(), &r), MOELITE_OK) << last_error();
  EXPECT_EQ(r->version(), 3u);
  EXPECT_EQ(r->alignment(), 32u);
  EXPECT_EQ(r->data_offset() % 32, 0u);
  EXPECT_EQ(r->metadata().size(), 20u);
  EXPECT_EQ(r->metadata()[0].key, "general.architecture");

  std::string s;
  ASSERT_TRUE(r->get_string("general.architecture", &s));
  EXPECT_EQ(s, "testarch");
  ASSERT_TRUE(r->get_string("t.empty_str", &s));
  EXPECT_EQ(s, "");

  int64_t i = 0;
  double d = 0;
  ASSERT_TRUE(r->get_int("t.u8", &i));
  EXPECT_EQ(i, 200);
  ASSERT_TRUE(r->get_int("t.i8", &i));
  EXPECT_EQ(i, -5);
  ASSERT_TRUE(r->get_int("t.u16", &i));
  EXPECT_EQ(i, 60000);
  ASSERT_TRUE(r->get_int("t.i16", &i));
  EXPECT_EQ(i, -30000);
  ASSERT_TRUE(r->get_int("t.u32", &i));
  EXPECT_EQ(i, 4000000000LL);
  ASSERT_TRUE(r->get_int("t.i32", &i));
  EXPECT_EQ(i, -2000000000LL);
  ASSERT_TRUE(r->get_int("t.i64", &i));
  EXPECT_EQ(i, INT64_MIN);
  EXPECT_FALSE(r->get_int("t.u64", &i)) << "UINT64_MAX does not fit int64";
  EXPECT_EQ(r->find("t.u64")->type, ValueType::UINT64);
  EXPECT_EQ(r->find("t.u64")->u, UINT64_MAX);
  EXPECT_FALSE(r->get_int("t.f32", &i));
  EXPECT_FALSE(r->get_int("general.architecture", &i));
  EXPECT_FALSE(r->get_int("t.bool", &i));

  ASSERT_TRUE(r->get_float("t.f32", &d));
  EXPECT_EQ(d, 1.5);
  ASSERT_TRUE(r->get_float("t.f64", &d));
  EXPECT_EQ(d, -2.25);
  ASSERT_TRUE(r->get_float("t.i16", &d));
  EXPECT_EQ(d, -30000.0);
  EXPECT_FALSE(r->get_float("general.architecture", &d));

  bool b = false;
  ASSERT_TRUE(r->get_bool("t.bool", &b));
  EXPECT_TRUE(b);
  EXPECT_FALSE(r->get_bool("t.u8", &b));
  EXPECT_FALSE(r->get_string("t.u8", &s));

  EXPECT_EQ(r->find("missing.key"), nullptr);
  EXPECT_FALSE(r->get_int("missing.key", &i));

  const Value* v = r->find("t.i8");
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->is_integer());
  EXPECT_FALSE(v->is_float());
  EXPECT_TRUE(r->find("t.f64")->is_float());
  EXPECT_FALSE(r->find("t.bool")->is_integer());
  ASSERT_TRUE(r->find("t.bool")->as_int(&i));
  EXPECT_EQ(i, 1);

  const Value* tok = r->find("tokenizer.ggml.tokens");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->type, ValueType::ARRAY);
  EXPECT_EQ(tok->elem_type, ValueType::STRING);
  EXPECT_EQ(tok->count, 4u);
  ASSERT_EQ(tok->strings.size(), 4u);
  EXPECT_EQ(tok->strings[2], "hello");
  EXPECT_EQ(tok->strings[3], "");
  EXPECT_FALSE(tok->array_int(0, &i));

  const Value* ai = r->find("t.arr_i32");
  ASSERT_NE(ai, nullptr);
  EXPECT_EQ(ai->elem_type, ValueType::INT32);
  EXPECT_EQ(ai->count, 3u);
  EXPECT_EQ(ai->raw.size(), 12u);
  ASSERT_TRUE(ai->array_int(0, &i));
  EXPECT_EQ(i, -1);
  ASSERT_TRUE(ai->array_int(2, &i));
  EXPECT_EQ(i, 7);
  ASSERT_TRUE(ai->array_double(2, &d));
  EXPECT_EQ(d, 7.0);
  EXPECT_FALSE(ai->array_int(3, &i));

  const Value* af = r->find("t.arr_f32");
  ASSERT_TRUE(af->array_double(1, &d));
  EXPECT_EQ(d, -3.0);
  EXPECT_FALSE(af->array_int(1, &i));

  const Value* ab = r->find("t.arr_bool");
  EXPECT_EQ(ab->elem_type, ValueType::BOOL);
  ASSERT_TRUE(ab->array_int(1, &i));
  EXPECT_EQ(i, 0);
  ASSERT_TRUE(ab->array_int(2, &i));
  EXPECT_EQ(i, 1);

  const Value* au = r->find("t.arr_u64");
  EXPECT_FALSE(au->array_int(0, &i));
  ASSERT_TRUE(au->array_int(1, &i));
  EXPECT_EQ(i, 9);

  const Value* ae = r->find("t.arr_empty");
  EXPECT_EQ(ae->count, 0u);
  EXPECT_FALSE(ae->array_int(0, &i));

  const Value* n = r->find("t.nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->elem_type, ValueType::ARRAY);
  ASSERT_EQ(n->nested.size(), 2u);
  EXPECT_EQ(n->nested[0].elem_type, ValueType::INT32);
  ASSERT_TRUE(n->nested[0].array_int(1, &i));
  EXPECT_EQ(i, 2);
  EXPECT_EQ(n->nested[1].elem_type, ValueType::STRING);
  ASSERT_EQ(n->nested[1].strings.size(), 1u);
  EXPECT_EQ(n->nested[1].strings[0], "x");

  EXPECT_STREQ(moelite::gguf::value_type_name(ValueType::FLOAT64), "float64");
  EXPECT_STREQ(moelite::gguf::value_type_name(ValueType::ARRAY), "array");
}

TEST(GgufReader, ValidFileRoundTripsTensorInfos) {
  GgufBuilder g = full_builder();
  std::vector<uint8_t> bytes = g.build();
  std::unique_ptr<Reader> r;
  ASSERT_EQ(open_bytes(bytes, &r), MOELITE_OK) << last_error();
  ASSERT_EQ(r->tensors().size(), 3u);
  EXPECT_EQ(r->file_size(), bytes.size());
  std::vector<uint64_t> offs = g.offsets();

  const TensorInfo* t = r->find_tensor("token_embd.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_dims, 2u);
  EXPECT_EQ(t->ne[0], 4);
  EXPECT_EQ(t->ne[1], 3);
  EXPECT_EQ(t->ne[2], 1);
  EXPECT_EQ(t->ne[3], 1);
  EXPECT_EQ(t->type, TensorType::F32);
  EXPECT_EQ(t->offset, offs[0]);
  EXPECT_EQ(t->file_offset, r->data_offset() + offs[0]);
  EXPECT_EQ(t->n_elements, 12u);
  EXPECT_EQ(t->row_bytes, 16u);
  EXPECT_EQ(t->size_bytes, 48u);

  t = r->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_dims, 3u);
  EXPECT_EQ(t->type, TensorType::Q4_0);
  EXPECT_EQ(t->offset, offs[1]);
  EXPECT_EQ(t->offset % 32, 0u);
  EXPECT_EQ(t->n_elements, 256u);
  EXPECT_EQ(t->row_bytes, 36u);
  EXPECT_EQ(t->size_bytes, 144u);

  t = r->find_tensor("blk.0.ffn_down_exps.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, TensorType::Q4_K);
  EXPECT_EQ(t->ne[2], 2);
  EXPECT_EQ(t->row_bytes, 144u);
  EXPECT_EQ(t->size_bytes, 288u);
  EXPECT_EQ(t->file_offset + t->size_bytes, bytes.size());

  EXPECT_EQ(&r->tensors()[1], r->find_tensor("blk.0.ffn_up_exps.weight")) << "directory keeps file order";
  EXPECT_EQ(r->find_tensor("nope"), nullptr);
  EXPECT_EQ(r->find_tensor(""), nullptr);

  // The tensor data is where the reader says it is.
  const TensorInfo* e = r->find_tensor("token_embd.weight");
  std::vector<uint8_t> data(e->size_bytes);
  ASSERT_EQ(r->file().read_at(e->file_offset, data.data(), data.size()), MOELITE_OK);
  for (size_t k = 0; k < data.size(); ++k) ASSERT_EQ(data[k], static_cast<uint8_t>((e->file_offset + k) * 131 + 7));
}

TEST(GgufReader, AcceptsVersion2AndPaddedFiles) {
  GgufBuilder g = small_builder();
  g.version = 2;
  g.pad_after_last = true;
  std::unique_ptr<Reader> r;
  ASSERT_EQ(open_bytes(g.build(), &r), MOELITE_OK) << last_error();
  EXPECT_EQ(r->version(), 2u);
}

TEST(GgufReader, CustomAlignmentAnyIntegerType) {
  for (int variant = 0; variant < 3; ++variant) {
    GgufBuilder g;
    g.alignment = 128;
    if (variant == 0) g.kv_u32("general.alignment", 128);
    if (variant == 1) g.kv_u64("general.alignment", 128);
    if (variant == 2) g.kv_i16("general.alignment", 128);
    g.tensor("a", {3}, 0);
    g.tensor("b", {5}, 0);
    std::unique_ptr<Reader> r;
    ASSERT_EQ(open_bytes(g.build(), &r), MOELITE_OK) << variant << ": " << last_error();
    EXPECT_EQ(r->alignment(), 128u);
    EXPECT_EQ(r->data_offset() % 128, 0u);
    EXPECT_EQ(r->find_tensor("b")->offset, 128u);
  }
}

TEST(GgufReader, MetadataOnlyAndZeroSizedTensors) {
  GgufBuilder g;
  g.kv_str("general.architecture", "x");
  std::unique_ptr<Reader> r;
  ASSERT_EQ(open_bytes(g.build(), &r), MOELITE_OK) << last_error();
  EXPECT_TRUE(r->tensors().empty());

  // A tensor with a zero dimension has no data and overlaps nothing.
  GgufBuilder z;
  z.tensor("empty", {0, 1000000}, 0, 0, 0);
  z.tensor("real", {8}, 0, 0);
  ASSERT_EQ(open_bytes(z.build(), &r), MOELITE_OK) << last_error();
  EXPECT_EQ(r->find_tensor("empty")->size_bytes, 0u);
  EXPECT_EQ(r->find_tensor("empty")->n_elements, 0u);
}

// ---------------------------------------------------------------- file-level failures

TEST(GgufReader, MissingFileAndDirectory) {
  std::unique_ptr<Reader> r;
  EXPECT_EQ(Reader::open(tmp_dir() + "/moelite_definitely_missing_file.gguf", &r), MOELITE_ERR_FILE_NOT_FOUND);
  EXPECT_EQ(r, nullptr);
  std::string dir = tmp_dir() + "/moelite_gguf_dir_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  EXPECT_EQ(Reader::open(dir, &r), MOELITE_ERR_FILE_NOT_FOUND);
  EXPECT_NE(last_error().find("directory"), std::string::npos) << last_error();
  ::rmdir(dir.c_str());
}

TEST(GgufReader, EmptyAndTinyFiles) {
  EXPECT_EQ(open_bytes({}), MOELITE_ERR_GGUF_TRUNCATED);
  EXPECT_NE(last_error().find("empty"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes({'G', 'G'}), MOELITE_ERR_GGUF_TRUNCATED);
  EXPECT_EQ(open_bytes({'P', 'K'}), MOELITE_ERR_GGUF_BAD_MAGIC);
}

TEST(GgufReader, BadMagic) {
  GgufBuilder g = small_builder();
  g.magic[3] = 'X';
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_BAD_MAGIC);
  EXPECT_NE(last_error().find("not a GGUF file"), std::string::npos) << last_error();
  std::vector<uint8_t> ggjt = {'t', 'j', 'g', 'g', 3, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(open_bytes(ggjt), MOELITE_ERR_GGUF_BAD_MAGIC);
  EXPECT_NE(last_error().find("legacy"), std::string::npos) << last_error();
}

TEST(GgufReader, BadVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    GgufBuilder g = small_builder();
    g.version = v;
    EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_BAD_VERSION) << v;
  }
  GgufBuilder g = small_builder();
  g.version = 1;
  open_bytes(g.build());
  EXPECT_NE(last_error().find("version 1"), std::string::npos) << last_error();
  for (uint32_t v : {2u, 3u}) {
    g.version = __builtin_bswap32(v);  // a big-endian file
    EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_BAD_VERSION);
    EXPECT_NE(last_error().find("big-endian"), std::string::npos) << last_error();
  }
}

TEST(GgufReader, TruncatedAtEveryByte) {
  std::vector<uint8_t> bytes = small_builder().build();
  ASSERT_EQ(open_bytes(bytes), MOELITE_OK) << last_error();
  TempFile f(tmp_dir(), "prefix");
  for (size_t n = 0; n < bytes.size(); ++n) {
    ASSERT_TRUE(f.write(bytes.data(), n));
    std::unique_ptr<Reader> r;
    Status st = Reader::open(f.path(), &r);
    ASSERT_TRUE(st == MOELITE_ERR_GGUF_TRUNCATED || st == MOELITE_ERR_GGUF_OUT_OF_BOUNDS)
        << "prefix of " << n << "/" << bytes.size() << " bytes gave status " << st << ": " << last_error();
    ASSERT_EQ(r, nullptr);
  }
}

TEST(GgufReader, FileEndsBeforeDataSection) {
  GgufBuilder g = one_tensor({8}, 0);
  std::vector<uint8_t> bytes = g.build();
  std::unique_ptr<Reader> r;
  ASSERT_EQ(open_bytes(bytes, &r), MOELITE_OK);
  uint64_t data_offset = r->data_offset();
  ASSERT_GT(data_offset, 1u);
  bytes.resize(data_offset - 1);
  EXPECT_EQ(open_bytes(bytes), MOELITE_ERR_GGUF_TRUNCATED);
  EXPECT_NE(last_error().find("before the tensor data section"), std::string::npos) << last_error();
}

// ---------------------------------------------------------------- header counts

TEST(GgufReader, AbsurdCounts) {
  GgufBuilder g = small_builder();
  g.use_n_kv_override = true;
  g.n_kv_override = uint64_t(1) << 62;
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("impossible"), std::string::npos) << last_error();

  g = small_builder();
  g.n_tensors_override = int64_t(1) << 62;
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);

  // Plausible counts the file is too short for: truncation.
  g = small_builder();
  g.use_n_kv_override = true;
  g.n_kv_override = 100000;
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_TRUNCATED);
  g = small_builder();
  g.n_tensors_override = 100000;
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_TRUNCATED);
}

// ---------------------------------------------------------------- metadata

std::vector<uint8_t> with_kv(const std::vector<uint8_t>& kv) {
  GgufBuilder g = small_builder();
  g.kv_raw(kv);
  return g.build();
}

TEST(GgufReader, AbsurdStringLengths) {
  // Key length.
  EXPECT_EQ(open_bytes(with_kv(Bytes().u64(uint64_t(1) << 62).b)), MOELITE_ERR_GGUF_CORRUPT);
  // Value string length.
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kStr).u64(uint64_t(1) << 62).b)), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("'k'"), std::string::npos) << last_error();
  // String inside a string array.
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kArr).u32(kStr).u64(1).u64(UINT64_MAX).b)),
            MOELITE_ERR_GGUF_CORRUPT);
  // Plausible length, file too short.
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kStr).u64(5000).b)), MOELITE_ERR_GGUF_TRUNCATED);
  // Keys: empty, longer than 65535.
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("").u32(kU8).u8(1).b)), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_EQ(open_bytes(with_kv(Bytes().str(std::string(70000, 'k')).u32(kU8).u8(1).b)), MOELITE_ERR_GGUF_CORRUPT);
  // A 65535-byte key is fine.
  EXPECT_EQ(open_bytes(with_kv(Bytes().str(std::string(65535, 'k')).u32(kU8).u8(1).b)), MOELITE_OK) << last_error();
}

TEST(GgufReader, AbsurdArrayCounts) {
  for (uint32_t et : {kU8, kI32, kF64, kBool, kStr, kArr}) {
    EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kArr).u32(et).u64(uint64_t(1) << 62).b)),
              MOELITE_ERR_GGUF_CORRUPT)
        << "elem type " << et;
    EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kArr).u32(et).u64(100000).b)), MOELITE_ERR_GGUF_TRUNCATED)
        << "elem type " << et;
  }
  // Nested array with an absurd inner count.
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kArr).u32(kArr).u64(1).u32(kU8).u64(UINT64_MAX).b)),
            MOELITE_ERR_GGUF_CORRUPT);
}

TEST(GgufReader, UnknownValueTypes) {
  for (uint32_t t : {13u, 100u, 0xFFFFFFFFu}) {
    EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(t).u64(0).b)), MOELITE_ERR_GGUF_UNKNOWN_TYPE) << t;
    EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kArr).u32(t).u64(0).b)), MOELITE_ERR_GGUF_UNKNOWN_TYPE) << t;
  }
  EXPECT_NE(last_error().find("unknown array element type"), std::string::npos) << last_error();
}

TEST(GgufReader, BoolMustBeZeroOrOne) {
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kBool).u8(2).b)), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("bool value 2"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes(with_kv(Bytes().str("k").u32(kArr).u32(kBool).u64(3).u8(0).u8(1).u8(255).b)),
            MOELITE_ERR_GGUF_CORRUPT);
}

TEST(GgufReader, DuplicateKey) {
  GgufBuilder g = small_builder();
  g.kv_u32("dup.key", 1);
  g.kv_str("dup.key", "again");
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("duplicate metadata key 'dup.key'"), std::string::npos) << last_error();
}

TEST(GgufReader, DeeplyNestedArrays) {
  Bytes b;
  b.str("deep").u32(kArr);
  for (int k = 0; k < 100; ++k) b.u32(kArr).u64(1);
  b.u32(kU8).u64(0);
  EXPECT_EQ(open_bytes(with_kv(b.b)), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("nested"), std::string::npos) << last_error();
}

TEST(GgufReader, BadAlignmentValues) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder g = one_tensor({8}, 0);
    g.kv_u32("general.alignment", a);
    EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT) << a;
    EXPECT_NE(last_error().find("power of two"), std::string::npos) << last_error();
  }
  GgufBuilder g = one_tensor({8}, 0);
  g.kv_i32("general.alignment", -32);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  g = one_tensor({8}, 0);
  g.kv_str("general.alignment", "32");
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  // A huge power of two: the data section offset would overflow.
  g = one_tensor({8}, 0);
  g.kv_u64("general.alignment", uint64_t(1) << 63);
  Status st = open_bytes(g.build());
  EXPECT_TRUE(st == MOELITE_ERR_GGUF_CORRUPT || st == MOELITE_ERR_GGUF_TRUNCATED) << st;
}

// ---------------------------------------------------------------- tensor directory

TEST(GgufReader, DuplicateTensorName) {
  GgufBuilder g = one_tensor({8}, 0);
  g.tensor("blk.3.ffn_up_exps.weight", {8}, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("duplicate tensor name 'blk.3.ffn_up_exps.weight'"), std::string::npos) << last_error();
}

TEST(GgufReader, BadTensorNames) {
  GgufBuilder g = one_tensor({8}, 0);
  g.tensor("", {8}, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  g = one_tensor({8}, 0);
  g.tensor(std::string(2000, 'n'), {8}, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  g = one_tensor({8}, 0);
  g.tensor(std::string(1000, 'n'), {8}, 0);  // long but accepted
  EXPECT_EQ(open_bytes(g.build()), MOELITE_OK) << last_error();
}

TEST(GgufReader, BadNDims) {
  EXPECT_EQ(open_bytes(one_tensor({}, 0, 0).build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("n_dims 0"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes(one_tensor({1, 1, 1, 1, 8}, 0).build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("n_dims 5"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes(one_tensor({8, 1, 1, 2}, 0).build()), MOELITE_OK) << last_error();
}

TEST(GgufReader, NegativeDimension) {
  EXPECT_EQ(open_bytes(one_tensor({8, -1}, 0, 0).build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("negative"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes(one_tensor({INT64_MIN}, 0, 0).build()), MOELITE_ERR_GGUF_CORRUPT);
}

TEST(GgufReader, ElementCountOverflow) {
  EXPECT_EQ(open_bytes(one_tensor({int64_t(1) << 32, int64_t(1) << 32}, 0, 0).build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("overflow"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes(one_tensor({2, 2, INT64_MAX / 2 + 1}, 0, 0).build()), MOELITE_ERR_GGUF_CORRUPT);
  // Element count fits int64, but the F32 byte size is past any file.
  Status st = open_bytes(one_tensor({INT64_MAX}, 0, 0).build());
  EXPECT_TRUE(st == MOELITE_ERR_GGUF_CORRUPT || st == MOELITE_ERR_GGUF_OUT_OF_BOUNDS) << st;
  st = open_bytes(one_tensor({int64_t(1) << 40, int64_t(1) << 20}, 0, 0).build());
  EXPECT_EQ(st, MOELITE_ERR_GGUF_OUT_OF_BOUNDS);
}

TEST(GgufReader, UnknownTensorType) {
  for (uint32_t t : {4u, 5u, 31u, 40u, 200u, 0xFFFFFFFFu}) {
    EXPECT_EQ(open_bytes(one_tensor({32}, t, 0).build()), MOELITE_ERR_GGUF_UNKNOWN_TYPE) << t;
  }
  EXPECT_NE(last_error().find("unknown tensor type"), std::string::npos) << last_error();
}

TEST(GgufReader, RowNotMultipleOfBlockSize) {
  EXPECT_EQ(open_bytes(one_tensor({33, 2}, 2, 0).build()), MOELITE_ERR_GGUF_CORRUPT);  // Q4_0
  EXPECT_NE(last_error().find("block size 32"), std::string::npos) << last_error();
  EXPECT_EQ(open_bytes(one_tensor({128}, 12, 0).build()), MOELITE_ERR_GGUF_CORRUPT);  // Q4_K
  EXPECT_EQ(open_bytes(one_tensor({256}, 12).build()), MOELITE_OK) << last_error();
}

TEST(GgufReader, OffsetNotAligned) {
  GgufBuilder g = one_tensor({8}, 0);
  g.tensor("second", {8}, 0, 48);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_CORRUPT);
  EXPECT_NE(last_error().find("not a multiple of the alignment 32"), std::string::npos) << last_error();
  // With alignment 16 the same offset is fine.
  g.alignment = 16;
  g.kv_u32("general.alignment", 16);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_OK) << last_error();
}

TEST(GgufReader, TensorBeyondEndOfFile) {
  GgufBuilder g = one_tensor({8}, 0);
  std::vector<uint8_t> bytes = g.build();
  bytes.resize(bytes.size() - 1);  // last byte of the only tensor is gone
  EXPECT_EQ(open_bytes(bytes), MOELITE_ERR_GGUF_OUT_OF_BOUNDS);
  EXPECT_NE(last_error().find("tensor 'blk.3.ffn_up_exps.weight': data [offset"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("ends past the end of the file (size " + std::to_string(bytes.size()) + ")"),
            std::string::npos)
      << last_error();

  // Offset far out, and an offset so large that data_offset + offset overflows.
  g = one_tensor({8}, 0);
  g.tensor("far", {8}, 0, 1 << 20, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_OUT_OF_BOUNDS);
  g = one_tensor({8}, 0);
  g.tensor("wrap", {8}, 0, UINT64_MAX - 31, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_OUT_OF_BOUNDS);
}

TEST(GgufReader, OverlappingTensors) {
  GgufBuilder g = one_tensor({16}, 0, 0);  // [0, 64)
  g.tensor("same_start", {8}, 0, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_OVERLAP);
  EXPECT_NE(last_error().find("overlaps"), std::string::npos) << last_error();

  g = one_tensor({16}, 0, 32);      // [32, 96)
  g.tensor("partial", {16}, 0, 0);  // [0, 64), listed second: order in the file must not matter
  g.tensor("after", {8}, 0, 96);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_ERR_GGUF_OVERLAP);

  // Touching ranges are fine.
  g = one_tensor({16}, 0, 64);
  g.tensor("before", {16}, 0, 0);
  EXPECT_EQ(open_bytes(g.build()), MOELITE_OK) << last_error();
}

// ---------------------------------------------------------------- robustness

TEST(GgufReader, RandomByteFlipsNeverCrash) {
  // Two bases: the small file and the one with every value type and nested arrays.
  std::vector<uint8_t> bases[2] = {small_builder().build(), full_builder().build()};
  size_t headers[2];
  for (int b = 0; b < 2; ++b) {
    std::unique_ptr<Reader> r0;
    ASSERT_EQ(open_bytes(bases[b], &r0), MOELITE_OK);
    headers[b] = static_cast<size_t>(r0->data_offset());
  }
  std::mt19937_64 rng(0x6775'6666);
  TempFile f(tmp_dir(), "fuzz");
  int ok = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    const std::vector<uint8_t>& base = bases[iter % 2];
    const size_t header = headers[iter % 2];
    std::vector<uint8_t> bytes = base;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      size_t pos = static_cast<size_t>(rng() % header);  // the header is where parsing happens
      switch (rng() % 3) {
        case 0: bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: bytes[pos] = static_cast<uint8_t>(rng()); break;
        default: bytes[pos] = (rng() & 1) ? 0xFF : 0x00; break;
      }
    }
    if (rng() % 8 == 0) bytes.resize(static_cast<size_t>(rng() % bytes.size()));
    ASSERT_TRUE(f.write(bytes));
    std::unique_ptr<Reader> r;
    Status st = Reader::open(f.path(), &r);
    if (st == MOELITE_OK) {
      ++ok;
      ASSERT_NE(r, nullptr);
      for (const TensorInfo& t : r->tensors()) {
        ASSERT_LE(t.file_offset + t.size_bytes, r->file_size());
        ASSERT_GE(t.file_offset, r->data_offset());
      }
    } else {
      ASSERT_EQ(r, nullptr);
      ASSERT_STRNE(moelite::last_error_message(), "");
    }
  }
  // Some flips land in string bytes and keep the file valid; most must be rejected.
  EXPECT_LT(ok, 2000);
}

TEST(GgufReader, ManySmallKeysStayBounded) {
  // 20000 key-values: linear parsing, and the buffered reader crosses many buffer boundaries.
  GgufBuilder g;
  for (int k = 0; k < 20000; ++k) g.kv_u32("key." + std::to_string(k), static_cast<uint32_t>(k));
  g.tensor("t", {8}, 0);
  std::unique_ptr<Reader> r;
  ASSERT_EQ(open_bytes(g.build(), &r), MOELITE_OK) << last_error();
  int64_t v = 0;
  ASSERT_TRUE(r->get_int("key.12345", &v));
  EXPECT_EQ(v, 12345);
  ASSERT_TRUE(r->get_int("key.19999", &v));
  EXPECT_EQ(v, 19999);
  // A string array bigger than the reader's buffer.
  GgufBuilder s;
  std::vector<std::string> toks;
  for (int k = 0; k < 30000; ++k) toks.push_back("tok" + std::to_string(k));
  s.kv_arr_str("tokenizer.ggml.tokens", toks);
  s.kv_raw(Bytes().str("big").u32(kArr).u32(kU8).u64(200000).raw(std::vector<uint8_t>(200000, 9)).b);
  ASSERT_EQ(open_bytes(s.build(), &r), MOELITE_OK) << last_error();
  EXPECT_EQ(r->find("tokenizer.ggml.tokens")->strings[29999], "tok29999");
  EXPECT_EQ(r->find("big")->raw.size(), 200000u);
  EXPECT_EQ(r->find("big")->raw[199999], 9);
}

// A large (sparse) file whose header claims counts that fit the file size but are not there: the
// reader must not size anything from the claim (no multi-GB reservation, no OUT_OF_MEMORY) and
// must fail on the first bogus entry.
TEST(GgufReader, LargeClaimedCountsInBigFileDoNotAllocate) {
  struct Case {
    uint64_t n_tensors, n_kv;
  };
  for (Case c : {Case{0, 250000000}, Case{100000000, 0}}) {
    Bytes b;
    b.raw({'G', 'G', 'U', 'F'}).u32(3).u64(c.n_tensors).u64(c.n_kv);
    TempFile f(tmp_dir(), "sparse");
    ASSERT_TRUE(f.write(b.b));
    int fd = ::open(f.path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, off_t(4) << 30), 0);  // 4 GiB of zeros, sparse on disk
    ::close(fd);
    std::unique_ptr<Reader> r;
    EXPECT_EQ(Reader::open(f.path(), &r), MOELITE_ERR_GGUF_CORRUPT) << last_error();
    EXPECT_NE(last_error().find("empty"), std::string::npos) << last_error();
  }
}

}  // namespace
