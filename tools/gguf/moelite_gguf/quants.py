"""Vectorised numpy quantize / dequantize for ggml block formats.

Block layouts follow ggml (ggml/src/ggml-common.h, ggml/src/ggml-quants.c) bit for bit.
Dequantization reproduces ggml's dequantize_row_* formulas, evaluated in float32 in the
same operation order.  Quantizers are simple (min/max or absmax scales, no iterative
search as in llama.cpp) but always produce valid blocks.

All functions work on flat float arrays whose length is a multiple of the block size;
``quantize(x, t)`` returns a 1-D uint8 array of raw bytes, ``dequantize(raw, t, n)``
returns a 1-D float32 array of n values.
"""

import numpy as np

# ggml type ids (ggml.h enum ggml_type)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
BF16 = 30
MXFP4 = 39

QK_K = 256

TYPE_NAMES = {
    F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0",
    Q5_1: "Q5_1", Q8_0: "Q8_0", Q8_1: "Q8_1", Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K",
    Q5_K: "Q5_K", Q6_K: "Q6_K", Q8_K: "Q8_K", MXFP4: "MXFP4",
}
TYPE_BY_NAME = {v: k for k, v in TYPE_NAMES.items()}

# (elements per block, bytes per block)
BLOCK = {
    F32: (1, 4), F16: (1, 2), BF16: (1, 2),
    Q4_0: (32, 18),   # fp16 d; u8 qs[16]
    Q4_1: (32, 20),   # fp16 d; fp16 m; u8 qs[16]
    Q5_0: (32, 22),   # fp16 d; u8 qh[4]; u8 qs[16]
    Q5_1: (32, 24),   # fp16 d; fp16 m; u8 qh[4]; u8 qs[16]
    Q8_0: (32, 34),   # fp16 d; i8 qs[32]
    Q8_1: (32, 36),   # fp16 d; fp16 s; i8 qs[32]
    Q2_K: (256, 84),  # u8 scales[16]; u8 qs[64]; fp16 d; fp16 dmin
    Q3_K: (256, 110), # u8 hmask[32]; u8 qs[64]; u8 scales[12]; fp16 d
    Q4_K: (256, 144), # fp16 d; fp16 dmin; u8 scales[12]; u8 qs[128]
    Q5_K: (256, 176), # fp16 d; fp16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
    Q6_K: (256, 210), # u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d
    Q8_K: (256, 292), # f32 d; i8 qs[256]; i16 bsums[16]
    MXFP4: (32, 17),  # u8 e (E8M0); u8 qs[16] (E2M1 codes: element j low nibble, j + 16 high)
}


def type_id(t):
    if isinstance(t, str):
        return TYPE_BY_NAME[t.upper()]
    return int(t)


def block_size(t):
    return BLOCK[type_id(t)][0]


def type_size(t):
    return BLOCK[type_id(t)][1]


def nbytes(t, n_elements):
    bs, ts = BLOCK[type_id(t)]
    if n_elements % bs:
        raise ValueError("%d elements not a multiple of block size %d for %s"
                         % (n_elements, bs, TYPE_NAMES[type_id(t)]))
    return n_elements // bs * ts


# ----------------------------------------------------------------------------- helpers

def _f16_bytes(a):
    """float -> fp16 (round to nearest even, as GGML_FP32_TO_FP16) -> [.., 2] uint8"""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32).astype("<f2")).view(np.uint8).reshape(
        np.shape(a) + (2,))


