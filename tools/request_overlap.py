#!/usr/bin/python3
"""What Read-ME-style request scheduling could save: requests grouped into batches by their
prompts' routing against the same requests in arrival order, counted as the distinct experts a
decode step of each batch uses (the reads a step cannot share).

R windows of held-out text are the requests: the first --prompt tokens are the prompt, the next
--decode tokens (teacher-forced) the decode steps. A request's signature is its prompt's expert
histogram (every layer); grouping is greedy: each batch starts from the oldest waiting request and
takes the waiting ones whose signatures are closest (cosine) to the batch's mean. Routing comes
from the independent numpy reference forward (tests/reference), not from the engine.

    /usr/bin/python3 tools/request_overlap.py MODEL.gguf TEXT [--requests 64] [--batch 8] [--prompt 32] [--decode 16]
"""
import argparse
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from routing_report import RecordingModel, topk_sets  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--moelite", default=os.path.join(ROOT, "build", "bin", "moelite"))
    a = ap.parse_args()
    ids = [int(t) for t in subprocess.run([a.moelite, "tokenize", "-m", a.model, "-f", a.text], capture_output=True,
                                          text=True, check=True).stdout.split()]
    m = RecordingModel(a.model)
    E, k, L = m.n_expert, m.n_expert_used, m.n_layer
    P, D = a.prompt, a.decode
    rng = np.random.default_rng(a.seed)
    starts = np.sort(rng.choice(len(ids) - P - D, a.requests, replace=False))
    sigs, steps = [], []
    for s in starts:
        sel = [topk_sets(r["weights"], k) for r in m.forward_recorded(ids[s:s + P + D])]
        sig = np.zeros((L, E))
        for layer in range(L):
            np.add.at(sig[layer], sel[layer][:P].ravel(), 1)
        sigs.append(sig.ravel() / sig.sum())
        steps.append([[set(sel[layer][P + t]) for layer in range(L)] for t in range(D)])
    sigs = np.array(sigs)

    def distinct_per_step(batches):
        total = 0
        for b in batches:
            for t in range(D):
                total += sum(len(set().union(*[steps[r][t][layer] for r in b])) for layer in range(L))
        return total / (len(batches) * D)

    order = list(rng.permutation(a.requests))
    arrival = [order[i:i + a.batch] for i in range(0, len(order), a.batch)]
    left, grouped = list(order), []
    while left:
        b = [left.pop(0)]
        while len(b) < a.batch and left:
            c = sigs[b].mean(0)
            score = [sigs[r] @ c / (np.linalg.norm(sigs[r]) * np.linalg.norm(c)) for r in left]
            b.append(left.pop(int(np.argmax(score))))
        grouped.append(b)
    fifo, sched = distinct_per_step(arrival), distinct_per_step(grouped)
    print("distinct experts per decode step (of %d, %d layers x %d): arrival order %.2f, grouped by prompt "
          "routing %.2f (%.1f %% fewer); independent uniform routing would give %.2f"
          % (L * E, L, E, fifo, sched, 100 * (1 - sched / fifo), L * E * (1 - (1 - k / E) ** a.batch)))


if __name__ == "__main__":
    main()
