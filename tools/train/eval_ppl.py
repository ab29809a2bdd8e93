#!/usr/bin/env python3
"""Held-out perplexity of the PyTorch checkpoint with moelite's protocol: consecutive windows of
--ctx tokens, each from scratch, every token after a window's first scored (last partial window
counts when it has >= 2 tokens). Prints JSON like `moelite perplexity --json`.

    /usr/bin/python3 tools/train/eval_ppl.py --data /tmp/moelite-train [--ctx 256]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import CONFIGS, MoE  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--ids", default=None, help="token ids (uint16) to score; default DATA/heldout.ids")
    ap.add_argument("--ckpt", default="ckpt.pt", help="checkpoint file name inside --data")
    a = ap.parse_args()
    torch.set_num_threads(2)
    ckpt = torch.load(os.path.join(a.data, a.ckpt))
    model = MoE(CONFIGS[ckpt.get("config", "qwen3moe")]())
    model.load_state_dict(ckpt["model"])
    model.eval()
    ids = np.fromfile(a.ids or os.path.join(a.data, "heldout.ids"), dtype=np.uint16).astype(np.int64)
    nll, n = 0.0, 0
    with torch.no_grad():
        for w0 in range(0, len(ids), a.ctx):
            win = torch.from_numpy(ids[w0:w0 + a.ctx])
            if win.numel() < 2:
                break
            logits, _ = model(win[None])
            nll += F.cross_entropy(logits[0, :-1].double(), win[1:], reduction="sum").item()
            n += win.numel() - 1
    print(json.dumps({"perplexity": math.exp(nll / n), "tokens_scored": n}))


if __name__ == "__main__":
    main()
