"""The binding's coverage of the C API (include/moelite.h), checked against expectations that do
not come from the binding: the header's enums and contracts, the model file read with the repo's
own Python GGUF reader (tools/gguf), /proc and os facts, and identities between counters (hits +
misses == activations, the routing callback's experts == the store's activations...).

Uses the shipped model (models/moelite-tiny-qwen3moe-Q8_0.gguf, or MOELITE_EXIT_TEST_MODEL).
"""
import json
import os
import re
import threading
import warnings

import pytest

from support import HEADER, MODEL

import moelite  # noqa: E402

np = pytest.importorskip("numpy")
TOKENS = [(37 * i + 11) % 1500 + 100 for i in range(24)]


def header_enum(typedef):
    with open(HEADER, encoding="utf-8") as f:
        h = f.read()
    start = h.index("typedef enum %s {" % typedef)
    body = h[start:h.index("} %s;" % typedef, start)]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return {name: int(v) for name, v in re.findall(r"MOELITE_(\w+)\s*=\s*(\d+)", body)}


def header_anon_enum(prefix):
    with open(HEADER, encoding="utf-8") as f:
        h = f.read()
    return {name: int(v) for name, v in re.findall(r"MOELITE_%s_(\w+)\s*=\s*(\d+)" % prefix, h)}


@pytest.fixture(scope="module")
def resident_logits(model):
    with moelite.Context(model, n_ctx=64) as c:
        out = []
        for t in TOKENS[:8]:
            c.eval([t])
            out.append(c.logits())
        return out


def decode_checks_bitwise(m, want):
    with moelite.Context(m, n_ctx=64) as c:
        for t, w in zip(TOKENS[:8], want):
            c.eval([t])
            assert c.logits().tobytes() == w.tobytes()


# ---- enums and keys against the header ---------------------------------------------------------

def test_model_keys_cover_the_header():
    keys = header_enum("moelite_model_key")
    assert max(keys.values()) >= 28 and len(keys) == max(keys.values()) + 1
    expected = {("backend_id" if k == "MODEL_BACKEND" else k[len("MODEL_"):].lower()): v for k, v in keys.items()}
    assert moelite._KEYS == expected
    for name in expected:
        assert isinstance(getattr(moelite.Model, name), property)


def test_platform_fields_and_flags_match_header():
    fields = header_enum("moelite_platform_field")
    assert {f.name: int(f) for f in moelite.PlatformField} == {k[len("PLATFORM_"):]: v for k, v in fields.items()}
    tok = header_anon_enum("TOKENIZE")
    assert {f.name: int(f) for f in moelite.TokenizeFlag if f.name != "NONE"} == tok
    detok = header_anon_enum("DETOKENIZE")
    assert {f.name: int(f) for f in moelite.DetokenizeFlag if f.name != "NONE"} == detok


# ---- model queries against the file -------------------------------------------------------------

def test_model_get_matches_gguf(model, gguf):
    md, arch = gguf.metadata, gguf.metadata["general.architecture"]
    assert model.arch == arch and model.name == md["general.name"]
    assert model.n_layers == md[arch + ".block_count"]
    assert model.n_experts == md[arch + ".expert_count"]
    assert model.n_experts_used == md[arch + ".expert_used_count"]
    assert model.n_embd == md[arch + ".embedding_length"]
    assert model.n_head == md[arch + ".attention.head_count"]
    assert model.n_head_kv == md[arch + ".attention.head_count_kv"]
    assert model.head_dim == md[arch + ".attention.key_length"]
    assert model.n_ff_expert == md[arch + ".expert_feed_forward_length"]
    assert model.n_ctx_train == md[arch + ".context_length"]
    assert model.n_vocab == len(md["tokenizer.ggml.tokens"])
    assert model.bos == md["tokenizer.ggml.bos_token_id"] and model.eos == md["tokenizer.ggml.eos_token_id"]
    expert = {n: t for n, t in gguf.tensors.items() if re.search(r"ffn_(gate|up|down)_exps", n)}
    dense = {n: t for n, t in gguf.tensors.items() if n not in expert}
    assert model.expert_bytes == sum(t["nbytes"] for t in expert.values())
    assert model.dense_bytes == sum(t["nbytes"] for t in dense.values())
    assert model.n_params == sum(int(np.prod(t["ne"])) for t in gguf.tensors.values())
    per_expert = sum(int(np.prod(t["ne"])) for t in expert.values()) // model.n_experts
    assert model.n_active_params < model.n_params
    assert model.n_params - model.n_active_params == per_expert * (model.n_experts - model.n_experts_used)
    # keys 19..28 without a budget: every expert resident in the file mapping
    assert (model.expert_budget, model.expert_pool_bytes, model.budget_auto) == (0, 0, 0)
    assert (model.budget_auto_room, model.budget_auto_context_bytes, model.budget_auto_headroom) == (0, 0, 0)
    assert model.experts_all_fit == 1 and model.expert_min_budget > 0
    assert model.threads == 2 and model.backend == "cpu" and model.backend_id == 1
    assert model.chat_template_kind == "chatml"


