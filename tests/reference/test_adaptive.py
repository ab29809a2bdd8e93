"""Adaptive expert gating, pre-gated routing and the sensitivity calibration: engine against the
independent numpy reference (tests/reference/reference_forward.py, whose docstring states the
semantics: gating rules, mass preservation, the lowest-weight perturbation, pre-gated routing).

Two groups:
  * reference-only checks (always run): the gating/perturbation helpers on hand-made weight
    vectors, neutral settings that must equal exact routing bit for bit, the keep-one and drop-one
    limits against independent constructions, and the pre-gated routing wiring.
  * engine checks (skipped unless MOELITE_BIN is set):
      - `moelite logits` on --pregate models (tools/make_tiny_model.py --pregate);
      - `moelite logits --gating score|sensitivity --threshold T [--profile P]`;
      - `moelite calibrate` (the per-layer sensitivity S_l of dropping the lowest expert, and its
        10 % finite-difference variant) against the same windowed estimator in numpy.

Thresholds are chosen so that (1) a good fraction of tokens, but not all, drop experts, asserted
from the reference's kept counts, so no test can pass vacuously, and (2) no compared quantity lies
closer to the threshold than MARGIN_* (relative), so float32-vs-float64 rounding cannot decide a
comparison differently in engine and reference.

Environment: MOELITE_BIN (the moelite CLI), MOELITE_TEST_TMP (scratch directory).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
sys.path.insert(0, HERE)
from moelite_gguf import GGUFReader, GGUFWriter  # noqa: E402
import reference_forward as RF  # noqa: E402
from gguf_edit import rewrite  # noqa: E402
# tolerances and their justification live with the plain engine-vs-reference comparison
from test_engine_vs_reference import TIGHT_FLOAT, TIGHT_QUANT, TOKENS, nmse  # noqa: E402

PY = sys.executable
MAKE = os.path.join(ROOT, "tools", "make_tiny_model.py")
BIN = os.environ.get("MOELITE_BIN")
TMP = os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-adaptive-tests")
SHIPPED = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
HELDOUT = os.path.join(ROOT, "tools", "train", "data", "heldout.txt")

needs_engine = pytest.mark.skipif(not BIN, reason="MOELITE_BIN is not set (path of the moelite CLI); "
                                                  "only the reference-only checks run")

# Longer than TOKENS so that kept-count fractions mean something; all ids < 512 (tiny vocab).
TOKENS_LONG = TOKENS + [64, 128, 5, 77, 401, 256, 33, 480, 12, 9, 200, 150, 350, 2]
# No gating comparison value may lie closer than this (relative) to the threshold: F32 weights
# agree to ~1e-7 between engine and reference; quantized ones move by activation-rounding flips
# (see test_engine_vs_reference), which shift hidden states by up to ~1e-4.
MARGIN_FLOAT = 1e-4
MARGIN_QUANT = 1e-3

# calibrate protocol (iii)
CAL_CTX = 128
CAL_MAX_TOKENS = 512
FD_ALPHA = 0.9


# ============================================================== helpers

def run(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check:
        assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr)
    return r


def make_model(name, arch, wtype, *extra):
    """the model file NAME, made once; a file of that name made with other arguments (another
    test's, or an earlier run's) is made again, so a name never hands one test another's shape"""
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "adaptive-" + name + ".gguf")
    args, stamp = json.dumps([arch, wtype, list(extra)]), path + ".args"
    if not (os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == args):
        run([PY, MAKE, "--arch", arch, "--type", wtype, "--seed", "7", "--out", path, "--quiet", *extra])
        with open(stamp, "w") as f:
            f.write(args)
    return path


def engine_logits(model, tokens, extra=()):
    os.makedirs(TMP, exist_ok=True)       # never next to the model: the shipped one is in the repo
    out = os.path.join(TMP, os.path.basename(model) + ".adaptive-engine.f32")
    run([BIN, "logits", "-m", model, "-t", "2", "--tokens", ",".join(map(str, tokens)), "--out", out, *extra])
    return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)


def write_profile(path, ref, sens):
    """a profile as `moelite calibrate` writes it, with chosen per-layer sensitivities"""
    prof = {"format": "moelite-profile", "version": 1,
            "model": {"arch": ref.arch, "n_layer": ref.n_layer, "n_expert": ref.n_expert,
                      "n_expert_used": ref.n_expert_used, "n_embd": ref.n_embd},
            "layers": [{"layer": il, "sensitivity": float(s)} for il, s in enumerate(sens)]}
    with open(path, "w") as f:
        json.dump(prof, f, indent=1)
    return path


def compared_values(topk, gating):
    """every quantity the gating rule compares with its threshold, per layer: [n_layer, T, k-1]
    (for sensitivity, all tails are listed even where the loop stops earlier: stricter)"""
    ranked = -np.sort(-topk, axis=-1)
    if gating[0] == "score":
        return ranked[..., 1:]
    tails = np.cumsum(ranked[..., ::-1], axis=-1)[..., :-1]
    return tails * tails * np.asarray(gating[2])[:, None, None]


