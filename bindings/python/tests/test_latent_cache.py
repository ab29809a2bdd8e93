"""A multi-head latent attention model (tiny deepseek2 in DeepSeek-V3's form: q low-rank path,
sigmoid grouped routing, two leading dense blocks of three) through the binding: the model keys, the
latent cache's size against a plain K/V cache of the same heads (from the shape make_tiny_model
writes, not from the engine), truncation and re-evaluation, and a budget smaller than the experts."""
import os
import subprocess
import sys

import numpy as np
import pytest

from support import REPO

import moelite

TMP = os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-py-tests")
TOKENS = [(i * 37 + 11) % 512 for i in range(40)]
N_CTX, N_LAYER, N_HEAD = 64, 3, 4
KV_LORA, QK_NOPE, QK_ROPE, V_HEAD = 256, 64, 32, 64  # make_tiny_model's deepseek2 defaults
ARGS = ["--q-lora", "256", "--gating", "sigmoid", "--probs-bias", "--expert-groups", "4", "--groups-used", "2",
        "--weights-norm", "--dense-lead", "2", "--n-layer", str(N_LAYER)]


@pytest.fixture(scope="module")
def path():
    os.makedirs(TMP, exist_ok=True)
    p = os.path.join(TMP, "py-deepseek2-v3-Q8_0.gguf")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_tiny_model.py"), "--arch", "deepseek2",
                    "--type", "Q8_0", "--seed", "5", "--out", p, "--quiet", *ARGS], check=True)
    return p


@pytest.fixture(scope="module")
def model(path):
    m = moelite.Model(path, threads=2)
    yield m
    m.close()


def test_model_reports_its_shape(model):
    assert model.arch == "deepseek2"
    assert model.n_dense_layers == 2
    assert model.n_shared_experts == 1
    assert model.head_dim == QK_NOPE + QK_ROPE


def test_latent_cache_is_one_row_per_layer_and_position(model):
    row = KV_LORA + QK_ROPE
    assert model.kv_bytes_per_token == 4 * N_LAYER * row
    ctx = moelite.Context(model, n_ctx=N_CTX)
    assert ctx.kv_bytes == 4 * N_LAYER * row * N_CTX
    plain = 4 * N_LAYER * N_HEAD * ((QK_NOPE + QK_ROPE) + V_HEAD) * N_CTX  # keys and values per head
    assert ctx.kv_bytes < plain
    ctx.close()


def test_truncate_and_reevaluate_give_the_same_bits(model):
    straight = moelite.Context(model, n_ctx=N_CTX, n_batch=8)
    straight.eval(TOKENS, logits_all=True)
    want = [straight.logits(i) for i in range(len(TOKENS))]
    ctx = moelite.Context(model, n_ctx=N_CTX, n_batch=8)
    ctx.eval(TOKENS)
    ctx.truncate(21)
    assert ctx.kv_length == 21
    ctx.eval(TOKENS[21:], logits_all=True)
    for i in range(21, len(TOKENS)):
        np.testing.assert_array_equal(ctx.logits(i - 21), want[i])
    straight.close()
    ctx.close()


def test_a_budget_below_the_experts_gives_the_same_logits(model, path):
    ctx = moelite.Context(model, n_ctx=N_CTX)
    ctx.eval(TOKENS, logits_all=True)
    want = np.array([ctx.logits(i) for i in range(len(TOKENS))])
    ctx.close()
    small = moelite.Model(path, threads=2, expert_budget=model.expert_min_budget)
    assert small.experts_all_fit == 0
    c2 = moelite.Context(small, n_ctx=N_CTX)
    c2.eval(TOKENS, logits_all=True)
    np.testing.assert_array_equal(np.array([c2.logits(i) for i in range(len(TOKENS))]), want)
    c2.close()
    small.close()
