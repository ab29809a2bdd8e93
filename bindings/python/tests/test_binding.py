"""Tests of the ctypes binding against facts that do not come from the binding itself: the C
header's enums and version, the hyperparameters the tiny-model generator was given, the
vocabulary it writes ("tok<N>" for id N >= 3), llama.cpp's tokenizer test vectors, and greedy
decoding recomputed from raw logits.

Environment: MOELITE_LIBRARY (the libmoelite to test), MOELITE_TEST_MODEL (optional: a small
model with the generator's gpt2 vocabulary; otherwise one is generated), MOELITE_TEST_TMP
(optional scratch directory).
"""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir, os.pardir))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, os.pardir)))  # the checkout's package

import moelite  # noqa: E402

np = pytest.importorskip("numpy")

HEADER = os.path.join(REPO, "include", "moelite.h")
VOCAB_DIR = os.path.join(REPO, "tests", "data", "vocab")
GPT2_VOCAB = os.path.join(VOCAB_DIR, "ggml-vocab-gpt-2.gguf")

# What tools/make_tiny_model.py is asked for below (and writes: vocab "<unk>", "<s>", "</s>",
# then "tok3".."tok511"; bos 1, eos 2).
TINY = dict(arch="qwen3moe", type="Q8_0", n_layer=2, n_embd=128, n_head=4, n_head_kv=2,
            n_expert=8, n_expert_used=2, n_ff_exp=64, vocab=512, ctx=256, seed=7)
EOS = 2


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


def _needs_generator_vocab(tiny):
    if tiny[1] is None:
        pytest.skip("needs the generated model's known vocabulary (MOELITE_TEST_MODEL is set)")


def piece_of(token):
    """Text of a token of the generated vocabulary, known independently of the library."""
    assert token >= 3, "control/unknown token %d in generated text" % token
    return "tok%d" % token


def greedy_reference(model, prompt, n):
    """Greedy decoding done by hand: eval, argmax of the raw logits, eval the choice..."""
    ctx = moelite.Context(model, n_ctx=128)
    try:
        toks = model.tokenize(prompt, add_special=True, parse_special=True)
        ctx.eval(toks)
        out = []
        for i in range(n):
            t = int(np.argmax(ctx.logits()))
            if t == EOS:
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


def test_status_enum_and_names_match_header():
    h = _header_text()
    body = h[h.index("typedef enum moelite_status"):h.index("} moelite_status;")]
    values = dict((name, int(v)) for name, v in re.findall(r"MOELITE_(\w+)\s*=\s*(\d+)", body))
    assert len(values) >= 20
    assert {s.name: int(s) for s in moelite.Status} == values
    for name, v in values.items():
        e = moelite.MoeliteError(v, "x")
        assert e.status == v and e.status_name == "MOELITE_" + name


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
    assert (model.bos, model.eos) == (1, EOS)
    assert model.is_end_token(EOS) and not model.is_end_token(5)


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


def test_chat_format_plain_fallback(model, tiny):
    _needs_generator_vocab(tiny)  # the generated model has no chat template
    assert model.chat_template_kind == "plain"
    s = model.chat_format([{"role": "system", "content": "be brief"},
                           {"role": "user", "content": "hello"}])
    assert isinstance(s, str)
    assert "system: be brief" in s and "user: hello" in s
    assert s.index("system: be brief") < s.index("user: hello")
    assert s.rstrip().endswith("assistant:")
    s2 = model.chat_format([{"role": "user", "content": "hello"}], add_assistant_prompt=False)
    assert "assistant" not in s2


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

def test_tokenize_generated_vocab(model, tiny):
    _needs_generator_vocab(tiny)
    assert model.tokenize("<s>", parse_special=True) == [1]
    assert model.detokenize([5, 17, 300]) == "tok5tok17tok300"
    assert model.detokenize_bytes([5, 17]) == b"tok5tok17"
    assert model.detokenize([1, 5]) == "tok5"  # control tokens render as nothing by default...
    assert model.detokenize([1, 5], special=True) == "<s>tok5"  # ...and as their text on request
    with pytest.raises(moelite.MoeliteError) as ei:
        model.detokenize([model.n_vocab])
    assert ei.value.status_name == "MOELITE_ERR_BAD_TOKEN"
    assert model.detokenize([]) == ""


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

PROMPT = "<s>"