def threshold_margin(topk, gating):
    """smallest relative distance between the threshold and a compared value"""
    v = compared_values(topk, gating)
    return float(np.min(np.abs(v - gating[1])) / abs(gating[1]))


def pick_threshold(values, lo=0.3, hi=0.7):
    """a threshold between the lo and hi quantiles of values, in the middle (geometric) of the
    widest relative gap there, so that no value lies near it"""
    v = np.sort(np.asarray(values, np.float64).ravel())
    v = v[int(lo * v.size):int(hi * v.size) + 1]
    gaps = np.log(v[1:] / v[:-1])
    i = int(np.argmax(gaps))
    return float(np.sqrt(v[i] * v[i + 1]))


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_rows(logp, logq):
    """KL(P_t || Q_t) per row from log-probabilities (natural log)"""
    return (np.exp(logp) * (logp - logq)).sum(axis=-1)


def windows(tokens, ctx):
    """the calibration windows: consecutive ctx-token slices, a last partial one if >= 2 tokens"""
    return [tokens[i:i + ctx] for i in range(0, len(tokens), ctx) if len(tokens[i:i + ctx]) >= 2]


def numpy_sensitivity(ref, tokens, ctx, alpha):
    """S_l = sum_t KL(P_t || Q_t) / sum_t d_t^2 over all positions of all windows, Q from
    perturb=(l, alpha): the estimator `moelite calibrate` implements, independently in numpy."""
    num = np.zeros(ref.n_layer)
    den = np.zeros(ref.n_layer)
    for win in windows(tokens, ctx):
        saved = {}
        logp = log_softmax(ref.forward(win, checkpoints=saved))
        for il in range(ref.n_layer):
            st = {}
            # Layers before the perturbed routing are the unperturbed run's: resume after them.
            logq = log_softmax(ref.forward(win, perturb=(il, alpha), stats=st, resume=(saved, ref.routed_in(il))))
            num[il] += kl_rows(logp, logq).sum()
            den[il] += (st["dropped"] ** 2).sum()
    return num / den


def dequantized_copy(src, dst):
    """the same model with every tensor stored as F32 (its dequantized values): the engine then
    keeps activations in float, so engine and reference agree to float rounding"""
    if os.path.exists(dst):
        return dst
    r = GGUFReader(src)
    w = GGUFWriter(dst)
    for key, value in r.metadata.items():
        vtype, elem = r.value_types[key]
        if key == "general.file_type":
            value = 0                                   # LLAMA_FTYPE_ALL_F32
        if key == "general.quantization_version":
            continue
        if vtype == 9:
            w.add_array(key, value, elem)
        else:
            w.add(key, value, vtype)
    for name in r.tensors:
        w.add_tensor_array(name, r.get(name), "F32")
    w.write()
    return dst


def corpus_file():
    """the first ~6000 bytes of the held-out text, cut at a line end"""
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "adaptive-corpus.txt")
    data = open(HELDOUT, "rb").read(6000)
    data = data[:data.rfind(b"\n") + 1]
    with open(path, "wb") as f:
        f.write(data)
    return path


def tokenize(model, path):
    """token ids as `moelite calibrate` / `moelite perplexity` see them (no BOS, flags 0)"""
    return [int(t) for t in run([BIN, "tokenize", "-m", model, "-f", path]).stdout.split()]


def calibrate(model, corpus, out):
    run([BIN, "calibrate", "-m", model, "-f", corpus, "-o", out, "--ctx", str(CAL_CTX),
         "--max-tokens", str(CAL_MAX_TOKENS)])
    with open(out) as f:
        return json.load(f)


def profile_values(prof, key):
    layers = sorted(prof["layers"], key=lambda r: r["layer"])
    return np.array([float(r[key]) for r in layers])


# ============================================================== reference only: hand-made weights

def test_score_gating_on_hand_made_weights():
    sel = np.array([[0.5, 0.3, 0.2],       # 0.2 < 0.25 dropped
                    [0.2, 0.1, 0.1],       # all < 0.25: only the highest stays
                    [0.25, 0.5, 0.25],     # == T stays
                    [0.1, 0.1, 0.1]])      # ties: the lowest slot is the highest
    out, kept = RF.apply_gating(sel, ("score", 0.25), 0)
    assert kept.tolist() == [2, 1, 3, 1]
    exp = np.array([[0.5, 0.3, 0.0], [0.4, 0.0, 0.0], [0.25, 0.5, 0.25], [0.3, 0.0, 0.0]])
    exp[0] *= 1.0 / 0.8                     # rescaled to the original mass
    assert np.allclose(out, exp, rtol=1e-15, atol=0)
    assert np.allclose(out.sum(axis=1), sel.sum(axis=1), rtol=1e-15)


