#version 450
// Rotates the first n_rot dims of each head: pairs (2i, 2i+1) (normal) or (i, i + n_rot/2) (neox).
// The angles' cosines and sines come from the host (computed in double there, as the CPU backend
// does), cs[t][i] = (cos, sin). One invocation per (token, head, pair).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Xbuf { float X[]; };
layout(std430, binding = 1) readonly buffer Cbuf { vec2 cs[]; };
layout(push_constant) uniform P { uint x_off, cols, head_dim, n_rot, neox, n_pairs_total; } p;
void main() {
  const uint id = gl_GlobalInvocationID.x;
  if (id >= p.n_pairs_total) return;
  const uint half_rot = p.n_rot / 2u, heads = p.cols / p.head_dim;
  const uint i = id % half_rot, h = (id / half_rot) % heads, t = id / (half_rot * heads);
  const vec2 a = cs[t * half_rot + i];
  const uint b = p.x_off + t * p.cols + h * p.head_dim;
  const uint a0 = p.neox != 0u ? b + i : b + 2u * i, a1 = p.neox != 0u ? b + i + half_rot : b + 2u * i + 1u;
  const float x0 = X[a0], x1 = X[a1];
  X[a0] = x0 * a.x - x1 * a.y;
  X[a1] = x0 * a.y + x1 * a.x;
}
