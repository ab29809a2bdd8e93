#!/usr/bin/python3
"""What the process allocator changes: two builds of the moelite CLI, one linked with mimalloc (the
default where libmimalloc-dev is installed) and one without (-DMOELITE_MIMALLOC=OFF), run
alternately on the same inputs; the best of N wall times each, and their ratio.

    /usr/bin/python3 tools/bench_allocator.py LIBC_CLI MIMALLOC_CLI [--model M] [--runs N] [--json F]

Workloads: tokenizing 1 MiB of text, loading the model without mmap (`info --no-mmap`), and
calibrating on the first half of the held-out text (2 threads).
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wall(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli_a")
    ap.add_argument("cli_b")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    text = open(os.path.join(ROOT, "tools", "train", "data", "heldout.txt"), "rb").read()
    mib = os.path.join(tmp, "1mib.txt")
    cal = os.path.join(tmp, "calibration.txt")
    open(mib, "wb").write((text * (1 + (1 << 20) // len(text)))[: 1 << 20])
    open(cal, "wb").write(text[: len(text) // 2])
    work = {
        "tokenize_1mib": lambda b: [b, "tokenize", "-m", args.model, "-f", mib],
        "load": lambda b: [b, "info", "-m", args.model, "--no-mmap"],
        "calibrate": lambda b: [b, "calibrate", "-m", args.model, "-f", cal, "-o", os.path.join(tmp, "p.json"),
                                "-t", "2"],
    }
    def allocator(b):  # `moelite version` says "allocator X" on its second line (builds before it: libc)
        lines = subprocess.run([b, "version"], capture_output=True, text=True).stdout.splitlines()
        return lines[1].replace("allocator ", "") if len(lines) > 1 else "libc"
    alloc = [allocator(b) for b in (args.cli_a, args.cli_b)]
    out = {"allocator_a": alloc[0], "allocator_b": alloc[1], "runs": args.runs}
    print("%-14s %14s %14s %7s" % ("workload", alloc[0], alloc[1], "b/a"))
    for name, cmd in work.items():
        best = [float("inf"), float("inf")]
        for _ in range(args.runs):  # alternate, so drift hits both alike
            for i, b in enumerate((args.cli_a, args.cli_b)):
                best[i] = min(best[i], wall(cmd(b)))
        out[name] = {"a_s": round(best[0], 4), "b_s": round(best[1], 4), "b_over_a": round(best[1] / best[0], 4)}
        print("%-14s %13.3fs %13.3fs %7.3f" % (name, best[0], best[1], best[1] / best[0]))
    print(json.dumps(out))
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
