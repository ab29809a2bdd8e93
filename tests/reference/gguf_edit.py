"""Copies a GGUF file through the independent Python reader/writer with edits (tests only)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools", "gguf"))
from moelite_gguf import quants as Q  # noqa: E402
from moelite_gguf.reader import GGUFReader  # noqa: E402
from moelite_gguf.writer import GGUFWriter  # noqa: E402


def merge_gate_up(src, dst):
    """Copies a GGUF with each layer's ffn_gate_exps and ffn_up_exps merged into ffn_gate_up_exps
    (expert e's slice: its gate rows, then its up rows), as newer converters write them; the values
    are the same bytes, so a model computes exactly what the original does."""
    r = GGUFReader(src)
    w = GGUFWriter(dst)
    for key, value in r.metadata.items():
        vtype, elem = r.value_types[key]
        if vtype == 9:
            w.add_array(key, value, elem)
        else:
            w.add(key, value, vtype)
    for name, t in r.tensors.items():
        if name.endswith("ffn_up_exps.weight"):
            continue
        ne, ttype, raw = list(t["ne"]), t["type"], bytes(r.raw(name))
        if name.endswith("ffn_gate_exps.weight"):
            up = bytes(r.raw(name.replace("ffn_gate_exps", "ffn_up_exps")))
            per = len(raw) // ne[2]
            raw = b"".join(raw[e * per:(e + 1) * per] + up[e * per:(e + 1) * per] for e in range(ne[2]))
            name, ne = name.replace("ffn_gate_exps", "ffn_gate_up_exps"), [ne[0], 2 * ne[1], ne[2]]
        w.add_tensor(name, ne, ttype, raw)
    w.write()
    return dst


def rewrite(src, dst, drop_keys=(), set_keys=None, drop_tensors=(), retype=None, reshape=None, requantize=None):
    """Copies a GGUF through the independent reader/writer with the given edits. set_keys {key: (value,
    type)} or, for an array, {key: (values, 9, element type)}; retype relabels a tensor's bytes (for
    error tests); requantize {name: type} converts its values to another type."""
    r = GGUFReader(src)
    w = GGUFWriter(dst)
    for key, value in r.metadata.items():
        if key in drop_keys or (set_keys and key in set_keys):
            continue
        vtype, elem = r.value_types[key]
        if vtype == 9:
            w.add_array(key, value, elem)
        else:
            w.add(key, value, vtype)
    for key, (value, vtype, *elem) in (set_keys or {}).items():  # an array: (values, 9, element type)
        if vtype == 9:
            w.add_array(key, value, elem[0])
        else:
            w.add(key, value, vtype)
    for name, t in r.tensors.items():
        if name in drop_tensors:
            continue
        ne, ttype, raw = list(t["ne"]), t["type"], bytes(r.raw(name))
        if reshape and name in reshape:
            ne = reshape[name]
            raw = raw[:Q.nbytes(ttype, int(np.prod(ne)))]
        if retype and name in retype:
            ttype, nb = retype[name]
            raw = raw[:nb]
        if requantize and name in requantize:
            values = Q.dequantize(raw, ttype, int(np.prod(ne)))
            ttype = Q.type_id(requantize[name])
            raw = bytes(Q.quantize(values, ttype))
        w.add_tensor(name, ne, ttype, raw)
    w.write()
    return dst
