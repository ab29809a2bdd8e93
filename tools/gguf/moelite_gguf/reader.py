"""Minimal independent GGUF (v2/v3) reader: metadata + tensors -> dequantized float32 numpy.

Parses the file itself (does not use writer.py); tensor bytes are memory-mapped, so
large models can be read one tensor / one expert slice at a time.

    r = GGUFReader("m.gguf")
    r.metadata["general.architecture"]       # python values; arrays -> list / numpy array
    r.tensors["blk.0.attn_q.weight"]          # dict(ne=[...], type=id, offset=abs, nbytes=...)
    w = r.get("blk.0.attn_q.weight")          # float32, numpy shape = ne reversed
    e3 = r.get("blk.0.ffn_up_exps.weight", index=3)   # slice of the outermost dim only
"""

import struct

import numpy as np

from . import quants as Q

_SCALAR = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
           6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
       10: "<u8", 11: "<i8", 12: "<f8"}


class GGUFReader:
    def __init__(self, path):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        self._pos = 0
        magic, version = struct.unpack("<II", self._take(8))
        if magic != 0x46554747:
            raise ValueError("not a GGUF file")
        if version not in (2, 3):
            raise ValueError("unsupported GGUF version %d" % version)
        self.version = version
        n_tensors, n_kv = struct.unpack("<QQ", self._take(16))
        self.metadata = {}
        self.value_types = {}      # key -> (vtype, elem_type or None)
        for _ in range(n_kv):
            key = self._string()
            vtype = self._u32()
            if vtype == 9:
                et = self._u32()
                self.value_types[key] = (9, et)
                self.metadata[key] = self._array(et)
            else:
                self.value_types[key] = (vtype, None)
                self.metadata[key] = self._value(vtype)
        self.alignment = int(self.metadata.get("general.alignment", 32))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            nd = self._u32()
            ne = list(struct.unpack("<%dQ" % nd, self._take(8 * nd)))
            ttype = self._u32()
            off = struct.unpack("<Q", self._take(8))[0]
            infos.append((name, ne, ttype, off))
        self.data_start = self._pos + (-self._pos) % self.alignment
        self.tensors = {}
        for name, ne, ttype, off in infos:
            n = int(np.prod(ne, dtype=np.int64))
            nb = Q.nbytes(ttype, n)
            if off % self.alignment:
                raise ValueError("tensor %s misaligned" % name)
            self.tensors[name] = dict(ne=ne, type=ttype, offset=self.data_start + off, nbytes=nb)
            if self.data_start + off + nb > self.mm.size:
                raise ValueError("tensor %s beyond end of file" % name)

    # -------------------------------------------------------------- parsing helpers
    def _take(self, n):
        b = bytes(self.mm[self._pos:self._pos + n])
        if len(b) != n:
            raise ValueError("truncated GGUF")
        self._pos += n
        return b

    def _u32(self):
        return struct.unpack("<I", self._take(4))[0]

    def _string(self):
        n = struct.unpack("<Q", self._take(8))[0]
        return self._take(n).decode("utf-8")

    def _value(self, vtype):
        if vtype == 8:
            return self._string()
        fmt, size = _SCALAR[vtype]
        v = struct.unpack(fmt, self._take(size))[0]
        return v

    def _array(self, et):
        n = struct.unpack("<Q", self._take(8))[0]
        if et == 8:
            return [self._string() for _ in range(n)]
        if et == 9:
            raise ValueError("nested arrays not supported")
        size = _SCALAR[et][1]
        a = np.frombuffer(self._take(n * size), dtype=_NP[et]).copy()
        return a.astype(bool) if et == 7 else a

    # -------------------------------------------------------------- tensors
    def raw(self, name, index=None):
        """raw bytes (uint8 memmap view) of a tensor, or of slice `index` of its outermost dim"""
        t = self.tensors[name]
        start, nb = t["offset"], t["nbytes"]
        if index is not None:
            per = nb // t["ne"][-1]
            start, nb = start + index * per, per
        return self.mm[start:start + nb]

    def shape(self, name, index=None):
        ne = self.tensors[name]["ne"]
        return tuple(ne[::-1][1:] if index is not None else ne[::-1])

    def get(self, name, index=None):
        """dequantized float32 array, numpy shape = ne reversed (minus outermost if index)"""
        t = self.tensors[name]
        shp = self.shape(name, index)
        n = int(np.prod(shp, dtype=np.int64))
        return Q.dequantize(np.asarray(self.raw(name, index)), t["type"], n).reshape(shp)

    def type_of(self, name):
        return self.tensors[name]["type"]

    def __contains__(self, name):
        return name in self.tensors
