"""The default model in PyTorch, computing exactly what moelite computes for `qwen3moe`:
pre-norm RMSNorm blocks (eps 1e-6), per-head q/k RMSNorm, NeoX RoPE (base 10000), causal GQA
attention scaled by 1/sqrt(head_dim), softmax router over all experts -> top-k -> renormalised,
SwiGLU experts, final RMSNorm, untied output head.

`mixtral()` is the Mixtral-style variant (GGUF arch `llama` with experts): no q/k norm, RoPE on
adjacent pairs, 8 experts of twice the width, top-2 (Mixtral's softmax over the two chosen logits
equals the renormalised top-2 of the full softmax)."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 2048
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 16
    top_k: int = 2
    n_ff: int = 192
    ctx: int = 256
    eps: float = 1e-6
    rope_base: float = 10000.0
    arch: str = "qwen3moe"  # or "llama" (Mixtral-style: no q/k norm, adjacent-pair RoPE)


def mixtral():
    """Same width, depth, attention and parameter count as the default model; 8 experts of ff 384."""
    return Config(n_expert=8, n_ff=384, arch="llama")


CONFIGS = {"qwen3moe": Config, "mixtral": mixtral}


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, base, neox=True):
    """x [B, H, T, D]; NeoX pairing (i, i + D/2), else adjacent pairs (2i, 2i + 1) as llama's."""
    T, D = x.shape[-2], x.shape[-1]
    half = D // 2
    inv = base ** (-torch.arange(0, half, dtype=torch.float64) * 2 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    if neox:
        x0, x1 = x[..., :half], x[..., half:]
        return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.n_embd, c.eps)
        self.wq = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.qk_norm = c.arch == "qwen3moe"
        if self.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.eps)
            self.k_norm = RMSNorm(c.head_dim, c.eps)
        self.ffn_norm = RMSNorm(c.n_embd, c.eps)
        self.router = nn.Linear(c.n_embd, c.n_expert, bias=False)
        s = 1 / math.sqrt(c.n_embd)
        self.gate = nn.Parameter(torch.randn(c.n_expert, c.n_ff, c.n_embd) * s)
        self.up = nn.Parameter(torch.randn(c.n_expert, c.n_ff, c.n_embd) * s)
        self.down = nn.Parameter(torch.randn(c.n_expert, c.n_embd, c.n_ff) / math.sqrt(c.n_ff))

    def attention(self, x):
        c = self.c
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, c.n_head, c.head_dim)
        k = self.wk(x).view(B, T, c.n_head_kv, c.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
        neox = c.arch == "qwen3moe"
        q, k = rope(q, c.rope_base, neox), rope(k, c.rope_base, neox)
        rep = c.n_head // c.n_head_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return self.wo((att @ v).transpose(1, 2).reshape(B, T, -1))

    def moe(self, x):
        c = self.c
        flat = x.reshape(-1, c.n_embd)
        probs = self.router(flat).softmax(-1)
        w, idx = probs.topk(c.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(c.n_expert):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = flat[rows]
            h = F.silu(xe @ self.gate[e].T) * (xe @ self.up[e].T)
            out.index_add_(0, rows, (h @ self.down[e].T) * w[rows, slot, None])
        # Switch-style load balancing: fraction routed x mean probability, per expert.
        frac = torch.zeros(c.n_expert).index_add_(0, idx.reshape(-1), torch.ones(idx.numel())) / idx.numel()
        aux = c.n_expert * (frac * probs.mean(0)).sum()
        return out.view_as(x), aux

    def forward(self, x):
        x = x + self.attention(self.attn_norm(x))
        m, aux = self.moe(self.ffn_norm(x))
        return x + m, aux


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.n_embd)
        nn.init.normal_(self.embed.weight, std=0.02 * math.sqrt(c.n_embd) / math.sqrt(c.n_embd))
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.eps)
        self.out = nn.Linear(c.n_embd, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        aux = 0.0
        for b in self.blocks:
            x, a = b(x)
            aux = aux + a
        return self.out(self.norm(x)), aux / self.c.n_layer