def test_budget_keys_and_min_budget(model, resident_logits):
    k, n_exp, n_layer = model.n_experts_used, model.n_experts, model.n_layers
    lo = model.expert_min_budget
    with moelite.Model(MODEL, threads=2, expert_budget=lo) as m:  # the smallest budget that loads
        assert m.expert_budget == lo and m.expert_min_budget == lo
        assert 0 < m.expert_pool_bytes <= lo
        assert m.expert_slots == k + 1 and m.experts_all_fit == 0 and m.budget_auto == 0
        decode_checks_bitwise(m, resident_logits)
        assert 0 < m.expert_peak_bytes <= m.expert_pool_bytes
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(MODEL, threads=2, expert_budget=lo - 1)
    assert e.value.status == moelite.Status.ERR_BUDGET_TOO_SMALL
    # per-layer pools: the minimum (top-k + 1 slots) holds in every layer
    per_layer_min = n_layer * lo
    with moelite.Model(MODEL, threads=2, expert_budget=per_layer_min, allocation="uniform") as m:
        assert m.expert_min_budget == per_layer_min
        assert m.expert_slots == n_layer * (k + 1)
        decode_checks_bitwise(m, resident_logits)
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(MODEL, threads=2, expert_budget=per_layer_min - 1, allocation="uniform")
    assert e.value.status == moelite.Status.ERR_BUDGET_TOO_SMALL
    with moelite.Model(MODEL, threads=2, expert_budget=1 << 40) as m:  # more than every expert
        assert m.experts_all_fit == 1 and m.expert_slots >= n_layer * n_exp


@pytest.mark.parametrize("opts", [
    dict(policy="lfu"), dict(policy="decay"), dict(policy="static"), dict(policy="belady", predictor="next-gate"),
    dict(predictor="next-gate", predictor_depth=2), dict(predictor="correlation"), dict(allocation="uniform"),
    dict(use_mmap=False),
])
def test_store_options_do_not_change_results(model, resident_logits, opts):
    # a budget that streams experts and holds every layer's minimum (for per-layer allocations)
    budget = None if opts.get("use_mmap") is False else model.expert_min_budget * model.n_layers
    with moelite.Model(MODEL, threads=2, expert_budget=budget, **opts) as m:
        assert m.experts_all_fit == (1 if budget is None else 0)
        decode_checks_bitwise(m, resident_logits)


def test_store_option_errors():
    for kw in (dict(policy="fifo"), dict(predictor="psychic"), dict(allocation="random")):
        with pytest.raises(moelite.MoeliteError):  # unknown names fail at load
            moelite.Model(MODEL, expert_budget=1 << 30, **kw)
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(MODEL, predictor_depth=0)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(MODEL, gating="score", threshold=-1.0)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT


def test_vocab_only_and_progress(model):
    seen = []
    with moelite.Model(MODEL, vocab_only=True, progress=lambda p: seen.append(p)) as v:
        assert v.n_vocab == model.n_vocab and v.expert_min_budget == 0
        assert v.tokenize("hello world") == model.tokenize("hello world")
    seen.clear()
    with moelite.Model(MODEL, threads=1, progress=lambda p: seen.append(p)):
        pass
    assert seen and all(0.0 <= p <= 1.0 for p in seen) and seen == sorted(seen)
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.Model(MODEL, threads=1, progress=lambda p: False)
    assert e.value.status == moelite.Status.ERR_PROGRESS_ABORTED

    class Stop(Exception):
        pass

    def raising(p):
        raise Stop()
    with pytest.raises(Stop):  # the callback's own exception, not ERR_PROGRESS_ABORTED
        moelite.Model(MODEL, threads=1, progress=raising)


