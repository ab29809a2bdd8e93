#!/usr/bin/python3
"""Reproduces the adaptive-MoE measurements (issue 6) on a model, by running the `moelite` CLI.

    /usr/bin/python3 tools/adaptive_report.py [--model M] [--bin build/bin/moelite] [--out DIR]

The held-out text (tools/train/data/heldout.txt) is split in two at a line end: the first half
calibrates (`moelite calibrate`), the second half is what perplexity and decode are measured on,
so no number is measured on the calibration text. Three tables, printed as Markdown and written
with everything measured to DIR/adaptive_report.json:

  1. gating: threshold T against experts per token and held-out perplexity, score-based and
     sensitivity-based, and the two compared at equal experts per token (linear interpolation);
  2. prediction: per predictor and layer, held-out accuracy from calibration, and live accuracy
     and timeliness under a 25 % budget while decoding the text;
  3. ablation at a 25 % budget (AdapMoE's): LRU with uniform per-layer quotas, + prefetch, + DP
     allocation, + adaptive gating, and all together: on-demand loads per token (the critical
     path), bytes read per token, hit rate and decode tok/s (median of --reps interleaved runs;
     this machine's timings swing by tens of percent).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def split_text(out_dir):
    data = open(os.path.join(ROOT, "tools", "train", "data", "heldout.txt"), "rb").read()
    cut = data.rfind(b"\n", 0, len(data) // 2) + 1
    cal, ev = os.path.join(out_dir, "calibration.txt"), os.path.join(out_dir, "evaluation.txt")
    open(cal, "wb").write(data[:cut])
    open(ev, "wb").write(data[cut:])
    return cal, ev


def interpolate(points, x):
    """y at x on the piecewise-linear curve through (x, y) points, or None outside it"""
    pts = sorted(points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def fmt(v, spec=".3f"):
    return "—" if v is None or (isinstance(v, float) and v != v) else format(v, spec)


def gating_table(a, model, profile, ev):
    base = ["-m", model, "-t", str(a.threads), "-f", ev, "--ctx", "256", "--json"]
    rows = []
    for mode, grid in (("sensitivity", [0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.3]),
                       ("score", [0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5])):
        for t in [0.0] + grid:
            extra = ["--gating", mode, "--threshold", repr(t), "--profile", profile] if t > 0 else []
            d = run_json([a.bin, "perplexity", *base, *extra])
            rows.append({"mode": mode if t > 0 else "exact", "threshold": t, "experts_per_token": d["experts_per_token"],
                         "perplexity": d["perplexity"]})
    exact = rows[0]["perplexity"]
    print("\n### 1. Adaptive gating: threshold vs experts per token vs held-out perplexity\n")
    print("| gating | T | experts/token (top-%d) | perplexity | vs exact |" % 2)
    print("|---|---|---|---|---|")
    seen = set()
    for r in rows:
        key = (r["mode"], r["threshold"])
        if key in seen:
            continue
        seen.add(key)
        print("| %s | %s | %.3f | %.3f | %+.2f %% |" % (r["mode"], fmt(r["threshold"], "g"), r["experts_per_token"],
                                                   r["perplexity"], 100 * (r["perplexity"] / exact - 1)))
    curves = {m: [(r["experts_per_token"], r["perplexity"]) for r in rows if r["mode"] in (m, "exact")]
              for m in ("sensitivity", "score")}
    print("\nAt equal experts per token (linear interpolation between measured points):\n")
    print("| experts/token | perplexity, score-based | perplexity, sensitivity-based |")
    print("|---|---|---|")
    compared = []
    for x in (1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2):
        s, g = interpolate(curves["score"], x), interpolate(curves["sensitivity"], x)
        compared.append({"experts_per_token": x, "score": s, "sensitivity": g})
        print("| %.1f | %s | %s |" % (x, fmt(s), fmt(g)))
    return {"rows": rows, "at_equal_experts": compared}


def bench(a, model, ev, extra):
    return run_json([a.bin, "bench", "-m", model, "-t", str(a.threads), "-p", "16", "-n", str(a.decode), "-f", ev,
                     "--json", "--no-membw", *extra])


def prediction_table(a, model, profile, ev):
    prof = json.load(open(profile))
    acc = prof["predictor_accuracy"]
    n_layer = len(prof["layers"])
    live = {}
    names = ["next-gate", "learned", "first-layer", "correlation"]
    for name in names:
        d = bench(a, model, ev, ["--budget", "25%", "--predictor", name, "--profile", profile])
        live[name] = d["layers"]
    print("\n### 2. Prediction: accuracy (share of used experts predicted) and timeliness (share fully loaded when needed)\n")
    print("Calibration: held-out accuracy; live: decoding %d tokens of the evaluation text at a 25 %% budget." % a.decode)
    print("\n| predictor | layer | accuracy (calibration) | accuracy (live) | timeliness (live) | hit rate (live) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        for l in range(n_layer):
            cal = acc.get(name, [None] * n_layer)[l]
            lv = live[name][l]
            print("| %s | %d | %s | %.3f | %.3f | %.3f |" % (name, l, fmt(cal), lv["accuracy"], lv["timeliness"],
                                                          lv["hit_rate"]))
    return {"calibration": acc, "live": live}


def ablation_table(a, model, profile, ev, threshold):
    gate = ["--gating", "sensitivity", "--threshold", repr(threshold)]
    pred = ["--predictor", a.predictor]
    configs = [
        ("LRU, uniform per-layer quotas", ["--allocation", "uniform"]),
        ("+ prefetch (%s)" % a.predictor, ["--allocation", "uniform", *pred]),
        ("+ DP allocation", ["--allocation", "dp"]),
        ("+ adaptive gating (T=%g)" % threshold, ["--allocation", "uniform", *gate]),
        ("all together", ["--allocation", "dp", *pred, *gate]),
    ]
    runs = {name: [] for name, _ in configs}
    for _ in range(a.reps):  # interleaved, so drifts of the machine hit every configuration alike
        for name, extra in configs:
            runs[name].append(bench(a, model, ev, ["--budget", "25%", "--profile", profile, *extra]))
    print("\n### 3. Ablation at a 25 %% expert budget (decode of %d tokens of the evaluation text, median of %d)\n"
          % (a.decode, a.reps))
    print("| configuration | on-demand loads/token | MB read/token | hit rate | experts/token | decode tok/s |")
    print("|---|---|---|---|---|---|")
    out = []
    for name, _ in configs:
        rs = runs[name]
        row = {"configuration": name,
               "on_demand_loads_per_token": statistics.median(r["on_demand_loads_per_token"] for r in rs),
               "bytes_read_per_token": statistics.median(r["bytes_read_per_token"] for r in rs),
               "hit_rate": statistics.median(r["hit_rate"] for r in rs),
               "experts_per_token": statistics.median(r["experts_per_token"] for r in rs),
               "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rs),
               "decode_tok_s_all": [r["decode_tok_s"] for r in rs]}
        out.append(row)
        print("| %s | %.3f | %.3f | %.3f | %.3f | %.0f |" % (name, row["on_demand_loads_per_token"],
                                                           row["bytes_read_per_token"] / 1e6, row["hit_rate"],
                                                           row["experts_per_token"], row["decode_tok_s"]))
    resident = bench(a, model, ev, [])
    print("\nEverything resident (no budget): %.0f tok/s." % resident["decode_tok_s"])
    return {"rows": out, "resident_decode_tok_s": resident["decode_tok_s"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf"))
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "moelite"))
    p.add_argument("--out", default="/tmp/moelite-adaptive-report")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode", type=int, default=400, help="decoded tokens per bench run")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--predictor", default="learned,first-layer", help="the prefetch of the ablation")
    p.add_argument("--threshold", type=float, default=None,
                   help="sensitivity threshold of the ablation (default: the largest measured one within 2 %% "
                        "of the exact perplexity)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cal, ev = split_text(a.out)
    profile = os.path.join(a.out, "profile.json")
    d = run_json([a.bin, "calibrate", "-m", a.model, "-t", str(a.threads), "-f", cal, "-o", profile, "--json"])
    print("calibrated on %d tokens in %.1f s -> %s" % (d["tokens"], d["seconds"], profile))
    report = {"model": a.model, "calibration": d}
    report["gating"] = gating_table(a, a.model, profile, ev)
    report["prediction"] = prediction_table(a, a.model, profile, ev)
    t = a.threshold
    if t is None:
        rows = report["gating"]["rows"]
        exact = rows[0]["perplexity"]
        ok = [r["threshold"] for r in rows if r["mode"] == "sensitivity" and r["perplexity"] <= exact * 1.02]
        t = max(ok) if ok else 0.001
    report["ablation"] = ablation_table(a, a.model, profile, ev, t)
    path = os.path.join(a.out, "adaptive_report.json")
    json.dump(report, open(path, "w"), indent=1)
    print("\nwrote %s" % path)


if __name__ == "__main__":
    main()
