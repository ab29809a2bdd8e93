#!/usr/bin/env python3
"""Throughput of moelite-server under concurrent requests: N clients each send a completion
request at the same moment (same lengths, fixed seeds, end tokens banned by a fixed max_tokens and
temperature 0.8), and the run reports the aggregate generated tokens per second (all completion
tokens over the wall time from the first request sent to the last answer), the mean time to the
first streamed token, and each answer's tokens. Several server binaries (e.g. this build and an
older one) are measured in alternating rounds of one run, so the machine's drift hits them alike.

  tools/server_bench.py -m MODEL --server build/bin/moelite-server [--server OLD/moelite-server] \\
      [--clients 1,2,4] [--max-tokens 32] [--rounds 2] [--budget 25%] [--json out.json]

Prints a Markdown table and, with --json, the raw numbers."""
import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time

PROMPTS = ["def fibonacci(n):", "import os\n", "The Python standard library", "class Point:\n    def __init__(self",
           "Explain a list comprehension.", "with open(path) as f:", "The garbage collector", "async def main():"]


def start(server, model, budget, parallel, threads):
    cmd = [server, "-m", model, "--port", "0", "-t", str(threads), "--parallel", str(parallel), "-c", "1024"]
    if budget:
        cmd += ["--budget", budget]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://([^:]+):(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit("%s did not start: %s %s" % (server, line, proc.stderr.read()))
    return proc, m.group(1), int(m.group(2))


def one_request(host, port, i, max_tokens, out):
    try:
        _one_request(host, port, i, max_tokens, out)
    except Exception as e:  # noqa: BLE001 - reported, and the run stops
        out[i] = e


def _one_request(host, port, i, max_tokens, out):
    body = json.dumps({"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0.8,
                       "seed": 100 + i, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens, text = None, 0, ""
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            if first is None:
                first = time.perf_counter() - t0
            text += chunk["choices"][0]["text"]
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    out[i] = (first if first is not None else float("nan"), tokens, time.perf_counter(), text)


def measure(host, port, clients, max_tokens):
    out = [None] * clients
    threads = [threading.Thread(target=one_request, args=(host, port, i, max_tokens, out)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        if isinstance(o, Exception):
            raise RuntimeError("a request to %s:%d failed: %r" % (host, port, o))
    wall = max(o[2] for o in out) - t0
    tokens = sum(o[1] for o in out)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
            "ttft_s": sum(o[0] for o in out) / clients, "texts": [o[3] for o in out]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--server", action="append", required=True, help="a moelite-server binary (repeatable)")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",")]
    results = {s: {n: [] for n in counts} for s in a.server}
    for _ in range(a.rounds):
        for server in a.server:
            proc, host, port = start(server, a.model, a.budget, max(counts), a.threads)
            try:
                measure(host, port, 1, 4)  # warm: pages in, threads up
                for n in counts:
                    results[server][n].append(measure(host, port, n, a.max_tokens))
            except RuntimeError as e:
                proc.terminate()
                raise SystemExit("%s (%s, exit %s): %s" % (e, server, proc.wait(timeout=60), proc.stderr.read()[-2000:]))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    print("| server | clients | aggregate tok/s (per round) | best | mean time to first token s |")
    print("|---|---|---|---|---|")
    summary = {}
    for server in a.server:
        for n in counts:
            rs = results[server][n]
            best = max(r["tok_s"] for r in rs)
            summary.setdefault(server, {})[n] = {"tok_s": [r["tok_s"] for r in rs], "best_tok_s": best,
                                                  "ttft_s": [r["ttft_s"] for r in rs]}
            print("| %s | %d | %s | %.2f | %s |" % (server, n, " / ".join("%.2f" % r["tok_s"] for r in rs), best,
                                                   " / ".join("%.2f" % r["ttft_s"] for r in rs)))
    # The same seeds give the same texts whichever server and however many clients.
    for server in a.server:
        for n in counts:
            for r in results[server][n]:
                for i, t in enumerate(r["texts"]):
                    ref = results[a.server[0]][counts[-1]][0]["texts"]
                    if i < len(ref) and t != ref[i]:
                        print("note: %s, %d clients, request %d differs from the first server's" % (server, n, i),
                              file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "budget": a.budget, "max_tokens": a.max_tokens, "results": summary}, f,
                      indent=1)


if __name__ == "__main__":
    main()
