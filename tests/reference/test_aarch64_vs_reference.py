"""The aarch64 build under qemu-user against the numpy reference and the x86-64 build: every
architecture x weight type on one NEON dispatch path, every weight type on each of the others.

tools/test_aarch64.sh runs this after the cross build. qemu's CPU model decides which kernel table
the aarch64 library dispatches to (getauxval HWCAP/HWCAP2): cortex-a53 is ARMv8.0 (table "neon"),
cortex-a76 adds the dot-product instructions ("dotprod"), max adds the int8 matrix multiply
("i8mm"). Each run's backend name is checked, so a dispatch that silently fell back to another table
fails the test instead of testing the wrong kernels.

Tolerances are test_engine_vs_reference's (see its docstring): the aarch64 engine quantizes
activations exactly as the x86-64 one does, so against the activation-emulating float64 reference
the same TIGHT_FLOAT / TIGHT_QUANT bounds hold; between the two builds only float32 summation order
(and the rare int8 rounding flip it can cause) differs, so the same bounds apply there too.

Environment: MOELITE_BIN (x86-64 CLI), MOELITE_BIN_AARCH64 (aarch64 CLI), MOELITE_AARCH64_SYSROOT
(default /usr/aarch64-linux-gnu), MOELITE_TEST_TMP.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_engine_vs_reference import (ARCHS, BLOCK_ONLY_ARCHS, BIN, TMP, TOKENS, TYPES, engine_logits, make_model,  # noqa: E402
                                      nmse, reference_logits, tight)

ARM_BIN = os.environ.get("MOELITE_BIN_AARCH64", "")
SYSROOT = os.environ.get("MOELITE_AARCH64_SYSROOT", "/usr/aarch64-linux-gnu")
# qemu CPU model -> the kernel table the library must pick on it.
CPUS = {"cortex-a53": "neon", "cortex-a76": "dotprod", "max": "i8mm"}

pytestmark = pytest.mark.skipif(not ARM_BIN, reason="MOELITE_BIN_AARCH64 not set (run tools/test_aarch64.sh)")


def qemu(cpu, args):
    env = dict(os.environ, QEMU_CPU=cpu)
    return subprocess.run(["qemu-aarch64", "-L", SYSROOT, ARM_BIN, *args], capture_output=True, text=True, env=env)


def arm_logits(model, cpu, extra=()):
    out = "%s.%s.f32" % (model, cpu)
    r = qemu(cpu, ["logits", "-m", model, "-t", "2", "--tokens", ",".join(map(str, TOKENS)), "--out", out, *extra])
    assert r.returncode == 0, "aarch64 moelite under qemu -cpu %s failed (%d):\n%s" % (cpu, r.returncode, r.stderr)
    return np.fromfile(out, dtype="<f4").reshape(len(TOKENS), -1)


@pytest.mark.parametrize("cpu", sorted(CPUS))
def test_dispatch_follows_the_cpu(cpu):
    model = make_model("qwen3moe-Q8_0", "qwen3moe", "Q8_0")
    r = qemu(cpu, ["info", "-m", model, "--backend", "cpu"])
    assert r.returncode == 0, r.stderr
    assert "cpu (%s)" % CPUS[cpu] in r.stdout, r.stdout
    # MOELITE_ISA caps the choice, as on x86-64.
    env_cap = dict(os.environ, QEMU_CPU=cpu, MOELITE_ISA="neon")
    r = subprocess.run(["qemu-aarch64", "-L", SYSROOT, ARM_BIN, "info", "-m", model, "--backend", "cpu"],
                       capture_output=True, text=True, env=env_cap)
    assert r.returncode == 0 and "cpu (neon)" in r.stdout, r.stdout + r.stderr


# Every arch x type, and MXFP4 (whose NEON decoder serves all three tables) on one arch, on the
# dot-product table (cortex-a76; Jetson Orin's Cortex-A78AE has the same extensions). The other two
# tables run every type on one arch: the architectures' own code is the same C++ on every table, so
# the kernels are what differs between them, and each type's kernel of each table still runs.
# gpt-oss's, Granite's, PhiMoE's and DeepSeek's own code (sinks, windows, biases, multipliers, MLA) is
# the same C++ on every type: two types of each suffice.
ARCH_MATRIX = ([(a, t) for a in ARCHS if a not in BLOCK_ONLY_ARCHS for t in TYPES]
               + [("qwen3moe", "MXFP4"), ("gpt-oss", "MXFP4"), ("gpt-oss", "Q8_0"), ("granitemoe", "Q4_K"),
                  ("granitemoe", "Q8_0"), ("phimoe", "Q4_K"), ("deepseek2", "Q4_K"), ("deepseek2", "Q8_0")])
FULL_MATRIX_CPU = "cortex-a76"
LOGITS_CASES = ([(a, t, FULL_MATRIX_CPU) for a, t in ARCH_MATRIX]
                + [("qwen3moe", t, cpu) for cpu in sorted(CPUS) if cpu != FULL_MATRIX_CPU for t in TYPES + ["MXFP4"]])


@pytest.mark.parametrize("arch,wtype,cpu", LOGITS_CASES)
def test_aarch64_logits_match_reference_and_x86(arch, wtype, cpu):
    model = make_model("%s-%s" % (arch, wtype), arch, wtype)
    got = arm_logits(model, cpu)
    ref = reference_logits(model, quantize=True)
    x86_path = model + ".x86.f32"
    x86 = (np.fromfile(x86_path, dtype="<f4").reshape(len(TOKENS), -1) if os.path.exists(x86_path) else None)
    if x86 is None:
        x86 = engine_logits(model)
        x86.tofile(x86_path)
    err_ref, err_x86 = nmse(got, ref), nmse(got, x86.astype(np.float64))
    print("%s %s -cpu %s (%s): nmse vs reference %.3e, vs x86-64 %.3e" % (arch, wtype, cpu, CPUS[cpu], err_ref,
                                                                           err_x86))
    assert err_ref < tight(wtype), "aarch64 vs reference: nmse %.3e" % err_ref
    assert err_x86 < tight(wtype), "aarch64 vs x86-64: nmse %.3e" % err_x86
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9


@pytest.mark.parametrize("cpu", sorted(CPUS))
def test_aarch64_budget_and_batching_are_exact(cpu):
    """Offloading and batching change speed, never results: on each ARM table a 40 % expert budget
    and token-by-token evaluation give the resident, batched logits bitwise."""
    model = make_model("qwen3moe-Q4_K", "qwen3moe", "Q4_K")
    base = arm_logits(model, cpu)
    np.testing.assert_array_equal(base, arm_logits(model, cpu, ["--budget", "40%"]))
    np.testing.assert_array_equal(base, arm_logits(model, cpu, ["-b", "1"]))


def test_binaries_differ():
    """Guards the harness: the aarch64 binary really is an aarch64 executable, not the host one."""
    with open(ARM_BIN, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64
    assert os.path.realpath(ARM_BIN) != os.path.realpath(BIN)
    assert TMP
