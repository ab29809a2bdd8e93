#!/usr/bin/env python3
"""Builds the training corpus and trains the byte-level BPE tokenizer for the default model.

Corpus: the reStructuredText sources of the Python 3.11 documentation, from Debian's package
`python3.11-doc` (PSF License; /usr/share/doc/python3.11-doc/copyright). Markup lines (directives,
tables, label targets) are dropped; prose, examples and code stay. Files are taken in sorted path
order; every 50th file is held out.

Tokenizer: GPT-2 byte-level BPE with the GPT-2 pre-tokenizer regex (what moelite runs for
tokenizer.ggml.pre = "gpt-2"), trained deterministically (ties broken by the pair's strings).

    /usr/bin/python3 tools/train/corpus.py --out /tmp/moelite-train --vocab 2048
"""
import argparse
import collections
import glob
import json
import os
import re
import sys

import regex

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gguf"))
from moelite_gguf.byte_chars import byte_chars  # noqa: E402

SRC = "/usr/share/doc/python3.11/html/_sources"
GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def clean(text):
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("..") or s.startswith(":") or re.fullmatch(r"[=\-~^*#+`'\"]{3,}", s) or s.startswith("+--") \
                or s.startswith("|"):
            continue
        out.append(line.rstrip())
    text = "\n".join(out)
    text = re.sub(r":[a-z:]+:`~?([^`<]*?)(?: <[^>]*>)?`", r"\1", text)  # :func:`name` -> name
    text = re.sub(r"``([^`]*)``", r"\1", text)
    return re.sub(r"\n{3,}", "\n\n", text)


def words(text):
    bc = byte_chars()
    return ["".join(bc[b] for b in w.encode("utf-8")) for w in GPT2_PATTERN.findall(text)]


def train_bpe(counts, n_merges):
    """Standard BPE over word counts; merges of the most frequent pair, ties to the smaller pair."""
    vocab = [list(w) for w in counts]
    freq = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(vocab):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    merges = []
    for _ in range(n_merges):
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], tuple(-ord(c) for c in kv[0][0] + "\0" + kv[0][1])))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        a, b = best
        for i in list(where[best]):
            w = vocab[i]
            for x, y in zip(w, w[1:]):
                pairs[(x, y)] -= freq[i]
                if pairs[(x, y)] <= 0:
                    del pairs[(x, y)]
                where[(x, y)].discard(i)
            j, nw = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(a + b)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            vocab[i] = nw
            for x, y in zip(nw, nw[1:]):
                pairs[(x, y)] += freq[i]
                where[(x, y)].add(i)
        del where[best]
    return merges


def encode_word(w, ranks, cache):
    if w in cache:
        return cache[w]
    sym = list(w)
    while len(sym) > 1:
        best = min(((ranks.get((x, y), 1 << 30), k) for k, (x, y) in enumerate(zip(sym, sym[1:]))))
        if best[0] == 1 << 30:
            break
        k = best[1]
        sym = sym[:k] + [sym[k] + sym[k + 1]] + sym[k + 2:]
    cache[w] = sym
    return sym


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=2048)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    files = sorted(glob.glob(SRC + "/**/*.txt", recursive=True))
    train, held = [], []
    for i, f in enumerate(files):
        (held if i % 50 == 25 else train).append(clean(open(f, encoding="utf-8", errors="replace").read()))
    train_text, held_text = "\n\n".join(train), "\n\n".join(held)
    open(os.path.join(a.out, "train.txt"), "w").write(train_text)
    open(os.path.join(a.out, "heldout.txt"), "w").write(held_text)
    counts = collections.Counter(words(train_text))
    merges = train_bpe(counts, a.vocab - len(SPECIALS) - 256)
    bc = byte_chars()
    tokens = SPECIALS + [bc[b] for b in range(256)] + [x + y for x, y in merges]
    ranks = {m: r for r, m in enumerate(merges)}
    ids = {t: i for i, t in enumerate(tokens)}
    cache = {}
    for name, text in (("train", train_text), ("heldout", held_text)):
        seq = [ids[s] for w in words(text) for s in encode_word(w, ranks, cache)]
        import numpy as np
        np.asarray(seq, dtype=np.uint16).tofile(os.path.join(a.out, name + ".ids"))
        print("%s: %d bytes, %d tokens" % (name, len(text.encode()), len(seq)))
    json.dump({"tokens": tokens, "merges": [x + " " + y for x, y in merges]}, open(os.path.join(a.out, "tokenizer.json"), "w"))


if __name__ == "__main__":
    main()
