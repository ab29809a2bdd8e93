#!/usr/bin/python3
"""Saved sessions against recomputing: evaluates a prompt of -p tokens, saves the context
(moelite_context_save), restores it into a fresh context (moelite_context_load), and prints JSON
with the prompt's evaluation time, save and restore times, the file's size against the KV bytes it
holds (compression ratio) and whether the next token's logits after the restore equal the
uninterrupted run's (bitwise).

    MOELITE_LIBRARY=build/lib/libmoelite.so /usr/bin/python3 tools/session_bench.py -m MODEL [-p 512] [-t 2]
"""
import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
import moelite  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=512, help="prompt tokens")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--dir", default=None, help="where the session file goes (default: a temporary directory)")
    a = ap.parse_args()
    with moelite.Model(a.model, threads=a.threads, backend=a.backend) as model:
        prompt = [(i * 7919 + 13) % (model.n_vocab - 1) + 1 for i in range(a.p)]
        nxt = [(a.p * 31 + 7) % (model.n_vocab - 1) + 1]
        ctx = moelite.Context(model, n_ctx=a.p + 8, n_batch=min(a.p, 512))
        ctx.eval(prompt[:8])  # warm-up: weights faulted in
        ctx.reset()
        t0 = time.perf_counter()
        ctx.eval(prompt)
        t_prompt = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(dir=a.dir) as d:
            path = os.path.join(d, "bench.session")
            t0 = time.perf_counter()
            ctx.save(path)
            t_save = time.perf_counter() - t0
            size = os.path.getsize(path)
            kv_held = a.p * model.kv_bytes_per_token
            ctx.eval(nxt)
            want = ctx.logits()
            fresh = moelite.Context(model, n_ctx=a.p + 8, n_batch=min(a.p, 512))
            os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)  # from storage, not cache
            t0 = time.perf_counter()
            fresh.load(path)
            t_load = time.perf_counter() - t0
            fresh.eval(nxt)
            exact = bool((fresh.logits() == want).all())
    print(json.dumps({"model": a.model, "backend": a.backend, "threads": a.threads, "prompt_tokens": a.p,
                      "prompt_eval_s": round(t_prompt, 4), "save_s": round(t_save, 4), "restore_s": round(t_load, 4),
                      "restore_speedup_vs_prompt": round(t_prompt / t_load, 2), "kv_bytes": kv_held,
                      "file_bytes": size, "compression_ratio": round(kv_held / size, 3), "exact": exact}))


if __name__ == "__main__":
    main()
