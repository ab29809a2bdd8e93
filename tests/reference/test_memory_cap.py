"""Runs under a cgroup (v1) memory cap, as a host app with a hard limit would: `moelite bench
--budget` must finish within a cap that fits the model's dense weights, the expert budget and the
bench's own bandwidth-probe buffer one after the other. Its 1 GiB DRAM probe used to be allocated
while the model was still loaded, so the process was OOM-killed under such a cap. Skips where
cgroup v1 memory control is not writable (not root, cgroup v2 only)."""
import os
import signal
import subprocess
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
CGROUP_ROOT = "/sys/fs/cgroup/memory"


@pytest.fixture
def memory_cgroup():
    if not os.access(CGROUP_ROOT, os.W_OK):
        pytest.skip("cgroup v1 memory controller not writable here")
    path = os.path.join(CGROUP_ROOT, "moelite-test-" + uuid.uuid4().hex[:8])
    os.mkdir(path)
    try:
        yield path
    finally:
        for _ in range(50):
            try:
                os.rmdir(path)
                break
            except OSError:
                subprocess.run(["sleep", "0.1"])


def run_capped(cgroup, limit_bytes, args):
    with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit_bytes))
    swap = os.path.join(cgroup, "memory.memsw.limit_in_bytes")
    if os.path.exists(swap):
        with open(swap, "w") as f:
            f.write(str(limit_bytes))

    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    r = subprocess.run([BIN, *args], capture_output=True, text=True, preexec_fn=enter, timeout=600)
    peak = int(open(os.path.join(cgroup, "memory.max_usage_in_bytes")).read())
    return r, peak


def make_model(wtype="Q8_0"):
    # 440 MB of Q8_0 experts (Q4_K: 226 MB), small dense part: the budget dominates the model's memory.
    tmp = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "memory-cap")
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "qwen3moe-4x32x1024-%s.gguf" % wtype)
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_tiny_model.py"), "--arch", "qwen3moe",
                        "--type", wtype, "--n-embd", "1024", "--n-layer", "4", "--n-expert", "32",
                        "--n-expert-used", "4", "--n-ff-exp", "1024", "--n-head", "8", "--n-head-kv", "4",
                        "--seed", "3", "--out", path + ".part", "--quiet"], check=True)
        os.rename(path + ".part", path)
    return path


def test_bench_with_budget_fits_a_cap_that_fits_the_budget(memory_cgroup):
    # 300 MiB of expert slots plus ~30 MiB of the rest while the model runs; 1 GiB for the DRAM
    # probe after. A 1244 MiB cap fits either phase, not both at once.
    model = make_model()
    cap = 1244 << 20
    r, peak = run_capped(memory_cgroup, cap,
                         ["bench", "-m", model, "--budget", "300MiB", "-p", "16", "-n", "8", "--json"])
    assert r.returncode != -signal.SIGKILL, "OOM-killed under the cap: peak %d MiB" % (peak >> 20)
    assert r.returncode == 0, r.stderr
    print("peak %d MiB under a %d MiB cap" % (peak >> 20, cap >> 20))
    assert peak <= cap
    assert '"dram_read_gb_s": 0.00' not in r.stdout  # the probe ran
    import json
    d = json.loads(r.stdout)
    # The storage probed with the store's reads (moelite_model_measure_expert_reads), and where a
    # decode step went: its parts add up to the step the bench timed, and the reads' bound is what
    # the bytes read take at the storage speed.
    probe, step = d["storage_probe"], d["step_ms"]
    # Two loaders, each with as many reads of this size (over 1 MiB) as fit in 2 MiB in flight: one.
    assert probe["read_gb_s"] > 0 and probe["reads_in_flight"] == 2 and probe["read_bytes"] >= 1024 * 1024 * 17 // 16
    assert step["step"] == pytest.approx(d["decode_ms_per_token"], rel=1e-3)
    assert step["compute"] + step["load_wait"] == pytest.approx(step["step"], rel=1e-3)
    assert 0 < step["read_busy"] <= step["step"] and step["read_idle"] == pytest.approx(step["step"] - step["read_busy"], abs=2e-3)
    assert step["read_bound"] == pytest.approx(1e3 * d["bytes_read_per_token"] / (d["storage_read_gb_s"] * 1e9), rel=0.01)


def test_a_budget_given_as_a_share_never_loads_the_whole_model():
    """`--budget 25%` is a share of the expert bytes, which the CLI reads from the file first. It
    used to read them with a resident load, and on x86 a resident Q4_K load copies every expert into
    the grouped layout when memory allows: the whole model in the process (340 MB of peak RSS here,
    2.3 GB for a 432 MiB budget of the 1.9 GB bench model) before the budgeted load began. No cap
    here: a capped machine's loader skips the copies (too little free memory), which hid it. 226 MB
    of Q4_K experts; the budgeted run needs their quarter (57 MB), the dense weights (~10 MB) and
    the process (~60 MB)."""
    import json
    model = make_model("Q4_K")
    r = subprocess.run([BIN, "bench", "-m", model, "--budget", "25%", "-p", "4", "-n", "2", "--no-warmup",
                        "--no-membw", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    peak = json.loads(r.stdout)["peak_rss_bytes"]
    print("peak RSS %d MiB" % (peak >> 20))
    assert peak < 200 << 20