def test_sensitivity_gating_on_hand_made_weights():
    sel = np.array([[0.6, 0.3, 0.1],
                    [0.1, 0.3, 0.6],
                    [0.5, 0.25, 0.25]])
    # S = 10, T = 1: tail 0.1 -> 0.1 < 1 drop; tail 0.1+0.3 -> 1.6 >= 1 stop: 2 kept
    out, kept = RF.apply_gating(sel, ("sensitivity", 1.0, [10.0]), 0)
    assert kept.tolist() == [2, 2, 2]
    assert np.allclose(out[0], np.array([0.6, 0.3, 0.0]) / 0.9, rtol=1e-15)
    assert np.allclose(out[1], np.array([0.0, 0.3, 0.6]) / 0.9, rtol=1e-15)
    # equal lowest weights: the higher slot is dropped first
    assert out[2, 2] == 0 and out[2, 1] > 0
    # T = 3: 1.6 < 3 drops the second too (third row: 0.625, then 0.5^2*10 = 2.5 < 3)
    _, kept = RF.apply_gating(sel, ("sensitivity", 3.0, [10.0]), 0)
    assert kept.tolist() == [1, 1, 1]
    # the layer's own S is used
    _, kept = RF.apply_gating(sel, ("sensitivity", 1.0, [10.0, 1000.0]), 1)
    assert kept.tolist() == [3, 3, 3]
    # a huge T keeps exactly the highest; T = 0 keeps everything unchanged
    out, kept = RF.apply_gating(sel, ("sensitivity", 1e300, [1.0]), 0)
    assert kept.tolist() == [1, 1, 1] and np.allclose(out[:, 0], [1.0, 0.0, 1.0], rtol=1e-15)
    out, kept = RF.apply_gating(sel, ("sensitivity", 0.0, [1.0]), 0)
    assert kept.tolist() == [3, 3, 3] and np.array_equal(out, sel)


def test_perturbation_on_hand_made_weights():
    sel = np.array([[0.7, 0.3], [0.5, 0.5], [0.2, 0.8]])
    out, d = RF.perturb_lowest(sel, 0.0)
    assert out.tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]   # tie: slot 1 is the lowest
    assert np.allclose(d, [0.3, 0.5, 0.2], rtol=1e-15)
    out, d = RF.perturb_lowest(sel, 0.9)
    assert np.allclose(out[0], np.array([0.7, 0.27]) / 0.97, rtol=1e-15)
    assert np.allclose(d, [0.03, 0.05, 0.02], rtol=1e-12)
    out, d = RF.perturb_lowest(sel, 1.0)
    assert np.array_equal(out, sel) and np.all(d == 0)
    # non-renormalised weights keep their own (smaller) mass
    out, _ = RF.perturb_lowest(np.array([[0.4, 0.1]]), 0.0)
    assert np.allclose(out, [[0.5, 0.0]], rtol=1e-15)
    with pytest.raises(ValueError):
        RF.perturb_lowest(np.array([[1.0]]), 0.0)


def test_gating_argument_validation():
    assert RF.check_gating(None, 2) is None and RF.check_gating("exact", 2) is None
    assert RF.check_gating(("score", "0.5"), 2) == ("score", 0.5)
    with pytest.raises(ValueError):
        RF.check_gating(("sensitivity", 1.0, [1.0]), 2)          # one S per layer
    with pytest.raises(ValueError):
        RF.check_gating(("topp", 0.5), 2)


# ============================================================== reference only: whole forward passes

@pytest.mark.parametrize("arch", ["llama", "qwen2moe", "qwen3moe", "olmoe"])
def test_neutral_settings_equal_exact_routing(arch):
    """T = 0 drops nothing and alpha = 1 changes nothing: bit-identical to exact routing."""
    m = RF.ReferenceModel(make_model("%s-F32" % arch, arch, "F32"))
    exact = m.forward(TOKENS)
    L, k = m.n_layer, m.n_expert_used
    for kw in ({"gating": ("score", 0.0)}, {"gating": ("sensitivity", 0.0, [1.0] * L)},
               {"perturb": (1, 1.0)}, {"perturb": (0, 1.0)}):
        st = {}
        assert np.array_equal(m.forward(TOKENS, stats=st, **kw), exact), kw
        assert st["kept"].shape == (L, len(TOKENS)) and np.all(st["kept"] == k)
    # and a threshold that does drop changes the logits
    assert not np.allclose(m.forward(TOKENS, gating=("score", 0.3)), exact)


def test_keep_one_equals_top1_model():
    """Renormalising arch: keeping only the highest expert with its mass (1) is exactly the same
    model with expert_used_count = 1, which the reference computes through the plain top-k path."""
    base = make_model("qwen3moe-F32", "qwen3moe", "F32")
    top1 = rewrite(base, os.path.join(TMP, "adaptive-qwen3moe-F32-top1.gguf"),
                   set_keys={"qwen3moe.expert_used_count": (1, 4)})
    m = RF.ReferenceModel(base)
    want = RF.ReferenceModel(top1).forward(TOKENS)
    for g in (("sensitivity", 1e300, [1.0] * m.n_layer), ("score", 1.5)):
        st = {}
        got = m.forward(TOKENS, gating=g, stats=st)
        assert np.all(st["kept"] == 1)
        assert np.allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max()), g


