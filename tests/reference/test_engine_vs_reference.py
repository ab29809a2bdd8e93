"""Engine logits against the independent numpy reference forward, for every architecture and
weight type.

The reference (tests/reference/reference_forward.py) reads the GGUF with its own reader, dequantizes
with its own numpy code and computes the forward pass in float64. With --quantize-activations it
rounds the activations entering each quantized matmul exactly as ggml-style integer dot products
do (Q8_0 / Q8_1 / Q8_K, see the reference), so what remains between the two is float32 vs float64
arithmetic: a tight tolerance.

Why the tolerances are what they are (normalised MSE = sum((a-b)^2) / sum(b^2) over all logits):
  * TIGHT_FLOAT (1e-9) for F32/F16/BF16 weights: activations stay float, so only float32 vs
    float64 rounding separates engine and reference (measured ~1e-14).
  * TIGHT_QUANT (5e-4) for quantized weights: with the activation quantization emulated, most
    prompts agree to ~1e-14 as well; but an activation whose float32 value lies within an ulp of a
    rounding boundary can round to the neighbouring int8 in one of the two, moving one dot product
    by one quantization step. About 127 * 1e-7 of all values are that close, i.e. roughly one flip
    per few thousand quantized values, and a flip reaches all later tokens through the KV cache.
    Measured over this matrix: worst 6.7e-5 (llama Q2_K, a flip at token 6).
  * Detection: one corrupted weight block of one matrix gives 1.8e-3 for Q4_0 (> TIGHT_QUANT) and
    ~1e-3 for F16 (10^6 x TIGHT_FLOAT); a swapped nibble order gives ~0.2 (tests below).
  * LOOSE (2e-2, plain float64 reference without emulation): the engine's activation quantization
    alone must not move the logits further than this; a sanity check of the emulation itself.

Environment: MOELITE_BIN (the moelite CLI), MOELITE_TEST_TMP (scratch directory).
"""
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
from moelite_gguf.reader import GGUFReader  # noqa: E402

sys.path.insert(0, HERE)
import reference_forward  # noqa: E402
from gguf_edit import merge_gate_up, rewrite  # noqa: E402

PY = sys.executable
MAKE = os.path.join(ROOT, "tools", "make_tiny_model.py")
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
TMP = os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests")

ARCHS = ["llama", "qwen2moe", "qwen3moe", "olmoe", "gpt-oss", "granitemoe", "phimoe", "deepseek2"]
# Architectures that add a block but no kernels: a few types each where runs are slow (devices, qemu).
BLOCK_ONLY_ARCHS = ("gpt-oss", "granitemoe", "phimoe", "deepseek2")
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# MXFP4 (gpt-oss's experts) is computed by every backend, but only GGUF files of gpt-oss carry it:
# the CPU runs it on every arch, the device backends on one (DEVICE_MATRIX).
CPU_TYPES = TYPES + ["MXFP4"]
TOKENS = [1, 17, 250, 3, 99, 42, 7, 300, 511, 0]
# Under the sanitizers (MOELITE_TEST_SANITIZED=1, set by the sanitized build's ctest) the matrices
# below shrink, since every case costs several times as much there and CI's time is bounded: each
# kernel of each backend and table still runs under ASan + UBSan in the unit tests (QuantKernels,
# CudaDevices, VulkanShaderPaths: every weight type against the scalar reference), and here each
# architecture's path runs end to end. The plain build runs every matrix whole.
SANITIZED = os.environ.get("MOELITE_TEST_SANITIZED") == "1"
# The CPU's arch x type matrix: whole in the plain build; sanitized, every type on one arch and two
# types on the others.
if SANITIZED:
    CPU_MATRIX = [("qwen3moe", t) for t in CPU_TYPES] + [(a, t) for a in ARCHS if a != "qwen3moe"
                                                         for t in ("Q8_0", "Q4_K")] + [("gpt-oss", "MXFP4")]
else:
    CPU_MATRIX = [(a, t) for a in ARCHS for t in CPU_TYPES]
# The types each forced kernel table (scalar, avx2, avxvnni) runs end to end.
ISA_TYPES = ["Q8_0", "Q4_K", "MXFP4"] if SANITIZED else CPU_TYPES
# The device backends' arch x type matrix (their engines run slowly here: lavapipe, the CUDA
# emulator). Sanitized: one type on every arch, and the float path on one.
if SANITIZED:
    DEVICE_MATRIX = [(a, "Q4_K") for a in ARCHS] + [("qwen3moe", "F16")]
else:
    DEVICE_MATRIX = [(a, t) for a in ARCHS if a not in BLOCK_ONLY_ARCHS for t in TYPES] + [
        (a, t) for a in BLOCK_ONLY_ARCHS for t in ("F32", "F16", "Q8_0", "Q4_K")]
DEVICE_MATRIX += [("qwen3moe", "MXFP4"), ("gpt-oss", "MXFP4")]
FLOAT_TYPES = ("F32", "F16", "BF16")
TIGHT_FLOAT = 1e-9
TIGHT_QUANT = 5e-4
LOOSE = 2e-2


