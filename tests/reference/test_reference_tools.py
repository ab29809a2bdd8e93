"""Tests for tools/gguf (moelite_gguf), tools/make_tiny_model.py and reference_forward.py.

Run:  /usr/bin/python3 -m pytest tests/reference      (if pytest is installed)
  or  /usr/bin/python3 tests/reference/test_reference_tools.py   (built-in mini runner)
"""

import os
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)

from moelite_gguf import GGUFReader, GGUFWriter, GGUFValueType, quants as Q  # noqa: E402
import make_tiny_model  # noqa: E402
import reference_forward as RF  # noqa: E402

_TMP = tempfile.mkdtemp(prefix="moelite_ref_tests_")


def f16(v):
    return np.array(v, np.float16).tobytes()


def u8(*v):
    return bytes(bytearray(v))


# =============================================================== quantizer round trips

RMSE_MAX = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 4e-3, Q.Q8_0: 0.01, Q.Q6_K: 0.035, Q.Q5_0: 0.06,
            Q.Q5_1: 0.06, Q.Q5_K: 0.06, Q.Q4_0: 0.11, Q.Q4_1: 0.11, Q.Q4_K: 0.11, Q.Q3_K: 0.25,
            Q.Q2_K: 0.45, Q.MXFP4: 0.14}  # MXFP4: 0.117 (E2M1 steps are coarse near the top)


def test_quant_round_trip_all_types():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(256 * 40).astype(np.float32)
    x[:256] *= 0.01                    # a block with a small range
    x[256:512] = np.abs(x[256:512])    # an all-positive block
    x[512:768] = 0.0                   # an all-zero block
    for t in Q.QUANT_TYPES:
        raw = Q.quantize(x, t)
        assert raw.dtype == np.uint8 and raw.size == Q.nbytes(t, x.size), Q.TYPE_NAMES[t]
        y = Q.dequantize(raw, t, x.size)
        assert np.all(np.isfinite(y)), Q.TYPE_NAMES[t]
        rmse = float(np.sqrt(np.mean((x[768:] - y[768:]) ** 2)))
        assert rmse <= RMSE_MAX[t], (Q.TYPE_NAMES[t], rmse)
        assert np.all(y[512:768] == 0), Q.TYPE_NAMES[t]
        # small-range block keeps relative accuracy (scales are per block)
        small = np.sqrt(np.mean((x[:256] - y[:256]) ** 2))
        assert small <= max(RMSE_MAX[t], 1e-6) * 0.05 + 1e-6, (Q.TYPE_NAMES[t], small)


def test_block_sizes_match_ggml():
    expect = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20),
              "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q8_1": (32, 36),
              "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
              "Q6_K": (256, 210), "Q8_K": (256, 292), "MXFP4": (32, 17)}
    for name, v in expect.items():
        assert (Q.block_size(name), Q.type_size(name)) == v, name
    assert Q.TYPE_BY_NAME["BF16"] == 30 and Q.TYPE_BY_NAME["Q6_K"] == 14 and Q.TYPE_BY_NAME["Q8_0"] == 8


# =============================================================== hand-made known blocks

def test_known_q4_0():
    qs = bytes((j | ((15 - j) << 4)) for j in range(16))
    raw = f16(0.5) + qs
    y = Q.dequantize(raw, "Q4_0")
    exp = [(j - 8) * 0.5 for j in range(16)] + [(7 - j) * 0.5 for j in range(16)]
    assert y.tolist() == exp
    assert y[0] == -4.0 and y[15] == 3.5 and y[16] == 3.5 and y[31] == -4.0


def test_known_q4_1_q5_0_q5_1_q8_0():
    qs = bytes((j | ((15 - j) << 4)) for j in range(16))
    y = Q.dequantize(f16(0.25) + f16(-1.0) + qs, "Q4_1")
    assert y.tolist() == [j * 0.25 - 1 for j in range(16)] + [(15 - j) * 0.25 - 1 for j in range(16)]
    # Q5_0: qh bit e is the 5th bit of element e (elements 16.. from the high nibbles)
    qs = bytearray(16)
    qs[0] = 0x03            # element 0 low nibble 3, element 16 low nibble 0
    qs[15] = 0x20           # element 31 nibble 2
    y = Q.dequantize(f16(1.0) + struct.pack("<I", (1 << 0) | (1 << 31)) + bytes(qs), "Q5_0")
    exp = [-16.0] * 32
    exp[0] = 3.0 + 16 - 16
    exp[31] = 2.0 + 16 - 16
    exp[15] = 0 - 16.0
    assert y.tolist() == exp
    # Q5_1: d=2, m=0.5, element 16 gets the high bit
    qs = bytearray(16)
    qs[0] = 0x51
    y = Q.dequantize(f16(2.0) + f16(0.5) + struct.pack("<I", 1 << 16) + bytes(qs), "Q5_1")
    assert y[0] == 2.5 and y[16] == (5 + 16) * 2 + 0.5 and y[1] == 0.5 and y[17] == 0.5
    y = Q.dequantize(f16(0.125) + np.arange(-16, 16, dtype=np.int8).tobytes(), "Q8_0")
    assert y.tolist() == [(j - 16) * 0.125 for j in range(32)]


