#version 450
// Copies a batch's k and v rows into the cache of one layer at positions pos0 ...
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Kbuf { float K[]; };
layout(std430, binding = 1) readonly buffer Vbuf { float V[]; };
layout(std430, binding = 2) buffer Cbuf { float C[]; };
layout(push_constant) uniform P { uint k_off, v_off, kv_dim, n, cache_k, cache_v; } p;  // cache offsets of row pos0
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n * p.kv_dim) return;
  C[p.cache_k + i] = K[p.k_off + i];
  C[p.cache_v + i] = V[p.v_off + i];
}