# ---- expert statistics ----------------------------------------------------------------------------

FIELDS = ["activations", "hits", "misses", "prefetches_issued", "prefetches_used", "prefetches_wasted",
          "bytes_read", "wait_seconds", "predicted", "predictions", "ready_when_needed", "routed_tokens",
          "routed_experts", "read_busy_seconds", "reads"]


def test_expert_stats_fields_match_header():
    with open(HEADER, encoding="utf-8") as f:
        h = f.read()
    body = h[h.index("typedef struct moelite_expert_stats {"):h.index("} moelite_expert_stats;")]
    names = re.findall(r"^\s*(?:size_t|uint64_t|double)\s+(\w+);", body, flags=re.M)
    assert names == ["struct_size"] + FIELDS
    assert [f[0] for f in moelite._lib.ExpertStats._fields_] == names
    assert [f.name for f in __import__("dataclasses").fields(moelite.ExpertStats)] == FIELDS


def test_expert_stats_identities_with_budget(model):
    routed = []

    def routing(layer, pos0, experts, weights):
        routed.append((layer, pos0, experts.copy(), weights.copy()))

    k, n_layer = model.n_experts_used, model.n_layers
    with moelite.Model(MODEL, threads=2, expert_budget=model.expert_min_budget * 2, predictor="next-gate") as m:
        m.reset_expert_stats()
        zero = m.expert_stats()
        assert all(v == 0 for v in zero.as_dict().values())
        with moelite.Context(m, n_ctx=64, routing=routing) as c:
            c.eval(TOKENS[:5])          # one batch of 5 tokens
            for t in TOKENS[5:12]:      # then 7 single tokens
                c.eval([t])
        s = m.expert_stats()
        per = m.expert_stats_per_layer()
        assert len(per) == n_layer
        # identities of the header's contract
        assert s.hits + s.misses == s.activations > 0
        assert s.routed_tokens == 12 * n_layer
        assert s.routed_experts == s.routed_tokens * k  # exact gating
        assert s.misses > 0 and s.bytes_read > 0 and s.read_busy_seconds > 0
        assert s.predicted <= s.activations and s.ready_when_needed <= s.activations
        assert s.wait_seconds >= 0
        for f in FIELDS:
            total = sum(getattr(p, f) for p in per)
            if f == "read_busy_seconds":
                assert total == 0  # store-wide only
            elif f == "wait_seconds":
                assert total == pytest.approx(s.wait_seconds, rel=1e-9, abs=1e-12)
            else:
                assert total == getattr(s, f), f
        # activations are one per distinct expert and batch: count them from the routing callback
        assert sum(len(set(e.ravel().tolist())) for _, _, e, _ in routed) == s.activations
        for layer in range(n_layer):
            mine = [e for l_, _, e, _ in routed if l_ == layer]
            assert per[layer].activations == sum(len(set(e.ravel().tolist())) for e in mine)
        with pytest.raises(moelite.MoeliteError) as e:
            m.expert_stats(n_layer)
        assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
        with pytest.raises(moelite.MoeliteError):
            m.expert_stats(-2)
        m.reset_expert_stats()
        assert all(v == 0 for v in m.expert_stats().as_dict().values())
        assert all(v == 0 for p in m.expert_stats_per_layer() for v in p.as_dict().values())


def test_expert_stats_without_budget_count_routing_only(model):
    model.reset_expert_stats()
    with moelite.Context(model, n_ctx=64) as c:
        c.eval(TOKENS[:3])
    s = model.expert_stats()
    assert (s.activations, s.hits, s.misses, s.bytes_read) == (0, 0, 0, 0)
    assert s.routed_tokens == 3 * model.n_layers and s.routed_experts == s.routed_tokens * model.n_experts_used


