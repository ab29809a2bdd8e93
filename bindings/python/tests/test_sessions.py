"""Saved sessions (moelite_context_save / _load): a restored context must go on exactly as the
uninterrupted one (logits bitwise equal) -- on every backend, with several sequences, sliding-window
rings and latent-attention caches -- and every bad file must be refused with its own status while
the context stays as it was. Writes are atomic: a failed save leaves the old file whole."""
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from support import DEVICE_BACKENDS, PKG_DIR, REPO, backend_for, tiny_model

import moelite

TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-py-tests"), "sessions")
os.makedirs(TMP, exist_ok=True)


def _tiny(name, *args):
    return tiny_model("sessions-" + name, *args)


MODELS = {
    "qwen3moe-Q8_0": lambda: os.path.join(REPO, "models", "moelite-tiny-qwen3moe-Q8_0.gguf"),
    "gpt-oss-window": lambda: _tiny("gpt-oss", "--arch", "gpt-oss", "--type", "F32", "--window", "5", "--seed", "3"),
    "deepseek2-Q8_0": lambda: _tiny("deepseek2", "--arch", "deepseek2", "--type", "Q8_0", "--dense-lead", "1",
                                    "--seed", "4"),
}
# 24 tokens a sequence: past the window of 5 (a ring that wrapped) and several batches of 4 and 6,
# few enough for the emulated CUDA device (seconds per hundred tokens).
TOKENS = [(i * 37 + 11) % 500 + 1 for i in range(24)]
OTHER = [(i * 53 + 5) % 500 + 1 for i in range(24)]


def _open(name, backend="cpu"):
    try:
        return moelite.Model(MODELS[name](), threads=2, backend=backend)
    except moelite.MoeliteError as e:
        if e.status == moelite.Status.ERR_BACKEND_UNAVAILABLE:
            pytest.skip(str(e))
        raise


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_restored_context_goes_on_bitwise(name, backend, monkeypatch):
    backend = backend_for(backend, monkeypatch)
    path = os.path.join(TMP, "%s-%s.session" % (name, backend))
    with _open(name, backend) as model:
        straight = moelite.Context(model, n_ctx=64, n_batch=4, n_seq=2)
        straight.eval_batch(TOKENS + OTHER, [0] * 24 + [1] * 24, [True] * 48)
        want = [straight.logits(i) for i in range(48)]
        saved = moelite.Context(model, n_ctx=64, n_batch=4, n_seq=2)
        saved.eval_batch(TOKENS[:18] + OTHER[:15], [0] * 18 + [1] * 15)
        saved.save(path)
        saved.close()
        # Another context: more sequences, another batch size (a windowed ring of another size).
        restored = moelite.Context(model, n_ctx=64, n_batch=6, n_seq=3)
        restored.eval_batch([1, 2, 3], [2, 2, 2])  # replaced by the load
        restored.load(path)
        assert [restored.seq_length(q) for q in range(3)] == [18, 15, 0]
        restored.eval_batch(TOKENS[18:] + OTHER[15:], [0] * 6 + [1] * 9, [True] * 15)
        for i in range(6):
            np.testing.assert_array_equal(restored.logits(i), want[18 + i])
        for i in range(9):
            np.testing.assert_array_equal(restored.logits(6 + i), want[24 + 15 + i])


def test_single_sequence_api_and_tokens():
    path = os.path.join(TMP, "plain.session")
    with _open("qwen3moe-Q8_0") as model:
        a = moelite.Context(model, n_ctx=64)
        a.eval(TOKENS[:20])
        a.save(path)
        b = moelite.Context(model, n_ctx=32)
        b.load(path)
        assert b.tokens() == TOKENS[:20]
        with pytest.raises(IndexError):
            b.logits()  # the load drops the last evaluation's logits
        b.eval(TOKENS[20:25])
        a.eval(TOKENS[20:25])
        np.testing.assert_array_equal(a.logits(), b.logits())


def _saved(model, path):
    ctx = moelite.Context(model, n_ctx=64)
    ctx.eval(TOKENS[:20])
    ctx.save(path)
    return ctx


def _expect(ctx, path, status):
    before = (ctx.tokens(), ctx.logits().copy())
    with pytest.raises(moelite.MoeliteError) as e:
        ctx.load(path)
    assert e.value.status == status, str(e.value)
    assert ctx.tokens() == before[0]
    np.testing.assert_array_equal(ctx.logits(), before[1])


