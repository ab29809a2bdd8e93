#!/usr/bin/env python3
"""Calibration cost: `moelite calibrate` time over `moelite perplexity --ctx CTX` time on the
same tokens of the same model, printed as JSON.

The corpus (default: tools/train/data/heldout.txt) is repeated until it holds about --tokens
tokens of the model's tokenizer and cut at a line end; both commands then run on that whole file
(calibrate with --max-tokens 0), one after the other, each timed by wall clock from start to exit
(model load and tokenization included in both). With random-weight models the text does not
matter for timing. The requirement this checks (docs/ARCHITECTURE.md, "Calibration"):
calibrating 100 k tokens costs at most 10x a perplexity pass over them.

  python3 tools/calibration_cost.py -m models/moelite-tiny-qwen3moe-Q8_0.gguf
  python3 tools/calibration_cost.py -m big.gguf --tokens 100000 -- --verbose --sensitivity-tokens 0

Arguments after `--` go to `moelite calibrate` only. On a shared machine run it more than once:
both passes are timed back to back, so the ratio is steadier than either time.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit("%s failed (%d):\n%s\n%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r, seconds


def count_tokens(binary, model, path):
    return len(run([binary, "tokenize", "-m", model, "-f", path])[0].stdout.split())


def make_corpus(binary, model, source, tokens, path):
    """source repeated and cut at a line end to about `tokens` tokens; returns the exact count"""
    text = open(source, "rb").read()
    per_byte = count_tokens(binary, model, source) / max(1, len(text))
    want = int(tokens / per_byte) + 1
    data = text * (want // len(text) + 1)
    cut = data.rfind(b"\n", 0, want)
    data = data[:cut + 1 if cut > 0 else want]
    with open(path, "wb") as f:
        f.write(data)
    n = count_tokens(binary, model, path)
    while n < tokens:  # the estimate fell short: add lines until it does not
        more = text[:max(1, text.find(b"\n", int((tokens - n) / per_byte)) + 1)]
        with open(path, "ab") as f:
            f.write(more)
        n = count_tokens(binary, model, path)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "moelite"), help="the moelite CLI")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tools", "train", "data", "heldout.txt"))
    ap.add_argument("--tokens", type=int, default=100000, help="tokens to measure on (default 100000)")
    ap.add_argument("--ctx", type=int, default=256, help="window of both commands (default 256)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="threads of both commands (0: their default)")
    ap.add_argument("calibrate_args", nargs="*", help="after --: extra `moelite calibrate` arguments")
    a = ap.parse_args()

    common = ["-m", a.model, "--ctx", str(a.ctx)] + (["-t", str(a.threads)] if a.threads else [])
    with tempfile.TemporaryDirectory(prefix="moelite-calcost-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        n = make_corpus(a.bin, a.model, a.corpus, a.tokens, corpus)
        ppl, ppl_s = run([a.bin, "perplexity", "-f", corpus, "--json"] + common)
        profile = os.path.join(tmp, "profile.json")
        cal, cal_s = run([a.bin, "calibrate", "-f", corpus, "-o", profile, "--max-tokens", "0", "--json"] + common +
                         a.calibrate_args)
        cal_json = json.loads(cal.stdout)
        prof = json.load(open(profile))
    out = {
        "model": a.model,
        "tokens": n,
        "ctx": a.ctx,
        "perplexity_seconds": round(ppl_s, 3),
        "calibrate_seconds": round(cal_s, 3),
        "ratio": round(cal_s / ppl_s, 3),
        "calibrate_reported_seconds": cal_json.get("seconds"),
        "sensitivity_tokens": prof.get("calibration", {}).get("sensitivity_tokens"),
        "perplexity": json.loads(ppl.stdout).get("perplexity"),
        "calibrate_args": a.calibrate_args,
        # what calibrate said on stderr: its choices, and with --verbose the time of each phase
        "calibrate_log": [line for line in cal.stderr.splitlines() if line.startswith("moelite: calibrat")],
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
