#!/usr/bin/python3
"""How many expert reads a decode step of N sequences can save, at best: a routing trace of one
sequence (`moelite trace record`) replayed as N sequences decoding together, under LRU and under
Belady's optimum (every future step known), per generated token.

Sequence i follows the trace from token i * T / N on, so the N sequences cover the trace once
(T / N steps each). A step reads, in each layer, the union of its sequences' experts: those not in
the layer's cache are loads. The step's experts are all computed, resident ones first, whatever
the capacity (as the expert store serves a step larger than its pool, in groups); afterwards the
cache keeps `capacity` of its residents and the step's experts: the most recently used (LRU), those
whose next use is expected soonest from their layer's turn and their reuse rate (cyclic, the store's
default; core/experts/cache_policy.cpp), or those used again soonest (Belady, the bound for any
policy, prediction included). The first pass
over the steps only warms the caches (a steady state). Independent of the engine: it reads the
trace file only.

    /usr/bin/python3 tools/batch_bound.py TRACE --capacity C|P% [--n-seq 1,2,4,8,16] [--global] [--json]
"""
import argparse
import bisect
import json
import sys


def read_trace(path):
    """{token: {layer: experts}}, n_layers, n_experts (header or data)."""
    routes, n_layers, n_experts = {}, 0, 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            if "token" not in d:
                n_layers, n_experts = d.get("n_layers", 0), d.get("n_experts", 0)
                continue
            routes.setdefault(d["token"], {}).setdefault(d["layer"], set()).update(d["experts"])
            n_layers = max(n_layers, d["layer"] + 1)
            n_experts = max(n_experts, max(d["experts"], default=-1) + 1)
    return [routes[t] for t in sorted(routes)], n_layers, n_experts


def steps_of(tokens, n_seq):
    """Per step, per layer: the union of the n_seq sequences' experts."""
    per_seq = len(tokens) // n_seq
    out = []
    for s in range(per_seq):
        step = {}
        for i in range(n_seq):
            for layer, experts in tokens[i * len(tokens) // n_seq + s].items():
                step.setdefault(layer, set()).update(experts)
        out.append(step)
    return out


def replay(steps, n_layers, capacity, global_pool, policy):
    """Loads of the second pass over `steps` (the first warms the caches)."""
    # The accesses in order: (cache, the set of keys the step reads there); a key is (layer, expert).
    accesses = []
    for _ in range(2):
        for step in steps:
            for layer in range(n_layers):
                if step.get(layer):
                    accesses.append((0 if global_pool else layer, {(layer, x) for x in step[layer]}))
    uses = {}  # key -> the indices of the accesses that read it, ascending
    for i, (_, keys) in enumerate(accesses):
        for k in keys:
            uses.setdefault(k, []).append(i)

    def next_use(k, i):
        at = bisect.bisect_right(uses[k], i)
        return uses[k][at] if at < len(uses[k]) else len(accesses)
    caches, last, rate = {}, {}, {}
    passes, served, half_life = 0, -1, 8.0
    steady = 1 / (1 - 0.5 ** (1 / half_life))

    def rate_now(k):
        value, at = rate.get(k, (0.0, passes))
        return value * 0.5 ** ((passes - at) / half_life)
    loads = 0
    counted_from = len(accesses) // 2
    for i, (c, keys) in enumerate(accesses):
        cache = caches.setdefault(c, set())
        if i >= counted_from:
            loads += len(keys - cache)
        layer = next(iter(keys))[0]
        if layer <= served:
            passes += 1
        served = layer
        for k in keys:
            last[k] = i
            rate[k] = (rate_now(k) + 1, passes)
        pool = cache | keys
        if len(pool) > capacity:
            if policy == "lru":  # most recent first; within a step, by key (any order is as good)
                rank = sorted(pool, key=lambda k: (-last[k], k))
            elif policy == "cyclic":  # the soonest expected next use (turns to its layer's, reuse rate)
                def expected(k):
                    p = min(1.0, max(1e-3, rate_now(k) / steady))
                    return (k[0] - layer - 1) % n_layers + n_layers * (1 / p - 1)
                rank = sorted(pool, key=lambda k: (expected(k), -last[k], k))
            else:  # soonest next use first; never used again last
                rank = sorted(pool, key=lambda k: (next_use(k, i), k))
            pool = set(rank[:capacity])
        caches[c] = pool
    return loads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--capacity", required=True, help="experts per cache, or P%% of a layer's (of all, --global)")
    ap.add_argument("--n-seq", default="1,2,4,8,16")
    ap.add_argument("--global", dest="global_pool", action="store_true", help="one cache for all layers")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tokens, n_layers, n_experts = read_trace(a.trace)
    if a.capacity.endswith("%"):
        pool = n_experts * (n_layers if a.global_pool else 1)
        capacity = int(float(a.capacity[:-1]) * pool / 100 + 1e-9)
    else:
        capacity = int(a.capacity)
    if capacity < 1:
        sys.exit("batch_bound.py: capacity %s is below one expert" % a.capacity)
    rows = []
    for n in (int(x) for x in a.n_seq.split(",")):
        if not 1 <= n <= len(tokens):
            sys.exit("batch_bound.py: --n-seq %d is outside 1..%d (the trace's tokens)" % (n, len(tokens)))
        steps = steps_of(tokens, n)
        generated = len(steps) * n
        lru, cyclic, belady = (replay(steps, n_layers, capacity, a.global_pool, p) / generated
                               for p in ("lru", "cyclic", "belady"))
        rows.append({"n_seq": n, "steps": len(steps), "lru_loads_per_token": round(lru, 4),
                     "cyclic_loads_per_token": round(cyclic, 4), "belady_loads_per_token": round(belady, 4)})
    one = rows[0]
    for r in rows:
        r["lru_fewer_than_first"] = round(one["lru_loads_per_token"] / r["lru_loads_per_token"], 3) \
            if r["lru_loads_per_token"] else None
        r["belady_fewer_than_first_lru"] = round(one["lru_loads_per_token"] / r["belady_loads_per_token"], 3) \
            if r["belady_loads_per_token"] else None
    if a.json:
        print(json.dumps({"trace": a.trace, "capacity": capacity, "global": a.global_pool, "tokens": len(tokens),
                          "rows": rows}))
        return
    print("%d tokens, %d layers x %d experts; capacity %d experts %s" % (
        len(tokens), n_layers, n_experts, capacity, "shared by all layers" if a.global_pool else "per layer"))
    print("%6s %7s %12s %15s %14s %12s %20s %16s" % (
        "n_seq", "steps", "LRU loads/tok", "cyclic loads/tok", "Belady loads/tok", "LRU x fewer",
        "Belady x fewer (vs %d LRU)" % one["n_seq"], "cyclic / Belady"))
    for r in rows:
        print("%6d %7d %12.3f %15.3f %14.3f %12.2f %20.2f %16.2f" % (
            r["n_seq"], r["steps"], r["lru_loads_per_token"], r["cyclic_loads_per_token"], r["belady_loads_per_token"],
            r["lru_fewer_than_first"] or 0, r["belady_fewer_than_first_lru"] or 0,
            r["cyclic_loads_per_token"] / r["belady_loads_per_token"] if r["belady_loads_per_token"] else 0))


if __name__ == "__main__":
    main()