# ---- routing callback ------------------------------------------------------------------------------

def test_routing_callback_contract(model):
    calls = []

    def routing(layer, pos0, experts, weights):
        calls.append((threading.get_ident(), layer, pos0, experts, weights))

    k = model.n_experts_used
    with moelite.Context(model, n_ctx=64, routing=routing) as c:
        c.eval(TOKENS[:3])
        c.eval(TOKENS[3:8])
        assert [(l, p) for _, l, p, _, _ in calls] == [(l, 0) for l in range(model.n_layers)] + \
            [(l, 3) for l in range(model.n_layers)]
        for ident, layer, pos0, e, w in calls:
            assert ident == threading.get_ident()  # eval: the calling thread
            n = 3 if pos0 == 0 else 5
            assert e.shape == (n, k) and w.shape == (n, k) and e.dtype == np.int32 and w.dtype == np.float32
            assert ((0 <= e) & (e < model.n_experts)).all()
            assert all(len(set(row.tolist())) == k for row in e)  # distinct experts per token
            assert (w > 0).all() and (np.diff(w, axis=1) <= 0).all()  # top-k order
        calls.clear()
        list(c.generate("Hello", max_tokens=3, temperature=0))
        assert calls and all(ident != threading.get_ident() for ident, *_ in calls)  # helper thread


def test_score_gating_drops_slots(model):
    calls = []
    with moelite.Model(MODEL, threads=2, gating="score", threshold=0.45) as m:
        with moelite.Context(m, n_ctx=64, routing=lambda l, p, e, w: calls.append((e, w))) as c:
            m.reset_expert_stats()
            c.eval(TOKENS[:8])
        s = m.expert_stats()
    kept = sum(int((e >= 0).sum()) for e, _ in calls)
    dropped = [(e, w) for e, w in calls if (e < 0).any()]
    assert dropped, "threshold 0.45 with top-2 should drop some second experts"
    for e, w in calls:
        assert ((e >= 0).sum(axis=1) >= 1).all()  # at least one expert kept
        assert (w[e < 0] == 0).all()
    assert s.routed_experts == kept < s.routed_tokens * model.n_experts_used


# ---- tokens and text ---------------------------------------------------------------------------------

def test_tokenize_and_detokenize_flags(model, gguf):
    tokens = gguf.metadata["tokenizer.ggml.tokens"]
    im_start = tokens.index("<|im_start|>")
    text = "<|im_start|>user"
    assert model.tokenize(text, flags=moelite.TokenizeFlag.PARSE_SPECIAL)[0] == im_start
    assert model.tokenize(text, flags=moelite.TokenizeFlag.PARSE_SPECIAL) == model.tokenize(text, parse_special=True)
    assert im_start not in model.tokenize(text)
    both = moelite.TokenizeFlag.ADD_SPECIAL | moelite.TokenizeFlag.PARSE_SPECIAL
    assert model.tokenize(text, flags=both) == model.tokenize(text, add_special=True, parse_special=True)
    with pytest.raises(ValueError):
        model.tokenize(text, flags=4)
    ids = model.tokenize(text, parse_special=True)
    assert model.detokenize(ids) == "user"  # control tokens render as nothing by default
    assert model.detokenize(ids, flags=moelite.DetokenizeFlag.RENDER_SPECIAL) == text == model.detokenize(ids, special=True)
    assert model.detokenize_bytes(ids, flags=moelite.DetokenizeFlag.RENDER_SPECIAL) == text.encode()
    with pytest.raises(ValueError):
        model.detokenize(ids, flags=2)


def test_token_is_end_and_deprecated_alias(model, gguf):
    types = list(gguf.metadata["tokenizer.ggml.token_type"])
    normal = types.index(1)
    assert model.token_is_end(model.eos) is True
    assert model.token_is_end(normal) is False
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert model.is_end_token(model.eos) is True
    assert [x.category for x in w] == [DeprecationWarning]


# ---- platform ------------------------------------------------------------------------------------------

