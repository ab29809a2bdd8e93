#!/usr/bin/env python3
"""Routing statistics of a MoE GGUF model on a text: what the offloading techniques depend on.

Per layer:
  usage_entropy         entropy of the expert-selection distribution / log(n_expert)
                        (1 = uniform use, 0 = one expert always)
  usage_max_share       share of all selections taken by the most used expert
  distinct_sets_share   distinct top-k expert sets / tokens (input dependence: low = few fixed sets)
  top1_weight_*         the largest routing weight per token (mean, p10/p50/p90)
  cos_next_hidden       cosine similarity of the residual stream entering this layer and the next
  next_gate_recall      layer l+1's router applied to layer l's MoE input (the residual after layer
                        l's attention, normed with l+1's ffn_norm): share of layer l+1's actual
                        experts it predicts. chance_recall = k / n_expert for comparison.

The model is run by the independent numpy reference forward (float64), on consecutive windows of
--ctx tokens. Tokens come from `moelite tokenize` (so the engine's tokenizer is used).

    /usr/bin/python3 tools/routing_report.py MODEL.gguf -f text.txt [--ctx 256] [--max-tokens 4096] [--json]
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from reference_forward import ReferenceModel, rms_norm  # noqa: E402


class RecordingModel(ReferenceModel):
    """The reference forward, keeping each layer's residual input, MoE input and routing."""

    def forward_recorded(self, tokens):
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(tokens.size)
        h = self.w("token_embd.weight")[tokens].copy()
        layers = []
        for il in range(self.n_layer):
            p = "blk.%d." % il
            h_in = h.copy()
            h = h + self.attention(il, rms_norm(h, self.w(p + "attn_norm.weight"), self.eps), pos)
            h_mid = h.copy()
            x = rms_norm(h, self.w(p + "ffn_norm.weight"), self.eps)
            rec = []
            h = h + self.moe(il, x, rec)
            layers.append(dict(h_in=h_in, h_mid=h_mid, weights=rec[0]))
        return layers


def topk_sets(weights, k):
    return np.argsort(-weights, axis=-1, kind="stable")[:, :k]


def report(model_path, tokens, ctx):
    m = RecordingModel(model_path)
    E, k, L = m.n_expert, m.n_expert_used, m.n_layer
    per_layer = [dict(h_in=[], h_mid=[], weights=[]) for _ in range(L)]
    for w0 in range(0, len(tokens), ctx):
        win = tokens[w0:w0 + ctx]
        if not win:
            break
        for il, rec in enumerate(m.forward_recorded(win)):
            for key in rec:
                per_layer[il][key].append(rec[key])
    data = [{key: np.concatenate(v) for key, v in d.items()} for d in per_layer]
    out = []
    for il in range(L):
        wts = data[il]["weights"]
        sel = topk_sets(wts, k)
        counts = np.bincount(sel.ravel(), minlength=E).astype(np.float64)
        p = counts / counts.sum()
        nz = p[p > 0]
        entropy = float(-(nz * np.log(nz)).sum() / np.log(E)) if E > 1 else 0.0
        top1 = wts.max(axis=1)
        row = dict(layer=il, usage_entropy=entropy, usage_max_share=float(p.max()),
                   usage_min_share=float(p.min()),
                   distinct_sets_share=len({tuple(sorted(s)) for s in sel.tolist()}) / len(sel),
                   top1_weight_mean=float(top1.mean()), top1_weight_p10=float(np.percentile(top1, 10)),
                   top1_weight_p50=float(np.percentile(top1, 50)), top1_weight_p90=float(np.percentile(top1, 90)))
        if il + 1 < L:
            a, b = data[il]["h_in"], data[il + 1]["h_in"]
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)
            row["cos_next_hidden"] = float(cos.mean())
            nxt = "blk.%d." % (il + 1)
            x_pred = rms_norm(data[il]["h_mid"], m.w(nxt + "ffn_norm.weight"), m.eps)
            pred = topk_sets(m.route(il + 1, x_pred), k)
            actual = topk_sets(data[il + 1]["weights"], k)
            hits = [len(set(a_) & set(p_)) for a_, p_ in zip(actual.tolist(), pred.tolist())]
            row["next_gate_recall"] = float(np.mean(hits) / k)
        out.append(row)
    return dict(model=model_path, n_tokens=len(tokens), n_layers=L, n_expert=E, top_k=k,
                chance_recall=k / E, layers=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--moelite", default=os.path.join(ROOT, "build", "bin", "moelite"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ids = subprocess.run([a.moelite, "tokenize", "-m", a.model, "-f", a.file], capture_output=True, text=True,
                         check=True).stdout.split()
    tokens = [int(t) for t in ids][: a.max_tokens]
    r = report(a.model, tokens, a.ctx)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print("%s: %d tokens, %d layers, %d experts, top-%d (chance recall %.3f)"
          % (r["model"], r["n_tokens"], r["n_layers"], r["n_expert"], r["top_k"], r["chance_recall"]))
    print("layer  entropy  max_share  distinct_sets  top1_mean  top1_p10/p50/p90   cos_next  next_gate_recall")
    for row in r["layers"]:
        print("%5d  %7.3f  %9.3f  %13.3f  %9.3f  %5.2f/%4.2f/%4.2f  %8s  %16s" % (
            row["layer"], row["usage_entropy"], row["usage_max_share"], row["distinct_sets_share"],
            row["top1_weight_mean"], row["top1_weight_p10"], row["top1_weight_p50"], row["top1_weight_p90"],
            "%.3f" % row["cos_next_hidden"] if "cos_next_hidden" in row else "-",
            "%.3f" % row["next_gate_recall"] if "next_gate_recall" in row else "-"))


if __name__ == "__main__":
    main()
