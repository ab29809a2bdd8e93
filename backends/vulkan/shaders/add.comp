#version 450
// x += y, or with mode 1: x *= sigmoid(g[row]) (the shared expert's gate), mode 2: x = silu(x) * y.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Xbuf { float X[]; };
layout(std430, binding = 1) readonly buffer Ybuf { float Yv[]; };
layout(push_constant) uniform P { uint x_off, y_off, n, cols, mode; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  if (p.mode == 0u) X[p.x_off + i] += Yv[p.y_off + i];
  else if (p.mode == 1u) X[p.x_off + i] *= 1.0 / (1.0 + exp(-Yv[p.y_off + i / p.cols]));
  else {
    const float g = X[p.x_off + i];
    X[p.x_off + i] = g / (1.0 + exp(-g)) * Yv[p.y_off + i];
  }
}
