// Causal attention over the device KV cache, and the router.
#pragma once
#include <math.h>

#include "backends/cuda/kernels/dialect.cuh"

namespace moelite::cuda_kernels {

constexpr int kAttnThreads = 128;

// `partial` is the block's shared array of kAttnThreads / 32 floats.
template <class SharedFloats>
MK_DEVICE float block_reduce(float v, bool is_max, SharedFloats& partial) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int tid = int(threadIdx.x);
  __syncthreads();  // partial may still be read from the previous reduction
  if ((tid & 31) == 0) partial[tid >> 5] = v;
  __syncthreads();
  float r = partial[0];
  for (int j = 1; j < kAttnThreads / 32; ++j) r = is_max ? fmaxf(r, partial[j]) : r + partial[j];
  return r;
}

// Causal attention, split over the positions (flash-decoding): a long context is cut into chunks
// of kAttnChunk positions, each (token, head, chunk) is one block, and a second kernel merges the
// chunks. A decoding token over a long context thus spreads over many blocks instead of one. The
// chunking depends only on positions, never on the batch, so a token's result is the same in any
// batch. Scores stay in shared memory.
constexpr int kAttnChunk = 256;

// Block (t * n_head + h, c): positions [c * kAttnChunk, ...) of those the token sees -- [0, pos0 + t],
// or its sliding window when window > 0 -- (position j in cache slot j % slots; GQA: kv head
// h / (n_head / n_head_kv)). Writes the chunk's max score m, sum of exp(score - m) s, and
// o[d] = sum of exp(score - m) * v[d] (d < head_dim_v: a value is the first head_dim_v floats of its
// kv head's row in cache_v, which is cache_k for a keys-only cache) into
// partial[((t * n_head + h) * n_chunks + c) * (head_dim_v + 2)] as (m, s, o...); a chunk outside
// the token's positions writes (-inf, 0, 0...).
MK_GLOBAL void attention_chunk_kernel(const float* q, const float* cache_k, const float* cache_v, float* partial,
                                      int32_t pos0, int32_t n_head, int32_t n_head_kv, int64_t head_dim,
                                      int64_t head_dim_v, int64_t kv_dim, int32_t slots, int32_t window, float scale) {
  MK_SHARED(float, scores, kAttnChunk);
  MK_SHARED(float, reduce, kAttnThreads / 32);
  const int32_t t = int32_t(blockIdx.x) / n_head, h = int32_t(blockIdx.x) % n_head;
  const int32_t n_chunks = int32_t(gridDim.y), c = int32_t(blockIdx.y);
  const int64_t kv_off = int64_t(h / (n_head / n_head_kv)) * head_dim;
  const int32_t n_pos = pos0 + t + 1, visible = window > 0 && n_pos > window ? n_pos - window : 0;
  const int32_t first = c * kAttnChunk > visible ? c * kAttnChunk : visible;
  const int32_t end = (c + 1) * kAttnChunk < n_pos ? (c + 1) * kAttnChunk : n_pos;
  const int32_t count = end - first;
  float* out = partial + ((int64_t(t) * n_head + h) * n_chunks + c) * (head_dim_v + 2);
  const int tid = int(threadIdx.x);
  if (count <= 0) {  // the whole block agrees: no barrier is skipped by some threads only
    for (int64_t d = tid; d < head_dim_v + 2; d += kAttnThreads) out[d] = d == 0 ? -INFINITY : 0.0f;
    return;
  }
  const float* qh = q + (int64_t(t) * n_head + h) * head_dim;
  float mx = -3.402823466e38f;
  for (int32_t j = tid; j < count; j += kAttnThreads) {
    const float* kp = cache_k + int64_t((first + j) % slots) * kv_dim + kv_off;
    float dot = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kp[d];
    dot *= scale;
    scores[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = block_reduce(mx, true, reduce);
  float sum = 0.0f;
  for (int32_t j = tid; j < count; j += kAttnThreads) {
    const float e = expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, false, reduce);  // its barriers also make every scores[j] visible below
  if (tid == 0) {
    out[0] = mx;
    out[1] = sum;
  }
  for (int64_t d = tid; d < head_dim_v; d += kAttnThreads) {
    float acc = 0.0f;
    for (int32_t j = 0; j < count; ++j) acc += scores[j] * cache_v[int64_t((first + j) % slots) * kv_dim + kv_off + d];
    out[2 + d] = acc;
  }
}

// One block per (token, head): out = sum_c exp(m_c - M) o_c / (sum_c exp(m_c - M) s_c + exp(sink - M)),
// M = max(m_c, sink), the chunks taken in order; without sinks (null) the sink term is absent.
// head_dim here is the value width (the output head's floats).
MK_GLOBAL void attention_merge_kernel(const float* partial, int32_t n_chunks, int32_t n_head, int64_t head_dim,
                                      const float* sinks, float* out) {
  const float* p = partial + int64_t(blockIdx.x) * n_chunks * (head_dim + 2);
  const float sink = sinks ? sinks[int32_t(blockIdx.x) % n_head] : -INFINITY;
  float m = sink;
  for (int32_t c = 0; c < n_chunks; ++c) m = fmaxf(m, p[c * (head_dim + 2)]);
  float denom = sinks ? expf(sink - m) : 0.0f;
  for (int32_t c = 0; c < n_chunks; ++c) {
    const float* pc = p + c * (head_dim + 2);
    if (pc[1] > 0.0f) denom += expf(pc[0] - m) * pc[1];
  }
  const float inv = 1.0f / denom;
  float* o = out + int64_t(blockIdx.x) * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int32_t c = 0; c < n_chunks; ++c) {
      const float* pc = p + c * (head_dim + 2);
      if (pc[1] > 0.0f) acc += expf(pc[0] - m) * pc[2 + d];
    }
    o[d] = acc * inv;
  }
}

