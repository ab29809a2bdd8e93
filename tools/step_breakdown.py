#!/usr/bin/python3
"""Where each evaluation step's time went, from a timeline (`--trace-events FILE` of moelite run,
bench, chat...): per step (an "evaluate" span) its time, the share spent waiting for expert loads
and computing, and the storage side -- time with at least one expert read in flight, time with
none (idle), reads in flight on average, bytes read and the speed while reading. A decode step far
above its storage bound shows here as idle storage before a wait (the loads started late: no
prediction, or prediction too shallow) or as reading slower than the storage's probe (too few
reads in flight, small reads).

    /usr/bin/python3 tools/step_breakdown.py TRACE.json [--tokens N] [--json OUT]

Prints a Markdown table: one row per step, then the mean of the steps of N tokens (by default the
most common count: a decode run's steps of one token per sequence, not its prompts).
"""
import argparse
import json
import sys


def union_length(intervals, lo, hi):
    """Total length of the union of [a, b) intervals clipped to [lo, hi)."""
    spans = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, end = 0.0, lo
    for a, b in spans:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def in_flight_integral(intervals, lo, hi):
    """Integral over [lo, hi) of the number of intervals open: reads in flight x time."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


def breakdown(events, tokens):
    steps = sorted((e for e in events if e.get("name") == "evaluate" and e.get("ph") == "X"), key=lambda e: e["ts"])
    reads = [(e["ts"], e["ts"] + e["dur"], e.get("args", {}).get("bytes", 0))
             for e in events if e.get("name") == "read" and e.get("cat") == "io"]
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "wait"]
    read_spans = [(a, b) for a, b, _ in reads]
    rows = []
    for e in steps:
        lo, hi = e["ts"], e["ts"] + e["dur"]
        dur = hi - lo
        if dur <= 0:
            continue
        reading = union_length(read_spans, lo, hi)
        waiting = min(dur, union_length(waits, lo, hi))
        # Bytes of the reads that ended within the step (a read counts once, where it lands).
        landed = sum(n for a, b, n in reads if lo <= b < hi)
        rows.append({"tokens": e.get("args", {}).get("tokens", 0), "ms": dur / 1e3, "compute_ms": (dur - waiting) / 1e3,
                     "wait_ms": waiting / 1e3, "reading_ms": reading / 1e3, "idle_ms": (dur - reading) / 1e3,
                     "mean_in_flight": in_flight_integral(read_spans, lo, hi) / dur,
                     "mb_read": landed / 1e6, "gb_s_while_reading": landed / reading / 1e3 if reading > 0 else 0.0})
    if tokens is None and rows:
        counts = [r["tokens"] for r in rows]
        tokens = max(set(counts), key=counts.count)
    decode = [r for r in rows if r["tokens"] == tokens]
    mean = {k: sum(r[k] for r in decode) / len(decode) for k in decode[0] if k != "tokens"} if decode else {}
    return rows, mean, tokens


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--tokens", type=int, help="steps of this many tokens make the mean (default: the most common)")
    p.add_argument("--json", help="also write the rows and the mean here")
    a = p.parse_args()
    d = json.load(open(a.trace))
    events = d["traceEvents"] if isinstance(d, dict) else d
    rows, mean, tokens = breakdown(events, a.tokens)
    if not rows:
        sys.exit("no evaluate spans in %s" % a.trace)
    cols = ["ms", "compute_ms", "wait_ms", "reading_ms", "idle_ms", "mean_in_flight", "mb_read", "gb_s_while_reading"]
    print("| step | tokens | " + " | ".join(c.replace("_", " ") for c in cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for i, r in enumerate(rows):
        print("| %d | %d | " % (i, r["tokens"]) + " | ".join("%.2f" % r[c] for c in cols) + " |")
    if mean:
        print("| mean of the %d steps of %d tokens | | " % (sum(1 for r in rows if r["tokens"] == tokens), tokens)
              + " | ".join("%.2f" % mean[c] for c in cols) + " |")
    if a.json:
        json.dump({"steps": rows, "mean": mean, "mean_of_steps_of_tokens": tokens}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
