#!/usr/bin/python3
"""Write a random-weight MoE model as a GGUF file, laid out like llama.cpp's files.

Examples:
  /usr/bin/python3 tools/make_tiny_model.py --arch qwen3moe --type Q4_K --seed 1 --out /tmp/q3.gguf
  /usr/bin/python3 tools/make_tiny_model.py --arch llama --type Q8_0 --per-expert-tensors --out /tmp/mx.gguf
  /usr/bin/python3 tools/make_tiny_model.py --bench --type Q4_K --out /tmp/bench-q4k.gguf

Weights are deterministic in (seed, tensor name, chunk): each tensor (and each expert slice
of a 3-D expert tensor, and each row chunk of a large 2-D tensor) gets its own generator,
so --per-expert-tensors and the stacked layout hold identical expert weights.  Tensors are
generated, quantized and written one chunk at a time (streaming), so memory stays small.

Tensor types follow llama.cpp: 2-D/3-D matmul weights (attn q/k/v/output, experts, shared
experts, token_embd, output) get --type; norms, biases and the routers (ffn_gate_inp,
ffn_gate_inp_shexp) are F32.

gpt-oss files carry what llama.cpp's openai-moe model reads: q/k/v/output biases, attn_sinks,
post_attention_norm (in place of ffn_norm), a router bias, per-expert gate/up/down biases (F32,
gate/up biases wide enough that the clamped SwiGLU's limit of 7 is reached), attention.sliding_window
(--window) with the default pattern of 2 unless --window-pattern, and --yarn FACTOR's rope scaling.
--expert-type gives the routed experts a type of their own (real gpt-oss files: MXFP4 experts,
Q8_0 elsewhere).

granitemoe files carry logit_scale, residual_scale, embedding_scale and attention.scale (values
like Granite 3.0's, scaled to the tiny shapes) and, with --granite-shared, a shared expert without
a gate (ffn_*_shexp, expert_shared_feed_forward_length).

phimoe files carry biases on every norm, q/k/v/output and the output head, LongRoPE factors
(rope_factors_long in [1, 8], rope_factors_short in [1, 1.5]) with rope.scaling.attn_factor and
rope.scaling.original_context_length = --yarn-orig-ctx, as llama.cpp's converter writes them.

deepseek2 files carry multi-head latent attention as llama.cpp's converter writes it for MLA:
attn_q (or attn_q_a, attn_q_a_norm, attn_q_b with --q-lora), attn_kv_a_mqa, attn_kv_a_norm, and
attn_k_b/attn_v_b (per-head 3-D stacks; --fused-kv-b: the older attn_kv_b instead), key/value_length
for the latent cache and key/value_length_mla per head, head_count_kv 1 (the fused layout: the per-head
lengths and head_count_kv = n_head); --dense-lead leading dense blocks (ffn_gate/up/down,
feed_forward_length --n-ff-dense); --n-shared shared experts; routing keys expert_gating_func
(--gating), exp_probs_b.bias (--probs-bias), expert_group_count/used (--expert-groups/--groups-used),
expert_weights_norm/scale; --yarn-log-mul writes rope.scaling.yarn_log_multiplier (0.1 x
mscale_all_dim, as the converter does). Tensors whose rows do not fit the type's block fall back to
Q8_0 (or F16), as llama.cpp's quantizer does.

--pregate adds, for every layer N but the last, blk.N.ffn_pregate_inp.weight: a second router
(same shape, type and init scale as ffn_gate_inp) that Pre-gated MoE / Read-ME style engines apply
at layer N to choose layer N+1's experts one layer ahead (see tests/reference/reference_forward.py).
Each tensor's random stream is keyed by its own name, so the other tensors are unchanged and a file
written without --pregate is byte-identical to one from before the option existed.
"""

import argparse
import hashlib
import os
import shutil
import sys
import time
import zlib

MODEL_CACHE_ENV = "MOELITE_MODEL_CACHE"