def tight(wtype):
    return TIGHT_FLOAT if wtype in FLOAT_TYPES else TIGHT_QUANT


def nmse(a, b):
    return float(np.sum((a.astype(np.float64) - b) ** 2) / np.sum(b.astype(np.float64) ** 2))


def assert_close_but_for_a_routing_flip(eng, ref, bound, what):
    """Quantized types over many tokens: the engine sums in float32 in its kernels' order, the
    reference in float64, so an activation at a rounding boundary can quantize one code apart and,
    rarely, a near-tied router then picks another expert for one token (deepseek2-lite Q4_K on a
    Zen 5: one token at 1.8e-2, every other within 5e-4; the same file on a Zen 3 is within 3e-4
    everywhere). Passes when the whole run is within `bound`, or when every token but at most one
    in twenty is and none is beyond LOOSE."""
    err = nmse(eng, ref)
    if err < bound:
        return
    per_token = [nmse(eng[i:i + 1], ref[i:i + 1]) for i in range(len(eng))]
    outliers = [i for i, e in enumerate(per_token) if e >= bound]
    assert len(outliers) <= len(eng) // 20 and max(per_token) < LOOSE, \
        "%s: nmse %.3e; tokens beyond %g: %s" % (what, err, bound, {i: "%.2e" % per_token[i] for i in outliers})


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (cmd[0], r.returncode, r.stdout, r.stderr)
    return r


def make_model(name, arch, wtype, *extra):
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, name + ".gguf")
    if not os.path.exists(path):
        # Written aside and renamed: tests running in parallel (pytest -n) may ask for one model at
        # once, and none may read a half-written file.
        part = "%s.%d.part" % (path, os.getpid())
        run([PY, MAKE, "--arch", arch, "--type", wtype, "--seed", "7", "--out", part, "--quiet", *extra])
        os.replace(part, path)
    return path


def engine_logits(model, tokens=TOKENS, extra=(), threads=2, isa=None, env_extra=None):
    # Named per process: the Vulkan, CUDA and ARM reference tests call this on the same models while
    # ctest runs them beside this file's, and a file another process truncates mid-read is garbage.
    out = "%s.engine.%d.f32" % (model, os.getpid())
    env = dict(os.environ, **(env_extra or {}))
    if isa:
        env["MOELITE_ISA"] = isa
    cmd = [BIN, "logits", "-m", model, "-t", str(threads), "--tokens", ",".join(map(str, tokens)), "--out", out,
           *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, "%s failed (%d):\n%s" % (cmd, r.returncode, r.stderr)
    logits = np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)
    os.remove(out)
    return logits


_REFERENCE_CACHE = {}


def _hash_files(h, paths):
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)


def _reference_file(model, tokens, quantize, n_ctx):
    """Where a reference result is kept between processes, or None: under $MOELITE_MODEL_CACHE
    (tools/test.sh sets it for all of CI's stages), so the device tests (Vulkan, CUDA, ARM) and the
    sanitized stage, which compare against the references this file computes, read them instead of
    running the numpy forward again (most of those tests' time). Named by the model's bytes, the
    inputs, the reference's own source (reference_forward.py and the GGUF reader it uses) and
    numpy's version, so a changed model, reference or numpy is computed again."""
    root = os.environ.get("MOELITE_MODEL_CACHE")
    if not root:
        return None
    h = hashlib.sha256()
    gguf_dir = os.path.join(ROOT, "tools", "gguf", "moelite_gguf")
    _hash_files(h, [model, reference_forward.__file__] +
                sorted(os.path.join(gguf_dir, n) for n in os.listdir(gguf_dir) if n.endswith(".py")))
    h.update(repr((list(tokens), bool(quantize), int(n_ctx), np.__version__)).encode())
    return os.path.join(root, "reference", h.hexdigest() + ".npy")


def reference_logits(model, quantize=True, tokens=TOKENS, n_ctx=None):
    """n_ctx: the engine's context length (moelite logits' default: the tokens'), which picks phimoe's
    LongRoPE factors. Computed by reference_forward.logits_of (what its command line writes, rounded
    to float32 as that file is) and kept for the process: the device tests compare several runs of
    one model with the same reference. The key holds the file's size and mtime, so a model written
    again under the same name is computed again. Kept on disk too (_reference_file)."""
    st = os.stat(model)
    n_ctx = n_ctx or len(tokens)
    key = (model, st.st_size, st.st_mtime_ns, tuple(tokens), bool(quantize), n_ctx)
    if key not in _REFERENCE_CACHE:
        path = _reference_file(model, tokens, quantize, n_ctx)
        if path and os.path.exists(path):
            _REFERENCE_CACHE[key] = np.load(path)
        else:
            _REFERENCE_CACHE[key] = reference_forward.logits_of(model, tokens, quantize, n_ctx).astype("<f4")
            if path:
                # Written aside and renamed: another process may read the same key at once.
                os.makedirs(os.path.dirname(path), exist_ok=True)
                part = "%s.%d.part.npy" % (path[:-4], os.getpid())
                np.save(part, _REFERENCE_CACHE[key])
                os.replace(part, path)
    return _REFERENCE_CACHE[key].copy()


