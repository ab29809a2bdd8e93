#version 450
// out[t][c] = dq(table row ids[t], c).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint WTYPE = 0u;
layout(std430, binding = 0) readonly buffer Wbuf { uint W[]; };
layout(std430, binding = 1) readonly buffer Ibuf { int ids[]; };
layout(std430, binding = 2) writeonly buffer Ybuf { float Y[]; };
layout(push_constant) uniform P { uint w_off, row_bytes, cols, y_off, y_stride; } p;
#include "dequant.glsl"
void main() {
  const uint c = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (c >= p.cols) return;
  Y[p.y_off + t * p.y_stride + c] = dq(p.w_off + uint(ids[t]) * p.row_bytes, c);
}
