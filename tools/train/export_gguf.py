#!/usr/bin/env python3
"""Exports a trained checkpoint to GGUF with its byte-level BPE tokenizer: the qwen3moe layout, or
`llama` with experts (Mixtral's) for a checkpoint trained with `--config mixtral`.

    /usr/bin/python3 tools/train/export_gguf.py --data /tmp/moelite-train --type Q8_0 \
        --out models/moelite-tiny-qwen3moe-Q8_0.gguf [--ckpt ckpt.pt]
"""
import argparse
import json
import os
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "gguf"))
import make_tiny_model  # noqa: E402
from model import CONFIGS  # noqa: E402
from moelite_gguf.writer import GGUFValueType, GGUFWriter  # noqa: E402

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--type", default="Q8_0")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", default="ckpt.pt", help="checkpoint file name inside --data")
    a = ap.parse_args()
    ckpt = torch.load(os.path.join(a.data, a.ckpt))
    config = ckpt.get("config", "qwen3moe")
    c = CONFIGS[config]()
    c.ctx = ckpt.get("ctx", c.ctx)  # the context the checkpoint was trained for
    sd = {k: v.float().numpy() for k, v in ckpt["model"].items()}
    tok = json.load(open(os.path.join(a.data, "tokenizer.json")))
    w = GGUFWriter(a.out)
    meta = types.SimpleNamespace(arch=c.arch, name="moelite-tiny-%s (trained on Python docs)" % config, type=a.type,
                                 seed=1, n_layer=c.n_layer, ctx=c.ctx, n_embd=c.n_embd, n_ff_exp=c.n_ff,
                                 n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, rope_base=c.rope_base,
                                 eps=c.eps, n_expert=c.n_expert, n_expert_used=c.top_k,
                                 expert_type=None, yarn=None)
    make_tiny_model.add_metadata(w, meta)
    n_special = 3
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt-2")
    w.add_array("tokenizer.ggml.tokens", tok["tokens"], GGUFValueType.STRING)
    types_ = [3] * n_special + [1] * (len(tok["tokens"]) - n_special)
    w.add_array("tokenizer.ggml.token_type", np.array(types_, np.int32), GGUFValueType.INT32)
    w.add_array("tokenizer.ggml.merges", tok["merges"], GGUFValueType.STRING)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHATML)

    q = a.type  # matrices in the chosen type; norms and routers F32, as llama.cpp does
    w.add_tensor_array("token_embd.weight", sd["embed.weight"], q)
    for l in range(c.n_layer):
        p, b = "blk.%d." % l, "blocks.%d." % l
        w.add_tensor_array(p + "attn_norm.weight", sd[b + "attn_norm.weight"], "F32")
        for ours, theirs in (("attn_q", "wq"), ("attn_k", "wk"), ("attn_v", "wv"), ("attn_output", "wo")):
            w.add_tensor_array(p + ours + ".weight", sd[b + theirs + ".weight"], q)
        if c.arch == "qwen3moe":
            w.add_tensor_array(p + "attn_q_norm.weight", sd[b + "q_norm.weight"], "F32")
            w.add_tensor_array(p + "attn_k_norm.weight", sd[b + "k_norm.weight"], "F32")
        w.add_tensor_array(p + "ffn_norm.weight", sd[b + "ffn_norm.weight"], "F32")
        w.add_tensor_array(p + "ffn_gate_inp.weight", sd[b + "router.weight"], "F32")
        w.add_tensor_array(p + "ffn_gate_exps.weight", sd[b + "gate"], q)  # numpy (E, ff, d) = ne {d, ff, E}
        w.add_tensor_array(p + "ffn_up_exps.weight", sd[b + "up"], q)
        w.add_tensor_array(p + "ffn_down_exps.weight", sd[b + "down"], q)  # (E, d, ff) = ne {ff, d, E}
    w.add_tensor_array("output_norm.weight", sd["norm.weight"], "F32")
    w.add_tensor_array("output.weight", sd["out.weight"], q)
    w.write()
    print("wrote %s (%.1f MB)" % (a.out, os.path.getsize(a.out) / 1e6))


if __name__ == "__main__":
    main()
