// moelite_model_measure_expert_reads: the storage probed with reads shaped like the expert store's.
// What it must get right, checked against the model's own sizes (not the probe's code): a read is
// one of an expert's three matrices widened to 4 KiB blocks, loaders x 4 experts x 3 reads are in
// flight, and its rates agree with each other; a failing read is an error naming it; bad
// arguments leave the output untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cstdlib>
#include <cstring>
#include <string>

#include "moelite.h"
#include "platforms/fault_inject.h"

namespace {

namespace fault = moelite::platform::fault;

const std::string kModel = std::string(MOELITE_SOURCE_DIR) + "/models/moelite-tiny-qwen3moe-Q8_0.gguf";

struct Inspected {
  moelite_model* model = nullptr;
  Inspected() { EXPECT_EQ(moelite_model_inspect(kModel.c_str(), &model), MOELITE_OK) << moelite_last_error(); }
  ~Inspected() { moelite_model_free(model); }
};

moelite_expert_read_probe fresh() {
  moelite_expert_read_probe p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  return p;
}

// One matrix of one expert, in bytes: the model's expert bytes over its experts' matrices (the
// shipped model's gate, up and down are the same size).
double matrix_bytes(moelite_model* m) {
  const double moe_layers = double(moelite_model_get(m, MOELITE_MODEL_N_LAYERS) -
                                   moelite_model_get(m, MOELITE_MODEL_N_DENSE_LAYERS));
  return double(moelite_model_get(m, MOELITE_MODEL_EXPERT_BYTES)) /
         (moe_layers * double(moelite_model_get(m, MOELITE_MODEL_N_EXPERTS)) * 3.0);
}

TEST(ExpertReadProbe, ReadsExpertMatricesWithTheStoresReadsInFlight) {
  Inspected i;
  ASSERT_NE(i.model, nullptr);
  moelite_expert_read_probe p = fresh();
  ASSERT_EQ(moelite_model_measure_expert_reads(i.model, uint64_t{8} << 20, &p), MOELITE_OK) << moelite_last_error();
  const double matrix = matrix_bytes(i.model);
  // O_DIRECT widens a read to whole 4 KiB blocks: at most one more block at each end.
  EXPECT_GE(p.read_bytes, matrix);
  EXPECT_LT(p.read_bytes, matrix + 2 * 4096);
  const char* env = getenv("MOELITE_IO_THREADS");
  const int loaders = env && *env ? atoi(env) : 2;
  // Each loader: at most 12 reads, and as many matrices widened to blocks as 2 MiB holds (at least
  // one).
  const double widened = std::ceil(matrix / 4096) * 4096 + 4096;
  const int per_loader = static_cast<int>(std::clamp(std::floor((2 << 20) / widened), 1.0, 12.0));
  EXPECT_EQ(p.reads_in_flight, loaders * per_loader);
  EXPECT_GT(p.read_gb_per_s, 0.0);
  EXPECT_GT(p.copy_gb_per_s, 0.0);
  // Every read lands whole (none reaches the end of the file in this model): bytes per second is
  // reads per second times their size.
  EXPECT_NEAR(p.reads_per_s * p.read_bytes / 1e9, p.read_gb_per_s, 0.02 * p.read_gb_per_s);
}

// MOELITE_IO_BYTES_IN_FLIGHT bounds each loader's reads in flight by bytes (always one read).
TEST(ExpertReadProbe, BytesInFlightBoundEachLoadersReads) {
  Inspected i;
  ASSERT_NE(i.model, nullptr);
  const double matrix = matrix_bytes(i.model);
  const char* env = getenv("MOELITE_IO_THREADS");
  const int loaders = env && *env ? atoi(env) : 2;
  struct Case {
    uint64_t bytes;
    int per_loader;
  };
  // Three reads of a matrix widened to blocks (up to a block more at each end), not four.
  const uint64_t widened = (static_cast<uint64_t>(matrix) + 4095) / 4096 * 4096 + 4096;
  const uint64_t three = 3 * widened + 4096;
  for (const Case c : {Case{4096, 1}, Case{three, 3}, Case{uint64_t{1} << 30, 12}}) {
    setenv("MOELITE_IO_BYTES_IN_FLIGHT", std::to_string(c.bytes).c_str(), 1);
    moelite_expert_read_probe p = fresh();
    const moelite_status st = moelite_model_measure_expert_reads(i.model, uint64_t{2} << 20, &p);
    unsetenv("MOELITE_IO_BYTES_IN_FLIGHT");
    ASSERT_EQ(st, MOELITE_OK) << moelite_last_error();
    EXPECT_EQ(p.reads_in_flight, loaders * c.per_loader) << c.bytes << " bytes in flight";
    EXPECT_GT(p.read_gb_per_s, 0.0);
  }
}

TEST(ExpertReadProbe, ALoadedModelIsProbedLikeAnInspectedOne) {
  Inspected i;
  moelite_model_params* mp = moelite_model_params_create();
  moelite_model_params_set_threads(mp, 1);
  moelite_model_params_set_expert_budget(mp, 0);
  moelite_model* loaded = nullptr;
  ASSERT_EQ(moelite_model_load(kModel.c_str(), mp, &loaded), MOELITE_OK) << moelite_last_error();
  moelite_model_params_free(mp);
  moelite_expert_read_probe a = fresh(), b = fresh();
  ASSERT_EQ(moelite_model_measure_expert_reads(i.model, uint64_t{4} << 20, &a), MOELITE_OK);
  ASSERT_EQ(moelite_model_measure_expert_reads(loaded, uint64_t{4} << 20, &b), MOELITE_OK);
  EXPECT_EQ(a.read_bytes, b.read_bytes);  // the same experts (a fixed seed), the same reads
  EXPECT_EQ(a.reads_in_flight, b.reads_in_flight);
  moelite_model_free(loaded);
}

TEST(ExpertReadProbe, AFailingReadIsAnErrorNamingIt) {
  Inspected i;
  // io_uring where the build and kernel have it, pread otherwise: fail the first read of either.
  moelite_expert_read_probe p = fresh();
  p.read_gb_per_s = -1;
  moelite_status st = MOELITE_OK;
  for (fault::Kind k : {fault::Kind::kUringComplete, fault::Kind::kRead}) {
    fault::arm(k, 1);
    st = moelite_model_measure_expert_reads(i.model, uint64_t{4} << 20, &p);
    const bool fired = fault::fired();
    const std::string why = moelite_last_error();
    fault::disarm();
    if (!fired) continue;
    EXPECT_EQ(st, MOELITE_ERR_IO);
    EXPECT_NE(why.find("storage probe"), std::string::npos) << why;
    EXPECT_NE(why.find("injected fault"), std::string::npos) << why;
    EXPECT_EQ(p.read_gb_per_s, -1);  // untouched
    return;
  }
  FAIL() << "neither an io_uring completion nor a pread was made";
}

TEST(ExpertReadProbe, BadArgumentsLeaveTheOutputUntouched) {
  Inspected i;
  moelite_expert_read_probe p = fresh();
  p.read_gb_per_s = -1;
  EXPECT_EQ(moelite_model_measure_expert_reads(nullptr, 0, &p), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moelite_model_measure_expert_reads(i.model, 0, nullptr), MOELITE_ERR_INVALID_ARGUMENT);
  p.struct_size = 0;
  EXPECT_EQ(moelite_model_measure_expert_reads(i.model, 0, &p), MOELITE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(moelite_last_error(), "struct_size"), nullptr);
  EXPECT_EQ(p.read_gb_per_s, -1);
  // A smaller struct of an older caller: only its fields are written.
  moelite_expert_read_probe small = fresh();
  small.struct_size = offsetof(moelite_expert_read_probe, reads_per_s);
  small.reads_per_s = -7;
  ASSERT_EQ(moelite_model_measure_expert_reads(i.model, uint64_t{1} << 20, &small), MOELITE_OK);
  EXPECT_GT(small.read_gb_per_s, 0.0);
  EXPECT_EQ(small.reads_per_s, -7);
  // A struct_size inside a field: that field is not written at all (no half field).
  small = fresh();
  small.struct_size = offsetof(moelite_expert_read_probe, reads_per_s) + 3;
  small.reads_per_s = -7;
  ASSERT_EQ(moelite_model_measure_expert_reads(i.model, uint64_t{1} << 20, &small), MOELITE_OK);
  EXPECT_GT(small.read_gb_per_s, 0.0);
  EXPECT_EQ(small.reads_per_s, -7);
}

}  // namespace
