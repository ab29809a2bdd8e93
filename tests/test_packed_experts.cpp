// The packed expert file (moelite_pack_experts, MODEL.experts): what it holds is checked against
// the GGUF's own tensors, located here with the GGUF reader and the layout the header documents
// (not with the packer's code); a budgeted model that reads it must give the resident model's
// logits bit for bit, in one read per expert; a packed file that is not the model's is ignored with
// a warning (the results stay exact); and packing never destroys a file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/gguf/reader.h"
#include "moelite.h"
#include "platforms/fault_inject.h"

namespace {

namespace fault = moelite::platform::fault;

const std::string kModel = std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf";

std::string tmp_dir() {
  const char* t = getenv("MOELITE_TEST_TMP");
  std::string d = std::string(t && *t ? t : "/tmp") + "/packed-experts-" + std::to_string(getpid());
  mkdir(d.c_str(), 0755);
  return d;
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
bool exists(const std::string& path) {
  struct stat sb;
  return lstat(path.c_str(), &sb) == 0;
}
uint64_t u64_at(const std::vector<char>& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + static_cast<size_t>(i)]);
  return v;
}

// A copy of the shipped model in a directory of its own, so its MODEL.experts is this test's.
struct ModelCopy {
  std::string dir, path;
  explicit ModelCopy(const std::string& name) : dir(tmp_dir()), path(dir + "/" + name) {
    write_all(path, read_all(kModel));
    std::remove((path + ".experts").c_str());
  }
  ~ModelCopy() {
    std::remove(path.c_str());
    std::remove((path + ".experts").c_str());
  }
};

moelite_model* load(const std::string& path, uint64_t budget) {
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model_params_set_threads(mp, 1);
  moelite_model_params_set_expert_budget(mp, budget);
  moelite_model* m = nullptr;
  const moelite_status st = moelite_model_load(path.c_str(), mp, &m);
  moelite_model_params_free(mp);
  EXPECT_EQ(st, MOELITE_OK) << moelite_last_error();
  return m;
}

// Logits of `n` tokens evaluated one by one (decode: every token routes anew).
std::vector<float> logits(moelite_model* m, int n) {
  moelite_context_params* cp = moelite_context_params_create();
  moelite_context_params_set_n_ctx(cp, 64);
  moelite_context* c = nullptr;
  EXPECT_EQ(moelite_context_create(m, cp, &c), MOELITE_OK) << moelite_last_error();
  moelite_context_params_free(cp);
  std::vector<float> out;
  const int64_t n_vocab = moelite_model_get(m, MOELITE_MODEL_N_VOCAB);
  for (int i = 0; i < n && c; ++i) {
    const int32_t t = (i * 37 + 11) % static_cast<int32_t>(n_vocab);
    EXPECT_EQ(moelite_eval(c, &t, 1, 1), MOELITE_OK) << moelite_last_error();
    const float* l = moelite_get_logits(c, 0);
    out.insert(out.end(), l, l + n_vocab);
  }
  moelite_context_free(c);
  return out;
}

uint64_t quarter_budget(const std::string& path) {
  moelite_model* i = nullptr;
  EXPECT_EQ(moelite_model_inspect(path.c_str(), &i), MOELITE_OK);
  const uint64_t b = static_cast<uint64_t>(moelite_model_get(i, MOELITE_MODEL_EXPERT_BYTES)) / 4;
  moelite_model_free(i);
  return b;
}

struct Warnings {
  std::string text;
  Warnings() {
    moelite_set_log_callback(
        [](moelite_log_level, const char* t, void* u) { static_cast<Warnings*>(u)->text += std::string(t) + "\n"; },
        this, MOELITE_LOG_WARN);
  }
  ~Warnings() { moelite_set_log_callback(nullptr, nullptr, MOELITE_LOG_WARN); }
};