@pytest.mark.parametrize("arch", ["qwen3moe", "olmoe"])
def test_drop_perturbation_equals_gating_drop(arch):
    """top-2: perturb=(l, alpha=0) drops the lowest expert at layer l only, which is what
    sensitivity gating does with S_l = 0 (every token drops) and huge S elsewhere (none drops)."""
    m = RF.ReferenceModel(make_model("%s-F32" % arch, arch, "F32"))
    assert m.n_expert_used == 2
    for il in range(m.n_layer):
        sens = [1e30] * m.n_layer
        sens[il] = 0.0
        st_p, st_g, st_x = {}, {}, {}
        lp = m.forward(TOKENS, perturb=(il, 0.0), stats=st_p)
        lg = m.forward(TOKENS, gating=("sensitivity", 1.0, sens), stats=st_g)
        assert np.allclose(lp, lg, rtol=0, atol=1e-12 * np.abs(lg).max())
        assert np.all(st_g["kept"][il] == 1) and np.all(np.delete(st_g["kept"], il, axis=0) == 2)
        # d_t is the lowest of the step-2 weights of the unperturbed routing at that layer
        m.forward(TOKENS, stats=st_x)
        assert np.array_equal(st_p["dropped"], st_x["topk"][il].min(axis=1))


class CapturingModel(RF.ReferenceModel):
    """the reference forward, keeping each layer's MoE input xn"""

    def moe(self, il, x, record=None, wts=None):
        self.xn[il] = x.copy()
        return super().moe(il, x, record, wts)


def pregate_model(name="qwen3moe-F32-pregate", arch="qwen3moe", wtype="F32", n_layer=3):
    return make_model(name, arch, wtype, "--pregate", "--n-layer", str(n_layer))


@pytest.mark.parametrize("which", ["shipped", "pregate"])
def test_resumed_forward_is_the_full_forward_bitwise(which):
    """numpy_sensitivity resumes each perturbed forward after the layers it shares with the
    unperturbed one (reference_forward's checkpoints): the same bits as computing them again, for
    every perturbed layer, with and without a pre-gate (which routes layer il in layer il - 1:
    resuming at il would miss the perturbation, and must differ)."""
    if which == "shipped":
        ref = RF.ReferenceModel(SHIPPED, quantize_acts=True)
    else:
        ref = RF.ReferenceModel(pregate_model())
    saved = {}
    full = ref.forward(TOKENS, checkpoints=saved)
    assert sorted(saved) == list(range(ref.n_layer))
    assert np.array_equal(ref.forward(TOKENS, resume=(saved, ref.n_layer - 1)), full)
    for il in range(ref.n_layer):
        want, got = {}, {}
        start = ref.routed_in(il)
        logits = ref.forward(TOKENS, perturb=(il, 0.0), stats=want)
        assert np.array_equal(ref.forward(TOKENS, perturb=(il, 0.0), stats=got, resume=(saved, start)), logits)
        for key in ("kept", "topk", "dropped"):
            assert np.array_equal(got[key], want[key], equal_nan=True), (il, key)
        if start != il:
            assert not np.array_equal(ref.forward(TOKENS, perturb=(il, 0.0), resume=(saved, il)), logits)
    if which == "pregate":
        assert any(ref.pregate_name(il) for il in range(ref.n_layer))
    with pytest.raises(ValueError):
        ref.forward(TOKENS[:-1], resume=(saved, 1))


def test_make_tiny_model_pregate_tensors():
    plain = make_model("qwen3moe-F32-3l", "qwen3moe", "F32", "--n-layer", "3")
    pre = pregate_model()
    rp, rq = GGUFReader(plain), GGUFReader(pre)
    extra = sorted(set(rq.tensors) - set(rp.tensors))
    assert extra == ["blk.0.ffn_pregate_inp.weight", "blk.1.ffn_pregate_inp.weight"]
    assert not any("pregate" in n for n in rp.tensors)
    for n in extra:
        gate = rq.tensors[n.replace("pregate", "gate")]
        assert rq.tensors[n]["ne"] == gate["ne"] and rq.tensors[n]["type"] == gate["type"]
        assert 0.5 < rq.get(n).std() / rq.get(n.replace("pregate", "gate")).std() < 2
    for n in rp.tensors:               # the other tensors are unchanged by --pregate
        assert np.array_equal(np.asarray(rp.raw(n)), np.asarray(rq.raw(n))), n


