#!/usr/bin/python3
"""The performance table: moelite against llama.cpp (when a llama-bench binary is given) on the same
GGUF file in one run, resident and under expert budgets, prefill and decode. Writes JSON and a
Markdown table.

    /usr/bin/python3 tools/perf_table.py -m MODEL [--llama-bench PATH] [-t 2] [-p 64] [-n 32]
        [--budgets 25%,50%] [--policies lru,lfu] [--rounds 2] [--json F] [--md F]
        [--throttle 1.0,1.5] [--backend cuda]

llama.cpp is the peer: build it yourself outside this repository and pass its llama-bench (or set
LLAMA_BENCH). moelite does not build or ship it. The two engines run alternately, `--rounds`
times, and each keeps its best, so slow drift of the machine's bandwidth hits both alike. Only
ratios within one run mean anything: machines of one kind differ, and their bandwidths drift.

Budgeted rows are moelite's alone (llama.cpp has no expert budget; under a memory cap its mmap
pages experts through the page cache), reported against the storage bound moelite's bench
measures (decode_fraction_of_budget_bound). That bound divides by a measured storage speed, which
a drifting or bursting virtual disk makes unreliable; `--throttle R,...` (root) repeats the
budgeted rows on a RAM-backed device capped at R GB/s (tools/throttled_storage.py), where the bound
is known: min(DRAM bound, R / bytes read per token).

`--budget-only` runs only the budgeted rows (budgets x `--n-seq` x `--policies` x `--predictors` x
`--expert-files`), and `--into FILE` writes their table into FILE between the lines
`<!-- budgeted-decode:begin -->` and `<!-- budgeted-decode:end -->` (`--section NAME` for another
pair); `--render A.json,B.json --into FILE` renders saved reports' rows, one table per model, without
running anything (docs/performance.md's tables come from docs/data/*.json so).

`--expert-files model,packed` runs each budgeted row reading experts from the model file and from
its packed expert file (`moelite pack`; written when missing), and `--iops N` caps a throttled
device's read requests per second as well, as flash cards and eMMC are capped.

`--backend cuda` (or vulkan) runs moelite on that backend and llama.cpp with every layer offloaded
(`-ngl 99`: give it a llama-bench built with the same GPU backend); the decode bound is then the
device memory's bandwidth, measured by moelite's bench in the same run.
"""
import argparse
import json
import os
import subprocess
import itertools
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def moelite_bench(cli, model, threads, n_prompt, n_gen, extra=(), preexec_fn=None, env=None):
    cmd = [cli, "bench", "-m", model, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-r", "2",
           "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=preexec_fn,
                       env=dict(os.environ, **env) if env else None)
    if r.returncode != 0:
        sys.exit("moelite bench failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def llama_bench(binary, model, threads, n_prompt, n_gen, gpu_layers=None):
    """llama-bench's JSON: one record per test (prompt processing, then generation). A failing peer
    (llama.cpp c392e5094 aborts on Q4_0 MoE files in its repack path) is reported, not fatal: the
    result is {"error": its message}."""
    cmd = [binary, "-m", model, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-r", "3", "-o", "json"]
    if gpu_layers is not None:
        cmd += ["-ngl", str(gpu_layers)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        # Its own message (GGML_ASSERT, error: ...) rather than the debugger's noise after it.
        own = [ln for ln in lines if any(w in ln.lower() for w in ("assert", "error", "abort", "failed"))]
        print("llama-bench failed (%d): %s" % (r.returncode, " ".join(cmd)), file=sys.stderr)
        why = (own or lines or ["exit status %d" % r.returncode])[0]
        return {"build_commit": None, "error": why}
    out = {"build_commit": None}
    for rec in json.loads(r.stdout):
        out["build_commit"] = rec.get("build_commit")
        if rec.get("n_prompt", 0) > 0 and rec.get("n_gen", 0) == 0:
            out["prefill_tok_s"] = rec["avg_ts"]
        elif rec.get("n_gen", 0) > 0 and rec.get("n_prompt", 0) == 0:
            out["decode_tok_s"] = rec["avg_ts"]
    return out


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("--render", help="JSON,...: no runs; the budgeted rows of these saved reports (--json), "
                    "one table (with --into: written into that file; with --json: their rows saved together)")
    ap.add_argument("--moelite", default=os.path.join(ROOT, "build", "bin", "moelite"))
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--prompt", type=int, default=64)
    ap.add_argument("-n", "--gen", type=int, default=32)
    ap.add_argument("--budgets", default="25%,50%,75%")
    ap.add_argument("--policies", default="cyclic")
    ap.add_argument("--predictors", default="none", help="predictors of the budgeted rows, e.g. none,next-gate")
    ap.add_argument("--n-seq", default="1", help="sequences decoding together in the budgeted rows, e.g. 1,4,8")
    ap.add_argument("--budget-only", action="store_true", help="only the budgeted rows (no resident run, no peer)")
    ap.add_argument("--into", help="write the budgeted table into this Markdown file, between the lines "
                    "<!-- budgeted-decode:begin --> and <!-- budgeted-decode:end -->")
    ap.add_argument("--section", default="budgeted-decode",
                    help="with --into: the marked section to write (<!-- SECTION:begin --> ... <!-- SECTION:end -->)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--throttle", default="", help="GB/s,...: budgeted rows again on a device capped at each speed")
    ap.add_argument("--iops", type=int, default=0, help="with --throttle: also cap read requests per second")
    ap.add_argument("--expert-files", default="model",
                    help="model,packed: read experts from the model file, from its packed expert file "
                         "(MODEL.experts, written by `moelite pack` when missing), or each in turn")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda", "vulkan"),
                    help="moelite's backend; a GPU one offloads every llama.cpp layer (-ngl 99)")
    a = ap.parse_args()
    if a.render:
        # One table per model, its reports' rows in the order given.
        reports = [json.load(open(f)) for f in a.render.split(",")]
        models = list(dict.fromkeys(r["model"] for r in reports))
        merged = [dict(next(r for r in reports if r["model"] == m),
                       budgeted=[b for r in reports if r["model"] == m for b in r["budgeted"]]) for m in models]
        text = "\n\n".join(budgeted_table(r) for r in merged)
        print(text)
        finish(a, merged[0], text, into_text=text)
        return
    if not a.model:
        ap.error("-m MODEL is needed (or --render)")
    backend = ["--backend", a.backend]
    gpu_layers = 99 if a.backend != "cpu" else None

    resident, peer = None, None
    for _ in range(0 if a.budget_only else a.rounds):  # alternate the engines; keep each one's best
        m = moelite_bench(a.moelite, a.model, a.threads, a.prompt, a.gen,
                          backend + (["--no-membw"] if resident else []))
        if resident is None:
            resident = m
        else:
            for k in ("prefill_tok_s", "decode_tok_s"):
                resident[k] = max(resident[k], m[k])
        if a.llama_bench and not (peer and "error" in peer):
            p = llama_bench(a.llama_bench, a.model, a.threads, a.prompt, a.gen, gpu_layers)
            if peer is None or "error" in p:
                peer = p
            else:
                peer = {k: max(peer.get(k, 0), v) if k != "build_commit" else v for k, v in p.items()}
    failed_peer = peer if peer and "error" in peer else None
    if failed_peer:
        peer = None
    budgeted = []

    expert_files = [f for f in a.expert_files.split(",") if f]
    if any(f not in ("model", "packed") for f in expert_files):
        ap.error("--expert-files takes model and/or packed")
    if "packed" in expert_files and not os.path.exists(a.model + ".experts"):
        subprocess.run([a.moelite, "pack", "-m", a.model, "--zstd-sample", "0"], check=True)

    def budgeted_rows(model, storage, extra=(), preexec_fn=None):
        for budget, n_seq, policy, predictor, expert_file in itertools.product(
                filter(None, a.budgets.split(",")), [int(n) for n in a.n_seq.split(",") if n],
                filter(None, a.policies.split(",")), filter(None, a.predictors.split(",")), expert_files):
            b = moelite_bench(a.moelite, model, a.threads, a.prompt, a.gen,
                              backend + ["--budget", budget, "--policy", policy, "--predictor", predictor,
                                         "--n-seq", str(n_seq), *extra], preexec_fn,
                              {"MOELITE_PACKED_EXPERTS": "1" if expert_file == "packed" else "0"})
            if (expert_file == "packed") != b["expert_file"].endswith(".experts"):
                sys.exit("asked for the %s file, but the bench read %s" % (expert_file, b["expert_file"]))
            budgeted.append({"storage": storage, "budget": budget, "n_seq": n_seq, "policy": policy,
                             "expert_file": expert_file, "reads_per_token": b["reads_per_token"],
                             "predictor": predictor, "decode_tok_s": b["decode_tok_s"],
                             "decode_tok_s_min": b["decode_tok_s_min"], "decode_tok_s_max": b["decode_tok_s_max"],
                             "prefill_tok_s": b["prefill_tok_s"],
                             "hit_rate": b["hit_rate"], "bytes_read_per_token": b["bytes_read_per_token"],
                             "storage_read_gb_s": b["storage_read_gb_s"],
                             "storage_probe_gb_s": b["storage_probe_gb_s"], "store_read_gb_s": b["store_read_gb_s"],
                             "storage_probe": b["storage_probe"], "step_ms": b["step_ms"],
                             "budget_bound_tok_s": b["budget_bound_tok_s"],
                             "decode_fraction_of_budget_bound": b["decode_fraction_of_budget_bound"],
                             "peak_rss_bytes": b["peak_rss_bytes"]})

    budgeted_rows(a.model, "the machine's disk (measured)")
    for rate in filter(None, a.throttle.split(",")):
        from throttled_storage import ThrottledStorage
        with ThrottledStorage(a.model, float(rate), iops=a.iops) as dev:
            budgeted_rows(dev.model, "capped at %s GB/s%s" % (rate, ", %d reads/s" % a.iops if a.iops else ""),
                          ["--storage-gb-s", rate], dev.enter)
    if a.budget_only:
        report = {"cpu": cpu_name(), "threads": a.threads, "model": os.path.basename(a.model), "n_prompt": a.prompt,
                  "n_gen": a.gen, "budgeted": budgeted}
        text = budgeted_table(report)
        print(text)
        finish(a, report, text)
        return
    report = {
        "cpu": cpu_name(), "threads": a.threads, "model": os.path.basename(a.model), "n_prompt": a.prompt,
        "n_gen": a.gen,
        "moelite": {k: resident.get(k) for k in ("backend", "prefill_tok_s", "decode_tok_s", "decode_bound_tok_s",
                                                 "decode_fraction_of_bound", "dram_read_gb_s", "bound_memory",
                                                 "device_memory_gb_s")},
        "llama_cpp": peer or failed_peer,
        "decode_ratio": resident["decode_tok_s"] / peer["decode_tok_s"] if peer else None,
        "prefill_ratio": resident["prefill_tok_s"] / peer["prefill_tok_s"] if peer else None,
        "budgeted": budgeted,
    }
    md = ["| engine | prefill %d tok/s | decode tok/s | decode vs llama.cpp | prefill vs llama.cpp |" % a.prompt,
          "|---|---|---|---|---|"]
    mo = report["moelite"]
    if peer:
        md.append("| llama.cpp (%s) | %.1f | %.2f | 1.00 | 1.00 |" % (peer["build_commit"], peer["prefill_tok_s"],
                                                                     peer["decode_tok_s"]))
    elif failed_peer:
        md.append("| llama.cpp: failed (%s) | - | - | - | - |" % failed_peer["error"].replace("|", "/")[:160])
    md.append("| moelite %s | %.1f | %.2f | %s | %s |" % (
        mo["backend"], mo["prefill_tok_s"], mo["decode_tok_s"],
        "%.2f" % report["decode_ratio"] if peer else "-", "%.2f" % report["prefill_ratio"] if peer else "-"))
    on_device = mo.get("bound_memory") == "device"
    md += ["", "moelite decode at %.0f %% of its %s bound (%.1f GB/s measured)." % (
        100 * mo["decode_fraction_of_bound"], "device memory" if on_device else "DRAM",
        mo["device_memory_gb_s"] if on_device else mo["dram_read_gb_s"])]
    md.insert(0, "%s, %d threads, %s (-p %d, -n %d)\n" % (report["cpu"], a.threads, report["model"], a.prompt, a.gen))
    text = "\n".join(md) + ("\n\n" + budgeted_table(report) if budgeted else "")
    print(text)
    finish(a, report, text)


def budgeted_table(report):
    """The budgeted rows as Markdown: speed with its spread, what was read, the storage bound and
    the decode step's breakdown (bench's step_ms)."""
    md = ["%s, %d threads, %s, %d decoded tokens per sequence; storage speed: the faster of a probe with "
          "the store's reads and the store's own rate while reading (or as given for a capped device)." % (
              report["cpu"], report["threads"], report["model"], report["n_gen"]), "",
          "| storage | budget | sequences | policy | predictor | expert file | decode tok/s [min..max] | hit rate "
          "| MB read/token | reads/token | storage GB/s (probe) | bound tok/s | fraction of bound "
          "| step ms: computing / waiting | storage reading / idle ms |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for b in report["budgeted"]:
        s = b["step_ms"]
        md.append("| %s | %s | %d | %s | %s | %s | %.2f [%.2f..%.2f] | %.3f | %.2f | %s | %.2f (%.2f) | %.2f | %.2f "
                  "| %.1f / %.1f | %.1f / %.1f |" % (
                      b["storage"], b["budget"], b["n_seq"], b["policy"], b["predictor"], b.get("expert_file", "model"),
                      b["decode_tok_s"],
                      b["decode_tok_s_min"], b["decode_tok_s_max"], b["hit_rate"], b["bytes_read_per_token"] / 1e6,
                      "%.1f" % b["reads_per_token"] if "reads_per_token" in b else "-",
                      b["storage_read_gb_s"], b["storage_probe_gb_s"], b["budget_bound_tok_s"],
                      b["decode_fraction_of_budget_bound"], s["compute"], s["load_wait"], s["read_busy"],
                      s["read_idle"]))
    return "\n".join(md)


def finish(a, report, text, into_text=None):
    print(json.dumps(report))
    if a.json:
        json.dump(report, open(a.json, "w"), indent=1)
    if a.md:
        open(a.md, "w").write(text + "\n")
    if a.into and report["budgeted"]:
        render_into(a.into, into_text or budgeted_table(report), a.section)


def render_into(path, table, section="budgeted-decode"):
    """Replaces what lies between the section's markers of `path` with `table`."""
    begin, end = "<!-- %s:begin -->" % section, "<!-- %s:end -->" % section
    doc = open(path).read()
    if begin not in doc or end not in doc:
        sys.exit("%s has no %s ... %s section" % (path, begin, end))
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    open(path, "w").write(head + begin + "\n" + table + "\n" + end + tail)


if __name__ == "__main__":
    main()
