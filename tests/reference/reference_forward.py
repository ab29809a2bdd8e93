#!/usr/bin/python3
"""Independent numpy (float64) reference forward for MoE GGUF models.

Architectures: llama (Mixtral-style MoE), qwen2moe, qwen3moe, olmoe.

    /usr/bin/python3 tests/reference/reference_forward.py MODEL.gguf --tokens 1,2,3 \
        --out logits.f32 [--quantize-activations]

writes n_tokens x n_vocab float32 little-endian row-major logits for the tokens evaluated
as one causal prompt starting at position 0.

Semantics (as llama.cpp): pre-norm blocks; RMSNorm eps from metadata; head_dim from
attention.key_length else n_embd/n_head; RoPE with theta_i = pos * base^(-2i/n_rot)
(llama: adjacent pairs, others: NeoX halves; n_rot from rope.dimension_count else head_dim);
qwen2moe q/k/v biases; qwen3moe per-head q/k RMSNorm before RoPE; olmoe whole-projection
q/k RMSNorm before splitting into heads; GQA; causal softmax attention, scale 1/sqrt(head_dim);
router softmax over all experts, top-k (ties -> lower index), renormalised for llama and
qwen3moe only; SwiGLU experts; qwen2moe shared expert scaled by sigmoid(gate_inp_shexp . x);
final RMSNorm and output (tied to token_embd when output.weight is absent).

--quantize-activations emulates ggml's quantization of the activation row before each matmul
with a quantized weight (the vec_dot_type of the weight type):
  Q4_0, Q5_0, Q8_0 -> Q8_0 (quantize_row_q8_0_ref): per 32 block amax, d = amax/127 (fp32),
      id = d ? 1/d : 0, q = roundf(x*id) (half away from zero); d stored and used as fp16.
  Q4_1, Q5_1 -> Q8_1 (quantize_row_q8_1_ref): as Q8_0, plus s = fp16(sum(q) * d_fp32);
      the weight-min term of the dot uses s (m * s), as ggml_vec_dot_q4_1_q8_1 does.
  K-quants -> Q8_K (quantize_row_q8_K_ref): per 256 block, max = the element of largest
      |x| (first one), iscale = -127/max (fp32), q = min(127, nearest_int(iscale*x)) with
      nearest_int rounding half to even, d = 1/iscale (fp32, not fp16).
  F32/F16/BF16 weights -> activations stay float (moelite's choice; ggml would round them).
  F32 weights (norms, biases, routers) -> unchanged.
Token embedding lookup (get_rows), router, norms and attention stay in float.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "gguf"))
from moelite_gguf import GGUFReader, quants as Q  # noqa: E402

ARCHS = ("llama", "qwen2moe", "qwen3moe", "olmoe")


def rms_norm(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def quantize_activations(x, wtype):
    """x [T, n] -> (x_deq float64 [T, n], min_term_source or None).

    For Q8_1 the second value is (s [T, nb], blocksum(x_deq) [T, nb]) so the caller can
    replace the weight-min contribution by m * s exactly as ggml."""
    x32 = np.asarray(x, np.float32)
    T, n = x32.shape
    if wtype in (Q.F32, Q.F16, Q.BF16):
        # moelite keeps float activations for float weights (ggml would round them to the
        # weight's type; moelite's choice is the more exact one, documented in backends/cpu/quant.h).
        return np.asarray(x, np.float64), None
    if wtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):
        d16, q, _ = Q.q8_0_blocks(x32)
        xd = q.astype(np.float64) * d16.astype(np.float64)[:, None]
        return xd.reshape(T, n), None
    if wtype in (Q.Q4_1, Q.Q5_1):
        d16, q, s = Q.q8_1_blocks(x32)
        xd = q.astype(np.float64) * d16.astype(np.float64)[:, None]
        return xd.reshape(T, n), (s.astype(np.float64).reshape(T, -1), xd.sum(axis=1).reshape(T, -1))
    if wtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
        d, q = Q.q8_k_blocks(x32)
        xd = q.astype(np.float64) * d.astype(np.float64)[:, None]
        return xd.reshape(T, n), None
    raise ValueError("no activation quantization rule for type %d" % wtype)


class ReferenceModel:
    def __init__(self, path, quantize_acts=False):
        self.r = r = GGUFReader(path)
        self.qa = quantize_acts
        md = r.metadata
        self.arch = arch = md["general.architecture"]
        if arch not in ARCHS:
            raise ValueError("unsupported architecture " + arch)
        k = arch + "."
        self.n_layer = int(md[k + "block_count"])
        self.n_embd = int(md[k + "embedding_length"])
        self.n_head = int(md[k + "attention.head_count"])
        self.n_head_kv = int(md.get(k + "attention.head_count_kv", self.n_head))
        self.head_dim = int(md.get(k + "attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(md.get(k + "rope.dimension_count", self.head_dim))
        self.rope_base = float(md.get(k + "rope.freq_base", 10000.0))
        self.eps = float(md[k + "attention.layer_norm_rms_epsilon"])
        self.n_expert = int(md[k + "expert_count"])
        self.n_expert_used = int(md[k + "expert_used_count"])
        self.neox = arch != "llama"
        # Fixed per architecture, unless the file states it (DeepSeek-style keys).
        self.renorm = bool(md.get(arch + ".expert_weights_norm", arch in ("llama", "qwen3moe")))
        self.weights_scale = float(md.get(arch + ".expert_weights_scale", 1.0))
        self._cache = {}

    # ---------------------------------------------------------------- weights
    def w(self, name, index=None):
        key = (name, index)
        if key not in self._cache:
            self._cache[key] = self.r.get(name, index).astype(np.float64)
        return self._cache[key]

    def has(self, name):
        return name in self.r

    def _mins(self, name, index):
        """per-block weight mins m [n_out, nb] of a Q4_1/Q5_1 tensor (fp16 at bytes 2..3)"""
        t = self.r.type_of(name)
        ts = Q.type_size(t)
        raw = np.asarray(self.r.raw(name, index)).reshape(-1, ts)
        m = np.ascontiguousarray(raw[:, 2:4]).view("<f2")[:, 0].astype(np.float64)
        n_out = self.r.shape(name, index)[0]
        return m.reshape(n_out, -1)

    def matmul(self, name, x, index=None):
        """y = x @ W^T for weight `name` (numpy shape [n_out, n_in]); x [T, n_in]"""
        W = self.w(name, index)
        if not self.qa:
            return x @ W.T
        t = self.r.type_of(name)
        xd, extra = quantize_activations(x, t)
        y = xd @ W.T
        if extra is not None:
            s, bsum = extra
            y += (s - bsum) @ self._mins(name, index).T
        return y

    def expert(self, kind, il, e):
        """(name, index) of expert e's matrix, for stacked or per-expert layouts"""
        stacked = "blk.%d.ffn_%s_exps.weight" % (il, kind)
        if self.has(stacked):
            return stacked, e
        return "blk.%d.ffn_%s.%d.weight" % (il, kind, e), None

    # ---------------------------------------------------------------- blocks
    def rope(self, x, pos):
        """x [T, nh, hd], pos [T]"""
        nr = self.n_rot
        half = nr // 2
        inv = self.rope_base ** (-2.0 * np.arange(half) / nr)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if self.neox:
            a, b = x[..., :half], x[..., half:nr]
            out[..., :half] = a * c - b * s
            out[..., half:nr] = a * s + b * c
        else:
            a, b = x[..., 0:nr:2], x[..., 1:nr:2]
            out[..., 0:nr:2] = a * c - b * s
            out[..., 1:nr:2] = a * s + b * c
        return out

    def attention(self, il, h, pos):
        p = "blk.%d." % il
        T = h.shape[0]
        H, HKV, HD = self.n_head, self.n_head_kv, self.head_dim
        q = self.matmul(p + "attn_q.weight", h)
        k = self.matmul(p + "attn_k.weight", h)
        v = self.matmul(p + "attn_v.weight", h)
        for nm, t in (("q", q), ("k", k), ("v", v)):
            if self.has(p + "attn_%s.bias" % nm):
                t += self.w(p + "attn_%s.bias" % nm)
        if self.arch == "olmoe":
            q = rms_norm(q, self.w(p + "attn_q_norm.weight"), self.eps)
            k = rms_norm(k, self.w(p + "attn_k_norm.weight"), self.eps)
        q = q.reshape(T, H, HD)
        k = k.reshape(T, HKV, HD)
        v = v.reshape(T, HKV, HD)
        if self.arch == "qwen3moe":
            q = rms_norm(q, self.w(p + "attn_q_norm.weight"), self.eps)
            k = rms_norm(k, self.w(p + "attn_k_norm.weight"), self.eps)
        q = self.rope(q, pos)
        k = self.rope(k, pos)
        g = H // HKV
        kk = np.repeat(k, g, axis=1)               # q head h uses kv head h // g
        vv = np.repeat(v, g, axis=1)
        scores = np.einsum("thd,shd->hts", q, kk) / np.sqrt(HD)
        mask = pos[None, :] > pos[:, None]          # key position after query position
        scores = np.where(mask[None], -np.inf, scores)
        scores -= scores.max(axis=-1, keepdims=True)
        pr = np.exp(scores)
        pr /= pr.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", pr, vv).reshape(T, H * HD)
        return self.matmul(p + "attn_output.weight", o)

    def route(self, il, x):
        """x [T, n_embd] -> weights [T, n_expert] with exactly top-k non-zero entries"""
        logits = x @ self.w("blk.%d.ffn_gate_inp.weight" % il).T
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        top = np.argsort(-p, axis=-1, kind="stable")[:, : self.n_expert_used]
        wts = np.zeros_like(p)
        sel = np.take_along_axis(p, top, axis=-1)
        if self.renorm:
            sel = sel / sel.sum(axis=-1, keepdims=True)
        sel = sel * self.weights_scale
        np.put_along_axis(wts, top, sel, axis=-1)
        return wts

    def moe(self, il, x, record=None):
        p = "blk.%d." % il
        wts = self.route(il, x)
        if record is not None:
            record.append(wts.copy())
        out = np.zeros_like(x)
        for e in range(self.n_expert):
            rows = np.nonzero(wts[:, e])[0]
            if rows.size == 0:
                continue
            xe = x[rows]
            g = self.matmul(*self._mm("gate", il, e, xe))
            u = self.matmul(*self._mm("up", il, e, xe))
            d = self.matmul(*self._mm("down", il, e, silu(g) * u))
            out[rows] += wts[rows, e][:, None] * d
        if self.has(p + "ffn_gate_shexp.weight"):
            g = self.matmul(p + "ffn_gate_shexp.weight", x)
            u = self.matmul(p + "ffn_up_shexp.weight", x)
            d = self.matmul(p + "ffn_down_shexp.weight", silu(g) * u)
            gate = sigmoid(x @ self.w(p + "ffn_gate_inp_shexp.weight"))
            out += gate[:, None] * d
        return out

    def _mm(self, kind, il, e, x):
        name, idx = self.expert(kind, il, e)
        return name, x, idx

    def forward(self, tokens, record=None):
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(tokens.size)
        h = self.w("token_embd.weight")[tokens].copy()
        for il in range(self.n_layer):
            p = "blk.%d." % il
            h = h + self.attention(il, rms_norm(h, self.w(p + "attn_norm.weight"), self.eps), pos)
            h = h + self.moe(il, rms_norm(h, self.w(p + "ffn_norm.weight"), self.eps), record)
        h = rms_norm(h, self.w("output_norm.weight"), self.eps)
        out = "output.weight" if self.has("output.weight") else "token_embd.weight"
        return self.matmul(out, h)


def main(argv=None):
    ap = argparse.ArgumentParser(description="numpy reference forward for MoE GGUF models")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma separated token ids")
    ap.add_argument("--out", required=True, help="float32 LE logits, n_tokens x n_vocab row-major")
    ap.add_argument("--quantize-activations", action="store_true")
    a = ap.parse_args(argv)
    toks = [int(t) for t in a.tokens.split(",") if t.strip()]
    m = ReferenceModel(a.model, a.quantize_activations)
    logits = m.forward(toks)
    logits.astype("<f4").tofile(a.out)
    print("wrote %s: %d x %d logits" % (a.out, logits.shape[0], logits.shape[1]))


if __name__ == "__main__":
    main()
