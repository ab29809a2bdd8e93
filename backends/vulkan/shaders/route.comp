#version 450
// Router: softmax over each token's expert logits, top-k (ties to the lower expert id),
// optionally renormalised. Only the k ids and weights per token go back to the host.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Lbuf { float L[]; };
// Output: the n*k expert ids, then the n*k weights (as float bits).
layout(std430, binding = 1) buffer Obuf { uint outv[]; };
layout(push_constant) uniform P { uint l_off, n_expert, k, n, renorm; } p;
void main() {
  const uint t = gl_GlobalInvocationID.x;
  if (t >= p.n) return;
  const uint b = p.l_off + t * p.n_expert;
  float mx = L[b];
  for (uint e = 1u; e < p.n_expert; ++e) mx = max(mx, L[b + e]);
  float sum = 0.0;
  for (uint e = 0u; e < p.n_expert; ++e) sum += exp(L[b + e] - mx);
  float picked = 0.0;
  int last = -1;
  float last_v = 3.402823e38;
  for (uint j = 0u; j < p.k; ++j) {
    // The next largest after (last_v, last) in the order (value desc, id asc).
    int best = -1;
    float best_v = -3.402823e38;
    for (uint e = 0u; e < p.n_expert; ++e) {
      const float v = L[b + e];
      const bool after_last = v < last_v || (v == last_v && int(e) > last);
      if (after_last && (best < 0 || v > best_v)) {
        best = int(e);
        best_v = v;
      }
    }
    last = best;
    last_v = best_v;
    const float w = exp(best_v - mx) / sum;
    outv[t * p.k + j] = uint(best);
    outv[p.n * p.k + t * p.k + j] = floatBitsToUint(w);
    picked += w;
  }
  if (p.renorm != 0u)
    for (uint j = 0u; j < p.k; ++j)
      outv[p.n * p.k + t * p.k + j] = floatBitsToUint(uintBitsToFloat(outv[p.n * p.k + t * p.k + j]) / picked);
}