def test_pregate_wiring():
    """layer 0 routes with its own router; layer N+1 with pregate_N applied to layer N's MoE
    input; a layer whose predecessor has no pregate tensor falls back to its own router."""
    path = pregate_model(n_layer=4, name="qwen3moe-F32-pregate-4l")
    m = CapturingModel(path)
    m.xn, rec = {}, []
    m.forward(TOKENS, record=rec)
    assert np.array_equal(rec[0], m.route(0, m.xn[0]))
    for il in range(m.n_layer - 1):
        want = m.route(il + 1, m.xn[il], router="blk.%d.ffn_pregate_inp.weight" % il)
        assert np.array_equal(rec[il + 1], want), il
        # it is a different routing than the layer's own router would give
        assert not np.array_equal(rec[il + 1], m.route(il + 1, m.xn[il + 1])), il
    # without blk.1's pregate tensor, layer 2 uses its own router (layers 1 and 3 stay pregated)
    holed = rewrite(path, os.path.join(TMP, "adaptive-pregate-hole.gguf"),
                    drop_tensors=("blk.1.ffn_pregate_inp.weight",))
    h = CapturingModel(holed)
    h.xn, rec = {}, []
    h.forward(TOKENS, record=rec)
    assert np.array_equal(rec[1], h.route(1, h.xn[0], router="blk.0.ffn_pregate_inp.weight"))
    assert np.array_equal(rec[2], h.route(2, h.xn[2]))
    assert np.array_equal(rec[3], h.route(3, h.xn[2], router="blk.2.ffn_pregate_inp.weight"))


def test_zero_pregate_router_gives_tied_uniform_routing():
    """all-zero pregate tensors: softmax is uniform, ties go to the lower expert index, so the
    pregated layers use experts 0..k-1 with weight 1/k (renormalised), whatever their own router."""
    src = pregate_model()
    dst = os.path.join(TMP, "adaptive-pregate-zero.gguf")
    shutil.copyfile(src, dst)
    r = GGUFReader(src)
    data = bytearray(open(dst, "rb").read())
    for n, t in r.tensors.items():
        if "pregate" in n:
            data[t["offset"]:t["offset"] + t["nbytes"]] = bytes(t["nbytes"])
    open(dst, "wb").write(bytes(data))
    m = RF.ReferenceModel(dst)
    rec = []
    m.forward(TOKENS, record=rec)
    k = m.n_expert_used
    for il in (1, 2):
        want = np.zeros((len(TOKENS), m.n_expert))
        want[:, :k] = 1.0 / k
        assert np.allclose(rec[il], want, rtol=1e-15, atol=0), il
    assert not np.allclose(rec[0][:, :k], 1.0 / k)


def test_reference_cli_gating_options():
    model = make_model("qwen3moe-F32", "qwen3moe", "F32")
    m = RF.ReferenceModel(model)
    sens = [0.5, 2.0]
    prof = write_profile(os.path.join(TMP, "adaptive-cli-profile.json"), m, sens)
    want = m.forward(TOKENS, gating=("sensitivity", 0.02, sens)).astype("<f4")
    toks = ",".join(map(str, TOKENS))
    for extra in (["--sensitivity", "0.5,2.0"], ["--profile", prof]):
        out = os.path.join(TMP, "adaptive-cli.f32")
        RF.main([model, "--tokens", toks, "--out", out, "--gating", "sensitivity", "--threshold", "0.02"] + extra)
        assert np.array_equal(np.fromfile(out, "<f4").reshape(want.shape), want)
    out = os.path.join(TMP, "adaptive-cli-perturb.f32")
    RF.main([model, "--tokens", toks, "--out", out, "--perturb", "1,0.5"])
    assert np.array_equal(np.fromfile(out, "<f4").reshape(want.shape),
                          m.forward(TOKENS, perturb=(1, 0.5)).astype("<f4"))


# ============================================================== engine: pre-gated routing (i)

@needs_engine
@pytest.mark.parametrize("wtype", ["F32", "Q8_0"])
def test_pregate_matches_reference(wtype):
    """3 layers: layer 1 is pregated by layer 0 and pregates layer 2."""
    model = pregate_model("qwen3moe-%s-pregate" % wtype, "qwen3moe", wtype)
    plain = make_model("qwen3moe-%s-3l" % wtype, "qwen3moe", wtype, "--n-layer", "3")
    quant = wtype != "F32"
    ref = RF.ReferenceModel(model, quantize_acts=quant).forward(TOKENS)
    tol = TIGHT_QUANT if quant else TIGHT_FLOAT
    err = nmse(engine_logits(model, TOKENS), ref)
    print("pregate %s: nmse %.3e" % (wtype, err))
    assert err < tol
    # an engine ignoring the pregate tensors would be far off
    assert nmse(RF.ReferenceModel(plain, quantize_acts=quant).forward(TOKENS).astype(np.float32), ref) > 100 * tol


def test_pregate_prediction_under_a_budget():
    """the pregate predictor hints the exact next-layer routing: token-by-token logits under a
    budget stay bitwise those of the resident run, and calibration measures its held-out
    accuracy as 1 on every pre-gated layer (nothing predicts layer 0)"""
    model = pregate_model("qwen3moe-Q8_0-pregate", "qwen3moe", "Q8_0")
    want = engine_logits(model, TOKENS_LONG, ["-b", "1"])
    for pred in ["pregate", "next-gate"]:
        got = engine_logits(model, TOKENS_LONG, ["-b", "1", "--budget", "30%", "--predictor", pred])
        assert np.array_equal(got, want), pred
    prof = calibrate(model, corpus_file(), os.path.join(TMP, "adaptive-pregate-profile.json"))
    acc = prof["predictor_accuracy"]["pregate"]
    assert acc[0] is None
    assert all(a == 1.0 for a in acc[1:]), acc
    # the router-reuse guess on a pre-gated model is not exact
    assert min(prof["predictor_accuracy"]["next-gate"][1:]) < 1.0


