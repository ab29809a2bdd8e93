"""tools/perf_table.py against stand-in peers: a llama-bench that prints its JSON (the ratios are
moelite's numbers over the peer's) and one that aborts as llama.cpp c392e5094 does on Q4_0 MoE
files (reported in the table and the JSON, not fatal). moelite itself runs on the shipped model."""
import json
import os
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "perf_table")

GOOD_PEER = """#!/bin/sh
cat <<'JSON'
[{"build_commit": "peer1", "n_prompt": 8, "n_gen": 0, "avg_ts": 50.0},
 {"build_commit": "peer1", "n_prompt": 0, "n_gen": 4, "avg_ts": 10.0}]
JSON
"""
FAILING_PEER = """#!/bin/sh
echo "llama_model_load: loading" >&2
echo "ggml-cpu-aarch64.cpp:4012: GGML_ASSERT(params->wsize >= x) failed" >&2
echo "ptrace: Operation not permitted." >&2
kill -ABRT $$
"""


def peer(name, text):
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def run_table(peer_path):
    out_json = os.path.join(TMP, os.path.basename(peer_path) + ".json")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf_table.py"), "-m", MODEL, "--moelite", BIN,
                        "--llama-bench", peer_path, "-p", "8", "-n", "4", "--budgets", "", "--rounds", "1",
                        "--json", out_json], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout, json.load(open(out_json))


def test_ratios_are_moelite_over_the_peer():
    text, report = run_table(peer("good-peer", GOOD_PEER))
    assert report["llama_cpp"] == {"build_commit": "peer1", "prefill_tok_s": 50.0, "decode_tok_s": 10.0}
    m = report["moelite"]
    assert m["prefill_tok_s"] > 0 and m["decode_tok_s"] > 0
    assert abs(report["prefill_ratio"] - m["prefill_tok_s"] / 50.0) < 1e-12
    assert abs(report["decode_ratio"] - m["decode_tok_s"] / 10.0) < 1e-12
    assert "| llama.cpp (peer1) | 50.0 | 10.00 | 1.00 | 1.00 |" in text


def test_a_failing_peer_is_reported_not_fatal():
    text, report = run_table(peer("failing-peer", FAILING_PEER))
    assert report["llama_cpp"]["error"].startswith("ggml-cpu-aarch64.cpp:4012: GGML_ASSERT")
    assert report["decode_ratio"] is None and report["prefill_ratio"] is None
    assert report["moelite"]["decode_tok_s"] > 0
    assert "| llama.cpp: failed (ggml-cpu-aarch64.cpp:4012: GGML_ASSERT" in text


def test_budgeted_rows_for_each_budget_and_sequence_count_go_into_the_doc():
    """--budget-only with budgets x sequences x predictors: one row each, rendered between the
    markers of --into (what is outside them kept byte for byte); a file without them is refused."""
    os.makedirs(TMP, exist_ok=True)
    doc = os.path.join(TMP, "doc.md")
    before, after = "# Title\n\nText before.\n", "\nText after.\n"
    open(doc, "w").write(before + "<!-- budgeted-decode:begin -->\nold table\n<!-- budgeted-decode:end -->" + after)
    out_json = os.path.join(TMP, "budgeted.json")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf_table.py"), "-m", MODEL, "--moelite", BIN,
                        "--budget-only", "--budgets", "25%,50%", "--n-seq", "1,2", "-p", "4", "-n", "2",
                        "--json", out_json, "--into", doc], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.load(open(out_json))["budgeted"]
    assert [(b["budget"], b["n_seq"], b["policy"], b["predictor"]) for b in rows] == [
        ("25%", 1, "cyclic", "none"), ("25%", 2, "cyclic", "none"), ("50%", 1, "cyclic", "none"),
        ("50%", 2, "cyclic", "none")]
    for b in rows:
        s = b["step_ms"]
        assert b["decode_tok_s_min"] <= b["decode_tok_s"] <= b["decode_tok_s_max"]
        # Each of the three is rounded to 0.001 ms: their sums may differ by 0.0015 ms (a step of
        # the shipped model under a budget takes well under a millisecond).
        assert s["compute"] + s["load_wait"] == __import__("pytest").approx(s["step"], rel=1e-3, abs=2e-3)
    text = open(doc).read()
    assert text.startswith(before + "<!-- budgeted-decode:begin -->\n") and text.endswith(
        "<!-- budgeted-decode:end -->" + after)
    assert "old table" not in text and text.count("| the machine's disk (measured) | ") == 4
    assert "| the machine's disk (measured) | 50% | 2 | cyclic | none | " in text
    # The same rows rendered again from the saved report (no runs): the same table.
    again = os.path.join(TMP, "again.md")
    open(again, "w").write(before + "<!-- budgeted-decode:begin -->\n<!-- budgeted-decode:end -->" + after)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf_table.py"), "--render", out_json,
                        "--into", again], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert open(again).read() == text
    open(doc, "w").write("no markers\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf_table.py"), "-m", MODEL, "--moelite", BIN,
                        "--budget-only", "--budgets", "25%", "-p", "4", "-n", "2", "--into", doc],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "budgeted-decode:begin" in r.stderr
    assert open(doc).read() == "no markers\n"
