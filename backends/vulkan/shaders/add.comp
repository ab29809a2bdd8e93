#version 450
// x += y (mode 0); x *= sigmoid(y[row]) (mode 1: the shared expert's gate); x = act(x, y) with
// x the gate and y the up projection (mode 2: silu(x) * y; mode 3: gpt-oss's clamped SwiGLU,
// x' = min(x, limit), y' = clamp(y, -limit, limit), x' * sigmoid(alpha * x') * (y' + 1));
// x *= alpha (mode 4, y unused); x[row] += y (mode 5: a bias of `cols` floats on every row).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Xbuf { float X[]; };
layout(std430, binding = 1) readonly buffer Ybuf { float Yv[]; };
layout(push_constant) uniform P { uint x_off, y_off, n, cols, mode; float alpha, limit; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  if (p.mode == 0u) X[p.x_off + i] += Yv[p.y_off + i];
  else if (p.mode == 4u) X[p.x_off + i] *= p.alpha;
  else if (p.mode == 5u) X[p.x_off + i] += Yv[p.y_off + i % p.cols];
  else if (p.mode == 1u) X[p.x_off + i] *= 1.0 / (1.0 + exp(-Yv[p.y_off + i / p.cols]));
  else if (p.mode == 2u) {
    const float g = X[p.x_off + i];
    X[p.x_off + i] = g / (1.0 + exp(-g)) * Yv[p.y_off + i];
  } else {
    const float g = min(X[p.x_off + i], p.limit);
    const float u = clamp(Yv[p.y_off + i], -p.limit, p.limit);
    X[p.x_off + i] = g / (1.0 + exp(-p.alpha * g)) * (u + 1.0);
  }
}
