// Included by matmul.comp and matmul_subgroup.comp.
// out[orow(t)][r] = sum_i dq(W row r, i) * x[irow(t)][i] (+ bias[r]): one workgroup per (output
// row, chunk of up to NT tokens), its threads striding over the columns, then a fixed-order tree
// reduction per token (results do not depend on scheduling). A weight is decoded once for the
// chunk's tokens; each token's sum is the same sequence of operations whatever the chunk holds, so
// a prompt and token-by-token decoding give the same bits. Optional row maps gather input rows and
// scatter output rows (the tokens routed to one expert).
layout(local_size_x = 64) in;
// Tokens a workgroup: 4 (kMatmulTokensPerGroup in vk_backend.cpp), or 1 in the *_vec shaders that
// one-token products (decode) use, which would otherwise carry three idle accumulators (lavapipe
// decoded 27 % slower with them).
#ifndef MATMUL_TOKENS
#define MATMUL_TOKENS 4u
#endif
const uint NT = MATMUL_TOKENS;
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
  uint n_tok;      // tokens of the dispatch (workgroup y covers tokens [NT y, NT y + NT))
} p;
#include "dequant.glsl"
shared float partial[NT * 64u];
void main() {
  const uint r = p.row0 + gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * NT, tid = gl_LocalInvocationID.x;
  const uint nt = min(NT, p.n_tok - t0);
  const uint row = p.w_off + r * p.row_bytes;
  uint xs[NT];
  float acc[NT];
  for (uint j = 0u; j < NT; ++j) {
    const uint t = t0 + min(j, nt - 1u);
    xs[j] = p.x_off + ((p.flags & 2u) != 0u ? uint(M[t]) : t) * p.x_stride;
    acc[j] = 0.0;
  }
  for (uint i = tid; i < p.cols; i += 64u) {
    const float w = dq(row, i);
    for (uint j = 0u; j < NT; ++j)
      if (j < nt) acc[j] += w * X[xs[j] + i];
  }
#ifdef SUBGROUPS
  // Per token: subgroup sums, then the subgroups' sums in subgroup order (fixed for a device).
  for (uint j = 0u; j < NT; ++j) {
    const float s = subgroupAdd(acc[j]);
    if (subgroupElect()) partial[j * 64u + gl_SubgroupID] = s;
  }
  barrier();
  if (tid < nt) {
    float total = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) total += partial[tid * 64u + g];
    acc[0] = total;
  }
#else
  for (uint j = 0u; j < NT; ++j) partial[j * 64u + tid] = acc[j];
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s)
      for (uint j = 0u; j < NT; ++j) partial[j * 64u + tid] += partial[j * 64u + tid + s];
    barrier();
  }
  if (tid < nt) acc[0] = partial[tid * 64u];
#endif
  // Thread j < nt writes token t0 + j's output.
  if (tid < nt) {
    const uint t = t0 + tid;
    const uint orow = (p.flags & 4u) != 0u ? uint(M[p.map_n + t]) : t;
    Y[p.y_off + orow * p.y_stride + p.y_col0 + r] = acc[0] + ((p.flags & 1u) != 0u ? B[p.y_col0 + r] : 0.0);
  }
}
