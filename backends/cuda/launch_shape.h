// A kernel launch's grid and block sizes, as CUDA's dim3: shared by the GPU's launches
// (gpu_launch.h) and the SIMT emulator (simt/simt.h), so neither needs the other.
#pragma once

namespace moelite::cuda {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3() = default;
  constexpr Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

}  // namespace moelite::cuda
