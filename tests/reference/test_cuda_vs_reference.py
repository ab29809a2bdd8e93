"""The CUDA backend end to end, through the SIMT emulator (MOELITE_CUDA_EMULATOR): the kernels'
own source compiled for the CPU, on an emulated device whose streams run only when waited for.
`moelite logits --backend cuda` against the independent numpy float64 reference for every
architecture x weight type; batched vs token by token and budgeted vs resident bitwise, on an
emulated integrated GPU (zero-copy expert slots) and a discrete one (a device tier of expert
slots filled on a copy stream); and the reason given without a device.

On a machine with a CUDA GPU the `gpu` tests run the same checks on it (the kernels nvcc compiled
into the library's fatbin), and compare it with the emulator; elsewhere they are skipped.

Float weights are computed in float32 and compared with the reference's plain float64 forward at
TIGHT_FLOAT, as the Vulkan backend's are. Quantized weights are integer products of activations
quantized as the CPU backend quantizes them (MOELITE_CUDA_PRODUCTS=int8, the default), so they
are compared with the reference that emulates that quantization at TIGHT_QUANT, as the CPU is
(and with the CPU backend itself); MOELITE_CUDA_PRODUCTS=float keeps the float kernels, which
still match the plain float64 forward at TIGHT_FLOAT.
Environment: MOELITE_BIN, MOELITE_TEST_TMP.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_engine_vs_reference import (BIN, DEVICE_MATRIX, FLOAT_TYPES, LOOSE, SANITIZED, TIGHT_FLOAT,  # noqa: E402
                                      TIGHT_QUANT, TMP, TOKENS, engine_logits, make_model, nmse, reference_logits)

ROOT = os.path.dirname(os.path.dirname(HERE))
SHIPPED = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")


def run(args, device="integrated", products=None):
    """device: an emulated one ("integrated", "discrete"), or "gpu" / None for a real GPU;
    products: MOELITE_CUDA_PRODUCTS (None: the default, int8)."""
    env = dict(os.environ)
    env.pop("MOELITE_CUDA_EMULATOR", None)
    env.pop("MOELITE_CUDA_PRODUCTS", None)
    if device and device != "gpu":
        env["MOELITE_CUDA_EMULATOR"] = device
    if products:
        env["MOELITE_CUDA_PRODUCTS"] = products
    return subprocess.run([BIN, *args, "--backend", "cuda"], capture_output=True, text=True, env=env)


def built():
    r = run(["info", "-m", SHIPPED])
    return r.returncode == 0 or "no CUDA backend" not in r.stderr, r.stderr.strip()


BUILT, WHY = built()
pytestmark = pytest.mark.skipif(not BUILT, reason="built without the CUDA backend: " + WHY)


def gpu_present():
    r = run(["info", "-m", SHIPPED], "gpu")
    return r.returncode == 0, r.stderr.strip()[-300:]


GPU, WHY_NO_GPU = gpu_present() if BUILT else (False, WHY)
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA GPU: " + WHY_NO_GPU)
# Parameters for tests that run on the emulated devices and, where there is one, a real GPU.
WITH_GPU = [pytest.param("gpu", marks=needs_gpu)]


def cuda_logits(model, device="integrated", extra=(), tokens=TOKENS, products=None):
    out = os.path.join(TMP, "%s.cuda-%s.f32" % (os.path.basename(model), device))
    r = run(["logits", "-m", model, "--tokens", ",".join(map(str, tokens)), "--out", out, *extra], device, products)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)


def expected(model, wtype, tokens=TOKENS):
    """The reference a type's logits are held to, and the tolerance (see the module's docstring)."""
    if wtype in FLOAT_TYPES:
        return reference_logits(model, quantize=False, tokens=tokens), TIGHT_FLOAT
    return reference_logits(model, quantize=True, tokens=tokens), TIGHT_QUANT


@pytest.mark.parametrize("arch,wtype", DEVICE_MATRIX)
def test_cuda_logits_match_reference(arch, wtype):
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    got = cuda_logits(model)
    ref, tol = expected(model, wtype)
    err = nmse(got, ref)
    cpu_err = nmse(got, engine_logits(model, extra=("--backend", "cpu")).astype(np.float64))
    print("%s %s: cuda (emulated) vs float64 reference nmse %.3e, vs cpu backend %.3e" % (arch, wtype, err, cpu_err))
    assert err < tol
    # Quantized: both quantize activations alike, so they agree as each agrees with the reference
    # (a code that rounds the other way after float-order differences upstream is within it).
    assert cpu_err < (LOOSE if wtype in FLOAT_TYPES else TIGHT_QUANT)
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() >= (1.0 if wtype in FLOAT_TYPES else 0.9)


@pytest.mark.parametrize("wtype", ["Q8_0", "Q4_K", "Q5_1", "MXFP4"])
def test_cuda_float_products_still_match_the_plain_reference(wtype):
    """MOELITE_CUDA_PRODUCTS=float: the float kernels (weights decoded to floats, activations not
    quantized), which the int8 ones replace by default, against the plain float64 forward."""
    arch = "gpt-oss" if wtype == "MXFP4" else "qwen3moe"
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    got = cuda_logits(model, products="float")
    assert nmse(got, reference_logits(model, quantize=False)) < TIGHT_FLOAT


@needs_gpu
@pytest.mark.parametrize("arch,wtype", DEVICE_MATRIX)
def test_gpu_logits_match_reference_and_the_emulator(arch, wtype):
    """The same matrix on a real GPU: the fatbin's kernels against the float64 reference at the same
    tolerance, and against the emulator's float32 results (not bitwise: nvcc contracts a * b + c
    into fused multiply-adds, the host compiler here does not)."""
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    got = cuda_logits(model, "gpu")
    ref, tol = expected(model, wtype)
    err = nmse(got, ref)
    emu_err = nmse(got, cuda_logits(model, "integrated").astype(np.float64))
    print("%s %s: cuda (gpu) vs float64 reference nmse %.3e, vs the emulator %.3e" % (arch, wtype, err, emu_err))
    assert err < tol
    assert emu_err < TIGHT_FLOAT
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() >= (1.0 if wtype in FLOAT_TYPES else 0.9)


@pytest.mark.parametrize("device", ["integrated"] + WITH_GPU)
@pytest.mark.parametrize("variant", ["tied", "per-expert-tensors", "gqa1", "pregate", "long-context"])
def test_cuda_layout_variants(variant, device):
    """Tied output, the old per-expert Mixtral layout, one KV head, a pre-gated router, and a
    prompt longer than one chunk of the split attention, against the float64 reference."""
    extra = {"tied": ["--tied"], "per-expert-tensors": ["--per-expert-tensors"], "gqa1": ["--n-head-kv", "1"],
             "pregate": ["--pregate", "--n-layer", "3"], "long-context": ["--ctx", "1024"]}[variant]
    if SANITIZED and variant == "long-context":
        # 310 positions through the emulated device took 69 s of the sanitized run's CUDA minutes; its
        # instrumented coverage is CudaOps' attention tests (prompts of 300 and 600: two and three
        # chunks), which run whole there. The plain build runs it.
        pytest.skip("sanitized build: the split attention's chunks are covered by the CudaOps tests")
    arch = "llama" if variant == "per-expert-tensors" else "qwen3moe"
    model = make_model("cuda-variant-" + variant, arch, "Q4_K", *extra)
    tokens = TOKENS * 31 if variant == "long-context" else TOKENS  # 310 positions: two chunks
    got = cuda_logits(model, device, tokens=tokens)
    ref, tol = expected(model, "Q4_K", tokens)
    assert nmse(got, ref) < tol
    if variant == "pregate":  # routing from the pre-gate of the layer before
        np.testing.assert_array_equal(got, cuda_logits(model, device, ["--budget", "40%", "--predictor", "pregate"]))


BATCHING_MODELS = [("qwen2moe", "Q4_K"), ("olmoe", "Q5_0"), ("llama", "Q6_K"), ("qwen3moe", "BF16")]
# Each model on both emulated devices (and a real GPU); under the sanitizers each model on one of
# the two, in turn (the discrete case also compares with the integrated device).
if SANITIZED:
    BATCHING_CASES = [(("integrated", "discrete")[i % 2], a, t) for i, (a, t) in enumerate(BATCHING_MODELS)]
else:
    BATCHING_CASES = [(d, a, t) for a, t in BATCHING_MODELS for d in ("integrated", "discrete")]
BATCHING_CASES += [pytest.param("gpu", a, t, marks=needs_gpu) for a, t in BATCHING_MODELS]


@pytest.mark.parametrize("device,arch,wtype", BATCHING_CASES)
def test_batching_and_the_expert_budget_do_not_change_cuda_results(device, arch, wtype):
    """Token by token equals batched; the budgeted store (zero-copy slots on the integrated device,
    the device tier on the discrete one) equals everything resident, bitwise, at 40 % and with a
    predictor."""
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    whole = cuda_logits(model, device)
    np.testing.assert_array_equal(whole, cuda_logits(model, device, ["-b", "1"]))
    np.testing.assert_array_equal(whole, cuda_logits(model, device, ["--budget", "40%"]))
    np.testing.assert_array_equal(whole, cuda_logits(model, device, ["-b", "3", "--budget", "40%", "--predictor",
                                                                     "next-gate"]))
    if device == "discrete":
        np.testing.assert_array_equal(whole, cuda_logits(model, "integrated"))


def test_the_devices_say_how_budgeted_experts_reach_the_kernels():
    model = make_model("qwen3moe-Q8_0", "qwen3moe", "Q8_0")
    args = ["logits", "-m", model, "--tokens", ",".join(map(str, TOKENS)), "--out", model + ".v.f32", "--budget",
            "40%", "-b", "1", "--verbose"]
    r = run(args, "integrated")
    assert r.returncode == 0, r.stderr
    assert "zero copy" in r.stderr and "slots in device-visible memory" in r.stderr, r.stderr
    r = run(args, "discrete")
    assert r.returncode == 0, r.stderr
    assert "device expert tier of" in r.stderr, r.stderr
    hits = int(r.stderr.split("slots: ")[1].split(" hits")[0])
    loads = int(r.stderr.split(" hits, ")[1].split(" loads")[0])
    assert loads > 0 and hits > 0, r.stderr
    if GPU:  # a real GPU says which of the two it is (a Jetson: zero copy; a PCIe card: the tier)
        r = run(args, "gpu")
        assert r.returncode == 0, r.stderr
        assert "zero copy" in r.stderr or "device expert tier of" in r.stderr, r.stderr


def test_without_a_device_or_the_emulator_the_backend_is_unavailable_with_a_reason():
    r = run(["logits", "-m", SHIPPED, "--tokens", "1,2", "--out", os.path.join(TMP, "none.f32")], device=None)
    if r.returncode == 0:
        pytest.skip("this machine has a CUDA device")
    assert "MOELITE_ERR_BACKEND_UNAVAILABLE" in r.stderr, r.stderr
    assert "CUDA" in r.stderr and "MOELITE_CUDA_EMULATOR" in r.stderr, r.stderr
    r = run(["info", "-m", SHIPPED], device="sideways")
    assert r.returncode != 0 and "MOELITE_CUDA_EMULATOR" in r.stderr, r.stderr


@pytest.mark.parametrize("device", ["integrated"] + WITH_GPU)
def test_cuda_bench_and_the_shipped_model(device):
    os.makedirs(TMP, exist_ok=True)
    cpu_out = os.path.join(TMP, "shipped.cpu-vs-cuda.f32")
    subprocess.run([BIN, "logits", "-m", SHIPPED, "--tokens", ",".join(map(str, TOKENS)), "--out", cpu_out,
                    "--backend", "cpu"], check=True, capture_output=True)
    cpu = np.fromfile(cpu_out, dtype="<f4").reshape(len(TOKENS), -1)
    os.remove(cpu_out)
    assert nmse(cuda_logits(SHIPPED, device), cpu.astype(np.float64)) < LOOSE
    r = run(["bench", "-m", SHIPPED, "-p", "8", "-n", "4", "-r", "1", "--json"], device)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["backend"].startswith("cuda") and d["decode_tok_s"] > 0 and d["prefill_tok_s"] > 0
    # The decode bound comes from the device's own memory, measured in the same run.
    assert d["bound_memory"] == "device" and d["device_memory_gb_s"] > (20 if device == "gpu" else 0), d
    # Written with 4 significant digits: the shipped model on an H200 decodes at 4e-4 of its bound
    # (with 3 decimals that read 0.000).
    assert d["decode_bound_tok_s"] > 0 and 0 < d["decode_fraction_of_bound"], d
