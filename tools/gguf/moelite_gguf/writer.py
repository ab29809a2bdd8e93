"""GGUF v3 writer (streaming).

File layout written (all little endian):
    u32 magic 'GGUF' (0x46554747), u32 version 3, u64 n_tensors, u64 n_kv
    n_kv x  { string key, u32 value_type, value }
    n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
    zero padding to `alignment`, then the tensor data section; each tensor starts at
    data_start + offset, offset a multiple of `alignment`, zero padding after each tensor.
  string = u64 length + UTF-8 bytes (no NUL); array = u32 elem_type, u64 count, elements.

Shapes are GGUF ``ne`` order: ne[0] is the innermost, contiguous dimension.  A C-order
numpy array of shape (a, b, c) is a tensor with ne = [c, b, a] (numpy shape reversed), e.g.
a matmul weight W with y = W @ x, W.shape == (n_out, n_in), has ne = [n_in, n_out].

Usage:
    w = GGUFWriter("m.gguf")                 # alignment 32 (general.alignment written only
    w.add_string("general.architecture", "olmoe")   # if a different one is asked for)
    w.add_uint32("olmoe.block_count", 2)
    w.add_array("tokenizer.ggml.tokens", ["a", "b"], GGUFValueType.STRING)
    w.add_tensor_array("output_norm.weight", np.ones(256, np.float32), "F32")
    w.add_tensor("big", ne=[256, 1024], ggml_type="Q4_K", data=lambda: chunks())  # streamed
    w.write()
Tensor data is written in the order tensors were added; ``data`` is bytes / a uint8 array
or a zero-argument callable returning an iterable of such chunks (called during write()).
"""

import struct

import numpy as np

from . import quants as Q

GGUF_MAGIC = 0x46554747
GGUF_VERSION = 3


class GGUFValueType:
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FMT = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_SCALAR_NP = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "<u1", GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}


def _pack_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value, elem_type=None):
    if vtype == GGUFValueType.STRING:
        return _pack_string(value)
    if vtype == GGUFValueType.ARRAY:
        if elem_type is None:
            raise ValueError("array needs elem_type")
        if elem_type == GGUFValueType.ARRAY:
            raise ValueError("nested arrays not supported")
        head = struct.pack("<IQ", elem_type, len(value))
        if elem_type == GGUFValueType.STRING:
            return head + b"".join(_pack_string(s) for s in value)
        arr = np.asarray(value)
        if elem_type == GGUFValueType.BOOL:
            arr = arr.astype(bool)
        return head + arr.astype(_SCALAR_NP[elem_type]).tobytes()
    if vtype == GGUFValueType.BOOL:
        return struct.pack("<?", bool(value))
    return struct.pack(_SCALAR_FMT[vtype], value)


def _guess_type(value):
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.INT32 if -2**31 <= value < 2**31 else GGUFValueType.INT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    raise TypeError("cannot guess GGUF type of %r" % (value,))


