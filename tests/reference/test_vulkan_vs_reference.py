"""The Vulkan backend end to end: `moelite logits --backend vulkan` against the independent numpy
float64 reference for every architecture x weight type, with the Khronos validation layer on
(any validation message fails), the memory-budgeted expert store on Vulkan, and bench.

The Vulkan shaders decode weights exactly (the same integer codes and fp16 scales as the
reference) and compute in float32 without quantizing activations, so they are compared with the
reference's plain float64 forward at the float tolerance TIGHT_FLOAT (1e-9 normalised MSE; float32
against float64 rounding measures ~1e-13). The CPU backend, which quantizes activations for
quantized weights (as ggml does), is only required to agree within LOOSE.

Skipped when this build or machine has no Vulkan device (in CI lavapipe provides one).
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
from test_engine_vs_reference import (BIN, DEVICE_MATRIX, LOOSE, TIGHT_FLOAT, TOKENS, engine_logits,  # noqa: E402
                                      make_model, nmse, reference_logits)

ROOT = os.path.dirname(os.path.dirname(HERE))
SHIPPED = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
ENV = dict(os.environ, MOELITE_VK_VALIDATION="1")


def vulkan_run(args):
    r = subprocess.run([BIN, *args, "--backend", "vulkan"], capture_output=True, text=True, env=ENV)
    assert "vulkan validation" not in r.stderr, "validation messages:\n" + r.stderr[-3000:]
    return r


def available():
    r = subprocess.run([BIN, "info", "-m", SHIPPED, "--backend", "vulkan"], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


AVAILABLE, WHY = available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason="no Vulkan backend/device: " + WHY)


def vulkan_logits(model, tokens=TOKENS, extra=()):
    out = model + ".vulkan.f32"
    r = vulkan_run(["logits", "-m", model, "--tokens", ",".join(map(str, tokens)), "--out", out, *extra])
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)


@pytest.mark.parametrize("arch,wtype", DEVICE_MATRIX)
def test_vulkan_logits_match_reference(arch, wtype):
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    vk = vulkan_logits(model)
    ref = reference_logits(model, quantize=False)
    err = nmse(vk, ref)
    # The CPU backend quantizes activations for quantized weights: it agrees within LOOSE.
    cpu_err = nmse(vk, engine_logits(model, extra=("--backend", "cpu")).astype(np.float64))
    print("%s %s: vulkan vs float64 reference nmse %.3e, vs cpu backend %.3e" % (arch, wtype, err, cpu_err))
    assert err < TIGHT_FLOAT
    assert cpu_err < LOOSE
    assert (vk.argmax(axis=1) == ref.argmax(axis=1)).all()


def test_vulkan_agrees_with_cpu_on_the_shipped_model():
    cpu_out = SHIPPED + ".cpu-vs-vk.f32"
    subprocess.run([BIN, "logits", "-m", SHIPPED, "--tokens", ",".join(map(str, TOKENS)), "--out", cpu_out,
                    "--backend", "cpu"], check=True, capture_output=True)
    cpu = np.fromfile(cpu_out, dtype="<f4").reshape(len(TOKENS), -1)
    os.remove(cpu_out)
    vk = vulkan_logits(SHIPPED)
    os.remove(SHIPPED + ".vulkan.f32")
    assert nmse(vk, cpu.astype(np.float64)) < LOOSE


def test_batching_and_the_expert_budget_do_not_change_vulkan_results():
    """Token by token equals batched; the budgeted store (experts copied from host slots per use)
    equals everything resident, bitwise, at 25 % and with a predictor."""
    model = make_model("qwen2moe-Q4_K", "qwen2moe", "Q4_K")
    whole = vulkan_logits(model)
    np.testing.assert_array_equal(whole, vulkan_logits(model, extra=["-b", "1"]))
    np.testing.assert_array_equal(whole, vulkan_logits(model, extra=["--budget", "40%"]))
    np.testing.assert_array_equal(whole, vulkan_logits(model, extra=["-b", "1", "--budget", "40%", "--predictor",
                                                                      "next-gate"]))


def test_budgeted_slots_are_device_memory_on_unified_memory_devices():
    """lavapipe (like integrated GPUs) has host-visible device memory: the store's slots live there
    and the shaders read experts where the loads put them (no copy); results stay bitwise."""
    model = make_model("qwen3moe-Q8_0", "qwen3moe", "Q8_0")
    r = vulkan_run(["logits", "-m", model, "--tokens", ",".join(map(str, TOKENS)), "--out", model + ".zc.f32",
                    "--budget", "40%", "--verbose"])
    assert r.returncode == 0, r.stderr
    if "unified memory" in r.stderr:
        assert "slots in device-visible memory" in r.stderr, r.stderr
    np.testing.assert_array_equal(np.fromfile(model + ".zc.f32", dtype="<f4").reshape(len(TOKENS), -1),
                                  vulkan_logits(model))


def test_discrete_device_paths_give_the_same_logits():
    """With device memory unmapped (as on a discrete GPU) weights, inputs and read-backs go through
    staging buffers, and budgeted experts go through the device tier of expert slots: logits are
    bitwise the same."""
    model = make_model("olmoe-Q5_K", "olmoe", "Q5_K")
    want = vulkan_logits(model)
    old = ENV.get("MOELITE_VK_AS_DISCRETE")
    ENV["MOELITE_VK_AS_DISCRETE"] = "1"
    try:
        np.testing.assert_array_equal(want, vulkan_logits(model))
        np.testing.assert_array_equal(want, vulkan_logits(model, extra=["--budget", "40%", "-b", "2"]))
        # The device tier of expert slots is filled on the transfer queue and then hit.
        r = vulkan_run(["logits", "-m", model, "--tokens", ",".join(map(str, TOKENS)), "--out", model + ".tier.f32",
                        "--budget", "40%", "-b", "1", "--verbose"])
        assert r.returncode == 0, r.stderr
        assert "device expert tier of" in r.stderr and "timeline semaphores" in r.stderr, r.stderr
        hits = int(r.stderr.split("device expert tier: ")[1].split(" hits")[0])
        assert hits > 0, r.stderr
        np.testing.assert_array_equal(want, np.fromfile(model + ".tier.f32", dtype="<f4").reshape(len(TOKENS), -1))
    finally:
        if old is None:
            del ENV["MOELITE_VK_AS_DISCRETE"]
        else:
            ENV["MOELITE_VK_AS_DISCRETE"] = old


def test_vulkan_bench_and_auto_choice():
    r = vulkan_run(["bench", "-m", SHIPPED, "-p", "16", "-n", "4", "--json", "--no-membw"])
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["backend"].startswith("vulkan") and d["decode_tok_s"] > 0 and d["prefill_tok_s"] > 0
    # "auto" never picks a CPU implementation of Vulkan (lavapipe) over the CPU backend.
    info = subprocess.run([BIN, "info", "-m", SHIPPED, "--json", "--backend", "auto"], capture_output=True, text=True)
    backend = json.loads(info.stdout)["backend"]
    if "llvmpipe" in r.stdout or "lavapipe" in r.stdout or "llvmpipe" in d["backend"]:
        assert backend.startswith("cpu"), backend
