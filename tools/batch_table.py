#!/usr/bin/python3
"""Throughput of several sequences decoding together (moelite bench --n-seq), resident and under
expert budgets: aggregate decode tokens/s, per-sequence tokens/s and bytes read from storage per
generated token, for each number of sequences. Writes JSON and a Markdown table.

    /usr/bin/python3 tools/batch_table.py -m MODEL [--n-seq 1,2,4,8,16] [--budgets 25%]
        [--allocations uniform,global] [--predictors none,next-gate] [--contexts 2,4] [-t 2] [-p 16] [-n 16]
        [--peer PROGRAM] [--throttle R] [--json F] [--md F]

--predictors P,...: each budgeted setting once per predictor (`moelite bench --predictor P`; none:
no predictor), so its guesses' effect on a step of several sequences shows beside the same rows
without it.

--contexts C,...: rows of C contexts decoding one sequence each on threads of their own at the same
time (moelite bench --contexts C), sharing the model and, under a budget, its expert store: the
alternative to one context with C sequences when requests arrive separately.

--peer: a program run as `PROGRAM MODEL N_PROMPT N_DECODE THREADS REPS N_SEQ` that prints JSON lines
with decode_tok_s (all sequences together), such as a small llama.cpp client that decodes N
sequences in one llama_batch; built outside this repository. Its resident rows are run alternately
with moelite's, so the ratio is of one moment of the machine. Budgeted rows are moelite's alone.

--throttle R (root): the budgeted rows read the model from a RAM-backed device capped at R GB/s
(tools/throttled_storage.py) instead of the machine's disk, whose speed drifts and bursts (a cloud
disk's token bucket): there the bytes read per token set the speed, and rows compare.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def moelite_bench(cli, model, threads, n_prompt, n_gen, n_seq, extra=(), preexec_fn=None, contexts=1, reps=2):
    cmd = [cli, "bench", "-m", model, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps),
           "--n-seq", str(n_seq), "--contexts", str(contexts), "--no-membw", "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=preexec_fn)
    if r.returncode != 0:
        sys.exit("moelite bench failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def peer_bench(peer, model, threads, n_prompt, n_gen, n_seq):
    r = subprocess.run([peer, model, str(n_prompt), str(n_gen), str(threads), "3", str(n_seq)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit("peer failed (%d): %s" % (r.returncode, r.stderr))
    runs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")][1:]  # first is a warm-up
    return max(x["decode_tok_s"] for x in runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--cli", default="build/bin/moelite")
    ap.add_argument("--n-seq", default="1,2,4,8,16")
    ap.add_argument("--budgets", default="25%")
    ap.add_argument("--allocations", default="uniform,global", help="expert-store allocations of the budgeted rows")
    ap.add_argument("--predictors", default="none", help="predictors of the budgeted rows (none: no predictor)")
    ap.add_argument("--contexts", default="", help="rows of C parallel contexts of one sequence each")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=16)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--peer", default=None)
    ap.add_argument("--throttle", type=float, default=None, help="GB/s of the budgeted rows' storage (root)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    # (sequences per context, contexts) of each row
    shapes = [(int(x), 1) for x in a.n_seq.split(",")] + [(1, int(c)) for c in filter(None, a.contexts.split(","))]
    settings = [("resident", [])]
    for b in filter(None, a.budgets.split(",")):
        for alloc in filter(None, a.allocations.split(",")):
            for pred in filter(None, a.predictors.split(",")):
                name = "%s %s" % (b, alloc) + ("" if pred == "none" else ", predictor %s" % pred)
                settings.append((name, ["--budget", b, "--allocation", alloc] +
                                 ([] if pred == "none" else ["--predictor", pred])))
    rows = []
    dev = None
    if a.throttle:
        from throttled_storage import ThrottledStorage
        dev = ThrottledStorage(a.model, a.throttle)
        dev.__enter__()
    try:
        for name, extra in settings:
            base = None
            if extra and dev:
                name += " (storage %.2g GB/s)" % a.throttle
            for n, contexts in shapes:
                if extra and dev:
                    d = moelite_bench(a.cli, dev.model, a.threads, a.p, a.n, n, extra, dev.enter, contexts)
                else:
                    d = moelite_bench(a.cli, a.model, a.threads, a.p, a.n, n, extra, contexts=contexts)
                peer = None
                if a.peer and not extra and contexts == 1:
                    peer = peer_bench(a.peer, a.model, a.threads, a.p, a.n, n)
                base = base or d["decode_tok_s"]
                row = {"setting": name, "n_seq": n * contexts, "contexts": contexts, "decode_tok_s": d["decode_tok_s"],
                       "decode_tok_s_per_seq": d["decode_tok_s_per_seq"], "speedup_vs_one": d["decode_tok_s"] / base,
                       "bytes_read_per_token": d["bytes_read_per_token"], "hit_rate": d["hit_rate"],
                       "stall_fraction": d["stall_fraction"], "peer_decode_tok_s": peer,
                       "vs_peer": d["decode_tok_s"] / peer if peer else None, "backend": d["backend"],
                       "threads": d["threads"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:  # the RAM device and its mount go on every way out, Ctrl-C included
        if dev:
            dev.__exit__(None, None, None)
    md = ["| setting | sequences | contexts | decode tok/s (all) | per sequence | × one sequence | MB read / token | "
          "hit rate | llama.cpp tok/s | moelite / llama.cpp |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append("| %s | %d | %d | %.2f | %.2f | %.2f | %.1f | %.3f | %s | %s |" % (
            r["setting"], r["n_seq"], r["contexts"], r["decode_tok_s"], r["decode_tok_s_per_seq"], r["speedup_vs_one"],
            r["bytes_read_per_token"] / 1e6, r["hit_rate"], "%.2f" % r["peer_decode_tok_s"] if r["peer_decode_tok_s"]
            else "-", "%.2f" % r["vs_peer"] if r["vs_peer"] else "-"))
    print("\n".join(md))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "rows": rows}, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