TEST(PackedExperts, TheFileHoldsEveryExpertsMatricesInAlignedRecords) {
  ModelCopy m("layout.gguf");
  ASSERT_EQ(moelite_pack_experts(m.path.c_str(), nullptr, nullptr, nullptr), MOELITE_OK) << moelite_last_error();
  const std::vector<char> packed = read_all(m.path + ".experts"), gguf = read_all(m.path);
  ASSERT_GT(packed.size(), 4096u);
  EXPECT_EQ(std::string(packed.data(), 8), "MOEXPACK");
  std::unique_ptr<moelite::gguf::Reader> r;
  ASSERT_EQ(moelite::gguf::Reader::open(m.path, &r), MOELITE_OK);
  int64_t n_layer = 0;
  ASSERT_TRUE(r->get_int("qwen3moe.block_count", &n_layer));
  const uint64_t header = (48 + 64 * static_cast<uint64_t>(n_layer) + 4095) / 4096 * 4096;
  uint64_t at = header;
  const char* names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
  for (int64_t l = 0; l < n_layer; ++l) {
    const moelite::gguf::TensorInfo* t[3];
    uint64_t bytes[3], record = 0, offset_in_record[3];
    for (int c = 0; c < 3; ++c) {
      t[c] = r->find_tensor("blk." + std::to_string(l) + "." + names[c] + ".weight");
      ASSERT_NE(t[c], nullptr);
      bytes[c] = t[c]->size_bytes / static_cast<uint64_t>(t[c]->ne[2]);
      offset_in_record[c] = record;
      record += (bytes[c] + 4095) / 4096 * 4096;
    }
    // The header's row for the layer says the same.
    const size_t row = 48 + 64 * static_cast<size_t>(l);
    EXPECT_EQ(u64_at(packed, row), at);
    EXPECT_EQ(u64_at(packed, row + 8), record);
    const int64_t n_expert = t[0]->ne[2];
    for (int64_t e = 0; e < n_expert; ++e) {
      const uint64_t rec = at + static_cast<uint64_t>(e) * record;
      ASSERT_EQ(rec % 4096, 0u);
      for (int c = 0; c < 3; ++c) {
        const uint64_t src = t[c]->file_offset + static_cast<uint64_t>(e) * bytes[c];
        ASSERT_LE(rec + offset_in_record[c] + bytes[c], packed.size());
        ASSERT_EQ(memcmp(packed.data() + rec + offset_in_record[c], gguf.data() + src, bytes[c]), 0)
            << "layer " << l << " expert " << e << " matrix " << c;
      }
    }
    at += static_cast<uint64_t>(n_expert) * record;
  }
  EXPECT_EQ(at, packed.size());
}

TEST(PackedExperts, ABudgetReadsThePackedFileOneReadPerExpertWithResidentLogits) {
  ModelCopy m("exact.gguf");
  moelite_model* resident = load(m.path, 0);
  const std::vector<float> want = logits(resident, 24);
  moelite_model_free(resident);

  // From the model file first: three reads per expert loaded.
  moelite_model* plain = load(m.path, quarter_budget(m.path));
  EXPECT_EQ(std::string(moelite_model_expert_file(plain)), m.path);
  EXPECT_EQ(logits(plain, 24), want);
  moelite_expert_stats s = {sizeof s};
  ASSERT_EQ(moelite_model_expert_stats(plain, -1, &s), MOELITE_OK);
  EXPECT_GT(s.misses, 0u);
  EXPECT_EQ(s.reads, 3 * (s.misses + s.prefetches_issued));
  moelite_model_free(plain);

  ASSERT_EQ(moelite_pack_experts(m.path.c_str(), nullptr, nullptr, nullptr), MOELITE_OK) << moelite_last_error();
  moelite_model* packed = load(m.path, quarter_budget(m.path));
  EXPECT_EQ(std::string(moelite_model_expert_file(packed)), m.path + ".experts");
  EXPECT_EQ(logits(packed, 24), want);  // bit for bit
  s = {sizeof s};
  ASSERT_EQ(moelite_model_expert_stats(packed, -1, &s), MOELITE_OK);
  EXPECT_GT(s.misses, 0u);
  EXPECT_EQ(s.reads, s.misses + s.prefetches_issued);  // one read per expert
  moelite_model_free(packed);

  // MOELITE_PACKED_EXPERTS=0 reads the model file again.
  setenv("MOELITE_PACKED_EXPERTS", "0", 1);
  moelite_model* off = load(m.path, quarter_budget(m.path));
  unsetenv("MOELITE_PACKED_EXPERTS");
  EXPECT_EQ(std::string(moelite_model_expert_file(off)), m.path);
  moelite_model_free(off);
}

