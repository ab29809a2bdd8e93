"""Tests of the ctypes binding against facts that do not come from the binding itself: the C
header's enums and version, the hyperparameters the tiny-model generator was given, the
model's vocabulary and chat template read with the repo's own Python GGUF reader
(tools/gguf), llama.cpp's tokenizer test vectors, and greedy decoding recomputed from raw logits.

Environment: MOELITE_LIBRARY (the libmoelite to test), MOELITE_TEST_MODEL (optional: a small
model with a byte-level BPE ("gpt2") vocabulary; otherwise one is generated with
tools/make_tiny_model.py), MOELITE_TEST_TMP (optional scratch directory).
"""
import json
import os
import re
import struct
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir, os.pardir))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, os.pardir)))  # the checkout's package

import moelite  # noqa: E402

np = pytest.importorskip("numpy")
sys.path.insert(0, os.path.join(REPO, "tools", "gguf"))
from moelite_gguf.reader import GGUFReader  # noqa: E402  (independent of the C library)

HEADER = os.path.join(REPO, "include", "moelite.h")
VOCAB_DIR = os.path.join(REPO, "tests", "data", "vocab")
GPT2_VOCAB = os.path.join(VOCAB_DIR, "ggml-vocab-gpt-2.gguf")

# What tools/make_tiny_model.py is asked for below.
TINY = dict(arch="qwen3moe", type="Q8_0", n_layer=2, n_embd=128, n_head=4, n_head_kv=2,
            n_expert=8, n_expert_used=2, n_ff_exp=64, vocab=512, ctx=256, seed=7)
PROMPT = "Once upon a time"


def _gpt2_byte_decoder():
    """GPT-2's printable code point -> byte table (inverse of bytes_to_unicode)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class RefVocab:
    """The model's byte-level BPE vocabulary as stored in the file, decoded in Python."""
    RENDERLESS = (2, 3, 5)  # unknown, control, unused: no text unless special

    def __init__(self, path):
        r = GGUFReader(path)
        md = r.metadata
        if md.get("tokenizer.ggml.model") != "gpt2":
            pytest.skip("these checks need a byte-level BPE (gpt2) vocabulary")
        self.tokens = [t if isinstance(t, str) else t.decode("utf-8") for t in md["tokenizer.ggml.tokens"]]
        self.types = [int(x) for x in md["tokenizer.ggml.token_type"]]
        self.bos = int(md.get("tokenizer.ggml.bos_token_id", -1))
        self.eos = int(md.get("tokenizer.ggml.eos_token_id", -1))
        self.template = md.get("tokenizer.chat_template")
        self._dec = _gpt2_byte_decoder()

    def piece(self, t, special=False):
        if self.types[t] in self.RENDERLESS:
            return self.tokens[t].encode("utf-8") if special and self.types[t] == 3 else b""
        if self.types[t] == 4:  # user-defined: stored as plain text
            return self.tokens[t].encode("utf-8")
        return bytes(self._dec[c] for c in self.tokens[t])

    def text(self, ids, special=False):
        return b"".join(self.piece(t, special) for t in ids)


def _header_text():
    with open(HEADER, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="session")
def tmpdir_session(tmp_path_factory):
    d = os.environ.get("MOELITE_TEST_TMP")
    if d:
        d = os.path.join(d, "python-binding")
        os.makedirs(d, exist_ok=True)
        return d
    return str(tmp_path_factory.mktemp("moelite-py"))


@pytest.fixture(scope="session")
def tiny(tmpdir_session):
    """(path, expected) where expected is None for a model given through MOELITE_TEST_MODEL."""
    env = os.environ.get("MOELITE_TEST_MODEL")
    if env:
        return env, None
    out = os.path.join(tmpdir_session, "tiny-qwen3moe-Q8_0.gguf")
    t = TINY
    cmd = [sys.executable, os.path.join(REPO, "tools", "make_tiny_model.py"),
           "--arch", t["arch"], "--type", t["type"], "--seed", str(t["seed"]), "--quiet",
           "--n-layer", str(t["n_layer"]), "--n-embd", str(t["n_embd"]),
           "--n-head", str(t["n_head"]), "--n-head-kv", str(t["n_head_kv"]),
           "--n-expert", str(t["n_expert"]), "--n-expert-used", str(t["n_expert_used"]),
           "--n-ff-exp", str(t["n_ff_exp"]), "--vocab", str(t["vocab"]), "--ctx", str(t["ctx"]),
           "--out", out]
    subprocess.run(cmd, check=True)
    return out, t


