// Included by matmul.comp and matmul_subgroup.comp.
// out[orow(t)][r] = sum_i dq(W row r, i) * x[irow(t)][i] (+ bias[r]): one workgroup per (output
// row, token), its threads striding over the columns, then a fixed-order tree reduction (results
// do not depend on scheduling). Optional row maps gather input rows and scatter output rows (the
// tokens routed to one expert).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint WTYPE = 0u;
layout(std430, binding = 0) readonly buffer Wbuf { uint W[]; };
layout(std430, binding = 1) readonly buffer Xbuf { float X[]; };
layout(std430, binding = 2) buffer Ybuf { float Y[]; };
layout(std430, binding = 3) readonly buffer Bbuf { float B[]; };
layout(std430, binding = 4) readonly buffer Mbuf { int M[]; };
layout(push_constant) uniform P {
  uint w_off;      // byte offset of row 0 in W
  uint row_bytes;
  uint cols;
  uint row0;       // first output row of this dispatch (rows beyond 65535 workgroups)
  uint x_off, x_stride, y_off, y_stride;  // in floats
  uint flags;      // 1: bias, 2: input rows mapped (M[t]), 4: output rows mapped (M[map_n + t])
  uint map_n;
  uint y_col0;     // output column of row 0 (row chunks of a split weight)
} p;
#include "dequant.glsl"
shared float partial[64];
void main() {
  const uint r = p.row0 + gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
  const uint irow = (p.flags & 2u) != 0u ? uint(M[t]) : t;
  const uint orow = (p.flags & 4u) != 0u ? uint(M[p.map_n + t]) : t;
  const uint row = p.w_off + r * p.row_bytes;
  const uint x = p.x_off + irow * p.x_stride;
  float acc = 0.0;
  for (uint i = tid; i < p.cols; i += 64u) acc += dq(row, i) * X[x + i];
#ifdef SUBGROUPS
  // Subgroup sums, then the subgroups' sums in subgroup order (fixed for a device).
  acc = subgroupAdd(acc);
  if (subgroupElect()) partial[gl_SubgroupID] = acc;
  barrier();
  if (tid == 0u) {
    float total = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) total += partial[g];
    partial[0] = total;
  }
#else
  partial[tid] = acc;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
#endif
  if (tid == 0u) Y[p.y_off + orow * p.y_stride + p.y_col0 + r] = partial[0] + ((p.flags & 1u) != 0u ? B[p.y_col0 + r] : 0.0);
}