def model_cache_path(argv):
    """Where the model these arguments describe is kept in $MOELITE_MODEL_CACHE, or None.

    The test suites generate a few hundred small models, and each CI stage (plain, sanitized, ARM)
    used to generate them all again: 0.3 s each, minutes in all. The file is a pure function of the
    arguments (other than --out and --quiet) and of this generator's source, so the key hashes
    exactly those (and numpy's installation, whose generators make the weights); an edit to the
    generator or to moelite_gguf changes every key. --bench models (gigabytes) are never kept."""
    cache = os.environ.get(MODEL_CACHE_ENV)
    if not cache or "--bench" in argv:
        return None, None
    args, out, skip = [], None, False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--out" and i + 1 < len(argv):
            out, skip = argv[i + 1], True
        elif arg.startswith("--out="):
            out = arg[len("--out="):]
        elif arg != "--quiet":
            args.append(arg)
    if out is None:
        return None, None
    key = hashlib.sha256("\0".join(args).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.join(here, "gguf", "moelite_gguf")
    for path in [os.path.abspath(__file__)] + sorted(os.path.join(package, f) for f in os.listdir(package)
                                                     if f.endswith(".py")):
        with open(path, "rb") as f:
            key.update(f.read())
    # numpy's version without importing numpy (a hit costs a tenth of a generation that way).
    import importlib.util
    spec = importlib.util.find_spec("numpy")
    if spec and spec.origin:
        version_file = os.path.join(os.path.dirname(spec.origin), "version.py")
        stamp = version_file if os.path.exists(version_file) else spec.origin
        key.update(("%s %d" % (stamp, os.stat(stamp).st_mtime_ns)).encode())
    return os.path.join(cache, key.hexdigest()[:32] + ".gguf"), out


def copy_atomically(src, dst):
    """Copies src to dst through a temporary name, so that a concurrent reader (two tests asking
    for one model at once) sees the whole file or none."""
    tmp = "%s.tmp-%d" % (dst, os.getpid())
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


if __name__ == "__main__":  # a cached model is copied before numpy is even imported
    _cached, _out = model_cache_path(sys.argv[1:])
    if _cached and os.path.exists(_cached):
        copy_atomically(_cached, _out)
        sys.exit(0)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf"))
from moelite_gguf import GGUFWriter, GGUFValueType, quants as Q  # noqa: E402
from moelite_gguf.byte_chars import byte_chars  # noqa: E402

ARCHS = ("llama", "qwen2moe", "qwen3moe", "olmoe", "gpt-oss", "granitemoe", "phimoe", "deepseek2")

# llama_ftype values for general.file_type
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
             "Q2_K": 10, "Q3_K": 11, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "BF16": 32,
             "MXFP4": 38}  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE

CHUNK_ELEMS = 1 << 21


def _rng(seed, name, chunk):
    return np.random.default_rng([seed, zlib.crc32(name.encode()), chunk])


