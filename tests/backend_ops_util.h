// Helpers shared by the backend-operation tests (test_vulkan_ops.cpp, test_cuda_ops.cpp): device
// activations filled and read through the backend interface, random inputs, error measures, and an
// expert source that hands out in-memory experts as the resident source or a budgeted one does.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "core/expert_store/expert_source.h"

namespace moelite::test {

struct HostAct {
  Act a;
  Backend* be;
  HostAct(Backend* b, int64_t rows, int64_t cols) : be(b) { EXPECT_EQ(b->alloc_act(rows, cols, &a), MOELITE_OK); }
  ~HostAct() { be->free_act(&a); }
  void set(const std::vector<float>& v) {
    // Written through a one-row identity "weight" would be circular; instead get_rows from an F32 table.
    WeightView t;
    t.type = TensorType::F32;
    t.cols = a.cols;
    t.rows = a.rows;
    t.row_bytes = static_cast<uint64_t>(a.cols) * 4;
    t.data = reinterpret_cast<const uint8_t*>(v.data());
    std::vector<int32_t> ids(static_cast<size_t>(a.rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    // The backend finds its copy of a weight by host address, so the bytes must outlive it (as a
    // model's weights do): kept until the process ends.
    static std::deque<std::vector<float>> kept;
    kept.push_back(v);
    t.data = reinterpret_cast<const uint8_t*>(kept.back().data());
    ASSERT_EQ(be->place_weight(t), MOELITE_OK);
    ASSERT_EQ(be->get_rows(t, ids.data(), static_cast<int32_t>(a.rows), &a), MOELITE_OK);
  }
  std::vector<float> get() {
    std::vector<float> out(static_cast<size_t>(a.rows * a.cols));
    EXPECT_EQ(be->read_rows(a, 0, a.rows, out.data()), MOELITE_OK);
    return out;
  }
};

inline std::vector<float> randv(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(double(got[i]) - want[i]));
  }
  return err / scale;
}

inline std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

const TensorType kTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
                             TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
                             TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

// Experts held in memory, handed out as the resident source does or, with resident = false, as a
// budgeted source of two experts at a time (groups, pins and releases counted).
class FakeExperts final : public ExpertSource {
 public:
  std::vector<ExpertWeights> w;
  bool resident = true;
  int held = 0;
  bool all_resident() const override { return resident; }
  int32_t capacity(int32_t) const override { return resident ? 1 << 20 : 2; }
  Status prepare(int32_t, const std::vector<int32_t>& experts) override {
    held += resident ? 0 : static_cast<int>(experts.size());
    return MOELITE_OK;
  }
  Status acquire_next(int32_t, std::vector<int32_t>* pending, int32_t* e, ExpertWeights* out) override {
    *e = pending->front();
    pending->erase(pending->begin());
    *out = w[static_cast<size_t>(*e)];
    return MOELITE_OK;
  }
  void release(int32_t, int32_t) override { held -= resident ? 0 : 1; }
};

}  // namespace moelite::test