def test_generate_greedy_matches_manual_decoding(model, tiny):
    _needs_generator_vocab(tiny)
    n = 12
    ptoks, ref = greedy_reference(model, PROMPT, n)
    expected = "".join(piece_of(t) for t in ref)
    ctx = moelite.Context(model, n_ctx=128)
    it = ctx.generate(PROMPT, max_tokens=n, temperature=0)
    assert ctx.last_stats is None  # lazily started: nothing ran yet
    pieces = list(it)
    assert pieces and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == expected
    st = ctx.last_stats
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


def test_generate_same_seed_same_text(model, tiny):
    _needs_generator_vocab(tiny)
    ctx = moelite.Context(model, n_ctx=128)
    kw = dict(max_tokens=16, temperature=1.0, top_k=50, top_p=1.0, min_p=0.0)
    a = "".join(ctx.generate(PROMPT, seed=1234, **kw))
    st_a = dict(ctx.last_stats)
    ctx.reset()
    b = "".join(ctx.generate(PROMPT, seed=1234, **kw))
    other = moelite.Context(model, n_ctx=128)
    c = "".join(other.generate(PROMPT, seed=1234, **kw))
    assert a == b == c
    assert re.fullmatch(r"(tok\d+)*", a)  # only vocabulary text, nothing from control tokens
    assert st_a["n_generated_tokens"] == len(re.findall(r"tok\d+", a))
    texts = {s: "".join(other.generate(PROMPT, seed=s, **kw)) for s in (1, 2, 3, 4)}
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
    assert st is not None and st["stop_reason"] == moelite.StopReason.CALLBACK
    assert st["n_generated_tokens"] <= 4  # the worker runs at most one piece ahead
    assert ctx.kv_length < 10
    # an iterator kept alive but abandoned is stopped by the next call on the context
    it = ctx.generate(PROMPT, max_tokens=200, temperature=0)
    next(it)
    ctx.reset()
    assert ctx.kv_length == 0
    assert ctx.last_stats["stop_reason"] == moelite.StopReason.CALLBACK
    assert list(it) == []
    # explicit close() on the iterator
    it = ctx.generate(PROMPT, max_tokens=200, temperature=0)
    next(it)
    it.close()
    assert ctx.last_stats["n_generated_tokens"] <= 3
    # the context works normally afterwards
    assert len(list(ctx.generate(PROMPT, max_tokens=5, temperature=0))) >= 1
    assert ctx.last_stats["stop_reason"] in (moelite.StopReason.MAX_TOKENS, moelite.StopReason.END_TOKEN)
    ctx.close()


def test_generate_stop_strings(model, tiny):
    _needs_generator_vocab(tiny)
    _, ref = greedy_reference(model, PROMPT, 10)
    if len(ref) < 6:
        pytest.skip("greedy output ended too early for this model")
    full = "".join(piece_of(t) for t in ref)
    stop = piece_of(ref[4])
    cut = full.index(stop)
    ctx = moelite.Context(model, n_ctx=128)
    out = "".join(ctx.generate(PROMPT, max_tokens=10, temperature=0, stop=[stop, "never-there"]))
    assert out == full[:cut]
    assert stop not in out
    assert ctx.last_stats["stop_reason"] == moelite.StopReason.STRING
    out2 = "".join(ctx.generate(PROMPT, max_tokens=10, temperature=0, stop=stop))  # a single str
    assert out2 == out
    ctx.close()


def test_generate_error_then_context_still_works(model):
    ctx = moelite.Context(model, n_ctx=8)
    with pytest.raises(moelite.MoeliteError) as ei:
        list(ctx.generate("<s>" * 20, max_tokens=4))  # 20 prompt tokens > n_ctx 8
    assert ei.value.status_name == "MOELITE_ERR_CONTEXT_FULL"
    assert re.search(r"\d+ tokens", ei.value.message)
    pieces = list(ctx.generate(PROMPT, max_tokens=3, temperature=0))
    assert pieces and ctx.last_stats["n_generated_tokens"] >= 1
    ctx.eval([3])  # plain eval after generation
    assert np.all(np.isfinite(ctx.logits()))
    ctx.close()


def test_generate_invalid_parameters(model):
    ctx = moelite.Context(model, n_ctx=16)
    with pytest.raises(ValueError):
        ctx.generate(PROMPT, stop=[""])
    with pytest.raises(moelite.MoeliteError):
        list(ctx.generate(PROMPT, max_tokens=-5))
    assert len(list(ctx.generate(PROMPT, max_tokens=2, temperature=0))) >= 1
    ctx.close()