class Spec:
    """One tensor: name, ne (GGUF order), ggml type, init kind."""

    def __init__(self, name, ne, ttype, init, std=1.0, seed_name=None, expert=None):
        self.name, self.ne, self.ttype, self.init, self.std = name, list(ne), ttype, init, std
        self.seed_name = seed_name or name   # per-expert tensors share the stacked name's stream
        self.expert = expert

    def _values(self, seed, chunk, shape):
        g = _rng(seed, self.seed_name, chunk)
        v = g.standard_normal(shape, dtype=np.float32)
        if self.init == "norm":
            return np.float32(1.0) + np.float32(0.1) * v
        if self.init == "factor":  # LongRoPE divisors rising from 1 to std over the pairs
            return np.linspace(1.0, self.std, shape[-1], dtype=np.float32).reshape(shape)
        return v * np.float32(self.std)

    def chunks(self, seed):
        """yield raw quantized bytes, outermost-dim slices / row chunks in file order"""
        ne = self.ne
        if self.expert is not None:                       # one expert of a stacked tensor
            yield Q.quantize(self._values(seed, self.expert, (ne[1], ne[0])), self.ttype)
            return
        if len(ne) == 3:                                   # stacked experts: chunk = expert
            for e in range(ne[2]):
                yield Q.quantize(self._values(seed, e, (ne[1], ne[0])), self.ttype)
            return
        rows = int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
        per = max(1, CHUNK_ELEMS // ne[0])
        for c, r0 in enumerate(range(0, rows, per)):
            r = min(per, rows - r0)
            yield Q.quantize(self._values(seed, c, (r, ne[0])), self.ttype)


def fit_type(t, ne0):
    """t, or the type llama.cpp's quantizer would fall back to for rows of ne0 values"""
    if t in ("F32", "F16", "BF16") or ne0 % Q.block_size(t) == 0:
        return t
    return "Q8_0" if ne0 % 32 == 0 else "F16"


def deepseek2_layer(a, il, s):
    """one deepseek2 block's tensors (see the module docstring)"""
    qt, F = a.type, "F32"
    E, H, NE, FF = a.n_embd, a.n_head, a.n_expert, a.n_ff_exp
    nope, rot, dv, r = a.qk_nope, a.qk_rope, a.v_head, a.kv_lora
    inv = lambda n: 1.0 / np.sqrt(n)  # noqa: E731
    p = "blk.%d." % il
    s.append(Spec(p + "attn_norm.weight", [E], F, "norm"))
    if a.q_lora:
        s.append(Spec(p + "attn_q_a.weight", [E, a.q_lora], fit_type(qt, E), "mat", inv(E)))
        s.append(Spec(p + "attn_q_a_norm.weight", [a.q_lora], F, "norm"))
        s.append(Spec(p + "attn_q_b.weight", [a.q_lora, H * (nope + rot)], fit_type(qt, a.q_lora), "mat", inv(a.q_lora)))
    else:
        s.append(Spec(p + "attn_q.weight", [E, H * (nope + rot)], qt, "mat", inv(E)))
    s.append(Spec(p + "attn_kv_a_mqa.weight", [E, r + rot], qt, "mat", inv(E)))
    s.append(Spec(p + "attn_kv_a_norm.weight", [r], F, "norm"))
    if a.fused_kv_b:
        s.append(Spec(p + "attn_kv_b.weight", [r, H * (nope + dv)], fit_type(qt, r), "mat", inv(r)))
    else:
        s.append(Spec(p + "attn_k_b.weight", [nope, r, H], fit_type(qt, nope), "mat", inv(nope)))
        s.append(Spec(p + "attn_v_b.weight", [r, dv, H], fit_type(qt, r), "mat", inv(r)))
    s.append(Spec(p + "attn_output.weight", [H * dv, E], fit_type(qt, H * dv), "mat", inv(H * dv)))
    s.append(Spec(p + "ffn_norm.weight", [E], F, "norm"))
    if il < a.dense_lead:
        s.append(Spec(p + "ffn_gate.weight", [E, a.n_ff_dense], qt, "mat", inv(E)))
        s.append(Spec(p + "ffn_up.weight", [E, a.n_ff_dense], qt, "mat", inv(E)))
        s.append(Spec(p + "ffn_down.weight", [a.n_ff_dense, E], fit_type(qt, a.n_ff_dense), "mat", inv(a.n_ff_dense)))
        return
    s.append(Spec(p + "ffn_gate_inp.weight", [E, NE], F, "mat", a.router_scale * inv(E)))
    if a.probs_bias:
        s.append(Spec(p + "exp_probs_b.bias", [NE], F, "mat", 0.3))
    et = a.expert_type or qt
    for kind, ne, std in (("gate", [E, FF], inv(E)), ("up", [E, FF], inv(E)), ("down", [FF, E], inv(FF))):
        s.append(Spec(p + "ffn_%s_exps.weight" % kind, ne + [NE], et, "mat", std))
    if a.n_shared:
        FS = a.n_shared * FF
        s.append(Spec(p + "ffn_gate_shexp.weight", [E, FS], qt, "mat", inv(E)))
        s.append(Spec(p + "ffn_up_shexp.weight", [E, FS], qt, "mat", inv(E)))
        s.append(Spec(p + "ffn_down_shexp.weight", [FS, E], fit_type(qt, FS), "mat", inv(FS)))


def build_specs(a):
    arch, qt, F = a.arch, a.type, "F32"
    E, H, HKV, HD = a.n_embd, a.n_head, a.n_head_kv, a.head_dim
    NE, FF, FS = a.n_expert, a.n_ff_exp, a.n_ff_shexp
    s = []
    inv = lambda n: 1.0 / np.sqrt(n)  # noqa: E731
    s.append(Spec("token_embd.weight", [E, a.vocab], qt, "mat", 1.0))
    if arch == "phimoe":
        s.append(Spec("rope_factors_long.weight", [HD // 2], F, "factor", 8.0))
        s.append(Spec("rope_factors_short.weight", [HD // 2], F, "factor", 1.5))
    for il in range(a.n_layer):
        p = "blk.%d." % il
        if arch == "deepseek2":
            deepseek2_layer(a, il, s)
            continue
        s.append(Spec(p + "attn_norm.weight", [E], F, "norm"))
        s.append(Spec(p + "attn_q.weight", [E, H * HD], qt, "mat", inv(E)))
        s.append(Spec(p + "attn_k.weight", [E, HKV * HD], qt, "mat", inv(E)))
        s.append(Spec(p + "attn_v.weight", [E, HKV * HD], qt, "mat", inv(E)))
        if arch == "qwen2moe":
            s.append(Spec(p + "attn_q.bias", [H * HD], F, "mat", 0.1))
            s.append(Spec(p + "attn_k.bias", [HKV * HD], F, "mat", 0.1))
            s.append(Spec(p + "attn_v.bias", [HKV * HD], F, "mat", 0.1))
        if arch == "qwen3moe":
            s.append(Spec(p + "attn_q_norm.weight", [HD], F, "norm"))
            s.append(Spec(p + "attn_k_norm.weight", [HD], F, "norm"))
        if arch == "olmoe":
            s.append(Spec(p + "attn_q_norm.weight", [H * HD], F, "norm"))
            s.append(Spec(p + "attn_k_norm.weight", [HKV * HD], F, "norm"))
        s.append(Spec(p + "attn_output.weight", [H * HD, E], qt, "mat", inv(H * HD)))
        if arch == "phimoe":
            s.append(Spec(p + "attn_norm.bias", [E], F, "mat", 0.1))
            for nm, n in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD), ("output", E)):
                s.append(Spec(p + "attn_%s.bias" % nm, [n], F, "mat", 0.1))
            s.append(Spec(p + "ffn_norm.bias", [E], F, "mat", 0.1))
        if arch == "gpt-oss":
            for nm, n in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD), ("output", E)):
                s.append(Spec(p + "attn_%s.bias" % nm, [n], F, "mat", 0.1))
            s.append(Spec(p + "attn_sinks.weight", [H], F, "mat", 1.0))
            s.append(Spec(p + "post_attention_norm.weight", [E], F, "norm"))
        else:
            s.append(Spec(p + "ffn_norm.weight", [E], F, "norm"))
        s.append(Spec(p + "ffn_gate_inp.weight", [E, NE], F, "mat", a.router_scale * inv(E)))
        if arch == "gpt-oss":
            s.append(Spec(p + "ffn_gate_inp.bias", [NE], F, "mat", 0.5))
        if a.pregate and il + 1 < a.n_layer:
            # routes layer il+1 from layer il's MoE input; its own name gives it its own stream
            s.append(Spec(p + "ffn_pregate_inp.weight", [E, NE], F, "mat", a.router_scale * inv(E)))
        mats = [("gate", [E, FF], inv(E)), ("up", [E, FF], inv(E)), ("down", [FF, E], inv(FF))]
        et = a.expert_type or qt
        if a.per_expert_tensors:
            for kind, ne, std in mats:
                for e in range(NE):
                    s.append(Spec(p + "ffn_%s.%d.weight" % (kind, e), ne, et, "mat", std,
                                  seed_name=p + "ffn_%s_exps.weight" % kind, expert=e))
        else:
            for kind, ne, std in mats:
                s.append(Spec(p + "ffn_%s_exps.weight" % kind, ne + [NE], et, "mat", std))
        if arch == "gpt-oss":
            s.append(Spec(p + "ffn_gate_exps.bias", [FF, NE], F, "mat", 3.0))
            s.append(Spec(p + "ffn_up_exps.bias", [FF, NE], F, "mat", 3.0))
            s.append(Spec(p + "ffn_down_exps.bias", [E, NE], F, "mat", 0.1))
        if arch == "granitemoe" and a.granite_shared:
            s.append(Spec(p + "ffn_gate_shexp.weight", [E, FS], qt, "mat", inv(E)))
            s.append(Spec(p + "ffn_up_shexp.weight", [E, FS], qt, "mat", inv(E)))
            s.append(Spec(p + "ffn_down_shexp.weight", [FS, E], qt, "mat", inv(FS)))
        if arch == "qwen2moe":
            s.append(Spec(p + "ffn_gate_inp_shexp.weight", [E], F, "mat", inv(E)))
            s.append(Spec(p + "ffn_gate_shexp.weight", [E, FS], qt, "mat", inv(E)))
            s.append(Spec(p + "ffn_up_shexp.weight", [E, FS], qt, "mat", inv(E)))
            s.append(Spec(p + "ffn_down_shexp.weight", [FS, E], qt, "mat", inv(FS)))
    s.append(Spec("output_norm.weight", [E], F, "norm"))
    if arch == "phimoe":
        s.append(Spec("output_norm.bias", [E], F, "mat", 0.1))
    if not a.tied:
        s.append(Spec("output.weight", [E, a.vocab], qt, "mat", inv(E)))
        if arch == "phimoe":
            s.append(Spec("output.bias", [a.vocab], F, "mat", 0.5))
    return s


def add_metadata(w, a):
    arch = a.arch
    w.add_string("general.architecture", arch)
    w.add_string("general.name", a.name or "moelite-tiny-%s-%s-seed%d" % (arch, a.type, a.seed))
    w.add_uint32("general.file_type", FILE_TYPE[a.expert_type or a.type])
    if a.type not in ("F32", "F16", "BF16"):
        w.add_uint32("general.quantization_version", 2)
    k = arch + "."
    w.add_uint32(k + "block_count", a.n_layer)
    w.add_uint32(k + "context_length", a.ctx)
    w.add_uint32(k + "embedding_length", a.n_embd)
    w.add_uint32(k + "feed_forward_length", a.n_ff_dense if arch == "deepseek2" else a.n_ff_exp)
    w.add_uint32(k + "expert_feed_forward_length", a.n_ff_exp)
    if arch == "qwen2moe" or (arch == "granitemoe" and a.granite_shared):
        w.add_uint32(k + "expert_shared_feed_forward_length", a.n_ff_shexp)
    if arch == "granitemoe":
        w.add_float32(k + "logit_scale", 6.0)
        w.add_float32(k + "residual_scale", 0.22)
        w.add_float32(k + "embedding_scale", 12.0)
        w.add_float32(k + "attention.scale", 0.09)
    w.add_uint32(k + "attention.head_count", a.n_head)
    if arch == "deepseek2":
        w.add_uint32(k + "attention.head_count_kv", a.n_head if a.fused_kv_b else 1)
        w.add_uint32(k + "attention.q_lora_rank", a.q_lora)
        w.add_uint32(k + "attention.kv_lora_rank", a.kv_lora)
        if a.fused_kv_b:
            w.add_uint32(k + "attention.key_length", a.qk_nope + a.qk_rope)
            w.add_uint32(k + "attention.value_length", a.v_head)
        else:
            w.add_uint32(k + "attention.key_length", a.kv_lora + a.qk_rope)
            w.add_uint32(k + "attention.value_length", a.kv_lora)
            w.add_uint32(k + "attention.key_length_mla", a.qk_nope + a.qk_rope)
            w.add_uint32(k + "attention.value_length_mla", a.v_head)
        w.add_uint32(k + "rope.dimension_count", a.qk_rope)
        w.add_uint32(k + "leading_dense_block_count", a.dense_lead)
        w.add_uint32(k + "expert_shared_count", a.n_shared)
        w.add_float32(k + "expert_weights_scale", a.weights_scale)
        w.add_bool(k + "expert_weights_norm", a.weights_norm)
        w.add_uint32(k + "expert_gating_func", 2 if a.gating == "sigmoid" else 1)
        if a.expert_groups:
            w.add_uint32(k + "expert_group_count", a.expert_groups)
            w.add_uint32(k + "expert_group_used_count", a.groups_used)
    else:
        w.add_uint32(k + "attention.head_count_kv", a.n_head_kv)
    if arch == "deepseek2":
        pass  # key/value lengths above
    elif arch in ("qwen3moe", "gpt-oss") or a.head_dim != a.n_embd // a.n_head:
        w.add_uint32(k + "attention.key_length", a.head_dim)
        w.add_uint32(k + "attention.value_length", a.head_dim)
    w.add_float32(k + "rope.freq_base", a.rope_base)
    if arch in ("llama", "granitemoe"):
        w.add_uint32(k + "rope.dimension_count", a.head_dim)  # deepseek2's is written above
    w.add_float32(k + "attention.layer_norm_rms_epsilon", a.eps)
    w.add_uint32(k + "expert_count", a.n_expert)
    w.add_uint32(k + "expert_used_count", a.n_expert_used)
    if arch == "gpt-oss":
        w.add_uint32(k + "attention.sliding_window", a.window)
        if a.window_pattern is not None:
            w.add_uint32(k + "attention.sliding_window_pattern", a.window_pattern)
    if arch == "phimoe":  # as convert_hf_to_gguf writes Phi-3's LongRoPE: no type, an attention factor
        w.add_uint32(k + "rope.scaling.original_context_length", a.yarn_orig_ctx)
        scale = a.ctx / a.yarn_orig_ctx
        w.add_float32(k + "rope.scaling.attn_factor",
                      float(np.sqrt(1 + np.log(scale) / np.log(a.yarn_orig_ctx))) if scale > 1 else 1.0)
    if a.yarn:
        w.add_string(k + "rope.scaling.type", "yarn")
        w.add_float32(k + "rope.scaling.factor", a.yarn)
        w.add_uint32(k + "rope.scaling.original_context_length", a.yarn_orig_ctx)
        if a.yarn_log_mul:
            w.add_float32(k + "rope.scaling.yarn_log_multiplier", 0.1 * a.yarn_log_mul)


_COMMON = ("th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me "
           "de hi ri ro ic ne ea ra ce li ch ll be ma si om ur").split()


def add_tokenizer(w, vocab):
    """A small but real byte-level BPE vocabulary: 3 control tokens, the 256 byte tokens, then
    merges of common English letter pairs and space+letter, so any text tokenizes and detokenizes
    exactly. Plus a ChatML template whose markers are the control tokens."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bc = byte_chars()
    toks = specials + [bc[b] for b in range(256)]
    types = [3] * len(specials) + [1] * 256
    merges = []
    sp = bc[ord(" ")]
    pairs = [(sp, c) for c in "tawsbcdfhimoplnregyu"] + [(x[0], x[1]) for x in _COMMON]
    for l, r in pairs:
        if len(toks) >= vocab:
            break
        if l + r in toks:
            continue
        merges.append(l + " " + r)
        toks.append(l + r)
        types.append(1)
    while len(toks) < vocab:  # unused filler ids so the vocabulary matches the embedding rows
        toks.append("<unused%d>" % len(toks))
        types.append(5)
    toks, types = toks[:vocab], types[:vocab]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", toks, GGUFValueType.STRING)
    w.add_array("tokenizer.ggml.token_type", np.array(types, np.int32), GGUFValueType.INT32)
    w.add_array("tokenizer.ggml.merges", merges, GGUFValueType.STRING)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template",
                 "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
                 " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=ARCHS, default="olmoe")
    p.add_argument("--type", default="F32", type=str.upper,
                   choices=[Q.TYPE_NAMES[t] for t in Q.QUANT_TYPES])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-head-kv", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None, help="default n_embd/n_head")
    p.add_argument("--n-expert", type=int, default=8)
    p.add_argument("--n-expert-used", type=int, default=2)
    p.add_argument("--n-ff-exp", type=int, default=256)
    p.add_argument("--n-ff-shexp", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--rope-base", type=float, default=10000.0)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--router-scale", type=float, default=2.0,
                   help="router weight std = scale/sqrt(n_embd) (larger: more decisive routing)")
    p.add_argument("--tied", action="store_true", help="omit output.weight (tied to token_embd)")
    p.add_argument("--expert-type", default=None, type=str.upper, choices=[Q.TYPE_NAMES[t] for t in Q.QUANT_TYPES],
                   help="type of the routed experts (default: --type)")
    p.add_argument("--granite-shared", action="store_true", help="granitemoe: add the shared expert (no gate)")
    p.add_argument("--window", type=int, default=8, help="gpt-oss: attention.sliding_window")
    p.add_argument("--window-pattern", type=int, default=None,
                   help="gpt-oss: attention.sliding_window_pattern (absent: llama.cpp's default 2)")
    p.add_argument("--yarn", type=float, default=0.0, help="rope.scaling.type yarn with this factor")
    p.add_argument("--yarn-orig-ctx", type=int, default=64, help="rope.scaling.original_context_length")
    g = p.add_argument_group("deepseek2")
    g.add_argument("--q-lora", type=int, default=0, help="q low-rank path of this rank (0: attn_q)")
    g.add_argument("--kv-lora", type=int, default=256, help="attention.kv_lora_rank")
    g.add_argument("--qk-nope", type=int, default=64, help="per-head key dims without rope")
    g.add_argument("--qk-rope", type=int, default=32, help="per-head rope dims (rope.dimension_count)")
    g.add_argument("--v-head", type=int, default=64, help="per-head value dims")
    g.add_argument("--fused-kv-b", action="store_true", help="the older attn_kv_b instead of attn_k_b/attn_v_b")
    g.add_argument("--dense-lead", type=int, default=1, help="leading_dense_block_count")
    g.add_argument("--n-ff-dense", type=int, default=512, help="the dense blocks' feed_forward_length")
    g.add_argument("--n-shared", type=int, default=1, help="expert_shared_count")
    g.add_argument("--gating", choices=("softmax", "sigmoid"), default="softmax", help="expert_gating_func")
    g.add_argument("--probs-bias", action="store_true", help="exp_probs_b.bias (selection bias)")
    g.add_argument("--expert-groups", type=int, default=0, help="expert_group_count")
    g.add_argument("--groups-used", type=int, default=0, help="expert_group_used_count")
    g.add_argument("--weights-norm", action="store_true", help="expert_weights_norm")
    g.add_argument("--weights-scale", type=float, default=1.0, help="expert_weights_scale")
    g.add_argument("--yarn-log-mul", type=float, default=0.0,
                   help="mscale_all_dim (written x 0.1 as rope.scaling.yarn_log_multiplier)")
    p.add_argument("--per-expert-tensors", action="store_true",
                   help="old Mixtral layout blk.N.ffn_{gate,up,down}.E.weight (llama only)")
    p.add_argument("--pregate", action="store_true",
                   help="also write blk.N.ffn_pregate_inp.weight (N < n_layer-1): a router for layer N+1 "
                        "applied to layer N's MoE input (pre-gated routing)")
    p.add_argument("--bench", action="store_true",
                   help="OLMoE-like preset: olmoe, n_embd 2048, 16/16 heads, 64 experts top-8, "
                        "n_ff_exp 1024, 8 layers, vocab 32000, ctx 4096")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.bench:
        a.arch, a.n_embd, a.n_head, a.n_head_kv = "olmoe", 2048, 16, 16
        a.n_expert, a.n_expert_used, a.n_ff_exp, a.n_layer = 64, 8, 1024, 8
        a.vocab, a.ctx, a.head_dim = 32000, 4096, None
    if a.head_dim is None:
        if a.n_embd % a.n_head:
            p.error("n_embd must be a multiple of n_head (or give --head-dim)")
        a.head_dim = a.n_embd // a.n_head
    if a.n_head % a.n_head_kv:
        p.error("n_head must be a multiple of n_head_kv")
    if a.per_expert_tensors and a.arch != "llama":
        p.error("--per-expert-tensors is only for --arch llama")
    if not 0 < a.n_expert_used <= a.n_expert:
        p.error("need 0 < n_expert_used <= n_expert")
    if a.vocab < 3:
        p.error("vocab >= 3")
    return a


def main(argv=None):
    a = parse_args(argv)
    t0 = time.time()
    specs = build_specs(a)
    for sp in specs:
        if sp.ttype != "F32" and sp.ne[0] % Q.block_size(sp.ttype):
            raise SystemExit("tensor %s: ne0=%d is not a multiple of the %s block size %d; choose other sizes"
                             % (sp.name, sp.ne[0], sp.ttype, Q.block_size(sp.ttype)))
    w = GGUFWriter(a.out)
    add_metadata(w, a)
    add_tokenizer(w, a.vocab)
    for sp in specs:
        w.add_tensor(sp.name, sp.ne, sp.ttype, (lambda sp=sp: sp.chunks(a.seed)))
    w.write()
    cached, _ = model_cache_path(sys.argv[1:] if argv is None else list(argv))
    if cached:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        copy_atomically(a.out, cached)
    if not a.quiet:
        print("wrote %s: %d tensors, %.1f MiB, %.1f s" % (a.out, len(specs), os.path.getsize(a.out) / 2**20,
                                                         time.time() - t0))


if __name__ == "__main__":
    main()