def test_known_q4_k():
    # 6-bit scales/mins chosen so that the high bits (>= 16) are exercised
    sc = [1, 2, 3, 4, 33, 45, 50, 63]
    mn = [0, 1, 2, 3, 40, 17, 8, 63]
    scales = u8(129, 130, 195, 196, 128, 65, 2, 195, 129, 29, 130, 255)   # packed by hand
    qs = bytes(((l % 16) | (((l + 3) % 16) << 4)) for c in range(4) for l in range(32))
    raw = f16(1.0) + f16(0.5) + scales + qs
    y = Q.dequantize(raw, "Q4_K")
    exp = []
    for c in range(4):
        for h in range(2):
            s = 2 * c + h
            for l in range(32):
                q = (l % 16) if h == 0 else ((l + 3) % 16)
                exp.append(1.0 * sc[s] * q - 0.5 * mn[s])
    assert y.tolist() == exp
    s2, m2 = Q.unpack_scale_min_k4(np.frombuffer(scales, np.uint8)[None])
    assert s2[0].tolist() == sc and m2[0].tolist() == mn


def test_known_q3_k_scales_and_hmask():
    # signed 6-bit scales  ls-32; element e uses hmask[e % 32] bit e // 32 (set -> no -4)
    ls = [(7 * j + 5) % 64 for j in range(16)]
    s12 = bytearray(12)
    for j in range(16):
        if j < 8:
            s12[j] = ls[j] & 0xF
        else:
            s12[j - 8] |= (ls[j] & 0xF) << 4
        s12[8 + j % 4] |= (ls[j] >> 4) << (2 * (j // 4))
    hmask = bytearray(32)
    hmask[0] = 0b00000001       # element 0
    hmask[5] = 0b01000000       # element 6*32+5 = 197
    qs = bytes(((1) | (2 << 2) | (3 << 4) | (0 << 6)) for _ in range(64))
    raw = bytes(hmask) + qs + bytes(s12) + f16(0.25)
    y = Q.dequantize(raw, "Q3_K")
    for e in (0, 1, 33, 64, 100, 197, 229, 255):
        n, r = divmod(e, 128)
        j, l = divmod(r, 32)
        low = [1, 2, 3, 0][j]
        hb = (hmask[l] >> (4 * n + j)) & 1
        exp = 0.25 * (ls[e // 16] - 32) * (low - (0 if hb else 4))
        assert y[e] == np.float32(exp), (e, y[e], exp)
    assert y[0] == 0.25 * (ls[0] - 32) * 1 and y[197] == 0.25 * (ls[12] - 32) * 3
    assert y[229] == 0.25 * (ls[14] - 32) * (0 - 4) and y[1] == 0.25 * (ls[0] - 32) * (1 - 4)


# ---------- scalar transliterations of ggml's dequantize_row_* loops, compared on random bytes

def _scalar_q2_k(b):
    y = []
    sc, qs = b[0:16], b[16:80]
    d = float(np.frombuffer(b[80:82], "<f2")[0]); dmin = float(np.frombuffer(b[82:84], "<f2")[0])
    is_ = 0
    for n in range(2):
        q = qs[32 * n:32 * n + 32]
        for j in range(4):
            shift = 2 * j
            for half in range(2):
                s = sc[is_]; is_ += 1
                dl, ml = np.float32(d * (s & 0xF)), np.float32(dmin * (s >> 4))
                for l in range(16):
                    y.append(dl * np.float32((q[l + 16 * half] >> shift) & 3) - ml)
    return y


def _scalar_q3_k(b):
    hm, qs, s12 = b[0:32], b[32:96], b[96:108]
    d = float(np.frombuffer(b[108:110], "<f2")[0])
    aux = list(struct.unpack("<3I", bytes(s12))) + [0]
    k1, k2 = 0x03030303, 0x0F0F0F0F
    tmp = aux[2]
    aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4)
    aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)
    aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4)
    aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4)
    scales = np.frombuffer(struct.pack("<4I", *aux), np.int8).astype(int)
    y, is_, m = [], 0, 1
    for n in range(2):
        q = qs[32 * n:32 * n + 32]
        for j in range(4):
            shift = 2 * j
            for half in range(2):
                dl = np.float32(d * (scales[is_] - 32)); is_ += 1
                for l in range(16 * half, 16 * half + 16):
                    y.append(dl * np.float32(((q[l] >> shift) & 3) - (0 if hm[l] & m else 4)))
            m <<= 1
    return y


