"""The shipped default model is a trained one: its held-out perplexity is far below chance, and its
routing is input-dependent and not collapsed (numbers from tools/train/README.md's run; the
thresholds leave room, a random or collapsed model fails them)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import routing_report  # noqa: E402

BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
HELDOUT = os.path.join(ROOT, "tools", "train", "data", "heldout.txt")
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "default-model")


def test_heldout_perplexity_is_far_below_chance():
    os.makedirs(TMP, exist_ok=True)
    part = os.path.join(TMP, "heldout-30k.txt")
    open(part, "wb").write(open(HELDOUT, "rb").read()[:30000])
    r = subprocess.run([BIN, "perplexity", "-m", MODEL, "-f", part, "--json"], capture_output=True, text=True, check=True)
    ppl = json.loads(r.stdout)["perplexity"]
    assert ppl < 80, ppl  # measured ~49 on the whole held-out text; chance is the vocabulary, 2048


def test_routing_is_input_dependent_and_not_collapsed():
    ids = subprocess.run([BIN, "tokenize", "-m", MODEL, "-f", HELDOUT], capture_output=True, text=True,
                         check=True).stdout.split()
    rep = routing_report.report(MODEL, [int(t) for t in ids][:1024], ctx=256)
    for row in rep["layers"]:
        assert 0.6 < row["usage_entropy"] < 0.999       # every layer uses many experts, unevenly
        assert row["usage_max_share"] > 1.3 / rep["n_expert"]
        assert row["distinct_sets_share"] * 1024 > 30   # many different expert pairs across tokens
        assert row["top1_weight_mean"] > 0.6            # the router is confident, not uniform