TEST(PackedExperts, TheProbeReadsWholeRecords) {
  ModelCopy m("probe.gguf");
  ASSERT_EQ(moelite_pack_experts(m.path.c_str(), nullptr, nullptr, nullptr), MOELITE_OK) << moelite_last_error();
  moelite_model* i = nullptr;
  ASSERT_EQ(moelite_model_inspect(m.path.c_str(), &i), MOELITE_OK);
  moelite_expert_read_probe p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  ASSERT_EQ(moelite_model_measure_expert_reads(i, uint64_t{4} << 20, &p), MOELITE_OK) << moelite_last_error();
  // The shipped model's record: its three equal matrices, each rounded up to 4 KiB blocks.
  const uint64_t matrix = static_cast<uint64_t>(moelite_model_get(i, MOELITE_MODEL_EXPERT_BYTES)) /
                          static_cast<uint64_t>(moelite_model_get(i, MOELITE_MODEL_N_LAYERS) *
                                                moelite_model_get(i, MOELITE_MODEL_N_EXPERTS) * 3);
  EXPECT_EQ(p.read_bytes, double(3 * ((matrix + 4095) / 4096 * 4096)));
  const char* env = getenv("MOELITE_IO_THREADS");
  EXPECT_EQ(p.reads_in_flight, (env && *env ? atoi(env) : 2) * 12);
  moelite_model_free(i);
}

// Each way a file at MODEL.experts can be wrong: the model loads, reads its own file, warns, and
// computes exactly.
TEST(PackedExperts, APackedFileThatIsNotTheModelsIsIgnoredWithAWarning) {
  ModelCopy m("stale.gguf");
  ASSERT_EQ(moelite_pack_experts(m.path.c_str(), nullptr, nullptr, nullptr), MOELITE_OK) << moelite_last_error();
  const std::vector<char> good = read_all(m.path + ".experts"), model = read_all(m.path);
  moelite_model* resident = load(m.path, 0);
  const std::vector<float> want = logits(resident, 8);
  moelite_model_free(resident);

  std::unique_ptr<moelite::gguf::Reader> r;
  ASSERT_EQ(moelite::gguf::Reader::open(m.path, &r), MOELITE_OK);
  const uint64_t expert_data = r->find_tensor("blk.2.ffn_gate_exps.weight")->file_offset;

  struct Case {
    const char* what;
    std::vector<char> sidecar;  // empty: a directory there
    bool change_model;          // one byte of the model's expert data changed (same size and header)
  };
  std::vector<Case> cases;
  cases.push_back({"cut short", std::vector<char>(good.begin(), good.end() - 4096), false});
  cases.push_back({"not a packed file", std::vector<char>(good.size(), 'x'), false});
  std::vector<char> other_version = good;
  other_version[8] = 9;
  cases.push_back({"another version", other_version, false});
  std::vector<char> bad_row = good;
  bad_row[48 + 64 + 8] ^= 1;  // layer 1's record size
  cases.push_back({"a layer laid out otherwise", bad_row, false});
  cases.push_back({"made from the model before it changed", good, true});
  cases.push_back({"a directory", {}, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string side = m.path + ".experts";
    std::remove(side.c_str());
    rmdir(side.c_str());
    if (c.sidecar.empty())
      ASSERT_EQ(mkdir(side.c_str(), 0755), 0);
    else
      write_all(side, c.sidecar);
    std::vector<char> changed = model;
    if (c.change_model) changed[expert_data + 100] ^= 0x10;
    write_all(m.path, changed);
    Warnings w;
    moelite_model* b = load(m.path, quarter_budget(m.path));
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(std::string(moelite_model_expert_file(b)), m.path);
    EXPECT_NE(w.text.find("is not used"), std::string::npos) << w.text;
    if (!c.change_model) EXPECT_EQ(logits(b, 8), want);
    moelite_model_free(b);
    rmdir(side.c_str());
  }
  write_all(m.path, model);
}

TEST(PackedExperts, PackingNeverDestroysAFile) {
  ModelCopy m("safe.gguf");
  const std::vector<char> model = read_all(m.path);
  // The model itself, directly or through a link, is refused and untouched.
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), m.path.c_str(), nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  const std::string link = m.dir + "/link.gguf";
  std::remove(link.c_str());
  ASSERT_EQ(symlink(m.path.c_str(), link.c_str()), 0);
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), link.c_str(), nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  std::remove(link.c_str());
  EXPECT_EQ(read_all(m.path), model);
  // Special files and directories are not outputs.
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), "/dev/null", nullptr, nullptr), MOELITE_ERR_IO);
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), m.dir.c_str(), nullptr, nullptr), MOELITE_ERR_IO);
  EXPECT_EQ(moelite_pack_experts(nullptr, nullptr, nullptr, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_pack_experts((m.dir + "/missing.gguf").c_str(), nullptr, nullptr, nullptr),
            MOELITE_ERR_FILE_NOT_FOUND);

  // An old file at the output stays as it was when packing fails half way (a full disk, a cancel),
  // and no temporary file is left beside it.
  const std::string out = m.dir + "/out.experts";
  write_all(out, std::vector<char>(100, 'o'));
  fault::arm(fault::Kind::kWrite, 5);
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), out.c_str(), nullptr, nullptr), MOELITE_ERR_IO);
  EXPECT_NE(std::string(moelite_last_error()).find("No space left"), std::string::npos) << moelite_last_error();
  fault::disarm();
  EXPECT_EQ(read_all(out), std::vector<char>(100, 'o'));
  int calls = 0;
  auto cancel = [](float, void* u) -> int { return ++*static_cast<int*>(u) < 2; };
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), out.c_str(), cancel, &calls), MOELITE_ERR_PROGRESS_ABORTED);
  EXPECT_EQ(read_all(out), std::vector<char>(100, 'o'));
  // Then a whole one replaces it.
  EXPECT_EQ(moelite_pack_experts(m.path.c_str(), out.c_str(), nullptr, nullptr), MOELITE_OK);
  EXPECT_EQ(std::string(read_all(out).data(), 8), "MOEXPACK");
  std::remove(out.c_str());
  bool temporary_left = false;
  for (const char* name : {"out.experts.tmp-"}) {
    const std::string cmd = "ls " + m.dir + " | grep -q " + name;
    temporary_left = system(cmd.c_str()) == 0;
  }
  EXPECT_FALSE(temporary_left);
}