def _scalar_q4_5_k(b, five):
    d = float(np.frombuffer(b[0:2], "<f2")[0]); dmin = float(np.frombuffer(b[2:4], "<f2")[0])
    s = b[4:16]
    qh = b[16:48] if five else None
    ql = b[48:176] if five else b[16:144]

    def gsm(j):
        if j < 4:
            return s[j] & 63, s[j + 4] & 63
        return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
    y, is_, u1, u2 = [], 0, 1, 2
    for c in range(4):
        q = ql[32 * c:32 * c + 32]
        a, mm = gsm(is_); d1, m1 = np.float32(d * a), np.float32(dmin * mm)
        a, mm = gsm(is_ + 1); d2, m2 = np.float32(d * a), np.float32(dmin * mm)
        for l in range(32):
            y.append(d1 * np.float32((q[l] & 0xF) + (16 if five and qh[l] & u1 else 0)) - m1)
        for l in range(32):
            y.append(d2 * np.float32((q[l] >> 4) + (16 if five and qh[l] & u2 else 0)) - m2)
        is_ += 2; u1 <<= 2; u2 <<= 2
    return y


def _scalar_q6_k(b):
    ql, qh = b[0:128], b[128:192]
    sc = np.frombuffer(b[192:208], np.int8).astype(int)
    d = float(np.frombuffer(b[208:210], "<f2")[0])
    y = [0.0] * 256
    for n in range(2):
        L, H, S = ql[64 * n:], qh[32 * n:], sc[8 * n:]
        for l in range(32):
            is_ = l // 16
            q1 = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32
            q2 = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32
            q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
            q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
            for k, q in enumerate((q1, q2, q3, q4)):
                y[128 * n + l + 32 * k] = np.float32(d * S[is_ + 2 * k]) * np.float32(q)
    return y


def test_k_quants_match_scalar_ggml_loops_on_random_bytes():
    rng = np.random.default_rng(7)
    cases = [("Q2_K", _scalar_q2_k, [(80, 0.5), (82, 0.25)]),
             ("Q3_K", _scalar_q3_k, [(108, 0.75)]),
             ("Q4_K", lambda b: _scalar_q4_5_k(b, False), [(0, 0.5), (2, 0.125)]),
             ("Q5_K", lambda b: _scalar_q4_5_k(b, True), [(0, 1.5), (2, 0.25)]),
             ("Q6_K", _scalar_q6_k, [(208, 0.0625)])]
    for name, fn, dpos in cases:
        for _ in range(3):
            b = bytearray(rng.integers(0, 256, Q.type_size(name), dtype=np.uint8).tobytes())
            for p, v in dpos:
                b[p:p + 2] = f16(v)
            b = bytes(b)
            y = Q.dequantize(b, name)
            exp = np.array(_scalar_fn_list(fn(b)), np.float32)
            assert np.array_equal(y, exp), name


def _scalar_fn_list(v):
    return [float(t) for t in v]


def test_quantized_blocks_decode_to_their_own_scales():
    # quantize -> raw -> dequantize -> quantize again must give the same dequantized values
    # (values on the grid stay on the grid) for the simple formats
    rng = np.random.default_rng(3)
    x = rng.standard_normal(32 * 8).astype(np.float32)
    for t in ("Q4_0", "Q5_0", "Q8_0"):
        y = Q.dequantize(Q.quantize(x, t), t)
        y2 = Q.dequantize(Q.quantize(y, t), t)
        assert np.allclose(y, y2, rtol=0, atol=1e-3 * np.abs(y).max()), t


# =============================================================== activation quantization

