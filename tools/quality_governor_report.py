#!/usr/bin/python3
"""The quality governor against its targets, by running the `moelite` CLI: for each target (a
perplexity rise) without a calibration profile and with one, the perplexity rise actually measured
against exact routing on held-out text, the experts per token, the meter's KL and top-1 agreement,
and the meter's cost (tokens/s with and without it at its default sampling rate).

    /usr/bin/python3 tools/quality_governor_report.py [--model M] [--bin build/bin/moelite]
        [--targets 0.5%,1%,2%] [--bytes 40000] [--budget 25%] [--out DIR]

Text: the held-out text (tools/train/data/heldout.txt) is split at a line end; the first half
calibrates (`moelite calibrate`, for the "profile" rows), the last --bytes of the second half are
evaluated: `moelite perplexity --batch 1` (token by token, as decoding), windows of --ctx tokens,
`--gating sensitivity --quality-target T`. The rise is perplexity / exact perplexity - 1 on the
same tokens; the goal (the quality issue): the rise within 1.25x the target, and at 1 % at least
25 % fewer experts per token than exact without a profile, 30 % with one. With --budget, the same
runs under that expert budget add loads per token (cache-aware gating).

Writes DIR/quality_governor_report.json and .md and prints the Markdown.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from adaptive_report import run_json as untimed_run_json  # noqa: E402


def run_json(cmd):
    """adaptive_report's run_json, with the command's wall time as "seconds"."""
    t0 = time.monotonic()
    d = untimed_run_json(cmd)
    d["seconds"] = time.monotonic() - t0
    return d


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf"))
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "moelite"))
    p.add_argument("--text", default=os.path.join(ROOT, "tools", "train", "data", "heldout.txt"))
    p.add_argument("--targets", default="0.5%,1%,2%")
    p.add_argument("--bytes", type=int, default=40000, help="bytes of the evaluation half to evaluate (its end)")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--calibrate-tokens", type=int, default=4096)
    p.add_argument("--budget", default="", help="also run cache-aware gating under this expert budget (e.g. 25%%)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "build", "quality_governor_report"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)

    data = open(a.text, "rb").read()
    cut = data.rfind(b"\n", 0, len(data) // 2) + 1
    cal, ev = os.path.join(a.out, "calibration.txt"), os.path.join(a.out, "evaluation.txt")
    open(cal, "wb").write(data[:cut])
    tail = data[cut:][-a.bytes:]
    open(ev, "wb").write(tail[tail.find(b"\n") + 1:])
    profile = os.path.join(a.out, "profile.json")
    subprocess.run([a.bin, "calibrate", "-m", a.model, "-f", cal, "-o", profile, "--max-tokens",
                    str(a.calibrate_tokens), "--ctx", str(a.ctx), "-t", str(a.threads)], check=True,
                   capture_output=True)

    base = [a.bin, "perplexity", "-m", a.model, "-f", ev, "--ctx", str(a.ctx), "--batch", "1", "-t",
            str(a.threads), "--json"]
    exact = run_json(base)
    rows = []
    modes = [("sensitivity", "")] + ([("cache-aware", a.budget)] if a.budget else [])
    for mode, budget in modes:
        extra_budget = ["--budget", budget] if budget else []
        exact_b = run_json(base + extra_budget) if budget else exact
        for with_profile in (False, True):
            for target in a.targets.split(","):
                cmd = base + extra_budget + ["--gating", mode, "--quality-target", target]
                if with_profile:
                    cmd += ["--profile", profile]
                d = run_json(cmd)
                q = d["quality"]
                rise = d["perplexity"] / exact["perplexity"] - 1
                goal = float(target.rstrip("%")) / 100
                rows.append({"mode": mode, "budget": budget or None, "profile": with_profile, "target": target,
                             "target_rise": goal, "perplexity": d["perplexity"], "rise": rise,
                             "within_1_25x": rise <= 1.25 * goal,
                             "experts_per_token": d["experts_per_token"],
                             "fewer_experts": 1 - d["experts_per_token"] / exact["experts_per_token"],
                             "loads_per_token": d["loads_per_token"], "exact_loads_per_token": exact_b["loads_per_token"],
                             "metered_tokens": q["metered_tokens"], "kl_mean": q["kl_mean"], "kl_stderr": q["kl_stderr"],
                             "top1_agreement": q["top1_agreement"], "predicted_loss_metered": q["predicted_loss_metered"],
                             "target_kl": q["target_kl"], "final_threshold": q["threshold"],
                             "meter_seconds": q["meter_seconds"], "seconds": d["seconds"]})
    # The meter's cost: the same governed run, sampling every eighth step (the default) and one step in
    # 10^6 (the governor then steers on the sensitivity model alone), and tokens/s of both.
    costs = []
    for rate in ("0.125", "0.000001"):
        d = run_json(base + ["--gating", "sensitivity", "--profile", profile, "--quality-target", "1%",
                             "--quality-sample", rate])
        costs.append({"sample_rate": float(rate), "tokens_per_second": d["n_tokens"] / d["seconds"],
                      "meter_seconds": d["quality"]["meter_seconds"], "seconds": d["seconds"]})
    report = {"model": os.path.basename(a.model), "tokens": exact["n_tokens"], "exact_perplexity": exact["perplexity"],
              "exact_experts_per_token": exact["experts_per_token"], "rows": rows, "meter_cost": costs}
    json.dump(report, open(os.path.join(a.out, "quality_governor_report.json"), "w"), indent=1)

    md = ["%s, %d held-out tokens decoded one by one (windows of %d), exact perplexity %.3f, %.2f experts/token."
          % (report["model"], report["tokens"], a.ctx, exact["perplexity"], exact["experts_per_token"]), "",
          "| gating | profile | target | rise measured | experts/token | fewer experts | loads/token (exact) "
          "| meter KL (nats/token) | predicted | top-1 agreement |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loads = "—" if r["loads_per_token"] is None else "%.3f (%.3f)" % (r["loads_per_token"], r["exact_loads_per_token"])
        md.append("| %s%s | %s | %s | %+.2f %% | %.3f | %.0f %% | %s | %.4f ± %.4f (target %.4f) | %.4f | %.3f |" % (
            r["mode"], " " + r["budget"] if r["budget"] else "", "yes" if r["profile"] else "no", r["target"],
            100 * r["rise"], r["experts_per_token"], 100 * r["fewer_experts"], loads, r["kl_mean"], r["kl_stderr"],
            r["target_kl"], r["predicted_loss_metered"], r["top1_agreement"]))
    md += ["", "Meter cost (sensitivity, profile, 1 %%): %.0f tokens/s sampling every 8th step, %.0f tokens/s with "
           "sampling off (%.1f %% of the time in exact passes)." % (
               costs[0]["tokens_per_second"], costs[1]["tokens_per_second"],
               100 * costs[0]["meter_seconds"] / costs[0]["seconds"])]
    text = "\n".join(md) + "\n"
    open(os.path.join(a.out, "quality_governor_report.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
