"""Writes vocabulary-only GGUF files for the chat-injection test: the real GPT-2 (byte-level BPE)
and Llama (SentencePiece) vocabularies of tests/data/vocab, with every chat-template marker that
moelite formats added as a control token (tokenizer.ggml.token_type 3) when the vocabulary lacks
it. With these, each template family can be formatted on both tokenizer kinds.

    make_vocabs.py OUT_DIR    -> OUT_DIR/chat-gpt2.gguf, OUT_DIR/chat-spm.gguf
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "gguf"))
from moelite_gguf.reader import GGUFReader  # noqa: E402
from moelite_gguf.writer import GGUFValueType, GGUFWriter  # noqa: E402

# Every marker of the ChatML, Llama-3, Tulu, Mistral and DeepSeek-V3 templates (core/text/chat_template.cpp).
MARKERS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|begin_of_text|>", "<|user|>", "<|assistant|>", "<|system|>", "[INST]", "[/INST]",
           "<|endoftext|>", "</s>", "<s>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
CONTROL = 3


def extend(src, dst):
    r = GGUFReader(src)
    md = dict(r.metadata)
    tokens = list(md["tokenizer.ggml.tokens"])
    types = [int(t) for t in md["tokenizer.ggml.token_type"]]
    scores = [float(s) for s in md["tokenizer.ggml.scores"]] if "tokenizer.ggml.scores" in md else None
    known = set(tokens)
    for m in MARKERS:
        if m in known:
            continue
        tokens.append(m)
        types.append(CONTROL)
        if scores is not None:
            scores.append(0.0)
    w = GGUFWriter(dst)
    for key, value in md.items():
        vtype, elem = r.value_types[key]
        if key == "tokenizer.ggml.tokens":
            w.add_array(key, tokens, GGUFValueType.STRING)
        elif key == "tokenizer.ggml.token_type":
            w.add_array(key, np.array(types, np.int32), GGUFValueType.INT32)
        elif key == "tokenizer.ggml.scores":
            w.add_array(key, np.array(scores, np.float32), GGUFValueType.FLOAT32)
        elif key.endswith(".vocab_size"):
            w.add(key, len(tokens), vtype)
        elif vtype == GGUFValueType.ARRAY:
            w.add_array(key, value, elem)
        else:
            w.add(key, value, vtype)
    w.write()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    data = os.path.join(HERE, "..", "data", "vocab")
    extend(os.path.join(data, "ggml-vocab-gpt-2.gguf"), os.path.join(out, "chat-gpt2.gguf"))
    extend(os.path.join(data, "ggml-vocab-llama-spm.gguf"), os.path.join(out, "chat-spm.gguf"))


if __name__ == "__main__":
    main()