def test_activation_rounding_modes():
    x = np.zeros(32, np.float32)
    x[:5] = [127, 2.5, -2.5, 0.5, -0.5]
    d16, q, _ = Q.q8_0_blocks(x)           # d = 1: roundf -> half away from zero
    assert d16[0] == 1.0 and q[0, :5].tolist() == [127, 3, -3, 1, -1]
    d16, q, s = Q.q8_1_blocks(x)
    assert s[0] == float(np.float16(127 + 3 - 3 + 1 - 1))
    xk = np.zeros(256, np.float32)
    xk[:6] = [127, 2.5, 3.5, -0.5, -2.5, 1.5]   # max = 127 -> iscale = -1: half to even
    d, q = Q.q8_k_blocks(xk)
    assert d[0] == -1.0 and q[0, :6].tolist() == [-127, -2, -4, 0, 2, -2]
    xk[0] = -127                                # max = -127 -> iscale = 1; MIN(127, .)
    xk[1] = 127
    d, q = Q.q8_k_blocks(xk)
    assert d[0] == 1.0 and q[0, :3].tolist() == [-127, 127, 4]


# =============================================================== writer -> reader

def test_writer_reader_metadata_all_types():
    path = os.path.join(_TMP, "meta.gguf")
    V = GGUFValueType
    w = GGUFWriter(path)
    scalars = [("u8", V.UINT8, 200), ("i8", V.INT8, -100), ("u16", V.UINT16, 60000),
               ("i16", V.INT16, -30000), ("u32", V.UINT32, 4000000000), ("i32", V.INT32, -2000000000),
               ("f32", V.FLOAT32, 1.5), ("b", V.BOOL, True), ("s", V.STRING, "héllo"),
               ("u64", V.UINT64, 2**63 + 5), ("i64", V.INT64, -2**62), ("f64", V.FLOAT64, 1e-300)]
    for k, t, v in scalars:
        w.add("t." + k, v, t)
    arrays = {V.UINT8: [0, 255], V.INT8: [-128, 127], V.UINT16: [1, 65535], V.INT16: [-5, 5],
              V.UINT32: [7, 2**32 - 1], V.INT32: [-7, 7], V.FLOAT32: [0.25, -2.0], V.BOOL: [True, False],
              V.UINT64: [2**64 - 1], V.INT64: [-1, 2**40], V.FLOAT64: [3.25]}
    for t, v in arrays.items():
        w.add_array("a.%d" % t, v, t)
    w.add_array("a.str", ["x", "", "yz"], V.STRING)
    w.add_array("a.empty", [], V.STRING)
    w.add_tensor_array("t1", np.arange(6, dtype=np.float32).reshape(2, 3), "F32")
    w.add_tensor_array("t2", np.linspace(-1, 1, 64 * 3, dtype=np.float32).reshape(3, 64), "Q8_0")
    w.add_tensor_array("t3", np.ones(5, np.float32), "F16")
    w.write()
    r = GGUFReader(path)
    for k, t, v in scalars:
        assert r.value_types["t." + k] == (t, None), k
        assert r.metadata["t." + k] == v, k
    for t, v in arrays.items():
        assert r.value_types["a.%d" % t] == (V.ARRAY, t)
        assert list(r.metadata["a.%d" % t]) == v, t
    assert r.metadata["a.str"] == ["x", "", "yz"] and r.metadata["a.empty"] == []
    assert r.tensors["t1"]["ne"] == [3, 2] and r.get("t1").tolist() == [[0, 1, 2], [3, 4, 5]]
    assert r.tensors["t2"]["ne"] == [64, 3] and r.type_of("t2") == Q.Q8_0
    assert np.abs(r.get("t2") - np.linspace(-1, 1, 192).reshape(3, 64)).max() < 0.01
    assert r.get("t3").tolist() == [1.0] * 5
    for t in r.tensors.values():
        assert (t["offset"] - r.data_start) % 32 == 0 and r.data_start % 32 == 0
    assert os.path.getsize(path) % 32 == 0
    # header bytes
    with open(path, "rb") as f:
        magic, ver, nt, nkv = struct.unpack("<4sIQQ", f.read(24))
    assert magic == b"GGUF" and ver == 3 and nt == 3 and nkv == len(scalars) + len(arrays) + 2