@pytest.fixture(scope="session")
def model(tiny):
    m = moelite.Model(tiny[0], threads=2)
    yield m
    m.close()


@pytest.fixture(scope="session")
def vocab(tiny):
    return RefVocab(tiny[0])


def greedy_reference(model, prompt, n):
    """Greedy decoding done by hand: eval, argmax of the raw logits, eval the choice... until an
    end-of-generation token. Returns (prompt token ids, generated ids)."""
    ctx = moelite.Context(model, n_ctx=128)
    try:
        toks = model.tokenize(prompt, add_special=True, parse_special=True)
        ctx.eval(toks)
        out = []
        for i in range(n):
            t = int(np.argmax(ctx.logits()))
            if model.token_is_end(t):
                break
            out.append(t)
            if i + 1 < n:
                ctx.eval([t])
        return toks, out
    finally:
        ctx.close()


# ---- library, version, errors ------------------------------------------------------------------

def test_version_matches_header():
    h = _header_text()
    parts = [int(re.search(r"#define MOELITE_VERSION_%s (\d+)" % k, h).group(1))
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert moelite.__version__ == "%d.%d.%d" % tuple(parts)
    assert moelite.version_number() == parts[0] * 10000 + parts[1] * 100 + parts[2]
    assert os.path.exists(moelite.library_path) or "/" not in moelite.library_path
    assert "qwen3moe" in moelite.supported_archs()


def _header_enum_with_deprecations(h, typedef):
    """{name: value} of the canonical enumerators and {alias: canonical} of those the header
    marks MOELITE_DEPRECATED("MOELITE_<canonical>") (same value), comments removed."""
    body = h[h.index("typedef enum %s" % typedef):h.index("} %s;" % typedef)]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    canonical, deprecated = {}, {}
    for name, repl, v in re.findall(r'MOELITE_(\w+)\s*(?:MOELITE_DEPRECATED\("([^"]*)"\))?\s*=\s*(\d+)', body):
        if repl:
            deprecated[name] = (repl, int(v))
        else:
            canonical[name] = int(v)
    aliases = {}
    for name, (repl, v) in deprecated.items():
        target = repl[len("MOELITE_"):]
        assert canonical[target] == v  # an alias names a canonical enumerator of the same value
        aliases[name] = target
    return canonical, aliases


def test_status_enum_and_names_match_header():
    h = _header_text()
    values, aliases = _header_enum_with_deprecations(h, "moelite_status")
    assert len(values) >= 20 and aliases == {"ERR_CANCELLED": "ERR_PROGRESS_ABORTED"}
    assert {s.name: int(s) for s in moelite.Status} == values  # iteration: canonical only
    members = dict(moelite.Status.__members__)
    assert {n: int(m) for n, m in members.items()} == dict(values, **{a: values[t] for a, t in aliases.items()})
    for alias, target in aliases.items():
        assert members[alias] is members[target]
    for name, v in values.items():
        e = moelite.MoeliteError(v, "x")
        assert e.status == v and e.status_name == "MOELITE_" + name


def test_stop_reasons_match_header():
    values, aliases = _header_enum_with_deprecations(_header_text(), "moelite_stop_reason")
    values = {k[len("STOP_"):]: v for k, v in values.items()}
    aliases = {k[len("STOP_"):]: v[len("STOP_"):] for k, v in aliases.items()}
    assert {s.name: int(s) for s in moelite.StopReason} == values
    assert values["ABORTED"] == 3 and values["ERROR"] == 5 and aliases == {"CALLBACK": "ABORTED"}
    assert moelite.StopReason.__members__["CALLBACK"] is moelite.StopReason.ABORTED


def test_missing_file_maps_to_file_not_found(tmp_path):
    path = str(tmp_path / "no-such-model.gguf")
    with pytest.raises(moelite.MoeliteError) as ei:
        moelite.Model(path)
    e = ei.value
    assert e.status == 3 == moelite.Status.ERR_FILE_NOT_FOUND
    assert e.status_name == "MOELITE_ERR_FILE_NOT_FOUND"
    assert path in e.message and path in str(e)


def test_not_gguf_maps_to_bad_magic(tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"NOTAGGUF" + b"\0" * 64)
    with pytest.raises(moelite.MoeliteError) as ei:
        moelite.Model(str(p))
    assert ei.value.status_name == "MOELITE_ERR_GGUF_BAD_MAGIC"


def test_bad_arguments():
    with pytest.raises(ValueError):
        moelite.Model("x.gguf", backend="tpu")
    with pytest.raises(moelite.MoeliteError) as ei:
        moelite.Model("x.gguf", threads=-1)  # rejected by the setter before any file access
    assert ei.value.status_name == "MOELITE_ERR_INVALID_ARGUMENT"


# ---- model ---------------------------------------------------------------------------------

def test_model_properties(model, tiny):
    t = tiny[1]
    assert model.n_experts_used <= model.n_experts
    assert model.head_dim > 0 and model.n_head % model.n_head_kv == 0
    assert model.expert_bytes > 0 and model.dense_bytes > 0
    assert model.n_active_params < model.n_params
    assert model.threads == 2
    assert model.backend == "cpu" and model.backend_name.startswith("cpu")
    with pytest.raises(moelite.MoeliteError) as e:  # the CPU computes in host memory
        model.measure_device_bandwidth()
    assert "DRAM" in str(e.value)
    info = model.info()
    assert info["n_vocab"] == model.n_vocab and info["arch"] == model.arch
    if t is None:
        return
    assert model.arch == t["arch"]
    assert model.name == "moelite-tiny-%s-%s-seed%d" % (t["arch"], t["type"], t["seed"])
    assert model.expert_type == t["type"]
    assert (model.n_layers, model.n_experts, model.n_experts_used) == (t["n_layer"], t["n_expert"], t["n_expert_used"])
    assert (model.n_vocab, model.n_embd, model.n_ctx_train) == (t["vocab"], t["n_embd"], t["ctx"])
    assert (model.n_head, model.n_head_kv, model.n_ff_expert) == (t["n_head"], t["n_head_kv"], t["n_ff_exp"])
    assert model.n_shared_experts == 0
    # Q8_0 stores 32 weights in 34 bytes; the experts are gate, up (n_ff x n_embd) and down.
    n_expert_weights = t["n_layer"] * t["n_expert"] * 3 * t["n_ff_exp"] * t["n_embd"]
    assert model.expert_bytes == n_expert_weights // 32 * 34

def test_platform_and_budget_auto(model, tiny):
    info = moelite.platform_info()
    assert info["kind"] in ("jetson", "linux-arm", "x86-desktop", "linux-other")
    assert 0 < moelite.platform_memory_available() <= info["memory"]["total"]
    assert info["auto_backend"]["name"] in ("cpu", "vulkan", "cuda")
    with moelite.Model(tiny[0], threads=2, expert_budget="auto") as m:
        assert m.budget_auto == 1 and m.expert_budget > 0 and m.experts_all_fit == 1
        assert m.budget_auto_headroom == max(64 << 20, m.budget_auto_room // 10)
        with moelite.Context(m) as a, moelite.Context(model) as b:
            a.eval([1, 2, 3], logits_all=True)
            b.eval([1, 2, 3], logits_all=True)

            def raw(x):  # bitwise, not float equality
                return x.tobytes() if hasattr(x, "tobytes") else struct.pack("%df" % len(x), *x)
            for i in range(3):
                assert raw(a.logits(i)) == raw(b.logits(i))
    with moelite.Model(tiny[0], threads=2, expert_budget="auto", budget_headroom=100 << 20) as m:
        assert m.budget_auto_headroom == 100 << 20
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(tiny[0], expert_budget="auto", budget_headroom=1 << 61)
    assert e.value.status == moelite.Status.ERR_BUDGET_TOO_SMALL
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(tiny[0], expert_budget="auto", budget_headroom=(1 << 62) + 1)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(ValueError):
        moelite.Model(tiny[0], expert_budget=1 << 20, budget_headroom=1)


def test_special_tokens_match_file(model, vocab):
    assert (model.bos, model.eos) == (vocab.bos, vocab.eos)
    assert model.n_vocab == len(vocab.tokens)
    assert model.token_is_end(vocab.eos)
    normal = next(i for i, ty in enumerate(vocab.types) if ty == 1)
    assert not model.token_is_end(normal)


def test_closed_model_and_context_manager(tiny):
    with moelite.Model(tiny[0], threads=1) as m:
        ctx = moelite.Context(m, n_ctx=16)
        ctx.eval([3])
    assert m.closed and ctx.closed  # closing the model closed its context first
    with pytest.raises(ValueError):
        m.n_vocab
    with pytest.raises(ValueError):
        ctx.eval([3])
    m.close()
    ctx.close()  # idempotent


def test_context_keeps_model_alive(tiny):
    m = moelite.Model(tiny[0], threads=1)
    ctx = moelite.Context(m, n_ctx=16)
    del m
    import gc
    gc.collect()
    ctx.eval([3, 4])
    assert ctx.kv_length == 2
    ctx.close()


def test_vocab_only_model_has_no_contexts(tiny):
    with moelite.Model(tiny[0], vocab_only=True) as m:
        assert m.n_vocab == (tiny[1]["vocab"] if tiny[1] else m.n_vocab)
        with pytest.raises(moelite.MoeliteError) as ei:
            moelite.Context(m)
        assert ei.value.status_name == "MOELITE_ERR_INVALID_ARGUMENT"


def test_chat_format(model, vocab):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    s = model.chat_format(msgs)
    s2 = model.chat_format(msgs[1:], add_assistant_prompt=False)
    assert isinstance(s, str)
    if vocab.template and "<|im_start|>" in vocab.template:
        assert model.chat_template_kind == "chatml"
        assert s == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
                     "<|im_start|>assistant\n")
        assert s2 == "<|im_start|>user\nhello<|im_end|>\n"
    else:
        assert "be brief" in s and "hello" in s and s.index("be brief") < s.index("hello")
    with pytest.raises(TypeError):
        model.chat_format([("user", "hello")])


# ---- eval / logits -------------------------------------------------------------------------

def test_eval_logits_shape_and_kv(model):
    ctx = moelite.Context(model, n_ctx=32, n_batch=4)
    assert ctx.n_ctx == 32 and ctx.kv_length == 0
    ctx.eval([3, 4, 5, 6, 7])  # longer than n_batch: split by the library
    assert ctx.kv_length == 5
    lg = ctx.logits()
    assert isinstance(lg, np.ndarray) and lg.dtype == np.float32 and lg.shape == (model.n_vocab,)
    assert np.all(np.isfinite(lg)) and np.std(lg) > 0
    assert np.array_equal(ctx.logits(0), lg)  # without logits_all only the last token's exist
    with pytest.raises(IndexError):
        ctx.logits(1)
    ctx.truncate(2)
    assert ctx.kv_length == 2
    ctx.truncate(100)
    assert ctx.kv_length == 2
    ctx.reset()
    assert ctx.kv_length == 0
    ctx.close()


def test_logits_all_equals_token_by_token(model):
    toks = [3, 17, 250, 9, 100, 42, 7]
    a = moelite.Context(model, n_ctx=32)
    a.eval(toks, logits_all=True)
    batch = [a.logits(i) for i in range(len(toks))]
    assert np.array_equal(a.logits(-1), batch[-1])
    with pytest.raises(IndexError):
        a.logits(len(toks))
    b = moelite.Context(model, n_ctx=32)
    for i, t in enumerate(toks):
        b.eval([t])
        one = b.logits()
        assert one.tobytes() == batch[i].tobytes(), "token %d differs" % i  # bitwise
    # and the logits differ between positions (the comparison is not vacuous)
    assert not np.array_equal(batch[0], batch[1])
    a.close()
    b.close()


def test_context_usable_after_errors(model):
    ctx = moelite.Context(model, n_ctx=8)
    ctx.eval([3, 4])
    with pytest.raises(moelite.MoeliteError) as ei:
        ctx.eval([5, model.n_vocab])
    assert ei.value.status_name == "MOELITE_ERR_BAD_TOKEN"
    assert ctx.kv_length == 2
    with pytest.raises(moelite.MoeliteError) as ei:
        ctx.eval(list(range(3, 3 + 7)))  # 2 + 7 > 8
    assert ei.value.status_name == "MOELITE_ERR_CONTEXT_FULL"
    assert ctx.kv_length == 2
    ctx.eval([5])
    fresh = moelite.Context(model, n_ctx=8)
    fresh.eval([3, 4, 5])
    assert np.array_equal(ctx.logits(), fresh.logits())
    ctx.close()
    fresh.close()


def test_abort_callback(model):
    calls = []

    def abort():
        calls.append(1)
        return True

    ctx = moelite.Context(model, n_ctx=16, abort=abort)
    with pytest.raises(moelite.MoeliteError) as ei:
        ctx.eval([3, 4, 5])
    assert ei.value.status_name == "MOELITE_ERR_ABORTED" and calls
    assert ctx.kv_length == 0
    ctx.close()


# ---- tokenizer -------------------------------------------------------------------------------

def test_tokenize_model_vocab(model, vocab):
    text = "Hello there, the theory\n\tof everything \u00e9\u20ac!"
    ids = model.tokenize(text)
    assert all(0 <= t < model.n_vocab for t in ids)
    assert vocab.text(ids) == text.encode("utf-8")  # the ids' stored strings spell the text
    assert model.detokenize(ids) == text and model.detokenize_bytes(ids) == text.encode("utf-8")
    assert model.tokenize(text.encode("utf-8")) == ids
    controls = [i for i, ty in enumerate(vocab.types) if ty == 3]
    assert controls
    c = controls[-1]
    name = vocab.tokens[c]
    assert model.tokenize(name, parse_special=True) == [c]
    plain = model.tokenize(name)  # without parse_special the marker is ordinary text
    assert c not in plain and vocab.text(plain) == name.encode("utf-8")
    assert model.detokenize([c] + ids) == text  # control tokens render as nothing by default...
    assert model.detokenize([c] + ids, special=True) == name + text  # ...or as their text
    with pytest.raises(moelite.MoeliteError) as ei:
        model.detokenize([model.n_vocab])
    assert ei.value.status_name == "MOELITE_ERR_BAD_TOKEN"
    assert model.detokenize([]) == "" and model.tokenize("") == []
    long_text = "the theory of everything " * 400
    long_ids = model.tokenize(long_text)
    assert model.detokenize(long_ids) == long_text


def _vocab_vectors(name, limit=None):
    inp, out = os.path.join(VOCAB_DIR, name + ".inp"), os.path.join(VOCAB_DIR, name + ".out")
    if not (os.path.exists(inp) and os.path.exists(out)):
        pytest.skip("%s.inp/.out not in tests/data/vocab" % name)
    with open(inp, encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")
    with open(out, encoding="utf-8") as f:
        ids = [[int(x) for x in line.split()] for line in f.read().split("\n")]
    if texts and texts[-1] == "":
        texts = texts[:-1]
    ids = ids[: len(texts)]
    assert len(texts) == len(ids) and len(texts) > 10
    return list(zip(texts, ids))[:limit]


@pytest.fixture(scope="module")
def gpt2_vocab():
    if not os.path.exists(GPT2_VOCAB):
        pytest.skip("tests/data/vocab/ggml-vocab-gpt-2.gguf is not in this checkout")
    m = moelite.Model(GPT2_VOCAB, vocab_only=True)
    yield m
    m.close()


def test_gpt2_vectors(gpt2_vocab):
    cases = _vocab_vectors("ggml-vocab-gpt-2.gguf")
    checked = 0
    for text, expected in cases:
        got = gpt2_vocab.tokenize(text)
        assert got == expected, "tokenize(%r)" % text
        # byte-level BPE is lossless: the ids decode back to the exact input bytes
        assert gpt2_vocab.detokenize_bytes(expected) == text.encode("utf-8")
        assert gpt2_vocab.detokenize(expected) == text
        checked += 1
    assert checked == len(cases)


def test_gpt2_bytes_and_buffer_growth(gpt2_vocab):
    assert gpt2_vocab.n_vocab == 50257
    assert gpt2_vocab.tokenize("Hello world") == [15496, 995]  # well-known GPT-2 ids
    assert gpt2_vocab.tokenize(b"Hello world") == [15496, 995]
    long_text = "Hello world, " * 500
    toks = gpt2_vocab.tokenize(long_text)
    assert gpt2_vocab.detokenize(toks) == long_text
    # bytes input is tokenized as is; invalid UTF-8 reaches byte-level BPE as U+FFFD (llama.cpp)
    raw = b"abc\xff\xfe def"
    t = gpt2_vocab.tokenize(raw)
    assert gpt2_vocab.detokenize(t) == raw.decode("utf-8", "replace")
    assert gpt2_vocab.detokenize_bytes(t) == raw.decode("utf-8", "replace").encode("utf-8")


def test_gpt2_partial_characters(gpt2_vocab):
    text = "\u20ac \u65e5\u672c\u8a9e \U0001f600"
    toks = gpt2_vocab.tokenize(text)
    per_token = [gpt2_vocab.detokenize_bytes([t]) for t in toks]
    assert b"".join(per_token) == text.encode("utf-8")  # single tokens may split characters...
    split = [b for b in per_token if not _is_utf8(b)]
    assert split, "expected some token to hold an incomplete UTF-8 sequence"
    for b in split:  # ...which detokenize_bytes keeps and detokenize replaces
        assert gpt2_vocab.detokenize_bytes([toks[per_token.index(b)]]) == b
        assert "\ufffd" in gpt2_vocab.detokenize([toks[per_token.index(b)]])
    assert gpt2_vocab.detokenize(toks) == text


def _is_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ---- generation ------------------------------------------------------------------------------


def test_generate_greedy_matches_manual_decoding(model, vocab):
    n = 12
    ptoks, ref = greedy_reference(model, PROMPT, n)
    expected = vocab.text(ref)
    ctx = moelite.Context(model, n_ctx=128)
    it = ctx.generate(PROMPT, max_tokens=n, temperature=0)
    assert ctx.last_stats is None  # lazily started: nothing ran yet
    pieces = list(it)
    assert all(isinstance(p, str) and p for p in pieces)
    st = ctx.last_stats
    ctx.reset()
    raw = list(ctx.generate(PROMPT, max_tokens=n, temperature=0, as_bytes=True))
    assert all(isinstance(p, bytes) for p in raw)
    assert b"".join(raw) == expected
    assert pieces == [p.decode("utf-8", "replace") for p in raw]
    if _is_utf8(expected):
        assert "".join(pieces) == expected.decode("utf-8")
        for p in raw:  # pieces never split a character
            assert _is_utf8(p)
    assert st["n_generated_tokens"] == len(ref)
    assert st["n_prompt_tokens"] + st["n_cached_tokens"] == len(ptoks)
    if len(ref) == n:
        assert st["stop_reason"] == moelite.StopReason.MAX_TOKENS and st["stop_reason_name"] == "max_tokens"
        # every generated token but the last was evaluated into the cache
        assert ctx.kv_length == len(ptoks) + n - 1
    else:
        assert st["stop_reason"] == moelite.StopReason.END_TOKEN
    assert st["generate_seconds"] >= 0 and st["prompt_seconds"] >= 0
    ctx.close()


def test_generate_same_seed_same_text(model, vocab):
    ctx = moelite.Context(model, n_ctx=128)
    kw = dict(max_tokens=16, temperature=1.0, top_k=50, top_p=1.0, min_p=0.0)
    a = b"".join(ctx.generate(PROMPT, seed=1234, as_bytes=True, **kw))
    st_a = dict(ctx.last_stats)
    ctx.reset()
    b = b"".join(ctx.generate(PROMPT, seed=1234, as_bytes=True, **kw))
    other = moelite.Context(model, n_ctx=128)
    c = b"".join(other.generate(PROMPT, seed=1234, as_bytes=True, **kw))
    assert a == b == c
    assert 1 <= st_a["n_generated_tokens"] <= 16
    texts = {s: b"".join(other.generate(PROMPT, seed=s, as_bytes=True, **kw)) for s in (1, 2, 3, 4)}
    assert any(texts.values())
    assert set(texts.values()) != {a}  # the seed matters (random weights: many likely tokens)
    ctx.close()
    other.close()


def test_generate_early_break_stops(model):
    ctx = moelite.Context(model, n_ctx=256)
    got = []
    for piece in ctx.generate(PROMPT, max_tokens=200, temperature=0):
        got.append(piece)
        if len(got) == 2:
            break
    st = ctx.last_stats
    assert st is not None and st["stop_reason"] == moelite.StopReason.ABORTED
    # The worker runs at most one piece ahead; tokens without text (control, unused) emit no
    # piece, so the token count can be a little larger than the pieces taken.
    assert st["n_generated_tokens"] < 100
    n_prompt = len(model.tokenize(PROMPT, add_special=True, parse_special=True))
    assert ctx.kv_length == n_prompt + st["n_generated_tokens"] - 1
    # an iterator kept alive but abandoned is stopped by the next call on the context
    it = ctx.generate(PROMPT, max_tokens=200, temperature=0)
    next(it)
    ctx.reset()
    assert ctx.kv_length == 0
    assert ctx.last_stats["stop_reason"] == moelite.StopReason.ABORTED
    assert list(it) == []
    # explicit close() on the iterator
    it = ctx.generate(PROMPT, max_tokens=200, temperature=0)
    next(it)
    it.close()
    assert ctx.last_stats["stop_reason"] == moelite.StopReason.ABORTED
    # the context works normally afterwards
    list(ctx.generate(PROMPT, max_tokens=5, temperature=0))
    assert ctx.last_stats["n_generated_tokens"] >= 1
    assert ctx.last_stats["stop_reason"] in (moelite.StopReason.MAX_TOKENS, moelite.StopReason.END_TOKEN)
    ctx.close()


def test_generate_stop_strings(model, vocab):
    _, ref = greedy_reference(model, PROMPT, 16)
    full = vocab.text(ref)
    # a stop string taken from the middle of the greedy output (bytes: the output of a random
    # model need not be valid UTF-8, and stop strings are matched on bytes)
    start = len(full) // 2
    stop = full[start:start + 3]
    if len(ref) < 6 or len(stop) < 3 or b"\0" in stop:
        pytest.skip("greedy output too short for this model")
    cut = full.index(stop)
    ctx = moelite.Context(model, n_ctx=128)
    out = b"".join(ctx.generate(PROMPT, max_tokens=16, temperature=0, stop=[stop, "never-there"],
                                as_bytes=True))
    assert out == full[:cut]
    assert stop not in out
    assert ctx.last_stats["stop_reason"] == moelite.StopReason.STRING
    out2 = b"".join(ctx.generate(PROMPT, max_tokens=16, temperature=0, stop=stop, as_bytes=True))
    assert out2 == out  # a single stop string instead of a list
    # a stop string that never occurs changes nothing
    out3 = b"".join(ctx.generate(PROMPT, max_tokens=16, temperature=0, stop="never-there",
                                 as_bytes=True))
    assert out3 == full
    ctx.close()


def test_generate_error_then_context_still_works(model):
    ctx = moelite.Context(model, n_ctx=24)
    assert len(model.tokenize(PROMPT, add_special=True, parse_special=True)) < 20
    with pytest.raises(moelite.MoeliteError) as ei:
        list(ctx.generate("x y " * 20, max_tokens=4))  # >= 40 prompt tokens > n_ctx 24
    assert ei.value.status_name == "MOELITE_ERR_CONTEXT_FULL"
    assert re.search(r"\d+ tokens", ei.value.message)
    list(ctx.generate(PROMPT, max_tokens=3, temperature=0))
    assert ctx.last_stats["n_generated_tokens"] >= 1
    ctx.eval([3])  # plain eval after generation
    assert np.all(np.isfinite(ctx.logits()))
    ctx.close()


def test_generate_invalid_parameters(model):
    ctx = moelite.Context(model, n_ctx=16)
    with pytest.raises(ValueError):
        ctx.generate(PROMPT, stop=[""])
    with pytest.raises(moelite.MoeliteError):
        list(ctx.generate(PROMPT, max_tokens=-5))
    list(ctx.generate(PROMPT, max_tokens=2, temperature=0))
    assert ctx.last_stats["n_generated_tokens"] >= 1
    ctx.close()


def test_calibrate_profile_and_adaptive_options(model, tiny, tmpdir_session):
    """calibrate through the binding, then load with the profile: budgeted decoding with a learned
    predictor and the DP allocation gives the resident logits bit for bit; gating uses fewer
    experts; a bad gating mode and a missing profile raise their statuses"""
    tokens = [(7 * i + 3) % model.n_vocab for i in range(300)]
    profile = os.path.join(tmpdir_session, "binding-profile.json")
    model.calibrate(tokens, profile, window=100)
    with open(profile) as f:
        prof = json.load(f)
    assert prof["format"] == "moelite-profile" and len(prof["layers"]) == model.n_layers
    ctx = moelite.Context(model, n_ctx=64)
    want = [ctx.eval([t]) or ctx.logits().copy() for t in tokens[:24]]
    budget = model.expert_bytes * 4  # slots are padded for direct I/O: small experts need room
    with moelite.Model(tiny[0], threads=2, expert_budget=budget, predictor="learned", profile=profile,
                       allocation="dp") as m:
        c = moelite.Context(m, n_ctx=64)
        for t, w in zip(tokens[:24], want):
            c.eval([t])
            assert np.array_equal(c.logits(), w)
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(tiny[0], gating="sometimes", threshold=0.1)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    # Without a profile the model loads (a quality target can learn the sensitivities), but a
    # context without a target is refused.
    for mode in ("sensitivity", "cache-aware"):
        with moelite.Model(tiny[0], gating=mode, threshold=0.1) as m:
            with pytest.raises(moelite.MoeliteError) as e:
                moelite.Context(m, n_ctx=64)
            assert e.value.status == moelite.Status.ERR_BAD_PROFILE and mode in str(e.value)
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(tiny[0], gating="cache-aware", threshold=0.1, gating_penalty=0.5, profile=profile)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(tiny[0], gating="cache-aware", threshold=0.1, gating_substitutes=-1, profile=profile)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    # No budget: cache-aware (with or without substitution) is sensitivity gating, bit for bit.
    got = {}
    for mode in ("sensitivity", "cache-aware"):
        with moelite.Model(tiny[0], threads=2, gating=mode, threshold=0.05, gating_penalty=8,
                           gating_substitutes=4, profile=profile) as m:
            c = moelite.Context(m, n_ctx=64)
            got[mode] = [c.eval([t]) or c.logits().copy() for t in tokens[:12]]
    assert all(np.array_equal(a, b) for a, b in zip(got["sensitivity"], got["cache-aware"]))
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(tiny[0], profile=profile + ".missing")
    assert e.value.status == moelite.Status.ERR_FILE_NOT_FOUND


def test_a_library_not_found_names_every_try_and_the_variable(tmp_path):
    """Without a loadable libmoelite the import fails listing each path tried, in order, and how to
    choose one (MOELITE_LIBRARY): a chosen file that is not there, and a copy of the package outside
    a checkout with nothing installed."""
    import shutil
    pkg_dir = os.path.normpath(os.path.join(HERE, os.pardir))
    env = dict(os.environ, MOELITE_LIBRARY="/nonexistent/libmoelite.so")
    r = subprocess.run([sys.executable, "-c", "import moelite"], cwd=pkg_dir, env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "MOELITE_LIBRARY: /nonexistent/libmoelite.so (does not exist)" in r.stderr, r.stderr
    copy = tmp_path / "pkg"
    shutil.copytree(os.path.join(pkg_dir, "moelite"), copy / "moelite",
                    ignore=shutil.ignore_patterns("libmoelite*", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("MOELITE_LIBRARY", "LD_LIBRARY_PATH")}
    r = subprocess.run([sys.executable, "-c", "import moelite"], cwd=copy, env=env, capture_output=True, text=True)
    if r.returncode == 0:
        pytest.skip("a libmoelite is installed system-wide")
    for needle in ("Set MOELITE_LIBRARY", "package directory: " + str(copy / "moelite" / "libmoelite.so"),
                   "system library path: "):
        assert needle in r.stderr, r.stderr
