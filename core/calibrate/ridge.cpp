#include "core/calibrate/ridge.h"

#include <cmath>

namespace moelite {

RidgeAccumulator::RidgeAccumulator(int32_t n_in, int32_t n_out)
    : n_in_(n_in),
      n_out_(n_out),
      xtx_(static_cast<size_t>(n_in + 1) * static_cast<size_t>(n_in + 1), 0.0),
      xty_(static_cast<size_t>(n_in + 1) * static_cast<size_t>(n_out), 0.0),
      bx_(static_cast<size_t>(kBlock) * static_cast<size_t>(n_in + 1)),
      by_(static_cast<size_t>(kBlock) * static_cast<size_t>(n_out)) {}

void RidgeAccumulator::add(const float* x, const float* y) {
  const size_t d = static_cast<size_t>(n_in_) + 1;
  double* v = bx_.data() + static_cast<size_t>(nb_) * d;
  for (int32_t i = 0; i < n_in_; ++i) v[i] = x[i];
  v[d - 1] = 1.0;  // bias input
  double* t = by_.data() + static_cast<size_t>(nb_) * static_cast<size_t>(n_out_);
  for (int32_t o = 0; o < n_out_; ++o) t[o] = y[o];
  if (++nb_ == kBlock) flush();
}

void RidgeAccumulator::flush() {
  const size_t d = static_cast<size_t>(n_in_) + 1, no = static_cast<size_t>(n_out_);
  for (size_t i = 0; i < d; ++i) {
    double* row = xtx_.data() + i * d;
    double* ty = xty_.data() + i * no;
    for (int32_t b = 0; b < nb_; ++b) {
      const double* v = bx_.data() + static_cast<size_t>(b) * d;
      const double* y = by_.data() + static_cast<size_t>(b) * no;
      const double vi = v[i];
      if (vi == 0.0) continue;
      for (size_t j = i; j < d; ++j) row[j] += vi * v[j];
      for (size_t o = 0; o < no; ++o) ty[o] += vi * y[o];
    }
  }
  n_ += nb_;
  nb_ = 0;
}

Status RidgeAccumulator::solve(double lambda_scale, LinearMap* out) {
  flush();
  if (n_ == 0) return fail(MOELITE_ERR_INVALID_ARGUMENT, "ridge regression without samples");
  const size_t d = static_cast<size_t>(n_in_) + 1;
  std::vector<double> a(d * d);
  for (size_t i = 0; i < d; ++i)
    for (size_t j = i; j < d; ++j) a[i * d + j] = a[j * d + i] = xtx_[i * d + j];
  double diag = 0.0;
  for (size_t i = 0; i + 1 < d; ++i) diag += a[i * d + i];
  const double lambda = lambda_scale * (d > 1 ? diag / static_cast<double>(d - 1) : 1.0) + 1e-12;
  for (size_t i = 0; i + 1 < d; ++i) a[i * d + i] += lambda;  // the bias is not penalised
  // Cholesky: a = L L^T, L stored in the lower triangle.
  for (size_t j = 0; j < d; ++j) {
    double s = a[j * d + j];
    for (size_t k = 0; k < j; ++k) s -= a[j * d + k] * a[j * d + k];
    if (!(s > 0.0)) return fail(MOELITE_ERR_INVALID_ARGUMENT, "ridge regression: the system is singular");
    const double l = std::sqrt(s);
    a[j * d + j] = l;
    for (size_t i = j + 1; i < d; ++i) {
      double t = a[i * d + j];
      for (size_t k = 0; k < j; ++k) t -= a[i * d + k] * a[j * d + k];
      a[i * d + j] = t / l;
    }
  }
  out->rows = n_out_;
  out->n_in = n_in_;
  out->w.assign(static_cast<size_t>(n_out_) * d, 0.0f);
  std::vector<double> z(d);
  for (int32_t o = 0; o < n_out_; ++o) {
    // Forward then backward substitution for column o of X^T Y.
    for (size_t i = 0; i < d; ++i) {
      double t = xty_[i * static_cast<size_t>(n_out_) + static_cast<size_t>(o)];
      for (size_t k = 0; k < i; ++k) t -= a[i * d + k] * z[k];
      z[i] = t / a[i * d + i];
    }
    for (size_t i = d; i-- > 0;) {
      double t = z[i];
      for (size_t k = i + 1; k < d; ++k) t -= a[k * d + i] * z[k];
      z[i] = t / a[i * d + i];
    }
    for (size_t i = 0; i < d; ++i) out->w[static_cast<size_t>(o) * d + i] = static_cast<float>(z[i]);
  }
  return MOELITE_OK;
}

}  // namespace moelite