def test_bad_files_are_refused_and_change_nothing():
    good = os.path.join(TMP, "good.session")
    bad = os.path.join(TMP, "bad.session")
    with _open("qwen3moe-Q8_0") as model:
        _saved(model, good).close()
        data = open(good, "rb").read()
        ctx = moelite.Context(model, n_ctx=64)
        ctx.eval(OTHER[:7])
        cases = [
            (data[:30], moelite.Status.ERR_BAD_SESSION),                         # inside the header
            (data[:-1], moelite.Status.ERR_BAD_SESSION),                         # truncated
            (data + b"x", moelite.Status.ERR_BAD_SESSION),                       # trailing bytes
            (b"GGUF" + data[4:], moelite.Status.ERR_BAD_SESSION),                # not a session
            (data[:8] + struct.pack("<I", 2) + data[12:], moelite.Status.ERR_BAD_SESSION),  # a newer version
            (data[:12] + struct.pack("<I", 7) + data[16:], moelite.Status.ERR_BAD_SESSION),  # unknown compression
            (data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1:],
             moelite.Status.ERR_BAD_SESSION),                                    # a flipped bit in the data
            (data[:16] + bytes([data[16] ^ 1]) + data[17:], moelite.Status.ERR_SESSION_MISMATCH),  # other model
        ]
        for blob, status in cases:
            open(bad, "wb").write(blob)
            _expect(ctx, bad, status)
        _expect(ctx, os.path.join(TMP, "missing.session"), moelite.Status.ERR_FILE_NOT_FOUND)
        small = moelite.Context(model, n_ctx=16)  # 20 saved positions do not fit
        small.eval(OTHER[:3])
        _expect(small, good, moelite.Status.ERR_SESSION_MISMATCH)
        ctx.close()
        small.close()
    with _open("gpt-oss-window") as other:
        ctx = moelite.Context(other, n_ctx=64)
        ctx.eval(OTHER[:5])
        _expect(ctx, good, moelite.Status.ERR_SESSION_MISMATCH)
        ctx.close()


def test_save_is_atomic():
    path = os.path.join(TMP, "atomic.session")
    with _open("qwen3moe-Q8_0") as model:
        ctx = _saved(model, path)
        before = open(path, "rb").read()
        # A directory that cannot be written: the save fails, the old file stays whole, no temporary
        # file is left behind.
        ro = os.path.join(TMP, "ro")
        shutil.rmtree(ro, ignore_errors=True)
        os.makedirs(ro)
        target = os.path.join(ro, "s.session")
        shutil.copy(path, target)
        os.chmod(ro, 0o500)
        try:
            if os.access(ro, os.W_OK):  # root ignores the mode: a file in the way of the name instead
                os.chmod(ro, 0o700)
                os.makedirs(target + ".d")
                target = target + ".d"
            with pytest.raises(moelite.MoeliteError) as e:
                ctx.eval(OTHER[:3])
                ctx.save(target)
            assert e.value.status == moelite.Status.ERR_IO
        finally:
            os.chmod(ro, 0o700)
        assert open(path, "rb").read() == before
        assert not [f for f in os.listdir(ro) if ".tmp-" in f]
        ctx.close()


def _hash(data):
    """core/exec/session.cpp's payload checksum, written again from its definition."""
    mask = (1 << 64) - 1
    h = 0x9E3779B97F4A7C15

    def mix(h, w):
        h ^= w
        h = (h * 0xBF58476D1CE4E5B9) & mask
        return h ^ (h >> 31)

    n = len(data) // 8 * 8
    for (w,) in struct.iter_unpack("<Q", data[:n]):
        h = mix(h, w)
    tail = len(data)
    for b in data[n:]:
        tail = ((tail << 8) | b) & mask
    return mix(h, tail)


def _session(fingerprint, payload, compression=0, payload_bytes=None):
    header = b"MOELSESS" + struct.pack("<IIQQQQ", 1, compression, fingerprint,
                                       len(payload) if payload_bytes is None else payload_bytes, len(payload),
                                       _hash(payload))
    return header + payload


def _payload(layers=4, values=1, kv_dim=128, sequences=((0, 3, None),), rows=None, extra=b""):
    """A payload of the tiny qwen3moe's shape: per sequence (id, length, first position per layer)."""
    out = struct.pack("<IIQII", layers, values, kv_dim, 64, len(sequences))
    for sid, length, first in sequences:
        out += struct.pack("<II", sid, length) + struct.pack("<%di" % length, *([5] * length))
        for _ in range(layers):
            f = 0 if first is None else first
            out += struct.pack("<I", f)
            n = (length - f) if rows is None else rows
            out += b"\0" * (max(n, 0) * kv_dim * 4 * (2 if values else 1))
    return out + extra


