// The CPU backend's weight copies (backends/cpu/weight_copies.h): which weights get one and in
// which layout, that releasing the mapped pages loses nothing, that a matrix product through a
// copy (grouped: tail rows included) gives the bits of the row-by-row kernel on the file's bytes,
// and where copies live.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/weight_copies.h"
#include "platforms/fault_inject.h"
#include "platforms/platform.h"
#include "tests/proc_self_maps.h"
#include "tests/random_weights.h"

namespace moelite::cpu {
namespace {

constexpr int64_t kCols = 512;
constexpr int64_t kRows = 3 * kGroupRows + 5;  // three groups and five rows left in row layout

// A matrix (Q4_K unless said) written to a file and mapped, as a model's weights are.
struct MappedMatrix {
  std::string path;
  std::vector<uint8_t> bytes;
  platform::File file;
  platform::Mapping mapping;
  WeightView view;
  explicit MappedMatrix(TensorType type = TensorType::Q4_K) {
    std::mt19937 rng(5);
    for (int64_t r = 0; r < kRows; ++r) {
      const std::vector<uint8_t> row = test::random_weights(type, kCols, rng);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    path = ::testing::TempDir() + "weight_copies_" + std::to_string(getpid()) + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_TRUE(f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    if (f) std::fclose(f);
    EXPECT_EQ(platform::File::open(path, &file), MOELITE_OK);
    EXPECT_EQ(platform::Mapping::map(file, &mapping), MOELITE_OK);
    view.type = type;
    view.cols = kCols;
    view.rows = kRows;
    view.row_bytes = bytes.size() / kRows;
    view.data = mapping.data();
    view.mapped = true;
  }
  ~MappedMatrix() { std::remove(path.c_str()); }
};

const KernelTable* table_with_groups() {
  const KernelTable& best = kernels_best();
  return best.groups[static_cast<uint32_t>(TensorType::Q4_K)].dot ? &best : nullptr;
}

bool none(const WeightCopy& c) { return !c.grouped && !c.rows; }

TEST(WeightCopies, OnlyMappedWeightsAreCopiedGroupedWhereTheTableHasAGroupKernel) {
  MappedMatrix m;
  std::unique_ptr<ThreadPool> pool;
  ASSERT_EQ(ThreadPool::create(2, &pool), MOELITE_OK);
  {
    // The scalar table has no group kernel: the rows are copied as the file has them.
    WeightCopies g;
    const WeightCopy c = g.get_or_make(kernels_scalar(), m.view, pool.get());
    EXPECT_EQ(c.grouped, nullptr);
    ASSERT_NE(c.rows, nullptr);
    EXPECT_EQ(std::memcmp(c.rows, m.bytes.data(), m.bytes.size()), 0);
    EXPECT_EQ(g.bytes(), m.bytes.size());
  }
  const KernelTable* k = table_with_groups();
  if (!k) GTEST_SKIP() << "no group kernel in this CPU's table (" << kernels_best().isa << ")";
  WeightCopies g;
  // Bytes that are not the file's mapping (an owned copy, an expert-store slot) are never copied:
  // releasing their pages would lose them.
  WeightView owned = m.view;
  owned.data = m.bytes.data();
  owned.mapped = false;
  EXPECT_TRUE(none(g.get_or_make(*k, owned, pool.get())));
  EXPECT_EQ(g.bytes(), 0u);
  // Fewer rows than a group: a row copy.
  WeightView few = m.view;
  few.data += kGroupRows * few.row_bytes;
  few.rows = kGroupRows - 1;
  const WeightCopy f = g.get_or_make(*k, few, pool.get());
  EXPECT_EQ(f.grouped, nullptr);
  ASSERT_NE(f.rows, nullptr);
  EXPECT_EQ(std::memcmp(f.rows, m.bytes.data() + kGroupRows * few.row_bytes, few.bytes()), 0);
  EXPECT_EQ(g.bytes(), few.bytes());

  const WeightCopy c = g.get_or_make(*k, m.view, pool.get());
  ASSERT_NE(c.grouped, nullptr);
  EXPECT_EQ(c.rows, nullptr);
  EXPECT_EQ(g.get_or_make(*k, m.view, pool.get()).grouped, c.grouped);  // made once
  EXPECT_EQ(g.find(m.view).grouped, c.grouped);
  EXPECT_EQ(g.bytes(), few.bytes() + 3 * group_bytes_q4_k(kCols));
  // Another view at the same address (fewer rows) is not the copy's weight.
  WeightView shorter = m.view;
  shorter.rows = 2 * kGroupRows;
  EXPECT_TRUE(none(g.find(shorter)));
  // The released pages read back from the file.
  EXPECT_EQ(std::memcmp(m.mapping.data(), m.bytes.data(), m.bytes.size()), 0);
}

// Without memory for a copy the weight is computed from its file bytes, and the allocation is not
// tried again at its next product (under memory pressure that would be one failed allocation per
// matmul).
TEST(WeightCopies, AWeightWithoutMemoryForACopyIsNotTriedAgain) {
  MappedMatrix m;
  const KernelTable& k = kernels_best();
  std::unique_ptr<ThreadPool> pool;
  ASSERT_EQ(ThreadPool::create(2, &pool), MOELITE_OK);
  WeightCopies g;
  platform::fault::arm(platform::fault::Kind::kAlloc, 1);
  EXPECT_TRUE(none(g.get_or_make(k, m.view, pool.get())));
  EXPECT_TRUE(platform::fault::fired());
  platform::fault::disarm();
  EXPECT_TRUE(none(g.get_or_make(k, m.view, pool.get())));
  EXPECT_EQ(platform::fault::calls(platform::fault::Kind::kAlloc), 0);
  EXPECT_TRUE(none(g.find(m.view)));
  EXPECT_EQ(g.bytes(), 0u);
  // Its pages were not released (they are the only copy of the weight).
  EXPECT_EQ(std::memcmp(m.mapping.data(), m.bytes.data(), m.bytes.size()), 0);
  // Another weight (here: the same bytes seen as a shorter matrix at another address) still gets one.
  WeightView later = m.view;
  later.data += 2 * kGroupRows * later.row_bytes;
  later.rows = kRows - 2 * kGroupRows;
  EXPECT_FALSE(none(g.get_or_make(k, later, pool.get())));
  EXPECT_GT(g.bytes(), 0u);
}

// A matrix product through the backend (a decode row and a batch of five, so every count of the
// group kernel and the row kernel's tail rows run) against the table's vec_dot on the file's rows,
// bit for bit: Q4_K through its grouped copy (where the table has a group kernel), Q8_0 through
// its row copy.
class WeightCopiesMatmul : public ::testing::TestWithParam<TensorType> {};

TEST_P(WeightCopiesMatmul, GivesTheRowKernelsBitsOnTheFileBytes) {
  const TensorType type = GetParam();
  MappedMatrix m(type);
  std::unique_ptr<Backend> be;
  ASSERT_EQ(CpuBackend::create(2, &be), MOELITE_OK);
  ASSERT_EQ(be->place_weight(m.view), MOELITE_OK);
  const KernelTable& k = kernels_best();
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t n : {1, 5}) {
    std::vector<float> x(static_cast<size_t>(n * kCols));
    for (float& v : x) v = u(rng);
    Act xa, ya;
    ASSERT_EQ(be->alloc_act(n, kCols, &xa), MOELITE_OK);
    ASSERT_EQ(be->alloc_act(n, kRows, &ya), MOELITE_OK);
    std::memcpy(xa.handle, x.data(), x.size() * sizeof(float));  // the CPU backend's activations are host floats
    ASSERT_EQ(be->matmul(m.view, xa, nullptr, &ya), MOELITE_OK);
    std::vector<float> y(static_cast<size_t>(n * kRows));
    ASSERT_EQ(be->read_rows(ya, 0, n, y.data()), MOELITE_OK);
    std::vector<uint8_t> a(activation_row_bytes(type, kCols));
    for (int64_t t = 0; t < n; ++t) {
      k.quantize_act[static_cast<uint32_t>(dot_type(type))](x.data() + t * kCols, a.data(), kCols);
      for (int64_t r = 0; r < kRows; ++r) {
        float want = 0;
        k.vec_dot[static_cast<uint32_t>(type)](kCols, &want, m.bytes.data() + r * m.view.row_bytes, a.data());
        EXPECT_EQ(std::memcmp(&y[static_cast<size_t>(t * kRows + r)], &want, 4), 0)
            << "token " << t << " row " << r << ": " << y[static_cast<size_t>(t * kRows + r)] << " vs " << want;
      }
    }
    be->free_act(&xa);
    be->free_act(&ya);
  }
  // The product ran on a copy: the mapping's pages were released (it reads back from the file).
  EXPECT_EQ(std::memcmp(m.mapping.data(), m.bytes.data(), m.bytes.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Types, WeightCopiesMatmul, ::testing::Values(TensorType::Q4_K, TensorType::Q8_0),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           return std::string(type_name(info.param));
                         });

#if defined(__linux__)
// Copies lie in memory advised for transparent huge pages (a product streams its whole copy): two
// weights' copies (grouped, where the table can, then a row copy), one after the other in one
// chunk, both inside the advised range.
TEST(WeightCopies, CopiesLieInMemoryAdvisedForHugePages) {
  if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0) GTEST_SKIP() << "no transparent huge pages";
  MappedMatrix m;
  std::unique_ptr<ThreadPool> pool;
  ASSERT_EQ(ThreadPool::create(2, &pool), MOELITE_OK);
  WeightCopies g;
  const WeightCopy first = g.get_or_make(kernels_best(), m.view, pool.get());
  const uint8_t* a = first.grouped ? first.grouped : first.rows;
  const uint64_t a_bytes = g.bytes();
  WeightView few = m.view;  // rows past the first weight's groups, fewer than a group: a row copy
  few.data += 3 * kGroupRows * few.row_bytes;
  few.rows = kGroupRows - 3;
  const uint8_t* b = g.get_or_make(kernels_best(), few, pool.get()).rows;
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b, a + (a_bytes + 63) / 64 * 64) << "the second copy follows the first";
  EXPECT_TRUE(moelite::test::advised_huge(a)) << moelite::test::vm_flags_at(a);
  EXPECT_TRUE(moelite::test::advised_huge(b + few.bytes() - 1)) << moelite::test::vm_flags_at(b);
}
#endif

}  // namespace
}  // namespace moelite::cpu
