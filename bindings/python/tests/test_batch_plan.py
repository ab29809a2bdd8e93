"""The batch planner through the binding (moelite_plan_batch): the memory split between the
sequences' KV caches and the expert cache, checked against the model's own sizes (metadata, the
loaded store's pool) and the arithmetic of include/moelite.h, not against the planner's output
alone; and its refusals.

Uses the shipped model (models/moelite-tiny-qwen3moe-Q8_0.gguf)."""
import json
import math

import pytest

from support import MODEL

import moelite  # noqa: E402

MiB = 1 << 20
N_CTX = 256


def kv_per_sequence(m):
    return N_CTX * m.n_layers * 2 * m.n_head_kv * m.head_dim * 4  # f32 keys and values, every layer


def test_an_inspected_model_gets_its_budget_sized():
    with moelite.Model.inspect(MODEL) as m:
        p = m.plan_batch(n_ctx=N_CTX, n_batch=16, max_sequences=6, memory=11 * MiB, headroom=MiB, storage_gb_s=2.0)
        kv = kv_per_sequence(m)
        assert p["kv_bytes_per_sequence"] == kv
        for row in p["rows"]:
            room = 11 * MiB - m.dense_bytes - p["context_base_bytes"] - row["n_seq"] * kv - MiB
            # A pool per layer needs the minimum working set in every layer.
            minimum = m.expert_min_budget * (m.n_layers if row["allocation"] == "uniform" else 1)
            assert row["fits"] == (room >= minimum)
            if row["fits"]:
                assert row["expert_budget_bytes"] == room
                # Routed uniformly, k of E experts per token: E (1 - (1 - k/E)^n) distinct a layer.
                E, k = m.n_experts, m.n_experts_used
                assert math.isclose(row["distinct_experts_per_layer"], E * (1 - (1 - k / E) ** row["n_seq"]),
                                    rel_tol=1e-3)
        assert p["expert_budget_bytes"] == p["rows"][p["n_seq"] - 1]["expert_budget_bytes"]


def test_a_loaded_model_keeps_its_budget_and_counts_its_untouched_pool():
    """The pool of a freshly loaded model is allocated but not yet touched, so the room the
    system reports does not show it; the plan must count the whole pool all the same. The
    model's pools are its own: per layer here, so every row keeps the cache's share of hits."""
    with moelite.Model(MODEL, threads=2, expert_budget=4 * MiB, allocation="uniform") as m:
        pool = m.expert_pool_bytes
        assert 0 < pool <= 4 * MiB
        kv = kv_per_sequence(m)
        p = m.plan_batch(n_ctx=N_CTX, n_batch=16, max_sequences=8, memory=16 * MiB, headroom=MiB, storage_gb_s=2.0)
        assert p["fixed_budget"] and p["expert_budget_bytes"] == pool and p["allocation"] == "uniform"
        fit = [r["n_seq"] for r in p["rows"] if r["fits"]]
        most = (16 * MiB - m.dense_bytes - p["context_base_bytes"] - MiB - pool) // kv
        assert fit == list(range(1, min(8, most) + 1))
        share = (m.expert_slots - m.n_layers) / (m.n_layers * m.n_experts)  # one reserve slot a layer
        assert all(math.isclose(r["hit_share"], share, rel_tol=1e-3) for r in p["rows"])


def test_one_global_pool_that_a_step_outgrows_is_predicted_to_hit_nothing():
    with moelite.Model(MODEL, threads=2, expert_budget=4 * MiB, allocation="global") as m:
        p = m.plan_batch(n_ctx=N_CTX, n_batch=16, max_sequences=8, memory=64 * MiB, headroom=MiB, storage_gb_s=2.0)
        assert p["allocation"] == "global"
        for r in p["rows"]:
            step = m.n_layers * r["distinct_experts_per_layer"]  # experts a decode step of n sequences uses
            assert (r["hit_share"] == 0) == (step > m.expert_slots - 1), r
        assert any(r["hit_share"] == 0 for r in p["rows"]) and p["rows"][0]["hit_share"] > 0


def test_resident_counts_only_the_contexts():
    with moelite.Model.inspect(MODEL) as m:
        kv = kv_per_sequence(m)
        base = m.plan_batch(n_ctx=N_CTX, n_batch=16, expert_budget="resident", max_sequences=1)["context_base_bytes"]
        p = m.plan_batch(n_ctx=N_CTX, n_batch=16, expert_budget="resident", max_sequences=8,
                         memory=base + 3 * kv + MiB, headroom=MiB)
        assert p["resident"] and p["n_seq"] == 3 and p["expert_budget_bytes"] == 0
        assert [r["fits"] for r in p["rows"]] == [True] * 3 + [False] * 5


def test_refusals():
    with moelite.Model.inspect(MODEL) as m:
        for kwargs in (dict(storage_gb_s=0.0), dict(storage_gb_s=float("nan")), dict(storage_gb_s=-1.0),
                       dict(storage_gb_s=2.0, max_sequences=0), dict(storage_gb_s=2.0, max_sequences=257)):
            with pytest.raises(moelite.MoeliteError) as e:
                m.plan_batch(n_ctx=N_CTX, **kwargs)
            assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT, kwargs
        with pytest.raises(moelite.MoeliteError) as e:
            m.plan_batch(n_ctx=N_CTX, memory=3 * MiB, headroom=MiB, storage_gb_s=2.0)
        assert e.value.status == moelite.Status.ERR_BUDGET_TOO_SMALL
        assert "3145728 bytes of memory" in str(e.value)
    with moelite.Model(MODEL, vocab_only=True) as v:
        with pytest.raises(moelite.MoeliteError) as e:
            v.plan_batch(storage_gb_s=2.0)
        assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT


