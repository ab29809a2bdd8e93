"""A sliding-window model (tiny gpt-oss: layer 0 windowed at 8 positions, layer 1 full) through the
binding: the model keys, the cache's size, and what truncation keeps once the window's ring has
moved on. Expected values come from the model's shape and the ring rule in include/moelite.h, and
logits after a truncation are compared with those of the same positions evaluated straight through."""
import os
import subprocess
import sys

import numpy as np
import pytest

from support import REPO

import moelite

TMP = os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-py-tests")
TOKENS = [(i * 37 + 11) % 512 for i in range(40)]
WINDOW, N_CTX, N_BATCH = 8, 64, 4
KV_DIM = 2 * 64  # n_head_kv 2 x head_dim 64 (make_tiny_model's defaults)


@pytest.fixture(scope="module")
def gpt_oss():
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "py-gpt-oss-F32.gguf")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_tiny_model.py"), "--arch", "gpt-oss",
                    "--type", "F32", "--window", str(WINDOW), "--seed", "5", "--out", path, "--quiet"], check=True)
    m = moelite.Model(path, threads=2)
    yield m
    m.close()


def test_model_reports_its_window(gpt_oss):
    assert gpt_oss.arch == "gpt-oss"
    assert gpt_oss.sliding_window == WINDOW
    assert gpt_oss.n_windowed_layers == 1  # pattern 2 over 2 layers: layer 0


def test_windowed_layer_holds_window_plus_one_batch(gpt_oss):
    ctx = moelite.Context(gpt_oss, n_ctx=N_CTX, n_batch=N_BATCH)
    ring = WINDOW - 1 + N_BATCH
    assert ctx.kv_bytes == 2 * 4 * KV_DIM * (N_CTX + ring)
    ctx.close()


def test_truncation_keeps_what_the_ring_still_holds(gpt_oss):
    straight = moelite.Context(gpt_oss, n_ctx=N_CTX, n_batch=N_BATCH)
    straight.eval(TOKENS, logits_all=True)
    want = [straight.logits(i) for i in range(len(TOKENS))]
    ctx = moelite.Context(gpt_oss, n_ctx=N_CTX, n_batch=N_BATCH)
    ctx.eval(TOKENS)
    # The ring (11 slots) holds positions 29..39. Keeping 38 tokens, the next token (38) reads
    # 31..37: all there, so the cut keeps 38 and re-evaluating 38, 39 gives the same bits.
    ctx.truncate(38)
    assert ctx.kv_length == 38
    ctx.eval(TOKENS[38:], logits_all=True)
    np.testing.assert_array_equal(ctx.logits(0), want[38])
    np.testing.assert_array_equal(ctx.logits(1), want[39])
    # Keeping 35, token 35 would read 28..34, and 28's slot now holds 39: nothing can be kept.
    ctx.truncate(35)
    assert ctx.kv_length == 0
    ctx.eval(TOKENS[:36], logits_all=True)
    np.testing.assert_array_equal(ctx.logits(35), want[35])
    ctx.close()
    straight.close()
