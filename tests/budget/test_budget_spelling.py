"""One spelling of an expert budget means one pool everywhere: "25%", "100%" and "1.5MiB" give the
same budget and slots from `moelite info`, from `moelite-server` (its stats endpoint) and from the
Python binding (the text and, for shares, the fraction), and a share's slots are the count worked
out here from the model's shape: the share of the routed experts, rounded up, plus the store's
reserve slot (include/moelite.h, moelite_model_params_set_expert_budget_fraction). The C API, Node
and Rust assert the same count in their own suites (tests/test_c_api.c, bindings/*/test*)."""
import http.client
import json
import math
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
SERVER = os.environ.get("MOELITE_SERVER_BIN", os.path.join(ROOT, "build", "bin", "moelite-server"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
import moelite  # noqa: E402


def cli_info(budget):
    r = subprocess.run([CLI, "info", "-m", MODEL, "--budget", budget, "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    return info["expert_budget"], info["expert_slots"]


def server_stats(budget):
    proc = subprocess.Popen([SERVER, "-m", MODEL, "--port", "0", "-t", "1", "--budget", budget],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://"), (line, proc.stderr.read() if proc.poll() is not None else "")
        host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        c.request("GET", "/v1/moelite/stats")
        stats = json.loads(c.getresponse().read())
        c.close()
        return stats["expert_budget_bytes"], stats["expert_slots"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def python_binding(budget):
    with moelite.Model(MODEL, threads=1, expert_budget=budget) as m:
        return m.expert_budget, m.expert_slots


@pytest.fixture(scope="module")
def shape():
    m = moelite.Model.inspect(MODEL)
    routed = (m.n_layers - m.n_dense_layers) * m.n_experts
    slot = m.expert_min_budget // (m.n_experts_used + 1)
    m.close()
    return routed, slot


@pytest.mark.parametrize("budget, share", [("25%", 0.25), ("100%", 1.0), ("1.5MiB", None)])
def test_one_spelling_one_pool(budget, share, shape):
    routed, slot = shape
    seen = {"cli": cli_info(budget), "server": server_stats(budget), "python": python_binding(budget)}
    if share is not None:
        with moelite.Model(MODEL, threads=1, budget_fraction=share) as m:
            seen["python fraction"] = (m.expert_budget, m.expert_slots)
        slots = 1 + math.ceil(share * routed)
        expected = (slots * slot, slots)
    else:
        expected = (3 << 19, (3 << 19) // slot)
    for where, got in seen.items():
        assert got == expected, (where, got, expected)


def test_a_share_of_everything_keeps_every_expert(shape):
    routed, _ = shape
    with moelite.Model(MODEL, threads=1, expert_budget="100%") as m:
        assert m.experts_all_fit == 1 and m.expert_slots == routed + 1


def test_n_active_params_is_the_models_whatever_the_budget():
    with moelite.Model(MODEL, threads=1) as resident, moelite.Model(MODEL, threads=1, expert_budget="25%") as budgeted:
        assert budgeted.n_active_params == resident.n_active_params < resident.n_params