def test_hostile_payloads_with_valid_checksums_are_refused():
    """Past the checksum, every field is checked: crafted files whose checksum and fingerprint are right."""
    good = os.path.join(TMP, "crafted-good.session")
    bad = os.path.join(TMP, "crafted.session")
    with _open("qwen3moe-Q8_0") as model:
        _saved(model, good).close()
        fingerprint = struct.unpack("<Q", open(good, "rb").read()[16:24])[0]
        ctx = moelite.Context(model, n_ctx=64, n_seq=2)
        # The crafted format is right: a well-formed stored (uncompressed) file loads.
        open(bad, "wb").write(_session(fingerprint, _payload(sequences=((1, 3, None),))))
        ctx.load(bad)
        assert ctx.seq_length(1) == 3 and ctx.seq_length(0) == 0
        ctx.eval(OTHER[:4])
        cases = [
            (_payload(layers=5), moelite.Status.ERR_BAD_SESSION),                       # another layer count
            (_payload(values=0), moelite.Status.ERR_BAD_SESSION),                       # keys-only rows
            (_payload(kv_dim=64), moelite.Status.ERR_BAD_SESSION),                      # another row width
            (_payload(sequences=((0, 3, None),) * 3), moelite.Status.ERR_SESSION_MISMATCH),  # more sequences
            (_payload(sequences=((0, 3, None), (0, 2, None))), moelite.Status.ERR_BAD_SESSION),  # repeated id
            (_payload(sequences=((7, 3, None),)), moelite.Status.ERR_BAD_SESSION),      # id out of range
            (_payload(sequences=((0, 65, None),)), moelite.Status.ERR_SESSION_MISMATCH),  # longer than n_ctx
            (_payload(sequences=((0, 3, 2),)), moelite.Status.ERR_BAD_SESSION),         # a full layer lacks rows
            (_payload(sequences=((0, 3, 4),)), moelite.Status.ERR_BAD_SESSION),         # first past the length
            (_payload(rows=2), moelite.Status.ERR_BAD_SESSION),                         # rows missing
            (_payload(extra=b"\0"), moelite.Status.ERR_BAD_SESSION),                    # data after the end
            (_payload()[:-3], moelite.Status.ERR_BAD_SESSION),                          # ends inside a row
        ]
        for payload, status in cases:
            open(bad, "wb").write(_session(fingerprint, payload))
            _expect(ctx, bad, status)
        # A token outside the vocabulary.
        p = bytearray(_payload())
        struct.pack_into("<i", p, struct.calcsize("<IIQII") + 8, model.n_vocab)
        open(bad, "wb").write(_session(fingerprint, bytes(p)))
        _expect(ctx, bad, moelite.Status.ERR_BAD_SESSION)
        # A payload size no state of this context reaches: refused before anything is allocated.
        open(bad, "wb").write(_session(fingerprint, _payload(), compression=1, payload_bytes=1 << 60))
        _expect(ctx, bad, moelite.Status.ERR_SESSION_MISMATCH)
        # A zstd payload that is not zstd.
        open(bad, "wb").write(_session(fingerprint, _payload(), compression=1))
        _expect(ctx, bad, moelite.Status.ERR_BAD_SESSION)
        ctx.close()


def test_without_libzstd_sessions_are_stored_uncompressed():
    """libzstd is dlopen()ed: without it a save is stored, and loads anywhere; a compressed file then
    answers NOT_IMPLEMENTED. Run in a child process, which reads MOELITE_ZSTD_LIBRARY once."""
    good = os.path.join(TMP, "zstd-good.session")
    plain = os.path.join(TMP, "zstd-none.session")
    with _open("qwen3moe-Q8_0") as model:
        _saved(model, good).close()
    code = """
import sys, moelite
m = moelite.Model(sys.argv[1], threads=2)
c = moelite.Context(m, n_ctx=64)
c.eval(list(range(1, 21)))
c.save(sys.argv[2])
try:
    c.load(sys.argv[3])
    print("loaded")
except moelite.MoeliteError as e:
    print(moelite.Status(e.status).name)
"""
    env = dict(os.environ, MOELITE_ZSTD_LIBRARY="/nonexistent/libzstd.so.1", PYTHONPATH=PKG_DIR)
    r = subprocess.run([sys.executable, "-c", code, MODELS["qwen3moe-Q8_0"](), plain, good], env=env,
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ERR_NOT_IMPLEMENTED"
    assert struct.unpack("<I", open(plain, "rb").read()[12:16])[0] == 0  # stored
    with _open("qwen3moe-Q8_0") as model:  # this process has libzstd: the stored file loads
        ctx = moelite.Context(model, n_ctx=64)
        ctx.load(plain)
        assert ctx.tokens() == list(range(1, 21))
        ctx.close()


def test_window_ring_as_long_as_the_context():
    """A windowed layer whose ring is the whole context (window 5 - 1 + n_batch 4 = 8 = n_ctx): the
    restored ring record lets a later cut keep what the ring holds, as in the uninterrupted run."""
    path = os.path.join(TMP, "ring.session")
    with _open("gpt-oss-window") as model:
        straight = moelite.Context(model, n_ctx=8, n_batch=4)
        straight.eval(TOKENS[:7], logits_all=True)
        want = straight.logits(6)
        saved = moelite.Context(model, n_ctx=8, n_batch=4)
        saved.eval(TOKENS[:6])
        saved.save(path)
        restored = moelite.Context(model, n_ctx=8, n_batch=4)
        restored.load(path)
        restored.truncate(5)  # the ring still holds positions 0..4: kept
        assert restored.kv_length == 5
        restored.eval(TOKENS[5:7], logits_all=True)
        np.testing.assert_array_equal(restored.logits(1), want)
