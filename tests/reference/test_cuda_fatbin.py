"""The contract between the host and the GPU kernels, checked without a GPU: every kernel that
backends/cuda/kernels/launchers.inc launches must have the entry point runtime_cuda.cpp asks the
driver for -- moelite_<kernel>, plus _<type id> for each weight type of a templated kernel -- in the
fatbin nvcc built (its cubins carry the entry points' names). A kernel added to the launchers but
not to kernels_gpu.cu, or a type missing there, would otherwise fail only on a real GPU.
Environment: MOELITE_CUDA_FATBIN (skips when the build has no fatbin, i.e. no nvcc)."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FATBIN = os.environ.get("MOELITE_CUDA_FATBIN", "")
# The weight types the kernels support (launchers.inc's with_type), as GGUF type ids.
TYPE_IDS = [0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 39]
# The quantized ones: the integer products (the _q_ kernels, with_quantized_type) exist for these.
QUANTIZED_IDS = [2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 39]

pytestmark = pytest.mark.skipif(not os.path.exists(FATBIN), reason="this build has no CUDA fatbin (no nvcc)")


def launched_kernels():
    src = open(os.path.join(ROOT, "backends", "cuda", "kernels", "launchers.inc")).read()
    src = re.sub(r"//[^\n]*", "", src)  # comments mention the macro too
    kernels = {}
    for call in re.findall(r"MOELITE_LAUNCH\((.*?)\);", src, re.S):
        m = re.search(r"\b([a-z_]+_kernel)\b\s*(<)?", call)
        assert m, call
        kernels[m.group(1)] = bool(m.group(2))
    return kernels


def test_every_launched_kernel_has_its_entry_point_in_the_fatbin():
    blob = open(FATBIN, "rb").read()
    kernels = launched_kernels()
    assert len(kernels) >= 10, kernels
    missing = []
    for name, templated in sorted(kernels.items()):
        ids = QUANTIZED_IDS if "_q_" in name else TYPE_IDS
        entries = ["moelite_%s_%d" % (name, t) for t in ids] if templated else ["moelite_" + name]
        missing += [e for e in entries if (e.encode() + b"\0") not in blob]
    assert not missing, "entry points missing from the fatbin: %s" % missing


def test_the_type_ids_are_the_ones_the_launchers_dispatch():
    src = open(os.path.join(ROOT, "backends", "cuda", "kernels", "dequant.cuh")).read()
    enum = dict((k, int(v)) for k, v in re.findall(r"\bk(\w+) = (\d+)", src))
    assert sorted(enum.values()) == sorted(TYPE_IDS), enum
