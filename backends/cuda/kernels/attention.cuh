// Causal attention over the device KV cache, and the router.
#pragma once
#include "backends/cuda/kernels/dialect.cuh"

namespace moelite::cuda_kernels {

constexpr int kAttnThreads = 128;

MK_DEVICE float block_reduce(float v, bool is_max, float* partial) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int tid = int(threadIdx.x);
  __syncthreads();  // partial may still be read from the previous reduction
  if ((tid & 31) == 0) partial[tid >> 5] = v;
  __syncthreads();
  float r = partial[0];
  for (int j = 1; j < kAttnThreads / 32; ++j) r = is_max ? fmaxf(r, partial[j]) : r + partial[j];
  return r;
}

// One block per (token, query head): scores against cache positions [0, pos0 + t] (GQA: kv head
// h / (n_head / n_head_kv)), softmax, weighted sum of values. Scores go to global scratch
// (n_ctx floats per block) so any context length fits.
MK_GLOBAL void attention_kernel(const float* q, const float* cache_k, const float* cache_v, float* out, float* scores,
                                int32_t pos0, int32_t n_head, int32_t n_head_kv, int64_t head_dim, int64_t kv_dim,
                                int32_t n_ctx, float scale) {
  MK_SHARED(float, partial, kAttnThreads / 32);
  const int32_t t = int32_t(blockIdx.x) / n_head, h = int32_t(blockIdx.x) % n_head;
  const int64_t kv_off = int64_t(h / (n_head / n_head_kv)) * head_dim;
  const int32_t n_pos = pos0 + t + 1;
  const float* qh = q + (int64_t(t) * n_head + h) * head_dim;
  float* s = scores + int64_t(blockIdx.x) * n_ctx;
  const int tid = int(threadIdx.x);
  float mx = -3.402823466e38f;
  for (int32_t p = tid; p < n_pos; p += kAttnThreads) {
    const float* kp = cache_k + int64_t(p) * kv_dim + kv_off;
    float d = 0.0f;
    for (int64_t c = 0; c < head_dim; ++c) d += qh[c] * kp[c];
    d *= scale;
    s[p] = d;
    mx = fmaxf(mx, d);
  }
  mx = block_reduce(mx, true, partial);
  float sum = 0.0f;
  for (int32_t p = tid; p < n_pos; p += kAttnThreads) {
    const float e = expf(s[p] - mx);
    s[p] = e;
    sum += e;
  }
  sum = block_reduce(sum, false, partial);  // its barriers also make every s[p] visible below
  const float inv = 1.0f / sum;
  float* o = out + (int64_t(t) * n_head + h) * head_dim;
  for (int64_t c = tid; c < head_dim; c += kAttnThreads) {
    float acc = 0.0f;
    for (int32_t p = 0; p < n_pos; ++p) acc += s[p] * cache_v[int64_t(p) * kv_dim + kv_off + c];
    o[c] = acc * inv;
  }
}

// One thread per token: softmax over n_expert logits, the top k (ties to the lower id), optional
// renormalisation. A row without any ordered value (all NaN) yields dropped slots (id -1, weight 0).
MK_GLOBAL void route_kernel(const float* logits, int64_t n_tok, int32_t n_expert, int32_t k, int renorm, int32_t* ids,
                            float* weights) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tok) return;
  const float* l = logits + t * n_expert;
  float mx = l[0];
  for (int32_t e = 1; e < n_expert; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.0f;
  for (int32_t e = 0; e < n_expert; ++e) sum += expf(l[e] - mx);
  float picked = 0.0f, last_v = 3.402823466e38f;
  int32_t last = -1;
  for (int32_t j = 0; j < k; ++j) {
    int32_t best = -1;  // the next after (last_v, last) in the order value desc, id asc
    float best_v = 0.0f;
    for (int32_t e = 0; e < n_expert; ++e) {
      const float v = l[e];
      const bool after_last = last < 0 ? (v <= last_v) : (v < last_v || (v == last_v && e > last));
      if (after_last && (best < 0 || v > best_v)) {
        best = e;
        best_v = v;
      }
    }
    const float w = best < 0 ? 0.0f : expf(best_v - mx) / sum;
    ids[t * k + j] = best;
    weights[t * k + j] = w;
    picked += w;
    if (best >= 0) {
      last = best;
      last_v = best_v;
    }
  }
  if (renorm && picked > 0.0f)
    for (int32_t j = 0; j < k; ++j) weights[t * k + j] /= picked;
}

}  // namespace moelite::cuda_kernels
