// The CPU backend's grouped copies (backends/cpu/grouped_weights.h): which weights get one, that
// releasing the mapped pages loses nothing, and that a matrix product through a copy (tail rows
// included) gives the bits of the row-by-row kernel on the file's bytes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/grouped_weights.h"
#include "backends/cpu/quant.h"
#include "platforms/fault_inject.h"
#include "platforms/platform.h"
#include "tests/random_weights.h"

namespace moelite::cpu {
namespace {

constexpr int64_t kCols = 512;
constexpr int64_t kRows = 3 * kGroupRows + 5;  // three groups and five rows left in row layout

// A Q4_K matrix written to a file and mapped, as a model's weights are.
struct MappedMatrix {
  std::string path;
  std::vector<uint8_t> bytes;
  platform::File file;
  platform::Mapping mapping;
  WeightView view;
  MappedMatrix() {
    std::mt19937 rng(5);
    for (int64_t r = 0; r < kRows; ++r) {
      const std::vector<uint8_t> row = test::random_weights(TensorType::Q4_K, kCols, rng);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    path = ::testing::TempDir() + "grouped_weights_" + std::to_string(getpid()) + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_TRUE(f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    if (f) std::fclose(f);
    EXPECT_EQ(platform::File::open(path, &file), MOELITE_OK);
    EXPECT_EQ(platform::Mapping::map(file, &mapping), MOELITE_OK);
    view.type = TensorType::Q4_K;
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

TEST(GroupedWeights, OnlyMappedWeightsOfTypesWithAGroupKernel) {
  MappedMatrix m;
  std::unique_ptr<ThreadPool> pool;
  ASSERT_EQ(ThreadPool::create(2, &pool), MOELITE_OK);
  GroupedWeights g;
  // The scalar table has no group kernel: nothing is copied.
  EXPECT_EQ(g.get_or_make(kernels_scalar(), m.view, pool.get()), nullptr);
  const KernelTable* k = table_with_groups();
  if (!k) GTEST_SKIP() << "no group kernel in this CPU's table (" << kernels_best().isa << ")";
  // Bytes that are not the file's mapping (an owned copy, an expert-store slot) are never copied:
  // releasing their pages would lose them.
  WeightView owned = m.view;
  owned.data = m.bytes.data();
  owned.mapped = false;
  EXPECT_EQ(g.get_or_make(*k, owned, pool.get()), nullptr);
  WeightView few = m.view;
  few.rows = kGroupRows - 1;
  EXPECT_EQ(g.get_or_make(*k, few, pool.get()), nullptr);
  EXPECT_EQ(g.bytes(), 0u);

  const uint8_t* copy = g.get_or_make(*k, m.view, pool.get());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(g.get_or_make(*k, m.view, pool.get()), copy);  // made once
  EXPECT_EQ(g.find(m.view), copy);
  EXPECT_EQ(g.bytes(), 3 * group_bytes_q4_k(kCols));
  // Another view at the same address (fewer rows) is not the copy's weight.
  WeightView shorter = m.view;
  shorter.rows = 2 * kGroupRows;
  EXPECT_EQ(g.find(shorter), nullptr);
  // The released pages read back from the file.
  EXPECT_EQ(std::memcmp(m.mapping.data(), m.bytes.data(), m.bytes.size()), 0);
}

// Without memory for a copy the weight keeps its row layout, and the allocation is not tried again
// at its next product (under memory pressure that would be one failed allocation per matmul).
TEST(GroupedWeights, AWeightWithoutMemoryForACopyIsNotTriedAgain) {
  MappedMatrix m;
  const KernelTable* k = table_with_groups();
  if (!k) GTEST_SKIP() << "no group kernel in this CPU's table (" << kernels_best().isa << ")";
  std::unique_ptr<ThreadPool> pool;
  ASSERT_EQ(ThreadPool::create(2, &pool), MOELITE_OK);
  GroupedWeights g;
  platform::fault::arm(platform::fault::Kind::kAlloc, 1);
  EXPECT_EQ(g.get_or_make(*k, m.view, pool.get()), nullptr);
  EXPECT_TRUE(platform::fault::fired());
  platform::fault::disarm();
  EXPECT_EQ(g.get_or_make(*k, m.view, pool.get()), nullptr);
  EXPECT_EQ(platform::fault::calls(platform::fault::Kind::kAlloc), 0);
  EXPECT_EQ(g.find(m.view), nullptr);
  EXPECT_EQ(g.bytes(), 0u);
  // Its pages were not released (they are the only copy of the weight).
  EXPECT_EQ(std::memcmp(m.mapping.data(), m.bytes.data(), m.bytes.size()), 0);
  // Another weight (here: the same bytes seen as a shorter matrix at another address) still gets one.
  WeightView later = m.view;
  later.data += 2 * kGroupRows * later.row_bytes;
  later.rows = kRows - 2 * kGroupRows;
  EXPECT_NE(g.get_or_make(*k, later, pool.get()), nullptr);
  EXPECT_EQ(g.bytes(), group_bytes_q4_k(kCols));
}

// A matrix product through the backend (a decode row and a batch of five, so every count of the
// group kernel and the row kernel's tail rows run) against the table's vec_dot on the file's rows,
// bit for bit.
TEST(GroupedWeights, MatmulThroughACopyGivesTheRowKernelsBits) {
  MappedMatrix m;
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
    std::vector<uint8_t> a(activation_row_bytes(TensorType::Q4_K, kCols));
    for (int64_t t = 0; t < n; ++t) {
      k.quantize_act[static_cast<uint32_t>(TensorType::Q8_K)](x.data() + t * kCols, a.data(), kCols);
      for (int64_t r = 0; r < kRows; ++r) {
        float want = 0;
        k.vec_dot[static_cast<uint32_t>(TensorType::Q4_K)](kCols, &want, m.bytes.data() + r * m.view.row_bytes, a.data());
        EXPECT_EQ(std::memcmp(&y[static_cast<size_t>(t * kRows + r)], &want, 4), 0)
            << "token " << t << " row " << r << ": " << y[static_cast<size_t>(t * kRows + r)] << " vs " << want;
      }
    }
    be->free_act(&xa);
    be->free_act(&ya);
  }
}

}  // namespace
}  // namespace moelite::cpu