@needs_engine
def test_deepseek2_dense_blocks_calibrate_and_predict_under_a_budget():
    """deepseek2 with two leading dense blocks (no routing, no expert slots): calibration measures
    nothing for them and predicts the first layer that routes; every predictor, with the profile's
    DP allocation, keeps a budgeted token-by-token run bitwise equal to the resident one."""
    model = make_model("deepseek2-dense2-Q8_0", "deepseek2", "Q8_0", "--dense-lead", "2", "--n-layer", "4",
                       "--gating", "sigmoid", "--probs-bias", "--weights-norm")
    prof_path = os.path.join(TMP, "adaptive-deepseek2-dense2.profile.json")
    prof = calibrate(model, corpus_file(), prof_path)
    sens = profile_values(prof, "sensitivity")
    assert sens[0] == sens[1] == 0.0 and min(sens[2:]) > 0.0
    first = prof["predictor_accuracy"]["first-layer"]
    assert first[0] is None and first[1] is None and first[2] is not None
    assert all(a is None for a in prof["predictor_accuracy"]["next-gate"][:3])
    want = engine_logits(model, TOKENS_LONG, ["-b", "1"])
    for pred in ["next-gate", "first-layer", "learned", "correlation"]:
        got = engine_logits(model, TOKENS_LONG, ["-b", "1", "--budget", "50%", "--predictor", pred,
                                                 "--profile", prof_path, "--allocation", "dp"])
        assert np.array_equal(got, want), pred


# ============================================================== engine: adaptive gating (ii)

SCORE_T = 0.3
GATING_CASES = [  # (name, arch, extra make_tiny_model args)
    ("qwen3moe", "qwen3moe", ()),                                   # renormalised top-2
    ("olmoe", "olmoe", ()),                                         # raw softmax weights
    ("llama", "llama", ()),
    ("qwen2moe", "qwen2moe", ()),                                   # + shared expert
    ("qwen3moe-k4", "qwen3moe", ("--n-expert-used", "4", "--n-layer", "3")),  # several drops
    ("olmoe-k4", "olmoe", ("--n-expert-used", "4")),
    # sigmoid scores, a selection bias, expert groups, renormalised and scaled: gating acts on the
    # final weights whatever the gating function
    ("deepseek2-v3", "deepseek2", ("--q-lora", "256", "--gating", "sigmoid", "--probs-bias", "--expert-groups", "4",
                                   "--groups-used", "2", "--weights-norm", "--weights-scale", "2.5",
                                   "--dense-lead", "0")),
]


def gating_model(case):
    name, arch, extra = case
    return make_model(name + "-F32", arch, "F32", *extra)


def check_not_vacuous(st, k):
    """a good fraction of (token, layer) pairs drop at least one expert, but not all; with k > 2
    some drop more than one"""
    dropping = float((st["kept"] < k).mean())
    assert 0.1 <= dropping <= 0.9, "fraction of tokens dropping experts: %.2f" % dropping
    if k > 2:
        assert st["kept"].min() < k - 1, "no token drops more than one expert"
    return dropping


@needs_engine
@pytest.mark.parametrize("case", [c for c in GATING_CASES if not c[0].endswith("k4")], ids=lambda c: c[0])
def test_score_gating_matches_reference(case):
    model = gating_model(case)
    ref = RF.ReferenceModel(model)
    gating = ("score", SCORE_T)
    st = {}
    want = ref.forward(TOKENS_LONG, gating=gating, stats=st)
    dropping = check_not_vacuous(st, ref.n_expert_used)
    assert threshold_margin(st["topk"], gating) > MARGIN_FLOAT
    err = nmse(engine_logits(model, TOKENS_LONG, ["--gating", "score", "--threshold", repr(SCORE_T)]), want)
    print("%s score %.2f: %.0f%% of tokens drop, nmse %.3e" % (case[0], SCORE_T, 100 * dropping, err))
    assert err < TIGHT_FLOAT


def sensitivity_setup(ref, tokens, sens):
    """T between the 30 % and 70 % quantiles of the first drop test's value w_lowest^2 * S_l
    under exact routing, then the gated run's stats"""
    st = {}
    ref.forward(tokens, stats=st)
    first = compared_values(st["topk"], ("sensitivity", 0.0, sens))[..., 0]
    gating = ("sensitivity", pick_threshold(first), list(sens))
    st = {}
    logits = ref.forward(tokens, gating=gating, stats=st)
    return gating, logits, st