MATRIX_ERRORS = {}


@pytest.mark.parametrize("arch,wtype", CPU_MATRIX)
def test_logits_match_reference(arch, wtype):
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    eng = engine_logits(model)
    ref_q = reference_logits(model, quantize=True)
    err = nmse(eng, ref_q)
    print("%s %s: nmse vs emulating reference %.3e" % (arch, wtype, err))
    MATRIX_ERRORS[(arch, wtype)] = err
    assert err < tight(wtype), "engine vs reference (activation quantization emulated): nmse %.3e" % err
    ref = reference_logits(model, quantize=False)
    err_plain = nmse(eng, ref)
    assert err_plain < LOOSE, "engine vs float64 reference: nmse %.3e" % err_plain
    # The top token agrees for every position (argmax is what greedy decoding uses).
    assert (eng.argmax(axis=1) == ref_q.argmax(axis=1)).mean() >= 0.9


def test_rounding_flips_are_rare():
    """TIGHT_QUANT leaves room for a few activation-rounding flips; a systematic error (a wrong
    formula in any kernel) would show in every case. So most quantized cases must agree as closely
    as the float ones."""
    quant = [e for (a, t), e in MATRIX_ERRORS.items() if t not in FLOAT_TYPES]
    if len(quant) < 20:
        pytest.skip("needs the full architecture x type matrix in the same run")
    exact = sum(e < 1e-9 for e in quant)
    print("quantized cases agreeing below 1e-9: %d of %d" % (exact, len(quant)))
    assert exact >= 0.75 * len(quant)


@pytest.mark.parametrize("variant", ["tied", "per-expert-tensors", "gqa1"])
def test_layout_variants(variant):
    extra = {"tied": ["--tied"], "per-expert-tensors": ["--per-expert-tensors"],
             "gqa1": ["--n-head-kv", "1"]}[variant]
    arch = "llama" if variant == "per-expert-tensors" else "qwen3moe"
    model = make_model("variant-" + variant, arch, "Q4_K", *extra)
    assert nmse(engine_logits(model), reference_logits(model)) < TIGHT_QUANT


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512"])
@pytest.mark.parametrize("wtype", ISA_TYPES)
def test_every_isa_matches_reference(isa, wtype):
    """The end-to-end check for the kernel tables the machine would not pick by default."""
    model = make_model("qwen3moe-" + wtype, "qwen3moe", wtype)
    err = nmse(engine_logits(model, isa=isa), reference_logits(model))
    assert err < tight(wtype), "%s %s: nmse %.3e" % (isa, wtype, err)


@pytest.mark.parametrize("wtype", ["Q8_0", "Q4_0", "MXFP4"])
def test_avxvnni_logits_are_the_avx2_tables_bit_for_bit(wtype):
    """vpdpbusd forms the sign trick's int32 lane sums, so the avxvnni table's logits equal the avx2
    table's exactly, in the batched (prepared) and the token-by-token products. Where the CPU has no
    AVX-VNNI both runs take the avx2 table."""
    model = make_model("qwen3moe-" + wtype, "qwen3moe", wtype)
    for extra in ((), ("-b", "1")):
        avx2 = engine_logits(model, isa="avx2", extra=extra)
        np.testing.assert_array_equal(engine_logits(model, isa="avxvnni", extra=extra), avx2)


@pytest.mark.parametrize("arch", ["qwen3moe", "olmoe"])
def test_amx_batched_logits_are_its_token_by_token_logits(arch):
    """The amx table's Q8_0 products go through the AMX tile (16 rows x up to 16 tokens a call; single
    tokens through its one-column form), a matrix's rows after its last group of 16 through the
    table's vec_dot; all sum each block exactly and add the blocks in the scalar order, so a prompt
    evaluated at once, in batches of 5 and token by token give the same logits, bit for bit, and
    match the reference. Where the CPU has no AMX the cap takes the best table below
    it, for which the same holds."""
    model = make_model("%s-Q8_0" % arch, arch, "Q8_0")
    batched = engine_logits(model, isa="amx")
    np.testing.assert_array_equal(engine_logits(model, isa="amx", extra=("-b", "1")), batched)
    np.testing.assert_array_equal(engine_logits(model, isa="amx", extra=("-b", "5")), batched)
    assert nmse(batched, reference_logits(model)) < tight("Q8_0")


@pytest.mark.parametrize("arch,wtype", [("qwen3moe", "Q4_K"), ("olmoe", "Q4_K"), ("qwen2moe", "Q5_K"),
                                        ("olmoe", "Q6_K"), ("qwen3moe", "Q3_K"),
                                        ("qwen2moe", "Q2_K")])
