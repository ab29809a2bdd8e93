#version 450
// Copies a batch's k and v rows into the cache of one layer: position pos0 + r goes to slot
// (pos0 + r) % slots (a sliding-window layer's ring wraps), keys first, values after all key slots
// (a keys-only cache, has_v 0, stores no values).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Kbuf { float K[]; };
layout(std430, binding = 1) readonly buffer Vbuf { float V[]; };
layout(std430, binding = 2) buffer Cbuf { float C[]; };
layout(push_constant) uniform P { uint k_off, v_off, kv_dim, n, pos0, slots, has_v; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n * p.kv_dim) return;
  const uint r = i / p.kv_dim, c = i % p.kv_dim;
  const uint dst = ((p.pos0 + r) % p.slots) * p.kv_dim + c;
  C[dst] = K[p.k_off + i];
  if (p.has_v != 0u) C[p.slots * p.kv_dim + dst] = V[p.v_off + i];
}
