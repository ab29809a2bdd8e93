"""`moelite info --platform` and `--budget auto` from the command line: the platform JSON parses
and agrees with /proc on this machine, the text form lists the same facts, `--budget auto` on the
shipped model reports its sizing and gives logits bitwise equal to a resident load, and bad
headroom values are usage errors."""
import json
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")


def cli(*args, cwd=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def test_platform_json_is_valid_and_matches_this_machine(tmp_path):
    r = cli("info", "--platform", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)  # the whole output is one JSON document
    assert p["kind"] in ("jetson", "linux-arm", "x86-desktop", "linux-other")
    assert p["memory"]["total"] == meminfo_kib("MemTotal") * 1024
    # MemAvailable moves between our read and the CLI's; the room is never above it.
    assert 0 < p["memory"]["room"] <= p["memory"]["available"] <= p["memory"]["total"]
    if p["memory"]["cgroup_limit"]:
        assert p["memory"]["room"] <= p["memory"]["cgroup_limit"]
    cpu = p["cpu"]
    assert sorted(cpu["allowed"]) == sorted(os.sched_getaffinity(0))
    assert set(cpu["big_cores"]) <= set(cpu["allowed"])
    assert cpu["heterogeneous"] == bool(cpu["big_cores"])
    assert cpu["default_threads"] >= 1
    assert p["unified_memory"] == (p["kind"] == "jetson")
    assert p["backends"]["cpu"] is True
    assert p["auto_backend"]["name"] in ("cpu", "vulkan", "cuda")
    assert p["auto_backend"]["reason"]
    if not p["backends"]["cuda"] and not p["backends"]["vulkan"]:
        assert p["auto_backend"]["name"] == "cpu"
    assert p["storage"]["path"] == "."
    assert p["storage"]["read_gb_s"] > 0
    assert os.listdir(tmp_path) == []  # the scratch file is gone


def test_platform_json_with_a_model_measures_the_model_file():
    r = cli("info", "--platform", "--json", "-m", MODEL)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["storage"]["path"] == MODEL
    assert p["storage"]["read_gb_s"] > 0


def test_platform_text_lists_the_same_facts():
    r = cli("info", "--platform")
    assert r.returncode == 0, r.stderr
    for key in ("kind", "cpu.model", "cpu.big_cores", "memory.room", "memory.cgroup_limit", "unified_memory",
                "auto_backend.name", "auto_backend.reason", "storage.read_gb_s"):
        assert re.search(r"^%s\s+\S" % re.escape(key), r.stdout, re.M), (key, r.stdout)


def test_platform_missing_model_is_an_error():
    r = cli("info", "--platform", "-m", "/nonexistent/model.gguf")
    assert r.returncode == 2 and "cannot open" in r.stderr


def test_budget_auto_reports_its_sizing():
    r = cli("info", "-m", MODEL, "--budget", "auto", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["budget_auto"] == 1
    room, headroom = info["budget_auto_available"], info["budget_auto_headroom"]
    assert headroom == max(64 << 20, room // 10)
    # The shipped model is tiny: every expert fits, so the budget is a pool with a slot for each.
    assert info["experts_all_fit"] == 1
    assert info["expert_slots"] >= info["n_layers"] * info["n_experts"]
    assert info["expert_bytes"] <= info["expert_budget"] <= room
    assert "every expert resident" in info["budget_summary"]


def test_budget_auto_logits_are_bitwise_resident(tmp_path):
    tokens = "1,17,42,300,5,99,1024,7,2047,3,64,128"
    outs = {}
    for name, extra in (("resident", []), ("auto", ["--budget", "auto"]),
                        ("auto-headroom", ["--budget", "auto", "--budget-headroom", "128MiB"])):
        out = tmp_path / (name + ".f32")
        r = cli("logits", "-m", MODEL, "--tokens", tokens, "--out", str(out), *extra)
        assert r.returncode == 0, r.stderr
        outs[name] = out.read_bytes()
    assert len(outs["resident"]) == 12 * 2048 * 4
    assert outs["auto"] == outs["resident"]
    assert outs["auto-headroom"] == outs["resident"]


def test_budget_auto_too_little_memory_is_budget_too_small():
    r = cli("info", "-m", MODEL, "--budget", "auto", "--budget-headroom", "4000000GiB")
    assert r.returncode == 1
    assert "MOELITE_ERR_BUDGET_TOO_SMALL" in r.stderr and "minimum working set" in r.stderr, r.stderr


@pytest.mark.parametrize("args, message", [
    (["--budget-headroom", "1G"], "--budget-headroom goes with --budget auto"),
    (["--budget", "auto", "--budget-headroom", "10%"], "'10%' is not a size"),
    (["--budget", "auto", "--budget-headroom", "0"], "--budget-headroom"),
    (["--budget", "autox"], "--budget"),
])
def test_bad_headroom_is_a_usage_error(args, message):
    r = cli("info", "-m", MODEL, *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