def test_amx_k_quant_batches_on_tiles_are_its_token_by_token_logits(arch, wtype, monkeypatch):
    """The amx table runs the Q4_K and Q5_K group kernels (grouped copies of resident weights) on AMX
    tiles for 5 to 16 tokens a call (two groups of 8 rows; a lone group from 6), and weights in row
    layout (experts in the store's slots under a budget; every weight with MOELITE_GROUPED_ROWS=0)
    through the matrix tile from 6 tokens a chunk, all in the avx512 kernels' float order; fewer
    tokens (decode) take the avx512 kernels. Q2_K, Q3_K and Q6_K (no grouped layout) take their
    matrix tiles from 6 tokens, resident or not, and the table's own vec_dot (the scalar order)
    below. A 40-token prompt at once (calls of up to 16 tokens, about 10 tokens per expert), in
    batches of 7 and token by token, resident, under a budget and in
    row layout give the same logits bit for bit and match the reference. Without AMX the cap takes
    the best table below it, for which the same holds."""
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    tokens = TOKENS * 4
    batched = engine_logits(model, tokens=tokens, isa="amx")
    np.testing.assert_array_equal(engine_logits(model, tokens=tokens, isa="amx", extra=("-b", "1")), batched)
    np.testing.assert_array_equal(engine_logits(model, tokens=tokens, isa="amx", extra=("-b", "7")), batched)
    for extra in (("--budget", "50%"), ("--budget", "50%", "-b", "7")):
        np.testing.assert_array_equal(engine_logits(model, tokens=tokens, isa="amx", extra=extra), batched)
    monkeypatch.setenv("MOELITE_GROUPED_ROWS", "0")
    np.testing.assert_array_equal(engine_logits(model, tokens=tokens, isa="amx"), batched)
    assert nmse(batched, reference_logits(model, tokens=tokens)) < tight(wtype)


def test_metadata_overrides_renormalisation():
    """expert_weights_norm / expert_weights_scale in the file override the architecture default."""
    base = make_model("olmoe-Q8_0", "olmoe", "Q8_0")
    edited = rewrite(base, os.path.join(TMP, "olmoe-Q8_0-norm.gguf"),
                     set_keys={"olmoe.expert_weights_norm": (True, 7), "olmoe.expert_weights_scale": (0.5, 6)})
    ref = reference_logits(edited)
    assert nmse(engine_logits(edited), ref) < TIGHT_QUANT
    assert nmse(reference_logits(base), ref) > 1e-3  # the keys do change the model


def test_thread_count_and_mmap_do_not_change_results():
    model = make_model("qwen2moe-Q4_K", "qwen2moe", "Q4_K")
    base = engine_logits(model, threads=2)
    np.testing.assert_array_equal(base, engine_logits(model, threads=1))
    np.testing.assert_array_equal(base, engine_logits(model, threads=3))
    np.testing.assert_array_equal(base, engine_logits(model, extra=("--no-mmap",)))


def test_batch_splitting_does_not_change_results():
    model = make_model("olmoe-Q8_0", "olmoe", "Q8_0")
    whole = engine_logits(model)
    split = engine_logits(model, extra=("-b", "3"))
    np.testing.assert_array_equal(whole, split)


# gpt-oss's own paths: the tiny files have a window of 8 on layer 0 (pattern 2: layer 1 attends
# to everything), sinks, biases, and gate/up biases wide enough to reach the clamp of 7.
LONG = [(i * 37 + 11) % 512 for i in range(40)]


@pytest.mark.parametrize("variant", ["plain", "yarn", "pattern0", "real-types"])
def test_gpt_oss_variants_match_reference(variant):
    """Sliding windows shorter than the prompt (40 tokens, window 8), YaRN (factor 4 over an original
    context of 16, so the ramp between extrapolated and interpolated pairs falls inside n_rot), every
    layer windowed (pattern 0), and the types real files use (MXFP4 experts, Q8_0 elsewhere)."""
    extra = {"plain": (), "yarn": ("--yarn", "4", "--yarn-orig-ctx", "16"), "pattern0": ("--window-pattern", "0"),
             "real-types": ("--expert-type", "MXFP4")}[variant]
    wtype = "Q8_0" if variant == "real-types" else "F32"
    model = make_model("gpt-oss-%s-%s" % (variant, wtype), "gpt-oss", wtype, *extra)
    err = nmse(engine_logits(model, tokens=LONG), reference_logits(model, tokens=LONG))
    assert err < tight(wtype), "%s: nmse %.3e" % (variant, err)


def test_gpt_oss_window_ring_batches_and_truncation():
    """A windowed layer keeps window - 1 + n_batch positions: with batches of 3 the ring (10 slots)
    wraps several times over 40 tokens, and token-by-token decoding wraps it 4 times; both give the
    bits of one whole batch."""
    model = make_model("gpt-oss-plain-F32", "gpt-oss", "F32")
    whole = engine_logits(model, tokens=LONG)
    np.testing.assert_array_equal(whole, engine_logits(model, tokens=LONG, extra=("-b", "3")))
    np.testing.assert_array_equal(whole, engine_logits(model, tokens=LONG, extra=("-b", "1")))


