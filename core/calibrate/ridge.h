// Ridge regression for the learned predictors: W = argmin |X W^T - Y|^2 + lambda |W|^2 with a bias
// column (not penalised), solved exactly through the normal equations and a Cholesky factorisation
// in double precision. Sizes are small (n_embd inputs, n_expert outputs), so no iteration, no
// learning rate, and the same data always gives the same weights.
#pragma once
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "core/model/profile.h"

namespace moelite {

class RidgeAccumulator {
 public:
  RidgeAccumulator(int32_t n_in, int32_t n_out);
  // One sample: x (n_in floats), y (n_out targets). Samples are buffered and folded into X^T X a
  // block at a time (a blocked rank-k update: each row of X^T X is read once per block instead of
  // once per sample, so the O(n_in^2) work per sample runs from cache).
  void add(const float* x, const float* y);
  int64_t samples() const { return n_ + nb_; }
  // lambda_scale scales the penalty relative to the mean diagonal of X^T X.
  // MOELITE_ERR_INVALID_ARGUMENT without samples or for a singular system.
  Status solve(double lambda_scale, LinearMap* out);

 private:
  int32_t n_in_, n_out_;
  int64_t n_ = 0;
  std::vector<double> xtx_;  // (n_in + 1)^2, upper triangle filled
  std::vector<double> xty_;  // (n_in + 1) x n_out
  static constexpr int32_t kBlock = 64;
  std::vector<double> bx_, by_;  // buffered samples: kBlock x (n_in + 1), kBlock x n_out
  int32_t nb_ = 0;
  void flush();
};

}  // namespace moelite
