#!/usr/bin/python3
"""Independent numpy (float64) reference forward for MoE GGUF models.

Architectures: llama (Mixtral-style MoE), qwen2moe, qwen3moe, olmoe, gpt-oss, granitemoe, phimoe,
deepseek2.

    /usr/bin/python3 tests/reference/reference_forward.py MODEL.gguf --tokens 1,2,3 \
        --out logits.f32 [--quantize-activations] [--gating exact|score|sensitivity \
        --threshold T [--sensitivity S0,S1,... | --profile PROFILE.json]] [--perturb LAYER,ALPHA]

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

gpt-oss (as llama.cpp's openai-moe): NeoX RoPE; q/k/v and output biases; per-head sinks
(blk.N.attn_sinks.weight): softmax over [scores..., sink] with the sink's column dropped;
sliding window attention.sliding_window (W) on layers with il % P < P - 1, P =
attention.sliding_window_pattern (default 2; 0: every layer): a query at p sees keys at
p - W < pos <= p; rope.freq_base_swa (if present) for those layers; post_attention_norm as the
MoE's input norm; router logits = W x + b, the top k logits (ties -> lower index), weights =
softmax over those k logits; experts g = Wg x + bg, u = Wu x + bu, g' = min(g, 7),
u' = clip(u, -7, 7), h = g' * sigmoid(1.702 g') * (u' + 1), out = Wd h + bd.

granitemoe (as llama.cpp's granite model): adjacent-pair RoPE; embeddings times embedding_scale;
attention scores times attention.scale instead of 1/sqrt(head_dim); the attention output and the
MoE output (plus a shared expert without a gate, ffn_*_shexp) times residual_scale before each is
added to the residual stream; top-k weights renormalised; logits times 1/logit_scale. A key that
is absent or 0 means no scaling.

phimoe (as llama.cpp's phi3 graph): every norm is rms_norm(x) * w + b when the file has the bias
(attn_norm, ffn_norm, output_norm); q/k/v, output and head biases; NeoX RoPE whose angles are
divided per pair by rope_factors_long (a context longer than rope.scaling.original_context_length,
n_ctx = --n-ctx, default the file's context_length) or rope_factors_short; top-k renormalised.
rope.scaling.attn_factor multiplies cos and sin whatever the scaling type (none included).

deepseek2 (DeepSeek-V2/V3 as their Hugging Face modeling code defines it): multi-head latent
attention in its decompressed form: q = Wq x, or Wq_b rms(Wq_a x) (q_a_norm); per head
q = [q_nope | q_rope] (key_length_mla or key_length = nope + n_rot, n_rot = rope.dimension_count);
[c | k_rope] = Wkv_a x, c = rms(c) (kv_a_norm, kv_lora_rank wide), k_rope one rope key shared by all
heads; per head k = [K_b,h^T c | rope(k_rope)], v = V_b,h c with K_b,h (kv_lora_rank x nope) and
V_b,h (value_length_mla x kv_lora_rank) from attn_k_b/attn_v_b or the fused attn_kv_b (per head
nope key rows then value rows); adjacent-pair rope on the rope dims only; softmax scale
m^2 / sqrt(nope + n_rot) and cos/sin times a, where for YaRN with mscale_all_dim L (the file's
yarn_log_multiplier / 0.1): a = attn_factor, m = attn_factor * (1 + 0.1 L ln s); without L (or
without YaRN, s = 1): a = m = attn_factor * (1 + 0.1 ln s). With --quantize-activations and a
quantized attn_k_b/attn_kv_b the attention is computed absorbed (q_nope_h through K_b,h into latent
space, scores against c, output through V_b,h) so that the quantized activations are the engine's.
leading_dense_block_count dense SwiGLU blocks (ffn_gate/up/down) first; then MoE blocks whose shared
experts (ffn_*_shexp, no gate) are added; routing: scores = softmax (expert_gating_func 1 or absent)
or sigmoid (2) of the logits; selection = scores + exp_probs_b.bias (if present); with
expert_group_count G > 1, groups of n_expert/G consecutive experts scored by the sum of their two
best selection values, all but the expert_group_used_count best groups (ties -> lower group)
excluded; top-k selection values (ties -> lower index); weights = the picked unbiased scores,
divided by max(sum, 2^-14) when expert_weights_norm; times expert_weights_scale.

RoPE scaling (rope.scaling.type): "linear": theta / factor; "yarn" (factor s, original context
n_orig, beta_fast 32, beta_slow 1 unless the file says): for pair i of n_rot, with
dim(b) = n_rot * ln(n_orig / (2 pi b)) / (2 ln base), low = max(0, floor(dim(beta_fast))),
high = min(n_rot - 1, ceil(dim(beta_slow))), keep = 1 - clip((i - low) / max(0.001, high - low), 0, 1):
theta = theta/s * (1 - keep) + theta * keep, and cos/sin are scaled by
attn_factor * (1 + 0.1 ln s).

--quantize-activations emulates ggml's quantization of the activation row before each matmul
with a quantized weight (the vec_dot_type of the weight type):
  Q4_0, Q5_0, Q8_0, MXFP4 -> Q8_0 (quantize_row_q8_0_ref): per 32 block amax, d = amax/127 (fp32),
      id = d ? 1/d : 0, q = roundf(x*id) (half away from zero); d stored and used as fp16.
  Q4_1, Q5_1 -> Q8_1 (quantize_row_q8_1_ref): as Q8_0, plus s = fp16(sum(q) * d_fp32);
      the weight-min term of the dot uses s (m * s), as ggml_vec_dot_q4_1_q8_1 does.
  K-quants -> Q8_K (quantize_row_q8_K_ref): per 256 block, max = the element of largest
      |x| (first one), iscale = -127/max (fp32), q = min(127, nearest_int(iscale*x)) with
      nearest_int rounding half to even, d = 1/iscale (fp32, not fp16).
  F32/F16/BF16 weights -> activations stay float (moelite's choice; ggml would round them).
  F32 weights (norms, biases, routers) -> unchanged.
Token embedding lookup (get_rows), router, norms and attention stay in float.

Routing of layer l, in order (route() and the helpers below it):
  1. p = softmax over all experts of router @ xn, xn = layer l's MoE input (rms_norm with ffn_norm
     of the residual after l's attention); top-k slots by p descending, ties -> lower expert index.
  2. renormalise the k weights to sum 1 (llama, qwen3moe, or expert_weights_norm in the file).
  3. adaptive gating (forward(gating=...), CLI --gating), per token, on the weights of step 2.
     Rank the k weights descending, ties -> lower top-k slot first (ranked higher, kept first).
       "exact": keep all k (the default).
       ("score", T): drop every slot whose weight < T, but always keep the highest one.
       ("sensitivity", T, [S_0..S_{L-1}]): kept = k; while kept > 1 and
           (sum of the weights of the k-kept+1 lowest-ranked slots)^2 * S_l < T: kept -= 1.
     Dropped slots contribute nothing; the kept weights are rescaled so that their sum equals the
     sum of all k weights before dropping (mass preserved: 1 for renormalising archs).
  4. perturbation (forward(perturb=(layer, alpha)), CLI --perturb; a finite-difference probe for
     the sensitivity S_l, exact gating only): at that layer only, for every token, the lowest
     weight (ties -> the higher slot index is the lowest) is multiplied by alpha, then all k weights
     are rescaled to the sum they had before (alpha = 0 drops the lowest expert exactly as gating
     does; needs k >= 2). The token's "dropped weight" is d_t = (1 - alpha) * w_lowest, with
     w_lowest taken after step 2 (before expert_weights_scale).
  5. multiply by expert_weights_scale.
Pre-gated routing (Pre-gated MoE / Read-ME): when the file has blk.N.ffn_pregate_inp.weight
(ne = [n_embd, n_expert], like ffn_gate_inp) and N+1 < n_layer, layer N+1's routing (experts AND
weights, steps 1-5 with l = N+1: gating uses S_{N+1}, perturb=(N+1, a) perturbs it) is computed at
layer N from layer N's MoE input: route with ffn_pregate_inp_N in place of a router applied to xn_N.
Layer N+1 then ignores its own ffn_gate_inp. Layer 0, and any layer whose previous layer has no
pregate tensor, uses its own ffn_gate_inp.
forward(..., stats={}) fills stats["kept"] (int [n_layer, n_tokens]: experts kept per token per
layer), stats["topk"] (float [n_layer, n_tokens, k]: the weights of step 2 in top-k slot order,
i.e. what gating and perturbation act on) and, with perturb, stats["dropped"] (float [n_tokens]:
d_t at the perturbed layer).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "gguf"))
from moelite_gguf import GGUFReader, quants as Q  # noqa: E402

ARCHS = ("llama", "qwen2moe", "qwen3moe", "olmoe", "gpt-oss", "granitemoe", "phimoe", "deepseek2")


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
    if wtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.MXFP4):
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


GATING_MODES = ("exact", "score", "sensitivity")


def check_gating(gating, n_layer):
    """None / "exact" / ("exact",) / ("score", T) / ("sensitivity", T, [S_0..S_{L-1}]) ->
    None (exact routing) or a validated tuple."""
    if gating is None or gating == "exact" or tuple(gating) == ("exact",):
        return None
    mode = gating[0]
    if mode == "score" and len(gating) == 2:
        return ("score", float(gating[1]))
    if mode == "sensitivity" and len(gating) == 3:
        sens = [float(v) for v in gating[2]]
        if len(sens) != n_layer:
            raise ValueError("sensitivity gating needs %d per-layer values, got %d" % (n_layer, len(sens)))
        return ("sensitivity", float(gating[1]), sens)
    raise ValueError("bad gating %r: want None, ('score', T) or ('sensitivity', T, [S per layer])" % (gating,))


def rank_descending(sel):
    """sel [T, k] -> slot indices [T, k], largest weight first; ties keep the lower slot first
    (a stable sort), so among equal weights the higher slot ranks lowest."""
    return np.argsort(-sel, axis=-1, kind="stable")


def rescale_to(sel, mass):
    """scale each row of sel so that it sums to mass[T] (the routing mass before a drop)"""
    return sel * (mass / sel.sum(axis=-1))[:, None]


def kept_count(sel, gating, il):
    """number of top-k slots adaptive gating keeps per token: int [T]. sel [T, k] are the weights
    after renormalisation (before expert_weights_scale); gating as returned by check_gating."""
    T, k = sel.shape
    if gating is None:
        return np.full(T, k, dtype=np.int64)
    ranked = np.take_along_axis(sel, rank_descending(sel), axis=-1)   # [T, k] descending
    if gating[0] == "score":
        # the highest always stays, the rest stay when >= T
        return 1 + (ranked[:, 1:] >= gating[1]).sum(axis=-1)
    thr, sens = gating[1], gating[2][il]
    tails = np.cumsum(ranked[:, ::-1], axis=-1)          # tails[:, j]: sum of the j+1 lowest
    kept = np.full(T, k, dtype=np.int64)
    going = np.ones(T, dtype=bool)                        # still inside the while loop
    for j in range(k - 1):                                # kept = k - j > 1
        going &= tails[:, j] * tails[:, j] * sens < thr
        kept -= going
    return kept


def apply_gating(sel, gating, il):
    """adaptive gating on sel [T, k] (step 3 of the routing): -> (weights [T, k] with dropped slots
    zero and the kept ones rescaled to the row's original sum, kept [T])"""
    kept = kept_count(sel, gating, il)
    if gating is None:
        return sel, kept
    rank = np.argsort(rank_descending(sel), axis=-1)      # rank of each slot, 0 = highest
    out = np.where(rank < kept[:, None], sel, 0.0)
    return rescale_to(out, sel.sum(axis=-1)), kept


def perturb_lowest(sel, alpha):
    """step 4 of the routing: the lowest weight of each row (ties -> the higher slot) times alpha,
    then the row rescaled to its original sum. -> (weights [T, k], d [T] = (1 - alpha) * w_lowest)"""
    if sel.shape[1] < 2:
        raise ValueError("perturbing the lowest expert needs top-k >= 2")
    lowest = rank_descending(sel)[:, -1:]
    w_low = np.take_along_axis(sel, lowest, axis=-1)
    out = sel.copy()
    np.put_along_axis(out, lowest, alpha * w_low, axis=-1)
    return rescale_to(out, sel.sum(axis=-1)), (1.0 - alpha) * w_low[:, 0]


class ReferenceModel:
    def __init__(self, path, quantize_acts=False, n_ctx=None):
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
        self.neox = arch not in ("llama", "granitemoe")
        g = lambda key: float(md.get(k + key, 0.0) or 0.0)  # noqa: E731  (0: not set)
        self.embedding_scale, self.residual_scale = g("embedding_scale") or 1.0, g("residual_scale") or 1.0
        self.logit_scale, self.attention_scale = g("logit_scale") or 1.0, g("attention.scale") or None
        # Fixed per architecture, unless the file states it (DeepSeek-style keys). gpt-oss's softmax
        # over the k picked logits sums to 1 like a renormalised one (route()).
        self.renorm = bool(md.get(arch + ".expert_weights_norm", arch in ("llama", "qwen3moe", "gpt-oss", "granitemoe", "phimoe")))
        self.rope_base_swa = float(md.get(k + "rope.freq_base_swa", self.rope_base))
        self.window = [0] * self.n_layer
        if arch == "gpt-oss":
            W = int(md[k + "attention.sliding_window"])
            P = int(md.get(k + "attention.sliding_window_pattern", 2))
            self.window = [W if P == 0 or il % P < P - 1 else 0 for il in range(self.n_layer)]
        self.scaling = md.get(k + "rope.scaling.type", "none")
        self.factor = float(md.get(k + "rope.scaling.factor", 0.0) or 1.0)
        if self.factor == 1.0:
            self.scaling = "none"
        self.n_orig = int(md.get(k + "rope.scaling.original_context_length", md.get(k + "context_length", 4096)))
        self.beta_fast = float(md.get(k + "rope.scaling.yarn_beta_fast", 32.0))
        self.beta_slow = float(md.get(k + "rope.scaling.yarn_beta_slow", 1.0))
        self.attn_factor = float(md.get(k + "rope.scaling.attn_factor", 1.0))
        self.freq_factors = None
        n_ctx = n_ctx or int(md.get(k + "context_length", 4096))
        which = "rope_factors_long.weight" if n_ctx > self.n_orig else "rope_factors_short.weight"
        if arch == "phimoe" and which in r:
            self.freq_factors = r.get(which).astype(np.float64)
        self.weights_scale = float(md.get(arch + ".expert_weights_scale", 1.0))
        self.rope_mag = None          # cos/sin magnitude when not the generic one (deepseek2)
        self.dense_lead, self.sigmoid, self.groups, self.groups_used = 0, False, 0, 0
        if arch == "deepseek2":
            self.n_layer -= int(md.get(k + "nextn_predict_layers", 0))  # GLM's draft blocks: not the model
            self.window = [0] * self.n_layer
            self.neox = False
            self.head_dim = int(md.get(k + "attention.key_length_mla", md.get(k + "attention.key_length")))
            self.v_head = int(md.get(k + "attention.value_length_mla", md.get(k + "attention.value_length")))
            self.n_rot = int(md[k + "rope.dimension_count"])
            self.nope = self.head_dim - self.n_rot
            self.kv_lora = int(md[k + "attention.kv_lora_rank"])
            self.dense_lead = int(md.get(k + "leading_dense_block_count", 0))
            self.sigmoid = int(md.get(k + "expert_gating_func", 1)) == 2
            self.groups = int(md.get(k + "expert_group_count", 0))
            self.groups_used = int(md.get(k + "expert_group_used_count", 0))
            L = float(md.get(k + "rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
            s_ = self.factor if self.scaling == "yarn" else 1.0
            if self.scaling == "yarn" and L != 0.0:
                self.rope_mag, m = self.attn_factor, self.attn_factor * (1.0 + 0.1 * L * np.log(s_))
            else:
                self.rope_mag = m = self.attn_factor * (1.0 + 0.1 * np.log(s_))
            self.attention_scale = m * m / np.sqrt(self.head_dim)
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
    def rope(self, x, pos, base=None):
        """x [T, nh, hd], pos [T]"""
        nr = self.n_rot
        half = nr // 2
        base = base or self.rope_base
        i = np.arange(half)
        ang = pos[:, None].astype(np.float64) * (base ** (-2.0 * i / nr))[None, :]
        if self.freq_factors is not None:
            ang = ang / self.freq_factors[None, :]
        mag = self.attn_factor
        if self.scaling == "linear":
            ang = ang / self.factor
        elif self.scaling == "yarn":
            dim = lambda b: nr * np.log(self.n_orig / (2 * np.pi * b)) / (2 * np.log(base))  # noqa: E731
            low = max(0.0, np.floor(dim(self.beta_fast)))
            high = min(nr - 1.0, np.ceil(dim(self.beta_slow)))
            keep = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
            ang = (ang / self.factor) * (1.0 - keep)[None, :] + ang * keep[None, :]
            mag = self.attn_factor * (1.0 + 0.1 * np.log(self.factor))  # attn_factor as set above
        elif self.scaling != "none":
            raise ValueError("rope scaling " + self.scaling)
        if self.rope_mag is not None:
            mag = self.rope_mag
        c, s = mag * np.cos(ang)[:, None, :], mag * np.sin(ang)[:, None, :]
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

    def _quantized(self, name):
        return self.qa and Q.TYPE_NAMES[self.r.type_of(name)] not in ("F32", "F16", "BF16")

    def attention_mla(self, il, h, pos):
        """deepseek2's multi-head latent attention (see the module docstring)"""
        p = "blk.%d." % il
        T, H, nope, rot, dv, r = h.shape[0], self.n_head, self.nope, self.n_rot, self.v_head, self.kv_lora
        if self.has(p + "attn_q_a.weight"):
            q = self.matmul(p + "attn_q_b.weight",
                            rms_norm(self.matmul(p + "attn_q_a.weight", h), self.w(p + "attn_q_a_norm.weight"), self.eps))
        else:
            q = self.matmul(p + "attn_q.weight", h)
        q = q.reshape(T, H, nope + rot)
        kva = self.matmul(p + "attn_kv_a_mqa.weight", h)
        c = rms_norm(kva[:, :r], self.w(p + "attn_kv_a_norm.weight"), self.eps)          # [T, r]
        kr = self.rope(kva[:, None, r:], pos)                                              # [T, 1, rot]
        qr = self.rope(q[..., nope:], pos)                                                 # [T, H, rot]
        fused = not self.has(p + "attn_k_b.weight")
        kb_name = p + ("attn_kv_b.weight" if fused else "attn_k_b.weight")
        if fused:   # numpy [H * (nope + dv), r] -> per head nope key rows, then dv value rows
            kvb = self.w(p + "attn_kv_b.weight").reshape(H, nope + dv, r)
            kb, vb = kvb[:, :nope, :].transpose(0, 2, 1), kvb[:, nope:, :]                # [H, r, nope], [H, dv, r]
        else:       # attn_k_b ne {nope, r, H} -> [H, r, nope]; attn_v_b ne {r, dv, H} -> [H, dv, r]
            kb = np.stack([self.w(p + "attn_k_b.weight", i) for i in range(H)])
            vb = np.stack([self.w(p + "attn_v_b.weight", i) for i in range(H)])
        mask = pos[None, :] > pos[:, None]
        if self._quantized(kb_name):
            # Absorbed: each head's query into latent space (the fused file's K_b is used as
            # dequantized floats, unquantized activations; attn_k_b's quantizes them), then out of it.
            q_abs = np.stack([q[:, i, :nope] @ kb[i].T if fused else self.matmul(p + "attn_k_b.weight", q[:, i, :nope], i)
                              for i in range(H)], axis=1)                                  # [T, H, r]
            scores = np.einsum("thr,sr->hts", q_abs, c) + np.einsum("thd,sd->hts", qr, kr[:, 0, :])
        else:
            k_nope = np.einsum("tr,hrn->thn", c, kb)                                       # [T, H, nope]
            k = np.concatenate([k_nope, np.broadcast_to(kr, (T, H, rot))], axis=-1)
            scores = np.einsum("thd,shd->hts", np.concatenate([q[..., :nope], qr], axis=-1), k)
        scores = np.where(mask[None], -np.inf, scores * self.attention_scale)
        scores -= scores.max(axis=-1, keepdims=True)
        pr = np.exp(scores)
        pr /= pr.sum(axis=-1, keepdims=True)
        if self._quantized(kb_name):
            o_lat = np.einsum("hts,sr->thr", pr, c)                                        # [T, H, r]
            if fused:
                per = nope + dv
                o = np.concatenate([self.matmul(p + "attn_kv_b.weight", o_lat[:, i])[:, i * per + nope:(i + 1) * per]
                                    for i in range(H)], axis=-1)
            else:
                o = np.concatenate([self.matmul(p + "attn_v_b.weight", o_lat[:, i], i) for i in range(H)], axis=-1)
        else:
            v = np.einsum("tr,hvr->thv", c, vb)                                            # [T, H, dv]
            o = np.einsum("hts,shv->thv", pr, v).reshape(T, H * dv)
        return self.matmul(p + "attn_output.weight", o)

    def attention(self, il, h, pos):
        if self.arch == "deepseek2":
            return self.attention_mla(il, h, pos)
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
        W = self.window[il]
        base = self.rope_base_swa if W else self.rope_base
        q = self.rope(q, pos, base)
        k = self.rope(k, pos, base)
        g = H // HKV
        kk = np.repeat(k, g, axis=1)               # q head h uses kv head h // g
        vv = np.repeat(v, g, axis=1)
        scores = np.einsum("thd,shd->hts", q, kk) * (self.attention_scale or 1.0 / np.sqrt(HD))
        mask = pos[None, :] > pos[:, None]          # key position after query position
        if W:
            mask |= pos[None, :] <= pos[:, None] - W  # key W or more positions before the query
        scores = np.where(mask[None], -np.inf, scores)
        sinks = p + "attn_sinks.weight"
        if self.has(sinks):                         # one more column per head, dropped after the softmax
            sink = np.broadcast_to(self.w(sinks)[:, None, None], (H, T, 1))
            scores = np.concatenate([scores, sink], axis=-1)
        scores -= scores.max(axis=-1, keepdims=True)
        pr = np.exp(scores)
        pr /= pr.sum(axis=-1, keepdims=True)
        pr = pr[..., :T]
        o = np.einsum("hts,shd->thd", pr, vv).reshape(T, H * HD)
        out = self.matmul(p + "attn_output.weight", o)
        if self.has(p + "attn_output.bias"):
            out += self.w(p + "attn_output.bias")
        return out

    def route(self, il, x, router=None, gating=None, alpha=None, stats=None):
        """x [T, n_embd] -> weights [T, n_expert] for layer il's experts, at most top-k non-zero
        (exactly top-k unless gating drops some). router: the router tensor (default layer il's
        ffn_gate_inp; the previous layer's ffn_pregate_inp for pre-gated routing). gating: see
        check_gating; alpha: perturb the lowest slot (step 4). stats: filled as forward()'s."""
        bias = None
        if router is None:
            router = "blk.%d.ffn_gate_inp.weight" % il
            if self.has("blk.%d.ffn_gate_inp.bias" % il):
                bias = self.w("blk.%d.ffn_gate_inp.bias" % il)
        logits = x @ self.w(router).T
        if bias is not None:
            logits = logits + bias
        if self.arch == "deepseek2":                # scores, biased (grouped) selection, unbiased weights
            if self.sigmoid:
                p = 1.0 / (1.0 + np.exp(-logits))
            else:
                p = np.exp(logits - logits.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
            choose = p.copy()
            pb = "blk.%d.exp_probs_b.bias" % il
            if router == "blk.%d.ffn_gate_inp.weight" % il and self.has(pb):
                choose = choose + self.w(pb)
            if self.groups > 1:
                T_, G = choose.shape[0], self.groups
                grp = choose.reshape(T_, G, -1)
                gscore = np.sort(grp, axis=-1)[..., -2:].sum(axis=-1)                     # [T, G]
                best = np.argsort(-gscore, axis=-1, kind="stable")[:, : self.groups_used]
                keep = np.zeros((T_, G), bool)
                np.put_along_axis(keep, best, True, axis=-1)
                choose = np.where(np.repeat(keep, grp.shape[-1], axis=-1), choose, -np.inf)
            top = np.argsort(-choose, axis=-1, kind="stable")[:, : self.n_expert_used]
            wts = np.zeros_like(p)
            sel = np.take_along_axis(p, top, axis=-1)
            if self.renorm:
                sel = sel / np.maximum(sel.sum(axis=-1, keepdims=True), 2.0 ** -14)
        elif self.arch == "gpt-oss":                  # top-k logits, then a softmax over those k
            top = np.argsort(-logits, axis=-1, kind="stable")[:, : self.n_expert_used]
            sel = np.take_along_axis(logits, top, axis=-1)
            sel = np.exp(sel - sel.max(axis=-1, keepdims=True))
            sel /= sel.sum(axis=-1, keepdims=True)
            wts = np.zeros_like(logits)
        else:
            logits -= logits.max(axis=-1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=-1, keepdims=True)
            top = np.argsort(-p, axis=-1, kind="stable")[:, : self.n_expert_used]
            wts = np.zeros_like(p)
            sel = np.take_along_axis(p, top, axis=-1)
            if self.renorm:
                sel = sel / sel.sum(axis=-1, keepdims=True)
        if stats is not None:
            stats.setdefault("topk", {})[il] = sel
        sel, kept = apply_gating(sel, gating, il)
        if alpha is not None:
            sel, dropped = perturb_lowest(sel, alpha)
            if stats is not None:
                stats["dropped"] = dropped
        if stats is not None:
            stats.setdefault("kept", {})[il] = kept
        sel = sel * self.weights_scale
        # dropped slots hold 0 here; put_along_axis writes them as 0, so moe() skips them
        np.put_along_axis(wts, top, sel, axis=-1)
        return wts

    def moe(self, il, x, record=None, wts=None):
        """layer il's MoE on its input x; wts: routing weights [T, n_expert] (default: route(il, x))"""
        p = "blk.%d." % il
        if wts is None:
            wts = self.route(il, x)
        if record is not None:
            record.append(wts.copy())
        out = np.zeros_like(x)
        for e in range(self.n_expert):
            rows = np.nonzero(wts[:, e])[0]
            if rows.size == 0:
                continue
            xe = x[rows]
            g, u = self.expert_gate_up(il, e, xe)
            if self.arch == "gpt-oss":
                g = np.minimum(g + self.w(p + "ffn_gate_exps.bias")[e], 7.0)
                u = np.clip(u + self.w(p + "ffn_up_exps.bias")[e], -7.0, 7.0)
                d = self.matmul(*self._mm("down", il, e, g * sigmoid(1.702 * g) * (u + 1.0)))
                d += self.w(p + "ffn_down_exps.bias")[e]
            else:
                d = self.matmul(*self._mm("down", il, e, silu(g) * u))
            out[rows] += wts[rows, e][:, None] * d
        if self.has(p + "ffn_gate_shexp.weight"):
            g = self.matmul(p + "ffn_gate_shexp.weight", x)
            u = self.matmul(p + "ffn_up_shexp.weight", x)
            d = self.matmul(p + "ffn_down_shexp.weight", silu(g) * u)
            if self.has(p + "ffn_gate_inp_shexp.weight"):   # qwen2moe's gate; granitemoe has none
                d = sigmoid(x @ self.w(p + "ffn_gate_inp_shexp.weight"))[:, None] * d
            out += d
        return out

    def _mm(self, kind, il, e, x):
        name, idx = self.expert(kind, il, e)
        return name, x, idx

    def expert_gate_up(self, il, e, x):
        """(gate, up) projections of expert e: from ffn_gate_exps/ffn_up_exps, or from the merged
        ffn_gate_up_exps whose slice holds the gate rows, then the up rows"""
        merged = "blk.%d.ffn_gate_up_exps.weight" % il
        if self.has(merged):
            y = self.matmul(merged, x, e)
            half = y.shape[1] // 2
            return y[:, :half], y[:, half:]
        return self.matmul(*self._mm("gate", il, e, x)), self.matmul(*self._mm("up", il, e, x))

    def pregate_name(self, il):
        """the tensor that routes layer il+1 from layer il's MoE input, or None"""
        name = "blk.%d.ffn_pregate_inp.weight" % il
        return name if il + 1 < self.n_layer and self.has(name) else None

    def routed_in(self, il):
        """the layer whose computation routes layer il: il - 1 when a pre-gate there does, else il
        (a forward resumed there still sees a perturbation of layer il's routing)"""
        return il - 1 if il > 0 and self.pregate_name(il - 1) else il

    def forward(self, tokens, record=None, gating=None, perturb=None, stats=None, checkpoints=None, resume=None):
        """logits [T, n_vocab] (float64). record: list receiving each layer's routing weights;
        gating: None | ("score", T) | ("sensitivity", T, [S per layer]); perturb: None |
        (layer, alpha); stats: dict receiving "kept" (int [n_layer, T]), "topk" (float
        [n_layer, T, k]) and, with perturb, "dropped" (d_t, float [T]). See the module docstring
        for the semantics.
        checkpoints: dict receiving, for each layer il, the state before it (the residual stream,
        the routing a pre-gate computed for it, the stats so far); resume=(checkpoints, il) starts
        a forward of the same tokens at layer il from that state instead of computing layers
        0..il-1 again: the same float64 operations on the same values, so the same bits, provided
        nothing before layer il would differ (the caller's promise: e.g. a perturbation of layer
        il's routing, resumed at routed_in(il); other tokens raise ValueError).
        A resumed forward's record receives only the layers it computes."""
        gating = check_gating(gating, self.n_layer)
        if perturb is not None:
            if gating is not None:
                raise ValueError("perturb is defined for exact gating only")
            if not 0 <= perturb[0] < self.n_layer:
                raise ValueError("perturb layer %d out of range" % perturb[0])
        st = {}
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(tokens.size)
        pregated = None             # layer il's routing when layer il-1 computed it
        first = 0
        if resume is not None:
            saved, first = resume
            saved_tokens, h, pregated, saved_st = saved[first]
            if not np.array_equal(saved_tokens, tokens):
                raise ValueError("resume: the checkpoints are of other tokens")
            st = copy_stats(saved_st)
        else:
            h = self.w("token_embd.weight")[tokens] * self.embedding_scale
        for il in range(first, self.n_layer):
            if checkpoints is not None:
                checkpoints[il] = (tokens, h, pregated, copy_stats(st))
            p = "blk.%d." % il
            h = h + self.residual_scale * self.attention(il, self.norm(h, p + "attn_norm"), pos)
            xn = self.norm(h, p + ("post_attention_norm" if self.arch == "gpt-oss" else "ffn_norm"))
            if il < self.dense_lead:                 # deepseek2's leading dense blocks
                g, u = self.matmul(p + "ffn_gate.weight", xn), self.matmul(p + "ffn_up.weight", xn)
                h = h + self.matmul(p + "ffn_down.weight", silu(g) * u)
                st.setdefault("kept", {})[il] = np.full(tokens.size, self.n_expert_used, np.int64)  # nothing to drop
                st.setdefault("topk", {})[il] = np.full((tokens.size, self.n_expert_used), np.nan)
                continue
            wts = pregated if pregated is not None else self._route(il, xn, None, gating, perturb, st)
            pre = self.pregate_name(il)
            pregated = self._route(il + 1, xn, pre, gating, perturb, st) if pre else None
            h = h + self.residual_scale * self.moe(il, xn, record, wts)
        if stats is not None:
            stats["kept"] = np.stack([st["kept"][il] for il in range(self.n_layer)])
            stats["topk"] = np.stack([st["topk"][il] for il in range(self.n_layer)])
            if "dropped" in st:
                stats["dropped"] = st["dropped"]
        h = self.norm(h, "output_norm")
        out = "output.weight" if self.has("output.weight") else "token_embd.weight"
        logits = self.matmul(out, h)
        if out == "output.weight" and self.has("output.bias"):
            logits += self.w("output.bias")
        return logits / self.logit_scale

    def norm(self, x, name):
        """RMSNorm with NAME.weight, plus NAME.bias when the file has one"""
        y = rms_norm(x, self.w(name + ".weight"), self.eps)
        return y + self.w(name + ".bias") if self.has(name + ".bias") else y

    def _route(self, il, x, router, gating, perturb, stats):
        alpha = perturb[1] if perturb is not None and perturb[0] == il else None
        return self.route(il, x, router, gating, alpha, stats)


def copy_stats(st):
    """a forward's per-layer stats so far, with its per-layer dicts copied (a checkpoint's must not
    grow with the forward that goes on)"""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in st.items()}


def read_profile_sensitivity(path):
    """per-layer S_l from a moelite calibration profile (JSON, "format": "moelite-profile")"""
    with open(path) as f:
        prof = json.load(f)
    if prof.get("format") != "moelite-profile":
        raise ValueError("%s is not a moelite profile" % path)
    layers = sorted(prof["layers"], key=lambda r: r["layer"])
    return [float(r["sensitivity"]) for r in layers]


def gating_from_args(a, n_layer):
    if a.gating == "exact":
        return None
    if a.threshold is None:
        raise SystemExit("--gating %s needs --threshold" % a.gating)
    if a.gating == "score":
        return ("score", a.threshold)
    if a.profile:
        sens = read_profile_sensitivity(a.profile)
    elif a.sensitivity:
        sens = [float(v) for v in a.sensitivity.split(",") if v.strip()]
    else:
        raise SystemExit("--gating sensitivity needs --sensitivity S0,S1,... or --profile")
    return check_gating(("sensitivity", a.threshold, sens), n_layer)


def logits_of(path, tokens, quantize_activations=False, n_ctx=None):
    """exact-gating logits of `tokens` (float64, n_tokens x n_vocab): what the command line writes,
    for tests that call the reference in their own process"""
    return ReferenceModel(path, quantize_activations, n_ctx).forward(list(tokens))


def main(argv=None):
    ap = argparse.ArgumentParser(description="numpy reference forward for MoE GGUF models")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma separated token ids")
    ap.add_argument("--out", required=True, help="float32 LE logits, n_tokens x n_vocab row-major")
    ap.add_argument("--quantize-activations", action="store_true")
    ap.add_argument("--gating", choices=GATING_MODES, default="exact", help="adaptive gating rule")
    ap.add_argument("--threshold", type=float, default=None, help="T of score/sensitivity gating")
    ap.add_argument("--sensitivity", default=None, help="S_0,S_1,... per layer (sensitivity gating)")
    ap.add_argument("--profile", default=None, help="read S_l from a moelite-profile JSON instead")
    ap.add_argument("--perturb", default=None, help="LAYER,ALPHA: scale the lowest top-k weight")
    ap.add_argument("--n-ctx", type=int, default=None,
                    help="the context length the engine runs with (picks phimoe's LongRoPE factors)")
    a = ap.parse_args(argv)
    toks = [int(t) for t in a.tokens.split(",") if t.strip()]
    m = ReferenceModel(a.model, a.quantize_activations, a.n_ctx)
    perturb = None
    if a.perturb:
        layer, alpha = a.perturb.split(",")
        perturb = (int(layer), float(alpha))
    stats = {}
    logits = m.forward(toks, gating=gating_from_args(a, m.n_layer), perturb=perturb, stats=stats)
    logits.astype("<f4").tofile(a.out)
    print("wrote %s: %d x %d logits" % (a.out, logits.shape[0], logits.shape[1]))
    if a.gating != "exact":
        print("mean experts kept per layer: " + " ".join("%.3f" % v for v in stats["kept"].mean(axis=1)))


if __name__ == "__main__":
    main()
