#version 450
// Column blocks from one activation to another (Backend::copy_columns): element (t, g, c) of
// rows t, groups g < n_groups and columns c < width goes from x[t, g*x_stride + x_offset + c] to
// out[t, g*out_stride + out_offset + c].
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Xbuf { float X[]; };
layout(std430, binding = 1) buffer Obuf { float O[]; };
layout(push_constant) uniform P {
  uint x_base, x_cols, x_stride, x_offset, o_base, o_cols, o_stride, o_offset, n_groups, width, n;
} p;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  const uint c = i % p.width, g = (i / p.width) % p.n_groups, t = i / (p.width * p.n_groups);
  O[p.o_base + t * p.o_cols + g * p.o_stride + p.o_offset + c] = X[p.x_base + t * p.x_cols + g * p.x_stride + p.x_offset + c];
}