def test_a_routing_trace_is_replayed(tmp_path):
    """A trace whose every token routes to experts 0 and 1 in every layer: whatever the number of
    sequences, a step reads those two a layer, and once the cache holds them every read hits (the
    planner counts the second pass over the trace). A missing trace is ERR_FILE_NOT_FOUND."""
    with moelite.Model.inspect(MODEL) as m:
        trace = tmp_path / "routing.trace"
        with open(trace, "w") as f:
            f.write(json.dumps({"n_layers": m.n_layers, "n_experts": m.n_experts, "top_k": m.n_experts_used}) + "\n")
            for t in range(16):
                for layer in range(m.n_layers):
                    f.write(json.dumps({"token": t, "layer": layer, "experts": [1, 0]}) + "\n")
        p = m.plan_batch(n_ctx=N_CTX, max_sequences=4, memory=64 * MiB, headroom=MiB, storage_gb_s=2.0,
                         expert_budget=m.expert_min_budget * m.n_layers * 2, routing_trace=trace)
        assert p["routing"] == "trace"
        for row in p["rows"]:
            assert row["distinct_experts_per_layer"] == 2.0 and row["hit_share"] == 1.0, row
        with pytest.raises(moelite.MoeliteError) as e:
            m.plan_batch(storage_gb_s=2.0, routing_trace=tmp_path / "missing.trace")
        assert e.value.status == moelite.Status.ERR_FILE_NOT_FOUND and "missing.trace" in str(e.value)
        # The same routing from memory plans the same; another number of layers is refused.
        same = m.plan_batch(n_ctx=N_CTX, max_sequences=4, memory=64 * MiB, headroom=MiB, storage_gb_s=2.0,
                            expert_budget=m.expert_min_budget * m.n_layers * 2,
                            routing=[[[1, 0]] * m.n_layers] * 16)
        assert same == p
        with pytest.raises(moelite.MoeliteError) as e:
            m.plan_batch(storage_gb_s=2.0, routing=[[[1, 0]] * (m.n_layers + 1)] * 16)
        assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT and "layers" in str(e.value)
        with pytest.raises(ValueError):
            m.plan_batch(storage_gb_s=2.0, routing=[[[1, 0]] * m.n_layers], routing_trace=trace)


def che_hits(a, capacity):
    """Che's approximation of LRU, written out separately: items used each step with chances a;
    the cache holds what was used in the last T steps, T making that the capacity."""
    present = sum(1 for x in a if x > 0)
    if capacity >= present:
        return sum(a)
    held = lambda t: sum(1 - (1 - x) ** t for x in a)  # noqa: E731
    lo, hi = 0.0, 1.0
    while held(hi) < capacity:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if held(mid) < capacity else (lo, mid)
    return sum(x * (1 - (1 - x) ** hi) for x in a)


def test_a_profile_gives_the_routing_shares(tmp_path):
    """With a calibration profile the hit share is LRU's under the profile's routing (Che's
    approximation over each layer's shares), recomputed here from the profile file's counts."""
    profile = tmp_path / "tiny.profile"
    with moelite.Model(MODEL, threads=2) as m:
        toks = [(7 * i + 3) % m.n_vocab for i in range(256)]
        m.calibrate(toks, profile, window=64)
    counts = [layer["expert_counts"] for layer in json.load(open(profile))["layers"]]
    with moelite.Model.inspect(MODEL) as m:
        k, L = m.n_experts_used, m.n_layers
        p = m.plan_batch(n_ctx=N_CTX, n_batch=16, max_sequences=3, memory=9 * MiB, headroom=MiB,
                         storage_gb_s=2.0, allocation="uniform", profile=profile)
        flat = m.plan_batch(n_ctx=N_CTX, n_batch=16, max_sequences=3, memory=9 * MiB, headroom=MiB,
                            storage_gb_s=2.0, allocation="uniform")
        assert p["routing"] == "profile" and flat["routing"] == "uniform"
        for row, flat_row in zip(p["rows"], flat["rows"]):
            n = row["n_seq"]
            slots = row["expert_budget_bytes"] // p["slot_bytes"]
            hits = used = 0.0
            for c in counts:
                tokens = sum(c) / k
                a = [1 - (1 - x / tokens) ** n for x in c]
                hits += che_hits(a, (slots - L) / L)
                used += sum(a)
            # The JSON rounds shares to 4 decimals and experts to 3.
            assert abs(row["hit_share"] - hits / used) < 6e-5, (row, hits / used)
            assert abs(flat_row["hit_share"] - flat_row["cache_share"]) < 6e-5
            assert abs(row["distinct_experts_per_layer"] - used / L) < 6e-4
            assert row["hit_share"] > flat_row["hit_share"]  # skewed routing hits more than its share
        bad = tmp_path / "other.profile"
        text = open(profile).read().replace('"n_expert": %d' % m.n_experts, '"n_expert": %d' % (m.n_experts * 2))
        bad.write_text(text)
        with pytest.raises(moelite.MoeliteError) as e:
            m.plan_batch(n_ctx=N_CTX, storage_gb_s=2.0, profile=bad)
        assert e.value.status == moelite.Status.ERR_BAD_PROFILE