TEST(PackedExperts, CompressionIsMeasuredOnTheExpertsBytes) {
  moelite_model* i = nullptr;
  ASSERT_EQ(moelite_model_inspect(kModel.c_str(), &i), MOELITE_OK);
  int32_t n = -1;
  moelite_status st = moelite_model_measure_expert_compression(i, 3, 8, nullptr, 0, &n);
  if (st == MOELITE_ERR_NOT_IMPLEMENTED) GTEST_SKIP() << "no libzstd: " << moelite_last_error();
  ASSERT_EQ(st, MOELITE_ERR_BUFFER_TOO_SMALL);
  ASSERT_EQ(n, 1);  // the shipped model's experts are all Q8_0
  moelite_expert_compression row;
  ASSERT_EQ(moelite_model_measure_expert_compression(i, 3, 8, &row, 1, &n), MOELITE_OK) << moelite_last_error();
  // 8 experts of 3 matrices each; their bytes are the model's per-matrix bytes.
  const uint64_t matrix = static_cast<uint64_t>(moelite_model_get(i, MOELITE_MODEL_EXPERT_BYTES)) /
                          static_cast<uint64_t>(moelite_model_get(i, MOELITE_MODEL_N_LAYERS) *
                                                moelite_model_get(i, MOELITE_MODEL_N_EXPERTS) * 3);
  EXPECT_STREQ(row.weight_type, "Q8_0");
  EXPECT_EQ(row.matrices, 24);
  EXPECT_EQ(row.raw_bytes, 24 * matrix);
  EXPECT_GT(row.zstd_bytes, 0u);
  EXPECT_LT(row.zstd_bytes, 24 * matrix + 24 * 64);  // at worst stored, with a frame's overhead
  EXPECT_GT(row.decompress_gb_per_s, 0.0);
  EXPECT_EQ(moelite_model_measure_expert_compression(i, 20, 8, &row, 1, &n), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_measure_expert_compression(nullptr, 3, 8, &row, 1, &n), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_measure_expert_compression(i, 3, 8, nullptr, 1, &n), MOELITE_ERR_INVALID_ARGUMENT);
  moelite_model_free(i);
}

}  // namespace
