#version 450
// y = x / sqrt(mean(x^2) + eps) * w over each group of `group` columns (one workgroup per group).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Xbuf { float X[]; };
layout(std430, binding = 1) writeonly buffer Ybuf { float Y[]; };
layout(std430, binding = 2) readonly buffer Wbuf { float Wn[]; };
layout(push_constant) uniform P { uint x_off, y_off, cols, group, has_w; float eps; } p;
shared float partial[64];
void main() {
  const uint groups = p.cols / p.group;
  const uint t = gl_WorkGroupID.x / groups, g = gl_WorkGroupID.x % groups, tid = gl_LocalInvocationID.x;
  const uint xb = p.x_off + t * p.cols + g * p.group, yb = p.y_off + t * p.cols + g * p.group;
  float acc = 0.0;
  for (uint i = tid; i < p.group; i += 64u) acc += X[xb + i] * X[xb + i];
  partial[tid] = acc;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float inv = 1.0 / sqrt(partial[0] / float(p.group) + p.eps);
  barrier();  // every thread has read partial[0] (in place: Y may alias X)
  for (uint i = tid; i < p.group; i += 64u) Y[yb + i] = X[xb + i] * inv * (p.has_w != 0u ? Wn[i] : 1.0);
}