def _f16_round(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


def _f16_from(b):
    """[.., 2] uint8 -> float32"""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _safe_inv(d):
    d = np.asarray(d, dtype=np.float32)
    out = np.zeros_like(d)
    nz = d != 0
    out[nz] = np.float32(1.0) / d[nz]
    return out


def _blocks(x, bs):
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if x.size % bs:
        raise ValueError("length %d not a multiple of block size %d" % (x.size, bs))
    return x.reshape(-1, bs)


def _trunc_clip(v, lo, hi):
    # C: (int8_t)(v) truncation toward zero, then MIN(hi, .)
    return np.clip(np.trunc(v), lo, hi).astype(np.uint8)


def _signed_absmax(xb):
    """value with the largest magnitude per row (first one on ties), as ggml's loops."""
    idx = np.argmax(np.abs(xb), axis=-1)
    return np.take_along_axis(xb, idx[..., None], axis=-1)[..., 0]


def _round_half_away(v):
    """C roundf(): round half away from zero"""
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


# ----------------------------------------------------------------------------- float types

def _q_f32(x):
    return np.asarray(x, dtype="<f4").reshape(-1).view(np.uint8)


def _dq_f32(raw, n):
    return raw[: n * 4].view("<f4").astype(np.float32)


def _q_f16(x):
    return np.asarray(x, dtype=np.float32).reshape(-1).astype("<f2").view(np.uint8)


def _dq_f16(raw, n):
    return raw[: n * 2].view("<f2").astype(np.float32)


def bf16_bits(x):
    """ggml_compute_fp32_to_bf16: round to nearest even, NaN kept quiet."""
    u = np.asarray(x, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 64).astype(np.uint16)
    return r


def _q_bf16(x):
    return bf16_bits(x).astype("<u2").view(np.uint8)


def _dq_bf16(raw, n):
    return (raw[: n * 2].view("<u2").astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------- 32-blocks

def _q_q4_0(x):
    xb = _blocks(x, 32)
    mx = _signed_absmax(xb)
    d = mx / np.float32(-8)
    idv = _safe_inv(d)
    q = _trunc_clip(xb * idv[:, None] + np.float32(8.5), 0, 15)
    out = np.empty((xb.shape[0], 18), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(-1)


def _dq_q4_0(raw, n):
    b = raw.reshape(-1, 18)
    d = _f16_from(b[:, 0:2])
    qs = b[:, 2:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32) - 8
    return (q.astype(np.float32) * d[:, None]).reshape(-1)


def _q_q4_1(x):
    xb = _blocks(x, 32)
    mn = xb.min(axis=1)
    mx = xb.max(axis=1)
    d = (mx - mn) / np.float32(15)
    idv = _safe_inv(d)
    q = _trunc_clip((xb - mn[:, None]) * idv[:, None] + np.float32(0.5), 0, 15)
    out = np.empty((xb.shape[0], 20), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(mn)
    out[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(-1)


def _dq_q4_1(raw, n):
    b = raw.reshape(-1, 20)
    d = _f16_from(b[:, 0:2])
    m = _f16_from(b[:, 2:4])
    qs = b[:, 4:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)
    return (q * d[:, None] + m[:, None]).reshape(-1)


def _pack_qh32(hbits):
    """[nb, 32] 0/1 -> [nb, 4] bytes of little-endian uint32 with bit j = element j"""
    w = (hbits.astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=1).astype("<u4")
    return w.view(np.uint8).reshape(-1, 4)


def _unpack_qh32(b4):
    w = np.ascontiguousarray(b4).view("<u4")[:, 0]
    return ((w[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q_q5_0(x):
    xb = _blocks(x, 32)
    mx = _signed_absmax(xb)
    d = mx / np.float32(-16)
    idv = _safe_inv(d)
    q = _trunc_clip(xb * idv[:, None] + np.float32(16.5), 0, 31)
    out = np.empty((xb.shape[0], 22), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:6] = _pack_qh32(q >> 4)
    lo = q & 0xF
    out[:, 6:] = lo[:, :16] | (lo[:, 16:] << 4)
    return out.reshape(-1)


def _dq_q5_0(raw, n):
    b = raw.reshape(-1, 22)
    d = _f16_from(b[:, 0:2])
    h = _unpack_qh32(b[:, 2:6])
    qs = b[:, 6:]
    q = (np.concatenate([qs & 0xF, qs >> 4], axis=1) | (h << 4)).astype(np.int32) - 16
    return (q.astype(np.float32) * d[:, None]).reshape(-1)


def _q_q5_1(x):
    xb = _blocks(x, 32)
    mn = xb.min(axis=1)
    mx = xb.max(axis=1)
    d = (mx - mn) / np.float32(31)
    idv = _safe_inv(d)
    q = _trunc_clip((xb - mn[:, None]) * idv[:, None] + np.float32(0.5), 0, 31)
    out = np.empty((xb.shape[0], 24), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(mn)
    out[:, 4:8] = _pack_qh32(q >> 4)
    lo = q & 0xF
    out[:, 8:] = lo[:, :16] | (lo[:, 16:] << 4)
    return out.reshape(-1)


def _dq_q5_1(raw, n):
    b = raw.reshape(-1, 24)
    d = _f16_from(b[:, 0:2])
    m = _f16_from(b[:, 2:4])
    h = _unpack_qh32(b[:, 4:8])
    qs = b[:, 8:]
    q = (np.concatenate([qs & 0xF, qs >> 4], axis=1) | (h << 4)).astype(np.float32)
    return (q * d[:, None] + m[:, None]).reshape(-1)


def q8_0_blocks(x):
    """ggml quantize_row_q8_0_ref.  Returns (d_fp32_as_stored_fp16, qs int8 [nb,32])."""
    xb = _blocks(x, 32)
    amax = np.abs(xb).max(axis=1)
    d = amax / np.float32(127)
    idv = _safe_inv(d)
    q = _round_half_away(xb * idv[:, None]).astype(np.int8)
    return _f16_round(d), q, d


def _q_q8_0(x):
    d16, q, d = q8_0_blocks(x)
    out = np.empty((q.shape[0], 34), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(-1)


def _dq_q8_0(raw, n):
    b = raw.reshape(-1, 34)
    d = _f16_from(b[:, 0:2])
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (q * d[:, None]).reshape(-1)


def q8_1_blocks(x):
    """ggml quantize_row_q8_1_ref.  Returns (d as fp16->fp32, qs int8 [nb,32], s as fp16->fp32)
    where s = fp16(sum(qs) * d) with the unrounded float32 d."""
    d16, q, d = q8_0_blocks(x)
    s = q.astype(np.int32).sum(axis=1).astype(np.float32) * d
    return d16, q, _f16_round(s)


def _q_q8_1(x):
    d16, q, s = q8_1_blocks(x)
    out = np.empty((q.shape[0], 36), np.uint8)
    out[:, 0:2] = _f16_bytes(d16)
    out[:, 2:4] = _f16_bytes(s)
    out[:, 4:] = q.view(np.uint8)
    return out.reshape(-1)


def _dq_q8_1(raw, n):
    b = raw.reshape(-1, 36)
    d = _f16_from(b[:, 0:2])
    q = b[:, 4:].view(np.int8).astype(np.float32)
    return (q * d[:, None]).reshape(-1)


# ----------------------------------------------------------------------------- K-quants

def nearest_int(v):
    """ggml nearest_int(): the 1.5*2^23 trick == round half to even (default FP mode)."""
    return np.rint(v).astype(np.int32)


def q8_k_blocks(x):
    """ggml quantize_row_q8_K_ref.  Returns (d float32 [nb], qs int8 [nb,256])."""
    xb = _blocks(x, QK_K)
    mx = _signed_absmax(xb)
    nz = mx != 0
    iscale = np.zeros_like(mx)
    iscale[nz] = np.float32(-127) / mx[nz]
    q = np.minimum(127, nearest_int(iscale[:, None] * xb)).astype(np.int8)
    q[~nz] = 0
    d = np.zeros_like(mx)
    d[nz] = np.float32(1) / iscale[nz]
    return d, q


def _q_q8_k(x):
    d, q = q8_k_blocks(x)
    out = np.empty((q.shape[0], 292), np.uint8)
    out[:, 0:4] = d.astype("<f4").view(np.uint8).reshape(-1, 4)
    out[:, 4:260] = q.view(np.uint8)
    bs = q.astype(np.int16).reshape(-1, 16, 16).sum(axis=2).astype("<i2")
    out[:, 260:] = bs.view(np.uint8).reshape(-1, 32)
    return out.reshape(-1)


def _dq_q8_k(raw, n):
    b = raw.reshape(-1, 292)
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4")[:, 0]
    q = b[:, 4:260].view(np.int8).astype(np.float32)
    return (q * d[:, None]).reshape(-1)


def _affine_subblocks(xs, nmax, scale_max):
    """Quantize [nb, nsub, L] with per-sub-block (scale, min) as y = d*sc*q - dmin*m.

    Returns d, dmin (fp16-rounded float32 [nb]), sc, m (uint8 [nb, nsub]), q (uint8 [nb, nsub, L]).
    """
    mn = np.maximum(np.float32(0), -xs.min(axis=2))       # offset >= 0
    mx = xs.max(axis=2)
    s = np.maximum(mx + mn, np.float32(0)) / np.float32(nmax)
    d = _f16_round(s.max(axis=1) / np.float32(scale_max))
    dmin = _f16_round(mn.max(axis=1) / np.float32(scale_max))
    sc = np.clip(np.rint(s * _safe_inv(d)[:, None]), 0, scale_max).astype(np.uint8)
    # make sure a sub-block with a non-zero range gets a non-zero scale
    sc = np.where((sc == 0) & (s > 0) & (d[:, None] > 0), 1, sc).astype(np.uint8)
    m = np.clip(np.ceil(mn * _safe_inv(dmin)[:, None] - np.float32(1e-4)), 0, scale_max).astype(np.uint8)
    eff_d = d[:, None] * sc.astype(np.float32)
    eff_m = dmin[:, None] * m.astype(np.float32)
    q = np.rint((xs + eff_m[..., None]) * _safe_inv(eff_d)[..., None])
    q = np.clip(q, 0, nmax).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_scale_min_k4(sc, m):
    """inverse of ggml get_scale_min_k4: 8 6-bit scales + 8 6-bit mins -> 12 bytes"""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def unpack_scale_min_k4(s12):
    """ggml get_scale_min_k4 for j = 0..7, vectorised: [nb,12] -> sc, m [nb,8] (uint8)"""
    s12 = s12.astype(np.uint8)
    sc = np.empty((s12.shape[0], 8), np.uint8)
    m = np.empty((s12.shape[0], 8), np.uint8)
    sc[:, 0:4] = s12[:, 0:4] & 63
    m[:, 0:4] = s12[:, 4:8] & 63
    sc[:, 4:8] = (s12[:, 8:12] & 0xF) | ((s12[:, 0:4] >> 6) << 4)
    m[:, 4:8] = (s12[:, 8:12] >> 4) | ((s12[:, 4:8] >> 6) << 4)
    return sc, m


def _q_q2_k(x):
    xs = _blocks(x, QK_K).reshape(-1, 16, 16)
    d, dmin, sc, m, q = _affine_subblocks(xs, 3, 15)
    nb = xs.shape[0]
    out = np.empty((nb, 84), np.uint8)
    out[:, 0:16] = sc | (m << 4)
    L = q.reshape(nb, 2, 4, 32)          # element 128n + 32j + l
    out[:, 16:80] = (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(nb, 64)
    out[:, 80:82] = _f16_bytes(d)
    out[:, 82:84] = _f16_bytes(dmin)
    return out.reshape(-1)


def _dq_q2_k(raw, n):
    b = raw.reshape(-1, 84)
    nb = b.shape[0]
    scales = b[:, 0:16]
    qs = b[:, 16:80].reshape(nb, 2, 1, 32)
    d = _f16_from(b[:, 80:82])
    dmin = _f16_from(b[:, 82:84])
    q = ((qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3).reshape(nb, 16, 16)
    dl = d[:, None] * (scales & 0xF).astype(np.float32)
    ml = dmin[:, None] * (scales >> 4).astype(np.float32)
    return (dl[..., None] * q.astype(np.float32) - ml[..., None]).reshape(-1)


def _q_q3_k(x):
    xs = _blocks(x, QK_K).reshape(-1, 16, 16)
    nb = xs.shape[0]
    s = np.abs(xs).max(axis=2) / np.float32(4)          # q in -4..3
    d = _f16_round(s.max(axis=1) / np.float32(31))
    sc = np.clip(np.rint(s * _safe_inv(d)[:, None]), 0, 31).astype(np.int32)
    sc = np.where((sc == 0) & (s > 0) & (d[:, None] > 0), 1, sc)
    eff = d[:, None] * sc.astype(np.float32)
    q = np.clip(np.rint(xs * _safe_inv(eff)[..., None]), -4, 3).astype(np.int32)
    L = (q + 4).astype(np.uint8).reshape(nb, 256)      # 0..7
    out = np.empty((nb, 110), np.uint8)
    hb = (L >> 2).reshape(nb, 8, 32)                   # element 32*b + l -> hmask[l] bit b
    out[:, 0:32] = (hb << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1).astype(np.uint8)
    lo = (L & 3).reshape(nb, 2, 4, 32)
    out[:, 32:96] = (lo[:, :, 0] | (lo[:, :, 1] << 2) | (lo[:, :, 2] << 4) | (lo[:, :, 3] << 6)).reshape(nb, 64)
    ls = (sc + 32).astype(np.uint8)                    # 6-bit biased scales, 16 of them
    sb = np.zeros((nb, 12), np.uint8)
    sb[:, 0:8] = (ls[:, 0:8] & 0xF) | ((ls[:, 8:16] & 0xF) << 4)
    hi = ls >> 4
    for j in range(16):
        sb[:, 8 + j % 4] |= hi[:, j] << (2 * (j // 4))
    out[:, 96:108] = sb
    out[:, 108:110] = _f16_bytes(d)
    return out.reshape(-1)


def unpack_q3_k_scales(s12):
    """12 packed bytes -> 16 signed scales (the kmask1/kmask2 shuffle of dequantize_row_q3_K)"""
    s12 = s12.astype(np.uint8)
    low = np.concatenate([s12[:, 0:8] & 0xF, s12[:, 0:8] >> 4], axis=1)
    j = np.arange(16)
    high = (s12[:, 8 + j % 4] >> (2 * (j // 4)).astype(np.uint8)) & 3
    return (low | (high << 4)).astype(np.int32) - 32


def _dq_q3_k(raw, n):
    b = raw.reshape(-1, 110)
    nb = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96].reshape(nb, 2, 1, 32)
    sc = unpack_q3_k_scales(b[:, 96:108])
    d = _f16_from(b[:, 108:110])
    lo = ((qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3).reshape(nb, 256).astype(np.int32)
    hb = ((hmask[:, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1).reshape(nb, 256)
    q = lo - np.where(hb != 0, 0, 4)
    dl = d[:, None] * sc.astype(np.float32)
    return (dl[..., None] * q.reshape(nb, 16, 16).astype(np.float32)).reshape(-1)


def _q_q4_k(x):
    xs = _blocks(x, QK_K).reshape(-1, 8, 32)
    nb = xs.shape[0]
    d, dmin, sc, m, q = _affine_subblocks(xs, 15, 63)
    out = np.empty((nb, 144), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(dmin)
    out[:, 4:16] = _pack_scale_min_k4(sc, m)
    L = q.reshape(nb, 4, 2, 32)
    out[:, 16:144] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128)
    return out.reshape(-1)


def _dq_q4_k(raw, n):
    b = raw.reshape(-1, 144)
    nb = b.shape[0]
    d = _f16_from(b[:, 0:2])
    dmin = _f16_from(b[:, 2:4])
    sc, m = unpack_scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144].reshape(nb, 4, 1, 32)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
    d1 = d[:, None] * sc.astype(np.float32)
    m1 = dmin[:, None] * m.astype(np.float32)
    return (d1[..., None] * q - m1[..., None]).reshape(-1)


def _q_q5_k(x):
    xs = _blocks(x, QK_K).reshape(-1, 8, 32)
    nb = xs.shape[0]
    d, dmin, sc, m, q = _affine_subblocks(xs, 31, 63)
    out = np.empty((nb, 176), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(dmin)
    out[:, 4:16] = _pack_scale_min_k4(sc, m)
    hb = (q >> 4)                                      # [nb, 8, 32]: sub-block s -> qh bit s
    out[:, 16:48] = (hb << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1).astype(np.uint8)
    L = (q & 0xF).reshape(nb, 4, 2, 32)
    out[:, 48:176] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128)
    return out.reshape(-1)


def _dq_q5_k(raw, n):
    b = raw.reshape(-1, 176)
    nb = b.shape[0]
    d = _f16_from(b[:, 0:2])
    dmin = _f16_from(b[:, 2:4])
    sc, m = unpack_scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(nb, 4, 1, 32)
    lo = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32)
    hb = (qh[:, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = (lo + (hb << 4)).astype(np.float32)
    d1 = d[:, None] * sc.astype(np.float32)
    m1 = dmin[:, None] * m.astype(np.float32)
    return (d1[..., None] * q - m1[..., None]).reshape(-1)


def _q_q6_k(x):
    xs = _blocks(x, QK_K).reshape(-1, 16, 16)
    nb = xs.shape[0]
    s = np.abs(xs).max(axis=2) / np.float32(32)        # q in -32..31
    d = _f16_round(s.max(axis=1) / np.float32(127))
    sc = np.clip(np.rint(s * _safe_inv(d)[:, None]), 0, 127).astype(np.int32)
    sc = np.where((sc == 0) & (s > 0) & (d[:, None] > 0), 1, sc)
    eff = d[:, None] * sc.astype(np.float32)
    q = np.clip(np.rint(xs * _safe_inv(eff)[..., None]), -32, 31).astype(np.int32)
    L = (q + 32).astype(np.uint8).reshape(nb, 2, 4, 32)   # [n, k, l]: element 128n + 32k + l
    out = np.empty((nb, 210), np.uint8)
    lo = L & 0xF
    ql = np.empty((nb, 2, 2, 32), np.uint8)               # [n, half(k%2), l]
    ql[:, :, 0] = lo[:, :, 0] | (lo[:, :, 2] << 4)
    ql[:, :, 1] = lo[:, :, 1] | (lo[:, :, 3] << 4)
    out[:, 0:128] = ql.reshape(nb, 128)
    h = L >> 4
    out[:, 128:192] = (h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)).reshape(nb, 64)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = _f16_bytes(d)
    return out.reshape(-1)


def _dq_q6_k(raw, n):
    b = raw.reshape(-1, 210)
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 1, 2, 32)              # [n, ., k%2, l]
    qh = b[:, 128:192].reshape(nb, 2, 1, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16_from(b[:, 208:210])
    lo = np.concatenate([ql & 0xF, ql >> 4], axis=2).reshape(nb, 2, 4, 32)  # k = 2*(k//2) + k%2
    hi = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    q = (lo | (hi << 4)).astype(np.int32) - 32
    dl = d[:, None] * sc
    return (dl[..., None] * q.reshape(nb, 16, 16).astype(np.float32)).reshape(-1)


# ----------------------------------------------------------------------------- MXFP4
# OCP microscaling FP4: value = E2M1(code) * 2^(e - 127). An E2M1 code is sign (bit 3), exponent
# (bits 2-1, bias 1) and mantissa (bit 0); exponent 0 is subnormal (0 or 0.5).

def _e2m1_magnitudes():
    return np.array([(0.5 * (c & 1)) if (c >> 1) == 0 else 2.0 ** ((c >> 1) - 1) * (1 + 0.5 * (c & 1))
                     for c in range(8)], np.float32)


def _e8m0_scale(e):
    """2^(e - 127) as float32 for E8M0 bytes (e = 0 is the subnormal 2^-127)."""
    return np.ldexp(np.float64(1.0), e.astype(np.int64) - 127).astype(np.float32)


def _q_mxfp4(x):
    xb = _blocks(x, 32)
    amax = np.max(np.abs(xb), axis=1)
    # The smallest exponent whose scale brings amax within E2M1's largest magnitude, 6.
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)) + 127, 0)
    e = np.clip(e, 0, 254).astype(np.uint8)
    scaled = xb / _e8m0_scale(e)[:, None]
    mags = _e2m1_magnitudes()
    code = np.argmin(np.abs(np.abs(scaled)[..., None] - mags), axis=-1).astype(np.uint8)
    code |= np.where((scaled < 0) & (code != 0), 8, 0).astype(np.uint8)
    out = np.empty((xb.shape[0], 17), np.uint8)
    out[:, 0] = e
    out[:, 1:] = code[:, :16] | (code[:, 16:] << 4)
    return out.reshape(-1)


def _dq_mxfp4(raw, n):
    b = raw.reshape(-1, 17)
    qs = b[:, 1:]
    code = np.concatenate([qs & 0xF, qs >> 4], axis=1)
    mags = _e2m1_magnitudes()
    v = np.where(code >= 8, -mags[code & 7], mags[code & 7]).astype(np.float32)
    return (v * _e8m0_scale(b[:, 0])[:, None]).astype(np.float32).reshape(-1)


_QUANT = {F32: _q_f32, F16: _q_f16, BF16: _q_bf16, Q4_0: _q_q4_0, Q4_1: _q_q4_1,
          Q5_0: _q_q5_0, Q5_1: _q_q5_1, Q8_0: _q_q8_0, Q8_1: _q_q8_1, Q2_K: _q_q2_k,
          Q3_K: _q_q3_k, Q4_K: _q_q4_k, Q5_K: _q_q5_k, Q6_K: _q_q6_k, Q8_K: _q_q8_k, MXFP4: _q_mxfp4}
_DEQUANT = {F32: _dq_f32, F16: _dq_f16, BF16: _dq_bf16, Q4_0: _dq_q4_0, Q4_1: _dq_q4_1,
            Q5_0: _dq_q5_0, Q5_1: _dq_q5_1, Q8_0: _dq_q8_0, Q8_1: _dq_q8_1, Q2_K: _dq_q2_k,
            Q3_K: _dq_q3_k, Q4_K: _dq_q4_k, Q5_K: _dq_q5_k, Q6_K: _dq_q6_k, Q8_K: _dq_q8_k,
            MXFP4: _dq_mxfp4}

QUANT_TYPES = [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4]


def quantize(x, t):
    """float array (any shape, flattened C order) -> raw bytes (1-D uint8) of type t"""
    t = type_id(t)
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    nbytes(t, x.size)
    return _QUANT[t](x)


def dequantize(raw, t, n=None):
    """raw bytes of type t -> float32 1-D array (n elements, default: all)"""
    t = type_id(t)
    raw = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.view(np.uint8).reshape(-1)
    bs, ts = BLOCK[t]
    if n is None:
        n = raw.size // ts * bs
    need = nbytes(t, n)
    return _DEQUANT[t](raw[:need], n)