def test_granitemoe_shared_expert_matches_reference():
    """Granite MoE Shared: the shared expert joins the routed ones without a gate, inside the
    residual multiplier."""
    model = make_model("granitemoe-shared-Q4_K", "granitemoe", "Q4_K", "--granite-shared")
    err = nmse(engine_logits(model), reference_logits(model))
    assert err < TIGHT_QUANT, "nmse %.3e" % err
    plain = make_model("granitemoe-Q4_K", "granitemoe", "Q4_K")
    assert nmse(reference_logits(plain), reference_logits(model)) > 1e-4  # the shared expert counts


def test_phimoe_context_length_picks_the_longrope_factors():
    """A context longer than rope.scaling.original_context_length (64 in the tiny files) rotates by the
    long factors, a shorter one by the short factors; both match the reference, and differ."""
    model = make_model("phimoe-F32", "phimoe", "F32")
    long_ctx = engine_logits(model, tokens=LONG, extra=("-c", "512"))
    short_ctx = engine_logits(model, tokens=LONG, extra=("-c", "48"))
    assert nmse(long_ctx, reference_logits(model, tokens=LONG, n_ctx=512)) < TIGHT_FLOAT
    assert nmse(short_ctx, reference_logits(model, tokens=LONG, n_ctx=48)) < TIGHT_FLOAT
    assert nmse(short_ctx, long_ctx) > 1e-4


DEEPSEEK2_V3 = ("--q-lora", "256", "--gating", "sigmoid", "--probs-bias", "--expert-groups", "4", "--groups-used", "2",
                "--weights-norm", "--weights-scale", "2.5", "--dense-lead", "2", "--n-layer", "3")
DEEPSEEK2_VARIANTS = {
    "lite": (),  # DeepSeek-V2-Lite's shape: attn_q, softmax routing, one dense block, one shared expert
    "v3": DEEPSEEK2_V3,  # q low-rank path, sigmoid scores, selection bias, expert groups, renormalised, scaled
    "fused-kv-b": ("--fused-kv-b",),  # the older attn_kv_b (key part transposed at load)
    "yarn-log-mul": ("--yarn", "4", "--yarn-orig-ctx", "16", "--yarn-log-mul", "0.707"),  # V2's mscale_all_dim
    "yarn": ("--yarn", "4", "--yarn-orig-ctx", "16"),  # YaRN without a log multiplier
    "no-dense-two-shared": ("--dense-lead", "0", "--n-shared", "2"),
}


