#!/usr/bin/python3
"""The batch planner's predictions against measurement: for a model, a memory limit and each
context length, the plan (`moelite batch --plan --budget auto --memory M -c C`), then for chosen
numbers of sequences n a measured decode (`moelite bench --n-seq n --budget B(n)`, B(n) the expert
budget the plan gives n sequences at that context length). Writes JSON and a Markdown table:
predicted and measured aggregate tokens/s per n, the planner's choice and the measured best.

    /usr/bin/python3 tools/plan_table.py -m MODEL --memory 2GiB [--ctx 2048,512] [--n-seq 1,2,4,8,16]
        [--throttle 2.0] [-t 2] [-p 16] [-n 16] [-r 2] [--trace TRACE --text TEXT] [--json F] [--md F]

--trace TRACE: plan from a routing trace (`moelite batch --plan-trace`, recorded with `moelite
trace record -f TEXT`) instead of uniform routing; --text TEXT: the measured sequences read their
prompt and decoded tokens from TEXT (`moelite bench -f`), spread over it as the plan's replay
spreads its sequences over the trace. Each measurement is the best of -r runs after a warm-up run
of the same tokens: use a long -n so that a run's reuse of the run before it is small.

The bench's contexts hold n_prompt + n_gen positions, not C: a context's KV size changes the memory
it takes, not the speed of a short decode, and the memory is what the plan's B(n) already gives up.
--throttle R (root): reads come from a RAM-backed device capped at R GB/s (tools/throttled_storage.py),
and the plan is made for R; without it, the plan measures the model file's storage itself.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batch_table import moelite_bench  # noqa: E402


def plan(cli, model, memory, ctx, max_seq, storage_gbs, trace=None):
    prompts = "".join('{"prompt": "a"}\n' for _ in range(max_seq))
    req = "/tmp/moelite-plan-table-%d.jsonl" % os.getpid()
    with open(req, "w") as f:
        f.write(prompts)
    cmd = [cli, "batch", "-m", model, "-f", req, "--budget", "auto", "--memory", memory, "-c", str(ctx), "--plan"]
    if storage_gbs:
        cmd += ["--storage-gbs", str(storage_gbs)]
    if trace:
        cmd += ["--plan-trace", trace]
    r = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(req)
    if r.returncode != 0:
        sys.exit("planning failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--cli", default="build/bin/moelite")
    ap.add_argument("--memory", required=True)
    ap.add_argument("--ctx", default="2048,512")
    ap.add_argument("--n-seq", default="1,2,4,8,16")
    ap.add_argument("--throttle", type=float, default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=16)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--text", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    ns = [int(x) for x in a.n_seq.split(",")]
    dev = None
    if a.throttle:
        from throttled_storage import ThrottledStorage
        dev = ThrottledStorage(a.model, a.throttle)
        dev.__enter__()
    tables = []
    try:
        for ctx in [int(c) for c in a.ctx.split(",")]:
            p = plan(a.cli, a.model, a.memory, ctx, max(ns), a.throttle, a.trace)
            # With a trace, the uniform-routing plan's predictions of the same rows, to compare.
            u = plan(a.cli, a.model, a.memory, ctx, max(ns), a.throttle) if a.trace else None
            rows = []
            for n in sorted(set(ns + [p["n_seq"]])):  # the plan's own choice is measured too
                row = p["rows"][n - 1]
                if not row["fits"]:
                    rows.append({"n_seq": n, "fits": False})
                    continue
                extra = ["--budget", str(row["expert_budget_bytes"]), "--allocation", row["allocation"]]
                if a.text:
                    extra += ["-f", a.text]
                if dev:
                    d = moelite_bench(a.cli, dev.model, a.threads, a.p, a.n, n, extra, dev.enter, reps=a.reps)
                else:
                    d = moelite_bench(a.cli, a.model, a.threads, a.p, a.n, n, extra, reps=a.reps)
                out = {"n_seq": n, "fits": True, "expert_budget_bytes": row["expert_budget_bytes"],
                       "allocation": row["allocation"], "predicted_hit_share": row["hit_share"],
                       "kv_bytes": row["kv_bytes"], "cache_share": row["cache_share"],
                       "predicted_tok_s": row["decode_tok_s"], "measured_tok_s": d["decode_tok_s"],
                       "predicted_read_per_token": row["read_bytes_per_step"] / n,
                       "measured_read_per_token": d["bytes_read_per_token"], "hit_rate": d["hit_rate"]}
                if u:
                    ur = u["rows"][n - 1]
                    out.update(uniform_allocation=ur["allocation"], uniform_hit_share=ur["hit_share"],
                               uniform_tok_s=ur["decode_tok_s"])
                rows.append(out)
                print(json.dumps(dict(ctx=ctx, **out)), flush=True)
            measured = [r for r in rows if r["fits"]]
            best = max(measured, key=lambda r: r["measured_tok_s"])["n_seq"] if measured else None
            tables.append({"ctx": ctx, "plan_n_seq": p["n_seq"], "plan_reason": p["reason"], "measured_best_n_seq": best,
                           "routing": p["routing"],
                           "storage_gb_s": p["storage_gb_s"], "rows": rows})
    finally:
        if dev:
            dev.__exit__(None, None, None)
    md = ["| n_ctx | sequences | KV MiB | experts MiB (share), pools | predicted / measured hit rate | "
          "predicted tok/s | measured tok/s | predicted / measured MB read per token |",
          "|---|---|---|---|---|---|---|---|"]
    if a.trace:
        md[0] += " uniform routing: hit rate, tok/s |"
        md[1] += "---|"
    for t in tables:
        for r in t["rows"]:
            if not r["fits"]:
                md.append("| %d | %d | does not fit | | | | | |" % (t["ctx"], r["n_seq"]))
                continue
            mark = (" (plan)" if r["n_seq"] == t["plan_n_seq"] else "") + \
                (" (best measured)" if r["n_seq"] == t["measured_best_n_seq"] else "")
            md.append("| %d | %d%s | %.0f | %.0f (%.0f %%), %s | %.2f / %.2f | %.2f | %.2f | %.1f / %.1f |" % (
                t["ctx"], r["n_seq"], mark, r["kv_bytes"] / 2**20, r["expert_budget_bytes"] / 2**20,
                100 * r["cache_share"], r["allocation"], r["predicted_hit_share"], r["hit_rate"],
                r["predicted_tok_s"], r["measured_tok_s"],
                r["predicted_read_per_token"] / 1e6, r["measured_read_per_token"] / 1e6))
            if a.trace:
                md[-1] += " %.2f, %.2f |" % (r["uniform_hit_share"], r["uniform_tok_s"])
        md.append("| %d | plan: %d | | | | | | %s |" % (t["ctx"], t["plan_n_seq"], t["plan_reason"]))
    print("\n".join(md))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "memory": a.memory, "tables": tables}, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
