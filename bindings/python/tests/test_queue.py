"""moelite.Queue: requests decoded together. Each request's tokens, text and stop reason must be
what Context.generate() gives for it alone (the reference), whatever runs beside it."""
import pytest

import moelite

REQUESTS = [
    dict(prompt="def fibonacci(n):", max_tokens=12, temperature=0.0),
    dict(prompt="import os\n", max_tokens=6, temperature=0.8, seed=3),
    dict(prompt="The Python standard library", max_tokens=20, temperature=0.9, seed=5),  # + a stop (requests())
    dict(prompt="class Point:\n    def __init__(self", max_tokens=9, temperature=0.7, seed=9, repeat_penalty=1.2),
    dict(prompt="x", max_tokens=0),
]


def alone(model, spec):
    """The reference: generate() on a fresh one-sequence context, tokens and text."""
    spec = dict(spec)
    prompt = spec.pop("prompt")
    with moelite.Context(model, n_ctx=256) as ctx:
        pairs = list(ctx.generate(prompt, yield_tokens=True, **spec))
        stop = ctx.last_stats["stop_reason"]
    return [t for t, _ in pairs if t >= 0], "".join(text for _, text in pairs), stop


def requests(model):
    """REQUESTS, request 2 with a stop string its text alone contains part way (whatever the model
    says): a request that ends on a stop string beside requests that do not."""
    _, text, _ = alone(model, REQUESTS[2])
    assert len(text) > 12, text
    out = [dict(r) for r in REQUESTS]
    out[2]["stop"] = text[len(text) // 2:len(text) // 2 + 3]
    return out


@pytest.mark.parametrize("n_seq", [1, 3])
def test_each_request_is_what_it_is_alone(model, n_seq):
    reqs = requests(model)
    want = [alone(model, r) for r in reqs]
    assert any(stop == moelite.StopReason.STRING for _, _, stop in want)
    with moelite.Context(model, n_ctx=256, n_seq=n_seq, n_batch=16) as ctx, moelite.Queue(ctx) as q:
        ids = [q.add(**r) for r in reqs]
        assert ids == list(range(len(reqs)))
        assert q.waiting == len(reqs) and q.busy
        streamed = {i: [] for i in ids}
        for request, token, state in q.run():
            if token >= 0:
                streamed[request].append(token)
            assert state == q.state(request)
        assert not q.busy and q.finished == len(REQUESTS)
        for i, (tokens, text, stop) in zip(ids, want):
            assert q.tokens(i) == tokens == streamed[i]
            assert q.text(i) == text
            assert q.state(i) == stop
            stats = q.stats(i)
            assert stats["n_generated_tokens"] == len(tokens)
            assert stats["n_prompt_tokens"] + stats["n_cached_tokens"] == len(model.tokenize(
                REQUESTS[i]["prompt"], add_special=True, parse_special=True))


def test_cancel_remove_and_errors(model):
    with moelite.Context(model, n_ctx=32, n_seq=2) as ctx:
        q = moelite.Queue(ctx)
        a = q.add("def f(x):", max_tokens=20, temperature=0.0)
        b = q.add([1, 2, 3], max_tokens=4)
        c = q.add("import sys", max_tokens=4)
        q.cancel(c)  # waiting: never runs
        q.step()
        assert q.state(a) == moelite.REQUEST_RUNNING and q.running == 2
        q.cancel(a)
        assert q.state(a) == moelite.StopReason.ABORTED and q.running == 1
        list(q.run())
        assert q.state(c) == moelite.StopReason.ABORTED and q.tokens(c) == []
        assert q.stats(b)["stop_reason_name"] in ("max_tokens", "end_token")
        q.remove(b)
        with pytest.raises(moelite.MoeliteError) as e:
            q.state(b)
        assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
        with pytest.raises(moelite.MoeliteError) as e:
            q.add([1, -4])
        assert e.value.status == moelite.Status.ERR_BAD_TOKEN
        with pytest.raises(moelite.MoeliteError) as e:
            q.add([1] * 33)
        assert e.value.status == moelite.Status.ERR_CONTEXT_FULL
        with pytest.raises(ValueError):
            q.add("x", stop="")
        assert q.step() == []  # idle
    # Closing the context closed its queue first.
    assert q.closed
    with pytest.raises(ValueError):
        q.add("x")


def test_an_aborted_step_changes_nothing(model):
    calls = {"n": 0}

    def abort():
        calls["n"] += 1
        return calls["n"] <= 2

    want = alone(model, REQUESTS[0])
    with moelite.Context(model, n_ctx=256, n_seq=2) as ctx, moelite.Queue(ctx) as q:
        i = q.add(**REQUESTS[0])
        ctx.abort = abort
        for _ in range(2):
            with pytest.raises(moelite.MoeliteError) as e:
                q.step()
            assert e.value.status == moelite.Status.ERR_ABORTED
        list(q.run())
        assert (q.tokens(i), q.text(i), q.state(i)) == want