// One warp per token (kRouteWarps tokens a block): softmax over n_expert logits, the top k (ties
// to the lower id), optional renormalisation. Lane l holds experts l, l + 32, …; the maximum and
// the softmax's sum are fixed butterflies, and each of the k rounds takes every lane's best
// candidate after the last pick and reduces them in the order (logit desc, id asc). The CPU ranks
// the softmax's probabilities instead (ties to the lower id); the two orders differ only where two
// logits a few ulps apart round to the same probability, or underflow to 0 far below the maximum,
// and those picks are equally good (the kernel tests compare ids on random logits with ties). One
// thread per token (the first version) took 33 us a layer for 64 experts top-8 on an H200: k
// serial passes over the logits. A NaN logit is never picked; a row without any ordered value (all
// NaN) yields dropped slots (id -1, weight 0).
constexpr int kRouteWarps = 4;

MK_GLOBAL void route_kernel(const float* logits, int64_t n_tok, int32_t n_expert, int32_t k, int renorm, int32_t* ids,
                            float* weights) {
  const int lane = int(threadIdx.x & 31u);
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + int64_t(threadIdx.x >> 5);
  if (t >= n_tok) return;  // the whole warp
  const float* l = logits + t * n_expert;
  float mx = bits_to_float(0xFF800000u);  // -inf
  for (int32_t e = lane; e < n_expert; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float part = 0.0f;
  for (int32_t e = lane; e < n_expert; e += 32) part += expf(l[e] - mx);
  const float sum = warp_sum(part);
  float picked = 0.0f, last_v = bits_to_float(0x7F800000u);  // +inf: a +inf logit can be picked
  int32_t last = -1;
  for (int32_t j = 0; j < k; ++j) {
    int32_t best = -1;  // this lane's next after (last_v, last) in the order value desc, id asc
    float best_v = 0.0f;
    for (int32_t e = lane; e < n_expert; e += 32) {
      const float v = l[e];
      const bool after_last = last < 0 ? (v <= last_v) : (v < last_v || (v == last_v && e > last));
      if (after_last && (best < 0 || v > best_v)) {
        best = e;
        best_v = v;
      }
    }
    for (int m = 16; m > 0; m >>= 1) {
      const float ov = shfl_xor(best_v, m);
      const int32_t oi = shfl_xor(best, m);
      if (oi >= 0 && (best < 0 || ov > best_v || (ov == best_v && oi < best))) {
        best = oi;
        best_v = ov;
      }
    }
    const float w = best < 0 ? 0.0f : expf(best_v - mx) / sum;
    if (lane == 0) {
      ids[t * k + j] = best;
      weights[t * k + j] = w;
    }
    picked += w;
    if (best >= 0) {
      last = best;
      last_v = best_v;
    }
  }
  if (lane == 0 && renorm && picked > 0.0f)
    for (int32_t j = 0; j < k; ++j) weights[t * k + j] /= picked;
}

}  // namespace moelite::cuda_kernels
