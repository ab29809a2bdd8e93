"""The text side of the CLI: `moelite tokenize` on real vocabularies' test vectors, and `run` /
`chat` on a generated model (determinism by seed, stop strings, KV reuse across chat turns)."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "cli-text")
VOCAB = os.path.join(ROOT, "tests", "data", "vocab")
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")


def vectors(name):
    inp = open(os.path.join(VOCAB, name + ".inp"), "rb").read().split(b"\n__ggml_vocab_test__\n")
    out = open(os.path.join(VOCAB, name + ".out")).read().split("\n")
    return list(zip(inp, out))


@pytest.mark.parametrize("vocab", ["ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"])
def test_tokenize_command_matches_vectors(vocab):
    os.makedirs(TMP, exist_ok=True)
    cases = vectors(vocab)
    assert len(cases) > 20
    for i, (text, expected) in enumerate(cases):
        path = os.path.join(TMP, "input-%d.txt" % i)
        open(path, "wb").write(text)  # the file's bytes exactly, no added newline
        r = subprocess.run([BIN, "tokenize", "-m", os.path.join(VOCAB, vocab), "-f", path],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected.strip(), "input %r" % text


def run(*args, stdin=None):
    r = subprocess.run([BIN, *args], capture_output=True, input=stdin, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout, r.stderr.decode(errors="replace")


def test_run_is_deterministic_per_seed():
    a, stats = run("run", "-m", MODEL, "-p", "Once upon a time", "-n", "24", "--seed", "7")
    b, _ = run("run", "-m", MODEL, "-p", "Once upon a time", "-n", "24", "--seed", "7")
    c, _ = run("run", "-m", MODEL, "-p", "Once upon a time", "-n", "24", "--seed", "8")
    assert a == b and len(a) > 0
    assert a != c
    assert re.search(r"generated \d+ tokens", stats)


def test_run_greedy_ignores_seed():
    a, _ = run("run", "-m", MODEL, "-p", "Hello", "-n", "16", "--temp", "0", "--seed", "1")
    b, _ = run("run", "-m", MODEL, "-p", "Hello", "-n", "16", "--temp", "0", "--seed", "2")
    assert a == b


def test_stop_string_ends_output_before_it():
    full, _ = run("run", "-m", MODEL, "-p", "Hello", "-n", "40", "--temp", "0")
    text = full.decode("utf-8", errors="surrogateescape")
    assert len(text) > 6
    stop = text[3:5]  # a string the greedy output is known to contain
    cut, _ = run("run", "-m", MODEL, "-p", "Hello", "-n", "40", "--temp", "0", "--stop", stop)
    assert cut.decode("utf-8", errors="surrogateescape") == text[:text.index(stop)]


def test_chat_reuses_the_cache_between_turns():
    out, err = run("chat", "-m", MODEL, "-n", "8", "--temp", "0", stdin=b"Hello there\nAnd again\n")
    cached = [int(x) for x in re.findall(r"\((\d+) cached\)", err)]
    assert len(cached) == 2
    assert cached[0] == 0 and cached[1] > 5  # the second turn re-evaluates only the new part


def test_perplexity_matches_reference_forward():
    """`moelite perplexity` against the same windowed protocol computed with the numpy reference."""
    import json

    import numpy as np
    sys.path.insert(0, HERE)
    from reference_forward import ReferenceModel

    os.makedirs(TMP, exist_ok=True)
    text_path = os.path.join(TMP, "ppl.txt")
    open(text_path, "w").write("The quick brown fox jumps over the lazy dog. " * 6 + "Numbers 12345 and symbols #!")
    out, _ = run("perplexity", "-m", MODEL, "-f", text_path, "--ctx", "32", "--json")
    got = json.loads(out)
    ids, _ = run("tokenize", "-m", MODEL, "-f", text_path)
    tokens = [int(t) for t in ids.split()]
    ref = ReferenceModel(MODEL, quantize_acts=True)
    nll, scored = 0.0, 0
    for w0 in range(0, len(tokens), 32):
        win = tokens[w0:w0 + 32]
        if len(win) < 2:
            break
        logits = ref.forward(win)
        for i in range(len(win) - 1):
            l = logits[i].astype(np.float64)
            m = l.max()
            nll -= l[win[i + 1]] - m - np.log(np.exp(l - m).sum())
            scored += 1
    assert got["tokens_scored"] == scored
    assert abs(got["perplexity"] / np.exp(nll / scored) - 1) < 1e-3
