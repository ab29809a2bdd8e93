#!/usr/bin/env python3
"""Trains the default model on the corpus from corpus.py for --steps optimizer steps,
deterministic for a seed (data order, initialisation and the learning-rate schedule depend only on
the seed and the step), saving a checkpoint every few minutes.

With --ctx N (above the --seq windows), the last --long-steps steps train on windows of N tokens
(--batch * --seq / N of them, so a step sees as many tokens as before): RoPE positions the short
windows never reach are trained, and the checkpoint records N as the model's context.

    /usr/bin/python3 tools/train/train.py --data /tmp/moelite-train --steps 850 --seed 1 --ctx 2048 --long-steps 250
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import CONFIGS, MoE  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=850)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux", type=float, default=0.01)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="qwen3moe")
    ap.add_argument("--ckpt", default="ckpt.pt", help="checkpoint file name inside --data")
    ap.add_argument("--ctx", type=int, default=0, help="the model's context (default: the config's, 256)")
    ap.add_argument("--long-steps", type=int, default=0, help="final steps on windows of --ctx tokens")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    c = CONFIGS[a.config]()
    if a.ctx:
        c.ctx = a.ctx
    long_from = a.steps - a.long_steps if a.long_steps and c.ctx > a.seq else a.steps
    long_batch = max(1, a.batch * a.seq // c.ctx)
    ids = torch.from_numpy(np.fromfile(os.path.join(a.data, "train.ids"), dtype=np.uint16).astype(np.int64))
    model = MoE(c)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.05)
    gen = torch.Generator().manual_seed(a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print("params %.2fM, tokens %d" % (n_params / 1e6, ids.numel()), flush=True)
    start, step, last_save, ema = time.time(), 0, time.time(), None
    while step < a.steps:
        frac = step / a.steps
        lr = a.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        seq, batch = (c.ctx, long_batch) if step >= long_from else (a.seq, a.batch)
        off = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[o:o + seq] for o in off])
        y = torch.stack([ids[o + 1:o + seq + 1] for o in off])
        logits, aux = model(x)
        loss = F.cross_entropy(logits.reshape(-1, c.vocab), y.reshape(-1))
        (loss + a.aux * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        step += 1
        if step % 25 == 0:
            print("step %d  %.0fs  loss %.3f  aux %.3f  lr %.2e" % (step, time.time() - start, ema, aux.item(), lr), flush=True)
        if time.time() - last_save > 180:
            torch.save({"model": model.state_dict(), "step": step, "config": a.config, "ctx": c.ctx},
                       os.path.join(a.data, a.ckpt))
            last_save = time.time()
    torch.save({"model": model.state_dict(), "step": step, "loss": ema, "seconds": time.time() - start,
                "config": a.config, "ctx": c.ctx}, os.path.join(a.data, a.ckpt))
    print("done: %d steps, loss %.3f, %.0f s" % (step, ema, time.time() - start), flush=True)


if __name__ == "__main__":
    main()
