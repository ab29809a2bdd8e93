#version 450
// Causal attention for one (token, query head) per workgroup: scores against the positions the
// query sees ([0, pos] or its sliding window (pos - window, pos]; position j in slot j % slots, GQA:
// kv head h / (n_head / n_head_kv)), softmax with the head's sink logit in the denominator when
// there is one, weighted sum of values (head_dim_v floats of each; with a keys-only cache,
// cache_v 0, they are the first head_dim_v floats of the key row). Scores go to a scratch buffer so any context length fits.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Qbuf { float Q[]; };
layout(std430, binding = 1) readonly buffer Cbuf { float C[]; };
layout(std430, binding = 2) writeonly buffer Obuf { float O[]; };
layout(std430, binding = 3) buffer Sbuf { float S[]; };
layout(std430, binding = 4) readonly buffer Sinkbuf { float SINK[]; };
layout(push_constant) uniform P {
  uint q_off, o_off, cache_v, kv_dim, head_dim, head_dim_v, n_head, n_head_kv, pos0, slots, window, has_sinks;
  float scale;
} p;
shared float red[64];
void main() {
  const uint t = gl_WorkGroupID.x / p.n_head, h = gl_WorkGroupID.x % p.n_head, tid = gl_LocalInvocationID.x;
  const uint kvh = h / (p.n_head / p.n_head_kv), pos = p.pos0 + t;
  const uint first = (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
  const uint n_pos = pos + 1u - first;
  const uint qb = p.q_off + t * p.n_head * p.head_dim + h * p.head_dim, sb = gl_WorkGroupID.x * p.slots;
  const bool sink = p.has_sinks != 0u;
  float mx = sink ? SINK[h] : -3.402823e38;
  for (uint j = tid; j < n_pos; j += 64u) {
    const uint kb = ((first + j) % p.slots) * p.kv_dim + kvh * p.head_dim;
    float d = 0.0;
    for (uint c = 0u; c < p.head_dim; ++c) d += Q[qb + c] * C[kb + c];
    d *= p.scale;
    S[sb + j] = d;
    mx = max(mx, d);
  }
  red[tid] = mx;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] = max(red[tid], red[tid + s]);
    barrier();
  }
  mx = red[0];
  barrier();
  float sum = 0.0;
  for (uint j = tid; j < n_pos; j += 64u) {
    const float e = exp(S[sb + j] - mx);
    S[sb + j] = e;
    sum += e;
  }
  red[tid] = sum;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    barrier();
  }
  const float inv = 1.0 / (red[0] + (sink ? exp(SINK[h] - mx) : 0.0));
  memoryBarrierBuffer();
  barrier();
  for (uint c = tid; c < p.head_dim_v; c += 64u) {
    float acc = 0.0;
    for (uint j = 0u; j < n_pos; ++j)
      acc += S[sb + j] * C[p.cache_v + ((first + j) % p.slots) * p.kv_dim + kvh * p.head_dim + c];
    O[p.o_off + t * p.n_head * p.head_dim_v + h * p.head_dim_v + c] = acc * inv;
  }
}
