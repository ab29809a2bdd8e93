"""Timelines (moelite_model_trace_begin / _end): a budgeted run's trace is valid Chrome trace-event
JSON (what Perfetto opens) and agrees with the store's own counters, kept independently: the read
events' bytes add up to bytes_read and there is one per on-demand load, one routing event per layer
and pass, one computation event per expert asked for, every event inside its evaluation."""
import json
import os

import pytest

from support import MODEL
import moelite

TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-py-tests"), "trace")


def test_budgeted_trace_agrees_with_the_counters():
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "run.json")
    model = moelite.Model(MODEL, threads=2, backend="cpu", budget_fraction=0.25)
    ctx = moelite.Context(model, n_ctx=64, n_batch=8)
    model.reset_expert_stats()
    if os.path.exists(path):
        os.remove(path)
    model.trace_begin(path)
    assert not os.path.exists(path)  # checked, not written: the file comes at the end
    with pytest.raises(moelite.MoeliteError) as e:  # a directory that does not exist: refused at once
        model.trace_begin(os.path.join(TMP, "no-such-dir", "t.json"))
    assert e.value.status in (moelite.Status.ERR_IO, moelite.Status.ERR_INVALID_ARGUMENT)
    with pytest.raises(moelite.MoeliteError) as e:
        model.trace_begin(path)
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    prompt = [5, 17, 250, 3, 99, 42, 7, 300, 511, 1, 64, 128]  # 12 tokens: passes of 8 and 4
    ctx.eval(prompt)
    for t in (11, 12, 13):
        ctx.eval([t])
    model.trace_end()
    stats = model.expert_stats()
    with pytest.raises(moelite.MoeliteError) as e:
        model.trace_end()
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT

    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    assert trace["otherData"]["dropped_events"] == 0
    for ev in events:
        assert ev["ph"] in ("X", "i", "M") and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] != "M":
            assert ev["ts"] >= 0 and isinstance(ev["args"], dict)
        if ev["ph"] == "X":
            assert ev["dur"] >= 0
    names = {ev["args"]["name"] for ev in events if ev["ph"] == "M"}
    assert {"evaluation", "expert loader"} <= names

    def of(name):
        return [ev for ev in events if ev["ph"] == "X" and ev["name"] == name]

    reads = of("read")
    assert sum(ev["args"]["bytes"] for ev in reads) == stats.bytes_read > 0
    assert len(reads) == stats.misses  # no predictor: every read is an on-demand load
    passes = 2 + 3  # the prompt in two passes of n_batch, then three single tokens
    routes = of("route")
    assert len(routes) == model.n_layers * passes
    k = model.n_experts_used  # exact gating: every token keeps its top-k
    assert all(ev["args"]["experts"] == ev["args"]["tokens"] * k for ev in routes)
    # Each expert computes once: alone (an "expert" event, as its load lands) or in its layer's
    # pass over the experts already in memory ("experts in memory", with their count).
    computed = of("expert")
    in_memory = of("experts in memory")
    assert len(computed) + sum(ev["args"]["experts"] for ev in in_memory) == stats.activations
    evals = of("evaluate")
    assert len(evals) == 4
    for ev in computed + in_memory + routes:
        assert any(e["tid"] == ev["tid"] and e["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= e["ts"] + e["dur"] + 1
                   for e in evals), ev
    loader_tids = {ev["tid"] for ev in reads}
    assert not loader_tids & {ev["tid"] for ev in evals}, "reads were recorded on the evaluating thread"


def test_trace_errors():
    model = moelite.Model(MODEL, threads=1, backend="cpu")
    with pytest.raises(moelite.MoeliteError) as e:
        model.trace_begin("/nonexistent/dir/trace.json")
    assert e.value.status == moelite.Status.ERR_IO
    with pytest.raises(moelite.MoeliteError) as e:
        model.trace_end()
    assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
    # A trace still running when the model goes is written then.
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "at-free.json")
    model.trace_begin(path)
    ctx = moelite.Context(model, n_ctx=16)
    ctx.eval([1, 2, 3])
    del ctx
    model.close()
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    assert any(ev["name"] == "experts" for ev in events)  # resident: one computation event per layer