class GGUFWriter:
    def __init__(self, path, alignment=32):
        self.path = path
        self.alignment = int(alignment)
        self.kv = []          # (key, vtype, value, elem_type)
        self.tensors = []     # dict(name, ne, type, data, nbytes, offset)
        if self.alignment != 32:
            self.add_uint32("general.alignment", self.alignment)

    # ------------------------------------------------------------------ metadata
    def add(self, key, value, vtype=None, elem_type=None):
        if any(k == key for k, *_ in self.kv):
            raise KeyError("duplicate key " + key)
        if vtype is None:
            vtype = _guess_type(value)
        if key == "general.alignment":
            self.alignment = int(value)
        self.kv.append((key, vtype, value, elem_type))

    def add_uint8(self, k, v): self.add(k, v, GGUFValueType.UINT8)
    def add_int8(self, k, v): self.add(k, v, GGUFValueType.INT8)
    def add_uint16(self, k, v): self.add(k, v, GGUFValueType.UINT16)
    def add_int16(self, k, v): self.add(k, v, GGUFValueType.INT16)
    def add_uint32(self, k, v): self.add(k, v, GGUFValueType.UINT32)
    def add_int32(self, k, v): self.add(k, v, GGUFValueType.INT32)
    def add_uint64(self, k, v): self.add(k, v, GGUFValueType.UINT64)
    def add_int64(self, k, v): self.add(k, v, GGUFValueType.INT64)
    def add_float32(self, k, v): self.add(k, v, GGUFValueType.FLOAT32)
    def add_float64(self, k, v): self.add(k, v, GGUFValueType.FLOAT64)
    def add_bool(self, k, v): self.add(k, v, GGUFValueType.BOOL)
    def add_string(self, k, v): self.add(k, v, GGUFValueType.STRING)

    def add_array(self, key, values, elem_type):
        self.add(key, list(values) if elem_type == GGUFValueType.STRING else values,
                 GGUFValueType.ARRAY, elem_type)

    # ------------------------------------------------------------------ tensors
    def add_tensor(self, name, ne, ggml_type, data):
        """ne in GGUF order (ne[0] innermost).  data: bytes-like or callable -> iterable of chunks."""
        t = Q.type_id(ggml_type)
        ne = [int(v) for v in ne]
        if not 1 <= len(ne) <= 4:
            raise ValueError("tensor %s: 1..4 dims" % name)
        if ne[0] % Q.block_size(t):
            raise ValueError("tensor %s: ne0=%d not a multiple of %s block size %d"
                             % (name, ne[0], Q.TYPE_NAMES[t], Q.block_size(t)))
        n = int(np.prod(ne, dtype=np.int64))
        size = Q.nbytes(t, n)
        if any(d["name"] == name for d in self.tensors):
            raise KeyError("duplicate tensor " + name)
        self.tensors.append(dict(name=name, ne=ne, type=t, data=data, nbytes=size))

    def add_tensor_array(self, name, arr, ggml_type):
        """float numpy array; quantized to ggml_type; ne = arr.shape reversed."""
        arr = np.asarray(arr, dtype=np.float32)
        self.add_tensor(name, list(arr.shape[::-1]), ggml_type, Q.quantize(arr, ggml_type))

    # ------------------------------------------------------------------ output
    def _pad(self, n):
        return (-n) % self.alignment

    def write(self):
        offset = 0
        for t in self.tensors:
            t["offset"] = offset
            offset += t["nbytes"] + self._pad(t["nbytes"])
        with open(self.path, "wb") as f:
            f.write(struct.pack("<IIQQ", GGUF_MAGIC, GGUF_VERSION, len(self.tensors), len(self.kv)))
            for key, vtype, value, elem_type in self.kv:
                f.write(_pack_string(key) + struct.pack("<I", vtype) + _pack_value(vtype, value, elem_type))
            for t in self.tensors:
                f.write(_pack_string(t["name"]) + struct.pack("<I", len(t["ne"]))
                        + struct.pack("<%dQ" % len(t["ne"]), *t["ne"])
                        + struct.pack("<IQ", t["type"], t["offset"]))
            f.write(b"\0" * self._pad(f.tell()))
            data_start = f.tell()
            for t in self.tensors:
                assert f.tell() - data_start == t["offset"]
                src = t["data"]
                chunks = src() if callable(src) else [src]
                written = 0
                for c in chunks:
                    b = memoryview(np.ascontiguousarray(c).view(np.uint8).reshape(-1)) \
                        if isinstance(c, np.ndarray) else memoryview(c)
                    f.write(b)
                    written += b.nbytes
                if written != t["nbytes"]:
                    raise ValueError("tensor %s: wrote %d bytes, expected %d" % (t["name"], written, t["nbytes"]))
                t["data"] = None   # release memory
                f.write(b"\0" * self._pad(written))
        return self.path
