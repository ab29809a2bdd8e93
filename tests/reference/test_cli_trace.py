"""`--trace-events FILE`: a budgeted `moelite run` writes a Chrome trace-event file (what Perfetto
and chrome://tracing open: a JSON object with a traceEvents array of events with ph, ts, pid, tid,
and dur for complete events) holding the routing, the expert computation and the expert reads; a
path that cannot be written is refused before the run; tools/plot_report.py draws its timeline."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "cli-trace")
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")


def test_budgeted_run_writes_a_chrome_trace():
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "run.json")
    r = subprocess.run([BIN, "run", "-m", MODEL, "-t", "2", "--budget", "25%", "-p", "def fibonacci(n):", "-n", "12",
                        "--seed", "3", "--trace-events", path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    trace = json.load(open(path))
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for ev in events:
        assert ev["ph"] in ("X", "i", "M") and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert isinstance(ev["name"], str)
        if ev["ph"] == "X":
            assert ev["ts"] >= 0 and ev["dur"] >= 0
    by_name = {}
    for ev in events:
        by_name.setdefault(ev["name"], []).append(ev)
    for name in ("evaluate", "layer", "route", "expert", "read"):
        assert by_name.get(name), "no %r events" % name
    # Every evaluation holds each layer once, in order, and each layer's routing lies within it.
    n_layers = int(json.loads(subprocess.run([BIN, "info", "-m", MODEL, "--json"], capture_output=True, text=True,
                                             timeout=60).stdout)["n_layers"])
    for ev in by_name["evaluate"]:
        inside = [l for l in by_name["layer"] if ev["ts"] <= l["ts"] and l["ts"] + l["dur"] <= ev["ts"] + ev["dur"]]
        assert [l["args"]["layer"] for l in sorted(inside, key=lambda l: l["ts"])] == list(range(n_layers))
    for route in by_name["route"]:
        assert any(l["args"]["layer"] == route["args"]["layer"] and l["ts"] <= route["ts"] <= l["ts"] + l["dur"]
                   for l in by_name["layer"]), route
    assert all(ev["args"]["bytes"] > 0 for ev in by_name["read"])
    # The same run without the trace prints the same text: tracing changes nothing computed.
    plain = subprocess.run([BIN, "run", "-m", MODEL, "-t", "2", "--budget", "25%", "-p", "def fibonacci(n):", "-n",
                            "12", "--seed", "3"], capture_output=True, text=True, timeout=300)
    assert plain.stdout == r.stdout

    bad = subprocess.run([BIN, "run", "-m", MODEL, "-p", "x", "-n", "1", "--trace-events", "/nonexistent/dir/t.json"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "MOELITE_ERR_IO" in bad.stderr

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("no matplotlib (Debian: python3-matplotlib) for tools/plot_report.py")
    png = os.path.join(TMP, "timeline.png")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_report.py"), "timeline", path, "-o", png],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 5000
    # The first evaluation (the prompt) can be picked; one the trace does not have is an error, not
    # silently the last one.
    plot = [sys.executable, os.path.join(ROOT, "tools", "plot_report.py"), "timeline", path, "-o", png]
    n_evals = sum(1 for ev in json.load(open(path))["traceEvents"] if ev.get("cat") == "context")
    assert subprocess.run(plot + ["--eval", "0"], capture_output=True, timeout=120).returncode == 0
    p = subprocess.run(plot + ["--eval", str(n_evals)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "the trace has %d evaluations" % n_evals in p.stderr, p.stderr


def test_step_breakdown_of_a_hand_built_timeline():
    """tools/step_breakdown.py against numbers worked out by hand: a step of 100 us with two
    overlapping reads ([10, 30) and [20, 50): 40 us reading, 60 idle, 50 us x read on average 0.5
    in flight), a wait of [40, 60) and one outside the step; a prompt of 4 tokens beside it."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from step_breakdown import breakdown
    events = [
        {"name": "evaluate", "cat": "context", "ph": "X", "ts": 0, "dur": 1000, "args": {"tokens": 4}},
        {"name": "evaluate", "cat": "context", "ph": "X", "ts": 2000, "dur": 100, "args": {"tokens": 1}},
        {"name": "evaluate", "cat": "context", "ph": "X", "ts": 3000, "dur": 100, "args": {"tokens": 1}},
        {"name": "read", "cat": "io", "ph": "X", "ts": 2010, "dur": 20, "args": {"bytes": 1000}},
        {"name": "read", "cat": "io", "ph": "X", "ts": 2020, "dur": 30, "args": {"bytes": 3000}},
        {"name": "wait for a load", "cat": "wait", "ph": "X", "ts": 2040, "dur": 20},
        {"name": "wait for a load", "cat": "wait", "ph": "X", "ts": 2500, "dur": 20},
    ]
    rows, mean, tokens = breakdown(events, None)
    assert tokens == 1 and len(rows) == 3
    step = rows[1]
    assert step["ms"] == pytest.approx(0.1)
    assert step["reading_ms"] == pytest.approx(0.040) and step["idle_ms"] == pytest.approx(0.060)
    assert step["wait_ms"] == pytest.approx(0.020) and step["compute_ms"] == pytest.approx(0.080)
    assert step["mean_in_flight"] == pytest.approx(0.5)
    assert step["mb_read"] == pytest.approx(0.004) and step["gb_s_while_reading"] == pytest.approx(0.1)
    assert rows[2]["reading_ms"] == 0 and rows[2]["idle_ms"] == pytest.approx(0.1)
    assert mean["reading_ms"] == pytest.approx(0.020)  # the two one-token steps, not the prompt