def test_writer_custom_alignment_and_streaming():
    path = os.path.join(_TMP, "align.gguf")
    w = GGUFWriter(path, alignment=64)
    w.add_string("general.architecture", "x")
    w.add_tensor("a", [3], "F32", np.array([1, 2, 3], np.float32).view(np.uint8))
    chunks = [Q.quantize(np.full(256, i, np.float32), "Q4_K") for i in range(3)]
    w.add_tensor("b", [256, 3], "Q4_K", lambda: iter(chunks))
    w.write()
    r = GGUFReader(path)
    assert r.alignment == 64 and r.metadata["general.alignment"] == 64
    assert all((t["offset"] - r.data_start) % 64 == 0 for t in r.tensors.values())
    assert np.allclose(r.get("b"), np.repeat(np.arange(3.0), 256).reshape(3, 256), atol=0.02)
    assert np.allclose(r.get("b", index=2), 2.0, atol=0.02)


# =============================================================== generator + reference forward

def _model(arch, qtype="F32", extra=()):
    path = os.path.join(_TMP, "%s_%s_%s.gguf" % (arch, qtype, "_".join(e.strip("-") for e in extra)))
    if not os.path.exists(path):
        make_tiny_model.main(["--arch", arch, "--type", qtype, "--seed", "3", "--out", path, "--quiet",
                              "--n-layer", "2"] + list(extra))
    return path


def test_generated_models_have_llama_cpp_layout():
    r = GGUFReader(_model("qwen2moe", "Q4_K"))
    md = r.metadata
    assert md["general.architecture"] == "qwen2moe"
    assert md["qwen2moe.expert_count"] == 8 and md["qwen2moe.expert_used_count"] == 2
    assert md["qwen2moe.expert_shared_feed_forward_length"] == 256
    assert len(md["tokenizer.ggml.tokens"]) == 512 and md["tokenizer.ggml.model"] == "gpt2"
    T = r.tensors
    assert T["blk.0.ffn_gate_exps.weight"]["ne"] == [256, 256, 8]
    assert T["blk.0.ffn_down_exps.weight"]["ne"] == [256, 256, 8]
    assert T["blk.0.ffn_gate_inp.weight"]["ne"] == [256, 8] and T["blk.0.ffn_gate_inp.weight"]["type"] == Q.F32
    assert T["blk.0.ffn_gate_inp_shexp.weight"]["ne"] == [256]
    assert T["blk.0.attn_k.weight"]["ne"] == [256, 128] and T["blk.0.attn_k.weight"]["type"] == Q.Q4_K
    assert T["blk.0.attn_q.bias"]["type"] == Q.F32 and T["token_embd.weight"]["type"] == Q.Q4_K
    r = GGUFReader(_model("qwen3moe", "F16", ("--head-dim", "128")))
    assert r.metadata["qwen3moe.attention.key_length"] == 128
    assert r.tensors["blk.1.attn_q.weight"]["ne"] == [256, 512]
    assert r.tensors["blk.1.attn_output.weight"]["ne"] == [512, 256]
    assert r.tensors["blk.1.attn_q_norm.weight"]["ne"] == [128]
    r = GGUFReader(_model("olmoe", "Q8_0", ("--tied",)))
    assert "output.weight" not in r.tensors
    assert r.tensors["blk.0.attn_q_norm.weight"]["ne"] == [256]
    assert r.tensors["blk.0.attn_k_norm.weight"]["ne"] == [128]


TOK_A = [1, 5, 9, 200, 7, 300]
TOK_B = [1, 5, 9, 44, 100, 4]


def test_reference_forward_causal_and_topk_all_archs():
    for arch, extra in (("llama", ()), ("qwen2moe", ()), ("qwen3moe", ("--head-dim", "128")), ("olmoe", ())):
        m = RF.ReferenceModel(_model(arch, "F32", extra))
        rec = []
        la = m.forward(TOK_A, rec)
        lb = m.forward(TOK_B)
        assert la.shape == (6, 512) and np.all(np.isfinite(la))
        # causal: prefix logits unchanged (up to BLAS summation order for different T)
        assert np.allclose(la[:3], lb[:3], rtol=0, atol=1e-9 * np.abs(la).max()), arch
        assert not np.allclose(la[3:], lb[3:]), arch
        used = set()
        for wts in rec:
            nz = (wts > 0).sum(axis=1)
            assert np.all(nz <= m.n_expert_used) and np.all(nz == m.n_expert_used), arch
            sums = wts.sum(axis=1)
            if arch in ("llama", "qwen3moe"):
                assert np.allclose(sums, 1.0), arch
            else:
                assert np.all(sums < 1.0), arch
            used |= set(np.nonzero(wts)[1].tolist())
        assert len(used) >= 4, (arch, used)                     # routing is non-trivial


