"""The quality meter and governor through the binding (Context(quality_sample=, quality_target=),
Context.quality_stats()): the meter's KL checked against numpy on the logits of an exactly routed
context that loads the gated context's saved state before each step; the governor's target and
the errors of bad settings. Uses the shipped model (models/moelite-tiny-qwen3moe-Q8_0.gguf)."""
import math
import os
import tempfile

import pytest

from support import MODEL

import moelite  # noqa: E402

np = pytest.importorskip("numpy")
TEXT = ("The module provides functions for working with lists, dictionaries and sets. "
        "Each function returns a new object and leaves its arguments unchanged.")


def kl(p_logits, q_logits):
    p = np.asarray(p_logits, dtype=np.float64)
    q = np.asarray(q_logits, dtype=np.float64)
    lp = p - p.max() - np.log(np.exp(p - p.max()).sum())
    lq = q - q.max() - np.log(np.exp(q - q.max()).sum())
    return float((np.exp(lp) * (lp - lq)).sum())


def test_the_meter_reports_what_exact_routing_of_each_token_gives():
    with moelite.Model(MODEL, threads=2, gating="score", threshold=0.25) as gated_model, \
            moelite.Model(MODEL, threads=2) as exact_model:
        tokens = gated_model.tokenize(TEXT)[:20]
        gated = moelite.Context(gated_model, quality_sample=1.0)
        exact = moelite.Context(exact_model)
        session = os.path.join(tempfile.mkdtemp(), "s.session")
        want = []
        for i, t in enumerate(tokens):
            if i:
                gated.save(session)
                exact.load(session)
            gated.eval([t])
            exact.eval([t])
            want.append(kl(exact.logits(), gated.logits()))
        q = gated.quality_stats()
        assert q.metered_tokens == len(tokens) and q.gated_tokens == len(tokens)
        assert sum(want) > 0
        assert math.isclose(q.kl_mean, sum(want) / len(want), rel_tol=1e-6, abs_tol=1e-12)
        assert q.predicted_loss == 0  # score gating has no sensitivities
        assert exact.quality_stats().gated_tokens == 0
        gated.close()
        exact.close()


def test_the_governor_needs_sensitivity_gating_and_a_valid_target():
    with moelite.Model(MODEL, threads=2, gating="sensitivity") as m:  # no profile
        with pytest.raises(moelite.MoeliteError) as e:
            moelite.Context(m)  # sensitivity gating without a profile needs a target
        assert e.value.status == moelite.Status.ERR_BAD_PROFILE
        for bad in ("0%", "200%", "kl:-1", "one percent"):
            with pytest.raises(moelite.MoeliteError) as e:
                moelite.Context(m, quality_target=bad)
            assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT, bad
        with pytest.raises(ValueError):
            moelite.Context(m, quality_target="1\0%")
        ctx = moelite.Context(m, quality_target="1%", quality_sample=0.5, quality_bounds=(0.0, 1.0))
        for t in m.tokenize(TEXT * 3)[:120]:
            ctx.eval([t])
        q = ctx.quality_stats()
        assert math.isclose(q.target_kl, math.log(1.01), rel_tol=1e-12)
        assert q.metered_tokens > 20 and 0 < q.threshold <= 1.0
        ctx.close()
    with moelite.Model(MODEL, threads=2, gating="score", threshold=0.1) as m:
        with pytest.raises(moelite.MoeliteError) as e:
            moelite.Context(m, quality_target="1%")
        assert e.value.status == moelite.Status.ERR_INVALID_ARGUMENT
