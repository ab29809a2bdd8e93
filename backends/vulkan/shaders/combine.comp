#version 450
// out[t] = sum_j w[t,j] * y[t*k + j] in slot order j = 0..k-1, skipping dropped slots (id < 0).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Ybuf { float Yv[]; };
layout(std430, binding = 1) readonly buffer Rbuf { float R[]; };  // k weights then k ids (as floats) per token
layout(std430, binding = 2) writeonly buffer Obuf { float O[]; };
layout(push_constant) uniform P { uint o_off, cols, k, n; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n * p.cols) return;
  const uint t = i / p.cols, c = i % p.cols;
  float acc = 0.0;
  for (uint j = 0u; j < p.k; ++j)
    if (R[(t * 2u + 1u) * p.k + j] >= 0.0) acc += R[t * 2u * p.k + j] * Yv[(t * p.k + j) * p.cols + c];
  O[p.o_off + i] = acc;
}