def test_per_expert_layout_equals_stacked():
    a = RF.ReferenceModel(_model("llama", "Q8_0")).forward(TOK_A)
    b = RF.ReferenceModel(_model("llama", "Q8_0", ("--per-expert-tensors",))).forward(TOK_A)
    assert np.array_equal(a, b)


def test_quantize_activations_close_to_float():
    for qt in ("Q4_1", "Q4_K"):
        p = _model("olmoe", qt)
        lf = RF.ReferenceModel(p).forward(TOK_A)
        lq = RF.ReferenceModel(p, quantize_acts=True).forward(TOK_A)
        err = np.abs(lf - lq).max() / np.abs(lf).max()
        assert 0 < err < 0.1, (qt, err)
    for qt in ("F32", "F16"):  # float weights keep float activations (no emulation needed)
        p = _model("olmoe", qt)
        assert np.array_equal(RF.ReferenceModel(p).forward(TOK_A), RF.ReferenceModel(p, True).forward(TOK_A))


def test_q8_1_min_term_uses_s():
    # the Q4_1 x Q8_1 dot must equal sum_b d_w*d_a*sum(qw*qa) + m_b*s_b (ggml_vec_dot_q4_1_q8_1)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    path = os.path.join(_TMP, "q41.gguf")
    gw = GGUFWriter(path)
    gw.add_string("general.architecture", "olmoe")
    gw.add_tensor_array("w", w, "Q4_1")
    gw.write()
    m = RF.ReferenceModel.__new__(RF.ReferenceModel)
    m.r, m.qa, m._cache = GGUFReader(path), True, {}
    y = m.matmul("w", x.astype(np.float64))
    raw = np.asarray(m.r.raw("w")).reshape(3, 2, 20)
    d8, q8, s8 = Q.q8_1_blocks(x[0])
    exp = np.zeros(3)
    for r_ in range(3):
        for b in range(2):
            blk = raw[r_, b]
            dw = float(np.frombuffer(blk[0:2].tobytes(), "<f2")[0])
            mw = float(np.frombuffer(blk[2:4].tobytes(), "<f2")[0])
            qw = np.concatenate([blk[4:] & 0xF, blk[4:] >> 4]).astype(int)
            exp[r_] += dw * float(d8[b]) * int((qw * q8[b].astype(int)).sum()) + mw * float(s8[b])
    assert np.allclose(y[0], exp, rtol=1e-12, atol=1e-12)


def test_cli_writes_logits_file():
    p = _model("qwen3moe", "Q6_K")
    out = os.path.join(_TMP, "logits.f32")
    RF.main([p, "--tokens", "1,2,3", "--out", out, "--quantize-activations"])
    a = np.fromfile(out, "<f4")
    assert a.size == 3 * 512 and np.all(np.isfinite(a))


if __name__ == "__main__":
    import time
    import traceback
    fails = 0
    t0 = time.time()
    for name, fn in sorted((k, v) for k, v in dict(globals()).items() if k.startswith("test_") and callable(v)):
        t = time.time()
        try:
            fn()
            print("PASS %-55s %.2fs" % (name, time.time() - t))
        except Exception:
            fails += 1
            print("FAIL %s" % name)
            traceback.print_exc()
    print("%d failed, %.1fs total" % (fails, time.time() - t0))
    sys.exit(1 if fails else 0)


def test_mxfp4_decodes_e2m1_bit_fields():
    """MXFP4 against values written out by hand (the OCP spec's E2M1 table, not derived by the code
    under test): one block at exponent 127 (scale 1), one at 128 (scale 2), one at 0 (2^-127)."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    raw = b""
    for e in (127, 128, 0):
        raw += bytes([e]) + bytes([j | ((15 - j) << 4) for j in range(16)])
    y = Q.dequantize(np.frombuffer(raw, np.uint8), "MXFP4")
    for b, scale in enumerate((1.0, 2.0, 2.0 ** -127)):
        want = [v * scale for v in e2m1] + [v * scale for v in reversed(e2m1)]
        assert y[32 * b:32 * (b + 1)].tolist() == [np.float32(w) for w in want], b
    # Quantizing those values back gives the same codes (the quantizer picks the nearest value).
    x = np.array(e2m1 * 2, np.float32)
    assert np.array_equal(Q.dequantize(Q.quantize(x, "MXFP4"), "MXFP4")[:16], x[:16])