@needs_engine
@pytest.mark.parametrize("case", GATING_CASES, ids=lambda c: c[0])
def test_sensitivity_gating_matches_reference(case):
    model = gating_model(case)
    ref = RF.ReferenceModel(model)
    sens = [0.5 * 3.0 ** il for il in range(ref.n_layer)]  # distinct per layer: indexing matters
    gating, want, st = sensitivity_setup(ref, TOKENS_LONG, sens)
    dropping = check_not_vacuous(st, ref.n_expert_used)
    assert threshold_margin(st["topk"], gating) > MARGIN_FLOAT
    prof = write_profile(os.path.join(TMP, "adaptive-%s.profile.json" % case[0]), ref, sens)
    got = engine_logits(model, TOKENS_LONG, ["--gating", "sensitivity", "--threshold", repr(gating[1]),
                                             "--profile", prof])
    err = nmse(got, want)
    print("%s sensitivity T=%.4g: %.0f%% of tokens drop, kept %s, nmse %.3e"
          % (case[0], gating[1], 100 * dropping, np.bincount(st["kept"].ravel()).tolist(), err))
    assert err < TIGHT_FLOAT


@needs_engine
@pytest.mark.parametrize("case", [GATING_CASES[0], GATING_CASES[3]], ids=lambda c: c[0])
def test_cache_aware_gating_without_budget_is_sensitivity(case):
    """no budget: every expert is resident, so cache-aware gating (any penalty) is the reference's
    sensitivity gating, and the engine's sensitivity logits bit for bit"""
    model = gating_model(case)
    ref = RF.ReferenceModel(model)
    sens = [0.5 * 3.0 ** il for il in range(ref.n_layer)]
    gating, want, st = sensitivity_setup(ref, TOKENS_LONG, sens)
    check_not_vacuous(st, ref.n_expert_used)
    prof = write_profile(os.path.join(TMP, "adaptive-ca-%s.profile.json" % case[0]), ref, sens)
    opts = ["--threshold", repr(gating[1]), "--profile", prof]
    aware = engine_logits(model, TOKENS_LONG, ["--gating", "cache-aware", "--gating-penalty", "50", *opts])
    assert nmse(aware, want) < TIGHT_FLOAT
    sensitivity = engine_logits(model, TOKENS_LONG, ["--gating", "sensitivity", *opts])
    assert np.array_equal(aware.view(np.uint32), sensitivity.view(np.uint32))


@needs_engine
@pytest.mark.parametrize("edit", ["format", "n_layer", "n_expert", "layers"])
def test_profile_for_another_model_is_rejected(edit):
    model = gating_model(GATING_CASES[0])
    ref = RF.ReferenceModel(model)
    path = write_profile(os.path.join(TMP, "adaptive-bad-%s.json" % edit), ref, [1.0] * ref.n_layer)
    prof = json.load(open(path))
    if edit == "format":
        prof["format"] = "something-else"
    elif edit == "layers":
        prof["layers"] = prof["layers"][:-1]
    else:
        prof["model"][edit] += 1
    json.dump(prof, open(path, "w"))
    r = run([BIN, "logits", "-m", model, "--tokens", "1,2,3", "--out", path + ".f32", "--gating", "sensitivity",
             "--threshold", "0.01", "--profile", path], check=False)
    assert r.returncode != 0, "a profile with a wrong %s was accepted" % edit


# ============================================================== engine: calibration (iii)

def check_profile_shape(prof, ref):
    assert prof["format"] == "moelite-profile" and prof["version"] == 1
    assert [r["layer"] for r in prof["layers"]] == list(range(ref.n_layer))
    assert prof["model"]["n_layer"] == ref.n_layer and prof["model"]["n_expert"] == ref.n_expert
    assert prof["model"]["n_expert_used"] == ref.n_expert_used and prof["model"]["n_embd"] == ref.n_embd


@pytest.fixture(scope="module")
def shipped_calibration():
    """calibrate on the shipped Q8_0 model, and the numpy estimator on the same tokens/windows
    with activation quantization emulated"""
    corpus = corpus_file()
    tokens = tokenize(SHIPPED, corpus)[:CAL_MAX_TOKENS]
    assert len(tokens) == CAL_MAX_TOKENS
    prof = calibrate(SHIPPED, corpus, os.path.join(TMP, "adaptive-shipped.profile.json"))
    ref = RF.ReferenceModel(SHIPPED, quantize_acts=True)
    return dict(prof=prof, ref=ref, tokens=tokens,
                drop=numpy_sensitivity(ref, tokens, CAL_CTX, 0.0),
                fd=numpy_sensitivity(ref, tokens, CAL_CTX, FD_ALPHA))


