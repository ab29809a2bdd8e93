"""Greedy generation through the C API (moelite_generate_tokens, via the binding) on a tiny model of
every architecture, checked against the numpy reference forward (tests/reference): each generated
token is the reference's argmax after the prompt and the tokens before it (EOS banned in both), and
the check is not vacuous (the reference's best token leads by a clear margin)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from support import REPO

import moelite

sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
import reference_forward as RF  # noqa: E402

TMP = os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-py-tests")
ARCHS = ["llama", "qwen2moe", "qwen3moe", "olmoe", "gpt-oss", "granitemoe", "phimoe", "deepseek2"]
PROMPT = [1, 17, 250, 3, 99, 42, 7]
N_GEN = 10


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_follows_the_reference(arch):
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "py-gen-%s-F32.gguf" % arch)
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_tiny_model.py"), "--arch", arch, "--type",
                    "F32", "--seed", "11", "--out", path, "--quiet"], check=True)
    model = moelite.Model(path, threads=2)
    eos = model.eos
    ctx = moelite.Context(model, n_ctx=64)
    got = [t for t, _ in ctx.generate(PROMPT, max_tokens=N_GEN, temperature=0, logit_bias={eos: float("-inf")},
                                       yield_tokens=True) if t >= 0]
    ctx.close()
    model.close()
    assert len(got) == N_GEN
    seq = PROMPT + got
    logits = RF.ReferenceModel(path, n_ctx=64).forward(seq[:-1])
    logits[:, eos] = -np.inf
    for j, tok in enumerate(got):
        row = logits[len(PROMPT) - 1 + j]
        order = np.argsort(-row)
        assert tok == order[0], "token %d: engine %d, reference %d" % (j, tok, order[0])
        assert row[order[0]] - row[order[1]] > 1e-6  # a clear winner: the comparison means something