def test_platform_get_against_the_os():
    F = moelite.PlatformField
    with open("/proc/meminfo") as f:
        mem_total = int(re.search(r"MemTotal:\s+(\d+) kB", f.read()).group(1)) * 1024
    assert moelite.platform_get(F.MEM_TOTAL_BYTES) == mem_total
    assert 0 < moelite.platform_get(F.MEM_AVAILABLE_BYTES) <= mem_total
    assert moelite.platform_get(F.CPUS_ALLOWED) == len(os.sched_getaffinity(0))
    assert moelite.platform_get(F.CPUS_ONLINE) >= moelite.platform_get(F.CPUS_ALLOWED)
    assert moelite.platform_get(999) == -1
    info = json.loads(moelite.platform_describe_json())
    assert info["memory"]["total"] == mem_total
    assert info["backends"]["cuda"] == bool(moelite.platform_get(F.HAS_CUDA))
    assert info["backends"]["vulkan"] == bool(moelite.platform_get(F.HAS_VULKAN))
    assert len(info["cpu"]["allowed"]) == moelite.platform_get(F.CPUS_ALLOWED)
    assert info["cpu"]["default_threads"] == moelite.platform_get(F.DEFAULT_THREADS)
    assert moelite.platform_get(F.AUTO_BACKEND) in (1, 2, 3)
    with moelite.Model(MODEL, vocab_only=True):
        pass
    with moelite.Model(MODEL) as m:
        assert m.threads == moelite.platform_get(F.DEFAULT_THREADS)


# ---- calibration parameters ------------------------------------------------------------------------

def test_calibrate_params_and_progress(model, tmp_path):
    toks = [(7 * i + 3) % model.n_vocab for i in range(64)]
    out = str(tmp_path / "p.json")
    for kw in (dict(window=1), dict(stride=0), dict(holdout=1.5), dict(holdout=0.0)):
        with pytest.raises(moelite.MoeliteError) as e:
            model.calibrate(toks, out, **kw)
        assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT, kw
    with pytest.raises(moelite.MoeliteError) as e:
        model.calibrate(toks, out, window=32, progress=lambda p: False)
    assert e.value.status == moelite.Status.ERR_PROGRESS_ABORTED and not os.path.exists(out)
    seen = []
    model.calibrate(toks, out, window=32, stride=2, holdout=0.5, sensitivity_tokens=0, progress=seen.append)
    assert seen and all(0.0 <= p <= 1.0 for p in seen) and seen == sorted(seen)
    with open(out) as f:
        prof = json.load(f)
    assert len(prof["layers"]) == model.n_layers


# ---- the packed expert file ------------------------------------------------------------------------

def test_pack_experts_makes_a_budget_read_the_packed_file_with_the_same_tokens(tmp_path):
    import shutil
    model = str(tmp_path / "m.gguf")
    shutil.copyfile(MODEL, model)
    seen = []
    written = moelite.pack_experts(model, progress=lambda p: seen.append(p) is None)
    assert written == model + ".experts" and os.path.getsize(written) > 0
    with open(written, "rb") as f:
        assert f.read(8) == b"MOEXPACK"
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)
    texts = {}
    for budget in (None, "25%"):
        with moelite.Model(model, threads=1, expert_budget=budget) as m:
            assert m.expert_file == (written if budget else model)
            ctx = moelite.Context(m, n_ctx=64)
            texts[budget] = "".join(ctx.generate("def f(x):", max_tokens=12, temperature=0))
            if budget:
                s = ctx.expert_stats()
                assert s.misses > 0 and s.reads == s.misses + s.prefetches_issued  # one read per expert
            ctx.close()
    assert texts[None] == texts["25%"]


def test_pack_experts_errors_and_cancel_leave_no_file(tmp_path):
    import shutil
    model = str(tmp_path / "m.gguf")
    shutil.copyfile(MODEL, model)
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.pack_experts(model, out=model)
    assert e.value.status_name == "MOELITE_ERR_INVALID_ARGUMENT"
    with pytest.raises(moelite.MoeliteError) as e:
        moelite.pack_experts(model, progress=lambda p: False)
    assert e.value.status_name == "MOELITE_ERR_PROGRESS_ABORTED"

    class Stop(Exception):
        pass

    def raising(p):
        raise Stop()
    with pytest.raises(Stop):
        moelite.pack_experts(model, progress=raising)
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]