# Engine vs numpy for the SAME estimator on the quantized model. Dropping the lowest expert
# (alpha = 0) moves the output far more than activation rounding does: stable to < 1 % when the
# reference's arithmetic is disturbed at float32 level (measured spread <= 0.6 %; engine vs numpy
# measured: 0.02 %, 0.15 %, 0.03 %, 0.04 % for layers 0..3).
# The 10 % finite difference is not: its KL is ~100x smaller, so it is dominated by rare
# discontinuities (a downstream top-k choice or an int8 rounding of an activation flipping between
# P and Q runs), and an activation-rounding flip between engine and reference (they occur: engine vs
# reference nmse ~1e-6 on these windows) cascades into different ones. Perturbing the reference's
# matmul outputs by 3e-8..3e-7 relative moved the numpy S^fd by up to 12 % (layers 0, 1) and 36 %
# (layer 2) at 512 tokens; the engine measured -12.3 %, -0.3 %, -0.3 %, -1.4 % (S^fd engine 0.864,
# 0.172, 0.0796, 0.0937 vs numpy 0.985, 0.172, 0.0798, 0.0950). Hence a loose bound here, and the
# 10 % comparison of the same quantity on the float copy below, where no activation rounding exists
# (measured there: engine and numpy agree to 1e-6 relative for S and S^fd in every layer).
DROP_REL_TOL = 0.05
FD_REL_TOL_QUANT = 0.5
FD_REL_TOL_FLOAT = 0.10
# (b) AdapMoE's rule models the KL as quadratic in the dropped weight, so S from dropping the
# expert (alpha = 0) and from the 10 % finite difference should agree up to the curvature. This is
# a property of the model, not of the engine ((a) and the drop estimator check the engine): a
# sanity bound that the two estimators measure the same thing. Measured (shipped Q8_0, 2 048-position
# model, 512 tokens): engine S / numpy S_fd = 0.59, 0.60, 0.22, 1.82 for layers 0..3 (engine
# S = 0.599, 0.070, 0.077, 0.136; numpy S_fd = 1.018, 0.116, 0.351, 0.075): layer 2's KL saturates
# (a 10 % cut costs more per unit of weight than the whole expert). The 256-position model it
# replaced measured 0.85, 0.65, 1.02, 1.66.
QUADRATIC_FACTOR = 5.0


@needs_engine
def test_calibrate_sensitivity_vs_finite_differences(shipped_calibration):
    c = shipped_calibration
    check_profile_shape(c["prof"], c["ref"])
    s_eng = profile_values(c["prof"], "sensitivity")
    fd_eng = profile_values(c["prof"], "sensitivity_fd")
    print("engine S   ", s_eng, "\nnumpy S    ", c["drop"])
    print("engine S_fd", fd_eng, "\nnumpy S_fd ", c["fd"], "\nS / numpy S_fd", s_eng / c["fd"])
    assert np.all(s_eng > 0) and np.all(np.isfinite(s_eng))                                  # (c)
    assert np.all(np.abs(s_eng / c["drop"] - 1) < DROP_REL_TOL), "drop estimator differs"
    assert np.all(np.abs(fd_eng / c["fd"] - 1) < FD_REL_TOL_QUANT), "finite difference differs"  # (a)
    ratio = s_eng / c["fd"]
    assert np.all((ratio > 1 / QUADRATIC_FACTOR) & (ratio < QUADRATIC_FACTOR)), ratio       # (b)


@needs_engine
def test_calibrate_matches_reference_on_float_copy():
    """(a) at full strength: the shipped model dequantized to F32, where engine and reference
    agree to float rounding, so the finite-difference KL is not rounding noise."""
    model = dequantized_copy(SHIPPED, os.path.join(TMP, "adaptive-shipped-F32.gguf"))
    corpus = corpus_file()
    tokens = tokenize(model, corpus)[:CAL_MAX_TOKENS]
    prof = calibrate(model, corpus, os.path.join(TMP, "adaptive-shipped-F32.profile.json"))
    ref = RF.ReferenceModel(model)
    check_profile_shape(prof, ref)
    drop, fd = numpy_sensitivity(ref, tokens, CAL_CTX, 0.0), numpy_sensitivity(ref, tokens, CAL_CTX, FD_ALPHA)
    s_eng, fd_eng = profile_values(prof, "sensitivity"), profile_values(prof, "sensitivity_fd")
    print("float copy: engine S", s_eng, "numpy", drop, "\n            engine S_fd", fd_eng, "numpy", fd)
    assert np.all(np.abs(s_eng / drop - 1) < DROP_REL_TOL)
    assert np.all(np.abs(fd_eng / fd - 1) < FD_REL_TOL_FLOAT)


@needs_engine
def test_calibrated_profile_drives_sensitivity_gating(shipped_calibration):
    """calibrate's own profile read back by `logits --gating sensitivity --profile` (Q8_0)"""
    c = shipped_calibration
    path = os.path.join(TMP, "adaptive-shipped.profile.json")
    sens = RF.read_profile_sensitivity(path)
    ref, tokens = c["ref"], c["tokens"][:48]
    gating, want, st = sensitivity_setup(ref, tokens, sens)
    check_not_vacuous(st, ref.n_expert_used)
    assert threshold_margin(st["topk"], gating) > MARGIN_QUANT
    got = engine_logits(SHIPPED, tokens, ["--gating", "sensitivity", "--threshold", repr(gating[1]),
                                          "--profile", path])
    err = nmse(got, want)
    print("calibrated profile, T=%.4g: kept %s, nmse %.3e" % (gating[1], np.bincount(st["kept"].ravel()), err))
    assert err < TIGHT_QUANT
