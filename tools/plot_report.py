#!/usr/bin/python3
"""PNG plots of what moelite measured, with Debian's matplotlib (python3-matplotlib):

    /usr/bin/python3 tools/plot_report.py timeline TRACE.json -o timeline.png [--from-ms A --to-ms B]
    /usr/bin/python3 tools/plot_report.py hit-curves PROFILE.json -o hit_curves.png
    /usr/bin/python3 tools/plot_report.py gating CACHE_AWARE_REPORT.json -o gating.png
    /usr/bin/python3 tools/plot_report.py allocation PROFILE.json -o allocation.png --model M [--budgets 25%,50%]

timeline: a trace of `--trace-events` (or moelite_model_trace_begin): one row per thread; on the
evaluating thread each layer (labelled L0, L1, ...: what its routing and experts leave of it is
attention, norms and dense FFNs) with its routing, expert computation and waits for loads in red,
and outside the layers the embedding and output head; the loader threads' reads. One evaluation
(--eval N, default -1, the last; out of range is an error), named as a prompt of N tokens or a
decode step, or a span of --from-ms/--to-ms.
hit-curves: the LRU hit rate of each layer against the experts its cache holds, from a calibration
profile (`moelite calibrate`): what the DP allocation of a budget among layers reads.
gating: tools/cache_aware_report.py's table: expert loads per token and experts per token against
perplexity for exact, sensitivity and cache-aware gating (with and without substitution) at each budget, each point labelled with
its threshold (cache-aware: threshold/penalty).
allocation: the DP allocation of each budget among the layers, as the engine makes it at load
(`moelite info --allocation dp --verbose` reports it), against equal quotas.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Drawing order: backgrounds first (an evaluation, then its layers), then what is recorded in them.
COLORS = {"context": "#e4e4e4", "layer": "#cfdceb", "router": "#4c78a8", "compute": "#59a14f", "io": "#f28e2b",
          "wait": "#d62728"}
LABELS = {"context": "embedding, output head (outside the layers)",
          "layer": "attention, norms, dense FFN (the rest of a layer)", "router": "routing",
          "compute": "expert compute", "io": "expert read", "wait": "wait for a load"}


def evaluation_name(ev):
    tokens = ev.get("args", {}).get("tokens", 0)
    return "prompt of %d tokens" % tokens if tokens > 1 else "decode step (1 token)"


def timeline(a):
    trace = json.load(open(a.input))
    events = trace["traceEvents"]
    names = {ev["tid"]: ev["args"]["name"] for ev in events if ev["ph"] == "M"}
    spans = [ev for ev in events if ev["ph"] == "X"]
    if not spans:
        sys.exit("the trace has no events")
    evals = sorted((ev for ev in spans if ev["cat"] == "context"), key=lambda ev: ev["ts"])
    title = None
    if evals:
        if not -len(evals) <= a.eval < len(evals):
            sys.exit("--eval %d: the trace has %d evaluations (0..%d, or -1 for the last)"
                     % (a.eval, len(evals), len(evals) - 1))
        index = a.eval % len(evals)
        pick = evals[index]
        lo, hi = pick["ts"], pick["ts"] + pick["dur"]
        title = "evaluation %d of %d (%s): %.1f ms" % (index, len(evals), evaluation_name(pick), pick["dur"] / 1000)
    elif a.eval != -1:
        sys.exit("--eval %d: the trace has no evaluations" % a.eval)
    else:
        lo, hi = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    if a.from_ms is not None or a.to_ms is not None:
        lo = a.from_ms * 1000 if a.from_ms is not None else lo
        hi = a.to_ms * 1000 if a.to_ms is not None else hi
        if hi <= lo:
            sys.exit("--from-ms must be before --to-ms")
        title = "%.1f to %.1f ms" % (lo / 1000, hi / 1000)
    tids = sorted({ev["tid"] for ev in spans}, key=lambda t: (names.get(t, "~") != "evaluation", t))
    row = {t: i for i, t in enumerate(tids)}
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.6 * len(tids)))
    shown = [ev for ev in spans if ev["ts"] + ev["dur"] >= lo and ev["ts"] <= hi]
    order = list(COLORS)
    shown.sort(key=lambda ev: order.index(ev["cat"]) if ev["cat"] in order else len(order))
    width_ms = (hi - lo) / 1000
    for ev in shown:
        s = (ev["ts"] - lo) / 1000
        d = max(ev["dur"], 1) / 1000
        height = {"context": 0.9, "layer": 0.8}.get(ev["cat"], 0.55)
        y = row[ev["tid"]]
        ax.broken_barh([(s, d)], (y - height / 2, height), facecolors=COLORS.get(ev["cat"], "#999999"),
                       edgecolors="#ffffff" if ev["cat"] == "layer" else "none", linewidth=0.8)
        # Layers and evaluations are named where they are wide enough to hold the name.
        if ev["cat"] == "layer" and d > width_ms / 60:
            ax.text(s + d / 2, y - 0.42, "L%d" % ev["args"]["layer"], ha="center", va="bottom", fontsize=7,
                    color="#20313f", clip_on=True)
        elif ev["cat"] == "context" and d > width_ms / 8 and ev is not (evals[a.eval] if evals else None):
            ax.text(s + d / 2, y + 0.47, evaluation_name(ev), ha="center", va="top", fontsize=7, clip_on=True)
    ax.set_yticks(range(len(tids)))
    ax.set_yticklabels(["%s (%d)" % (names.get(t, "thread"), t) for t in tids])
    ax.set_ylim(len(tids) - 0.4, -0.7)
    ax.set_xlabel("ms")
    ax.set_xlim(0, width_ms)
    present = [c for c in COLORS if any(ev["cat"] == c for ev in shown)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in present]
    ax.legend(handles, [LABELS[c] for c in present], loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3,
              frameon=False, fontsize=8)
    ax.set_title(a.title or "moelite timeline: " + (title or "%.1f ms" % width_ms))
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


def hit_curves(a):
    prof = json.load(open(a.input))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, layer in enumerate(prof["layers"]):
        curve = layer.get("hit_curve")
        if curve:
            ax.plot(range(len(curve)), curve, label="layer %d" % i)
    ax.set_xlabel("experts the layer's cache holds")
    ax.set_ylabel("hit rate (LRU, calibration routing)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(a.title or "Hit rate against cache size per layer")
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


def gating(a):
    rows = json.load(open(a.input))["rows"]
    budgets = sorted({r["budget"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    marks = {"exact": "s", "sensitivity": "o", "cache-aware": "^"}
    # Cache-aware runs with and without substitution are separate curves.
    curves = sorted({(r["mode"], r.get("substitutes") or 0) for r in rows},
                    key=lambda c: (list(marks).index(c[0]), c[1]))
    for budget in budgets:
        for mode, n_sub in curves:
            rs = sorted((r for r in rows if r["budget"] == budget and r["mode"] == mode
                         and (r.get("substitutes") or 0) == n_sub), key=lambda r: r["perplexity"])
            if not rs:
                continue
            name = mode + (" + %d substitutes" % n_sub if n_sub else "")
            for ax, key in zip(axes, ("loads_per_token", "experts_per_token")):
                ax.plot([r["perplexity"] for r in rs], [r[key] for r in rs], marker="v" if n_sub else marks[mode],
                        linestyle="-", label="%s, %s" % (name, budget))
                if mode != "exact":  # each point's threshold (and cache-aware's penalty)
                    for r in rs:
                        tag = "%g" % r["threshold"] + ("/%g" % r["penalty"] if r.get("penalty") else "")
                        ax.annotate(tag, (r["perplexity"], r[key]), fontsize=6, alpha=0.7,
                                    xytext=(3, 3), textcoords="offset points")
    for ax, label in zip(axes, ("expert loads per token", "experts per token")):
        ax.set_xlabel("perplexity")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(a.title or "Gating: I/O and experts kept against quality")
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


def allocation(a):
    budgets = [b for b in a.budgets.split(",") if b]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(1, len(budgets))
    for i, budget in enumerate(budgets):
        r = subprocess.run([a.bin, "info", "-m", a.model, "--budget", budget, "--profile", a.input, "--allocation", "dp",
                            "--verbose"], capture_output=True, text=True)
        m = re.search(r"per-layer slots from the profile's DP allocation: ([0-9 ]+)", r.stderr)
        if r.returncode != 0 or not m:
            sys.exit("moelite info did not report a DP allocation for %s:\n%s" % (budget, r.stderr[-2000:]))
        slots = [int(x) for x in m.group(1).split()]
        xs = [l + (i - (len(budgets) - 1) / 2) * width for l in range(len(slots))]
        bars = ax.bar(xs, slots, width=width, label="%s budget (DP)" % budget)
        even = sum(slots) / sum(1 for q in slots if q > 0)
        ax.axhline(even, color=bars.patches[0].get_facecolor(), linestyle="--", linewidth=1,
                   label="%s budget, equal quotas" % budget)
    ax.set_xlabel("layer")
    ax.set_ylabel("expert slots")
    ax.set_xticks(range(len(slots)))
    ax.legend(fontsize=8)
    ax.set_title(a.title or "DP allocation of the expert budget among layers")
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["timeline", "hit-curves", "gating", "allocation"])
    p.add_argument("input")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--title")
    p.add_argument("--from-ms", type=float)
    p.add_argument("--to-ms", type=float)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--model", help="allocation: the model the profile was made for")
    p.add_argument("--budgets", default="25%,50%", help="allocation: budgets to allocate")
    p.add_argument("--bin", default=os.path.join(root, "build", "bin", "moelite"))
    p.add_argument("--eval", type=int, default=-1, help="timeline: which evaluation to show (0: the first; -1: the last)")
    a = p.parse_args()
    if a.kind == "allocation" and not a.model:
        p.error("allocation needs --model")
    {"timeline": timeline, "hit-curves": hit_curves, "gating": gating, "allocation": allocation}[a.kind](a)


if __name__ == "__main__":
    main()