@pytest.mark.parametrize("wtype", ["F32", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("variant", sorted(DEEPSEEK2_VARIANTS))
def test_deepseek2_variants_match_reference(variant, wtype):
    """Multi-head latent attention (computed absorbed, against the reference's decompressed form in
    float and its absorbed form where the quantized activations must match) over 40 tokens, with each
    routing and rope variant DeepSeek-V2/V3 files carry."""
    model = make_model("deepseek2-%s-%s" % (variant, wtype), "deepseek2", wtype, *DEEPSEEK2_VARIANTS[variant])
    eng = engine_logits(model, tokens=LONG)
    ref = reference_logits(model, tokens=LONG)
    if wtype in FLOAT_TYPES:
        err = nmse(eng, ref)
        assert err < tight(wtype), "%s %s: nmse %.3e" % (variant, wtype, err)
    else:
        assert_close_but_for_a_routing_flip(eng, ref, tight(wtype), "%s %s" % (variant, wtype))
    assert nmse(eng, reference_logits(model, quantize=False, tokens=LONG)) < LOOSE


def test_deepseek2_variants_differ():
    """The options the variants test change the model (the reference is not blind to them)."""
    lite = reference_logits(make_model("deepseek2-lite-F32", "deepseek2", "F32"), tokens=LONG)
    for variant in ("v3", "yarn-log-mul", "yarn", "no-dense-two-shared"):
        other = reference_logits(make_model("deepseek2-%s-F32" % variant, "deepseek2", "F32",
                                            *DEEPSEEK2_VARIANTS[variant]), tokens=LONG)
        assert nmse(other, lite) > 1e-4, variant
    yarn = reference_logits(make_model("deepseek2-yarn-F32", "deepseek2", "F32", *DEEPSEEK2_VARIANTS["yarn"]),
                            tokens=LONG)
    log_mul = reference_logits(make_model("deepseek2-yarn-log-mul-F32", "deepseek2", "F32",
                                          *DEEPSEEK2_VARIANTS["yarn-log-mul"]), tokens=LONG)
    assert nmse(yarn, log_mul) > 1e-6


def test_deepseek2_batches_and_budget_give_the_same_bits():
    """The latent cache across batches of 3 and token by token, and the expert store with leading
    dense blocks (no experts, no slots) under a small budget: the bits of one whole batch."""
    model = make_model("deepseek2-v3-Q8_0", "deepseek2", "Q8_0", *DEEPSEEK2_V3)
    whole = engine_logits(model, tokens=LONG)
    np.testing.assert_array_equal(whole, engine_logits(model, tokens=LONG, extra=("-b", "3")))
    np.testing.assert_array_equal(whole, engine_logits(model, tokens=LONG, extra=("-b", "1")))
    np.testing.assert_array_equal(whole, engine_logits(model, tokens=LONG, extra=("--budget", "40%")))
    np.testing.assert_array_equal(
        whole, engine_logits(model, tokens=LONG, extra=("--budget", "60%", "--allocation", "uniform")))


@pytest.mark.parametrize("arch,wtype", [("qwen3moe", "Q4_K"), ("olmoe", "Q4_K"), ("deepseek2", "Q4_K"),
                                         ("qwen2moe", "Q5_K"), ("olmoe", "Q5_K")])
def test_grouped_rows_give_the_bits_of_the_row_layout(arch, wtype):
    """Q4_K and Q5_K weights the CPU backend lays out in groups of eight rows (copies of the mapped bytes, made
    at load where its kernel table has a group kernel, backends/cpu/weight_copies.h) against the same
    file in row layout: read into memory (--no-mmap), streamed by the expert store (--budget), with
    the grouped copies turned off (MOELITE_GROUPED_ROWS=0: row copies; with MOELITE_WEIGHT_COPIES=0
    too: the mapping), token by token and in batches of 3. Every run gives
    the bits of the first: exact mode does not depend on the layout or the budget."""
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    out = model + ".grouped.f32"
    r = subprocess.run([BIN, "logits", "-m", model, "-t", "2", "--tokens", ",".join(map(str, LONG)), "--out", out,
                        "--verbose"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if platform.machine() in ("x86_64", "AMD64"):  # every x86 table above scalar has these group kernels
        assert "laid out in groups of 8 rows" in r.stderr, r.stderr
    grouped = np.fromfile(out, dtype="<f4").reshape(len(LONG), -1)
    env = dict(os.environ, MOELITE_GROUPED_ROWS="0")
    row_layout = subprocess.run([BIN, "logits", "-m", model, "-t", "2", "--tokens", ",".join(map(str, LONG)),
                                 "--out", out, "--verbose"], capture_output=True, text=True, env=env)
    assert row_layout.returncode == 0 and "laid out in groups" not in row_layout.stderr, row_layout.stderr
    np.testing.assert_array_equal(grouped, np.fromfile(out, dtype="<f4").reshape(len(LONG), -1))
    for extra in (("--no-mmap",), ("--budget", "60%"), ("-b", "1"), ("-b", "3")):
        np.testing.assert_array_equal(grouped, engine_logits(model, tokens=LONG, extra=extra), err_msg=str(extra))
    # In row layout and without copies: read from the file's mapping.
    np.testing.assert_array_equal(
        grouped, engine_logits(model, tokens=LONG, env_extra={"MOELITE_GROUPED_ROWS": "0", "MOELITE_WEIGHT_COPIES": "0"}))
    assert_close_but_for_a_routing_flip(grouped, reference_logits(model, tokens=LONG), tight(wtype), arch)


@pytest.mark.parametrize("arch,wtype", [("olmoe", "Q8_0"), ("qwen3moe", "Q6_K"), ("olmoe", "F16"),
                                         ("gpt-oss", "MXFP4")])
def test_weight_copies_give_the_bits_of_the_mapping(arch, wtype):
    """Mapped weights of a type without a grouped layout are computed from the CPU backend's copies of
    them (its own memory, in huge pages; backends/cpu/weight_copies.h), and with the copies turned off
    (MOELITE_WEIGHT_COPIES=0) from the file's mapping: the same bits, token by token and in batches
    of 3, and the reference's logits within the type's tolerance."""
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    out = "%s.copies.%d.f32" % (model, os.getpid())
    for copies in ("1", "0"):
        r = subprocess.run([BIN, "logits", "-m", model, "-t", "2", "--tokens", ",".join(map(str, LONG)), "--out",
                            out, "--verbose"], capture_output=True, text=True,
                           env=dict(os.environ, MOELITE_WEIGHT_COPIES=copies))
        assert r.returncode == 0, r.stderr
        assert ("copied into memory of the backend's own" in r.stderr) == (copies == "1"), r.stderr
    mapped = np.fromfile(out, dtype="<f4").reshape(len(LONG), -1)
    os.remove(out)
    for extra in (("-b", "1"), ("-b", "3")):
        np.testing.assert_array_equal(mapped, engine_logits(model, tokens=LONG, extra=extra), err_msg=str(extra))
    assert_close_but_for_a_routing_flip(mapped, reference_logits(model, tokens=LONG), tight(wtype), arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_perplexity_command_matches_reference(arch):
    """`moelite perplexity` on a tiny model of each architecture: windows of 16 tokens, every token
    after a window's first scored; the reference's mean negative log-likelihood from its own logits."""
    model = make_model("%s-F32" % arch, arch, "F32")
    text = os.path.join(TMP, "ppl-text.txt")
    with open(text, "w") as f:
        f.write("the cat sat on the mat and then it ran to the other side of the room where the dog was "
                "sleeping near the fire while the rain fell outside on the roof of the old house")
    toks = [int(t) for t in run([BIN, "tokenize", "-m", model, "-f", text]).stdout.split()]
    out = json.loads(run([BIN, "perplexity", "-m", model, "-f", text, "--ctx", "16", "--json", "-t", "2"]).stdout)
    nll, scored = 0.0, 0
    for w0 in range(0, len(toks), 16):
        win = toks[w0:w0 + 16]
        if len(win) < 2:
            continue
        logits = reference_logits(model, tokens=win).astype(np.float64)
        logp = logits - logits.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        nll -= sum(logp[i, win[i + 1]] for i in range(len(win) - 1))
        scored += len(win) - 1
    assert out["tokens_scored"] == scored and out["n_tokens"] == len(toks)
    assert abs(out["mean_nll"] - nll / scored) < 1e-5 * max(1.0, nll / scored), (out["mean_nll"], nll / scored)


@pytest.mark.parametrize("arch,wtype", [("deepseek2", "Q4_K"), ("qwen3moe", "Q8_0"), ("gpt-oss", "F32")])
def test_merged_gate_up_experts_compute_the_same(arch, wtype):
    """ffn_gate_up_exps (gate and up of an expert in one slice, as newer conversions store them, and
    llama.cpp reads for deepseek2) holds the same bytes as the separate tensors: the same logits, bit
    for bit, resident and from the expert store."""
    base = make_model("%s-%s" % (arch, wtype), arch, wtype)
    merged = merge_gate_up(base, os.path.join(TMP, "%s-%s-gate-up.gguf" % (arch, wtype)))
    assert "blk.0.ffn_up_exps.weight" not in GGUFReader(merged).tensors
    want = engine_logits(base)
    np.testing.assert_array_equal(engine_logits(merged), want)
    assert nmse(want, reference_logits(merged)) < tight(wtype)  # the reference reads the merged layout too
    np.testing.assert_array_equal(engine_logits(merged, extra=("--budget", "60%")), want)


def test_deepseek2_gating_defaults():
    """Without expert_gating_func a deepseek2 file is softmax-gated (DeepSeek-V2 files predate the key),
    except the GLM-4.7-Flash files llama.cpp recognises by 47/48 layers and a 154880-token vocabulary,
    which are sigmoid-gated: the same logits as the file stating 1 or 2."""
    base = make_model("deepseek2-47l-F32", "deepseek2", "F32", "--n-layer", "47", "--n-embd", "64", "--n-head", "2",
                      "--kv-lora", "64", "--n-ff-exp", "64", "--n-ff-dense", "64")
    key = "deepseek2.expert_gating_func"
    edit = lambda name, **kw: rewrite(base, os.path.join(TMP, name + ".gguf"), **kw)  # noqa: E731
    softmax = engine_logits(edit("d2-47-softmax", set_keys={key: (1, 4)}))
    sigmoid = engine_logits(edit("d2-47-sigmoid", set_keys={key: (2, 4)}))
    assert nmse(softmax, sigmoid.astype(np.float64)) > 1e-6
    np.testing.assert_array_equal(engine_logits(edit("d2-47-absent", drop_keys=[key])), softmax)
    # A GLM-4.7-Flash-shaped file: its 154880 tokens are its embedding's rows, as the loader requires
    # (a vocab_size key disagreeing with them is refused: test_model_metadata).
    glm = make_model("deepseek2-47l-glm-vocab-F32", "deepseek2", "F32", "--n-layer", "47", "--n-embd", "64",
                     "--n-head", "2", "--kv-lora", "64", "--n-ff-exp", "64", "--n-ff-dense", "64", "--vocab", "154880",
                     "--tied")
    glm_sigmoid = engine_logits(rewrite(glm, os.path.join(TMP, "d2-47-glm-sigmoid.gguf"), set_keys={key: (2, 4)}))
    assert nmse(engine_logits(glm), glm_sigmoid.astype(np.float64)) > 1e-6  # the file as made states softmax
    np.testing.assert_array_equal(
        engine_logits(rewrite(glm, os.path.join(TMP, "d2-47-glm-absent.gguf"), drop_keys=[key])), glm_sigmoid)


def test_deepseek2_multi_token_prediction_blocks_are_not_run():
    """GLM-4.x files count their draft (multi-token prediction) blocks in block_count and name them in
    nextn_predict_layers: a 3-block file saying 1 is the 2-block model (same seed, same tensors by
    name), bit for bit, and matches the reference of the 2-block file."""
    two = make_model("deepseek2-2l-F32", "deepseek2", "F32", "--n-layer", "2")
    three = make_model("deepseek2-3l-F32", "deepseek2", "F32", "--n-layer", "3")
    with_mtp = rewrite(three, os.path.join(TMP, "deepseek2-3l-mtp1-F32.gguf"),
                       set_keys={"deepseek2.nextn_predict_layers": (1, 4)})
    got = engine_logits(with_mtp, tokens=LONG)
    np.testing.assert_array_equal(got, engine_logits(two, tokens=LONG))
    assert nmse(got, reference_logits(two, tokens=LONG)) < TIGHT_FLOAT
    assert nmse(engine_logits(three, tokens=LONG), got) > 1e-4  # the third block does change the model


def test_yarn_on_a_standard_arch():
    """rope.scaling is read by every architecture, not only gpt-oss (Qwen3 files with YaRN exist)."""
    model = make_model("qwen3moe-yarn-F32", "qwen3moe", "F32", "--yarn", "4", "--yarn-orig-ctx", "16")
    plain = make_model("qwen3moe-F32", "qwen3moe", "F32")
    ref = reference_logits(model, tokens=LONG)
    assert nmse(engine_logits(model, tokens=LONG), ref) < TIGHT_FLOAT
    assert nmse(reference_logits(plain, tokens=LONG), ref) > 1e-4  # the scaling does change the model


def test_mixed_expert_types_match_reference_and_batching():
    """Up projections in Q4_0 beside Q8_0 gate and down: two weight types of one activation format,
    so the CPU drivers quantize (and, on tables with a prepared path, prepare) the activations once
    for both. The logits follow the reference, and prefill in one batch, in batches of 3 and token
    by token give the same bits."""
    base = make_model("olmoe-Q8_0", "olmoe", "Q8_0")
    n_layer = GGUFReader(base).metadata["olmoe.block_count"]
    mixed = rewrite(base, os.path.join(TMP, "olmoe-Q8_0-up-Q4_0.gguf"),
                    requantize={"blk.%d.ffn_up_exps.weight" % il: "Q4_0" for il in range(n_layer)})
    assert GGUFReader(mixed).tensors["blk.0.ffn_up_exps.weight"]["type"] == 2  # Q4_0
    whole = engine_logits(mixed)
    assert nmse(whole, reference_logits(mixed)) < TIGHT_QUANT
    assert nmse(whole, engine_logits(base)) > 1e-6  # the requantized weights do change the model
    np.testing.assert_array_equal(whole, engine_logits(mixed, extra=("-b", "3")))
    np.testing.assert_array_equal(whole, engine_logits(mixed, extra=("-b", "1")))


def tensor_span(path, name):
    r = GGUFReader(path)
    t = r.tensors[name]
    return t["offset"], t["nbytes"], t["type"]


def corrupted_copy(src, suffix, mutate):
    dst = src.replace(".gguf", "-" + suffix + ".gguf")
    shutil.copyfile(src, dst)
    data = bytearray(open(dst, "rb").read())
    mutate(data)
    open(dst, "wb").write(bytes(data))
    return dst


@pytest.mark.parametrize("wtype", ["Q4_0", "F16"])
def test_one_corrupted_block_is_detected(wtype):
    """The tolerance is tight enough that one bad block of one matrix fails the comparison."""
    model = make_model("qwen3moe-" + wtype, "qwen3moe", wtype)
    off, nbytes, _ = tensor_span(model, "blk.0.attn_q.weight")

    def mutate(d):
        if wtype == "Q4_0":  # block 0 of row 0: scale doubled (fp16 exponent + 1), quants inverted
            scale = int.from_bytes(d[off:off + 2], "little")
            d[off:off + 2] = (scale + 0x0400).to_bytes(2, "little")
            for i in range(off + 2, off + 18):
                d[i] ^= 0xFF
        else:  # the first 32 fp16 weights of row 0 change sign
            for i in range(off + 1, off + 64, 2):
                d[i] ^= 0x80

    bad = corrupted_copy(model, "corrupt", mutate)
    ref = reference_logits(model)
    assert nmse(engine_logits(model), ref) < tight(wtype)
    err = nmse(engine_logits(bad), ref)
    print("%s one corrupted block: nmse %.3e" % (wtype, err))
    assert err > 2 * tight(wtype)


@pytest.mark.parametrize("wtype,block,qs_off,qs_len", [("Q4_0", 18, 2, 16), ("Q4_K", 144, 16, 128)])
def test_swapped_nibble_order_is_detected(wtype, block, qs_off, qs_len):
    """A dequantizer that read high and low nibbles the other way round would compute on what the
    nibble-swapped file holds; comparing that to the reference must fail."""
    model = make_model("olmoe-" + wtype, "olmoe", wtype)
    off, nbytes, _ = tensor_span(model, "blk.0.attn_q.weight")

    def mutate(d):
        for b in range(off, off + nbytes, block):
            for i in range(b + qs_off, b + qs_off + qs_len):
                d[i] = ((d[i] & 0x0F) << 4) | (d[i] >> 4)

    swapped = corrupted_copy(model, "nibbles", mutate)
    err = nmse(engine_logits(swapped), reference_logits(model))
    print("%s nibble-swapped attn_q: nmse %.3e" % (wtype, err))
    assert err > 100 * TIGHT_QUANT

