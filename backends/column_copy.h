// The bounds every backend's copy_columns checks, in one place (see Backend::copy_columns).
#pragma once
#include <cstdint>

#include "backends/backend.h"

namespace moelite {

inline Status check_copy_columns(const Act& x, int64_t x_stride, int64_t x_offset, int32_t n_groups, int64_t width,
                                 const Act& out, int64_t out_stride, int64_t out_offset) {
  const auto fits = [&](int64_t stride, int64_t offset, int64_t cols) {
    return stride >= 0 && offset >= 0 && (n_groups - 1) * stride + offset + width <= cols;
  };
  if (n_groups < 1 || width < 1 || !fits(x_stride, x_offset, x.cols) || !fits(out_stride, out_offset, out.cols) ||
      out.rows < x.rows || x.handle == out.handle)
    return fail(MOELITE_ERR_INVALID_ARGUMENT,
                "copy_columns: %d groups of %lld columns (strides %lld/%lld, offsets %lld/%lld) do not fit a %lldx%lld "
                "source and a %lldx%lld destination",
                n_groups, static_cast<long long>(width), static_cast<long long>(x_stride),
                static_cast<long long>(out_stride), static_cast<long long>(x_offset),
                static_cast<long long>(out_offset), static_cast<long long>(x.rows), static_cast<long long>(x.cols),
                static_cast<long long>(out.rows), static_cast<long long>(out.cols));
  return MOELITE_OK;
}

}  // namespace moelite
