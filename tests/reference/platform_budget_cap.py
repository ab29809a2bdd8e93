"""`--budget auto` inside a cgroup v1 memory cap: the cap fits the model's dense weights plus the
expert store's minimum working set with room to spare, but not the model's experts (the file is
larger than the cap). moelite must size the budget from the cgroup's room -- not from the host's
MemAvailable, which would make it keep every expert and be OOM-killed -- generate text, and peak
below the cap.

Run by ctest (platform_budget_cap); exits 77 (ctest SKIP_RETURN_CODE) with the reason where cgroup
v1 memory control is not writable (not root, cgroup v2 only)."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
CGROUP_ROOT = "/sys/fs/cgroup/memory"
SKIP = 77
MiB = 1 << 20

sys.path.insert(0, HERE)
# The same synthetic model as the memory-cap tests: 4 layers x 32 experts of Q8_0 (about 440 MB),
# a dense part of a few MiB.
from test_memory_cap import make_model  # noqa: E402


def skip(reason):
    print("SKIP: " + reason)
    sys.exit(SKIP)


def model_facts(model):
    r = subprocess.run([BIN, "info", "-m", model, "--json"], capture_output=True, text=True, check=True)
    info = json.loads(r.stdout)
    # The store's minimum working set, as the library states it for a budget of one byte.
    r = subprocess.run([BIN, "info", "-m", model, "--budget", "1"], capture_output=True, text=True)
    m = re.search(r"minimum working set of (\d+) bytes", r.stderr)
    assert r.returncode == 1 and m, r.stderr
    return info["dense_bytes"], info["expert_bytes"], int(m.group(1))


def run_capped(cgroup, cap, args):
    for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
        path = os.path.join(cgroup, name)
        if name == "memory.limit_in_bytes" or os.path.exists(path):
            with open(path, "w") as f:
                f.write(str(cap))

    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    with open(os.path.join(cgroup, "memory.max_usage_in_bytes"), "w") as f:
        f.write("0")  # the cgroup's high-water mark, per run
    # Binary: a random synthetic model generates arbitrary bytes.
    with tempfile.TemporaryFile("w+b") as out_f, tempfile.TemporaryFile("w+b") as err_f:
        p = subprocess.Popen([BIN, *args], stdout=out_f, stderr=err_f, preexec_fn=enter)
        # wait4 on this child: its own peak RSS (ru_maxrss, KiB), not that of earlier children.
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read().decode(errors="replace"), err_f.read().decode(errors="replace")
    peak_cgroup = int(open(os.path.join(cgroup, "memory.max_usage_in_bytes")).read())
    return p.returncode, out, err, usage.ru_maxrss * 1024, peak_cgroup


def main():
    if not os.path.isdir(CGROUP_ROOT) or not os.path.exists(os.path.join(CGROUP_ROOT, "memory.limit_in_bytes")):
        skip("no cgroup v1 memory controller at %s" % CGROUP_ROOT)
    if not os.access(CGROUP_ROOT, os.W_OK):
        skip("cgroup v1 memory controller at %s is not writable (needs root)" % CGROUP_ROOT)
    model = make_model()
    dense, experts, minimum = model_facts(model)
    size = os.path.getsize(model)
    # Dense + minimum working set + 128 MiB for the binary, libc, KV cache, scratch, and the
    # default headroom (64 MiB here): a cap that the experts alone overflow.
    cap = dense + minimum + 128 * MiB
    print("model %d MiB (experts %d MiB, dense %d MiB), minimum working set %.1f MiB, cap %d MiB"
          % (size // MiB, experts // MiB, dense // MiB, minimum / MiB, cap // MiB))
    assert cap < experts, "the cap must not hold every expert, or the test proves nothing"

    cgroup = os.path.join(CGROUP_ROOT, "moelite-budget-auto-" + uuid.uuid4().hex[:8])
    try:
        os.mkdir(cgroup)
    except OSError as e:
        skip("cannot create a cgroup under %s: %s" % (CGROUP_ROOT, e))
    try:
        rc, out, err, peak_rss, peak_cg = run_capped(
            cgroup, cap, ["bench", "-m", model, "--budget", "auto", "-p", "16", "-n", "8", "-r", "1", "--json",
                          "--no-membw", "--verbose"])
        assert rc != -signal.SIGKILL, "OOM-killed under a %d MiB cap: %s" % (cap // MiB, err[-2000:])
        assert rc == 0, err[-2000:]
        bench = json.loads(out.strip().splitlines()[-1])
        m = re.search(r"expert budget auto: (\d+) bytes \((streaming|every expert fits)\) from (\d+) available", err)
        assert m, err[-2000:]
        budget, mode, room = int(m.group(1)), m.group(2), int(m.group(3))
        print("budget auto: %.1f MiB (%s) from %.1f MiB available; peak RSS %.1f MiB, cgroup peak %.1f MiB, "
              "cap %d MiB" % (budget / MiB, mode, room / MiB, peak_rss / MiB, peak_cg / MiB, cap // MiB))
        assert room <= cap, "the room must come from the cgroup, not the host's MemAvailable"
        assert mode == "streaming" and minimum <= budget < experts
        assert bench["expert_budget_bytes"] == budget and bench["budget_auto"] == 1
        assert bench["decode_tok_s"] > 0
        assert 0 < peak_rss < cap, "peak RSS %d over the cap %d" % (peak_rss, cap)
        assert peak_cg <= cap

        # The same cap with generation through `run`: the process survives and writes text.
        rc, out, err, peak_rss, peak_cg = run_capped(
            cgroup, cap, ["run", "-m", model, "--budget", "auto", "-p", "Hello", "-n", "16", "--temp", "0"])
        assert rc != -signal.SIGKILL, "run OOM-killed under the cap: %s" % err[-2000:]
        assert rc == 0, err[-2000:]
        print("run under the cap: exit 0, %d bytes of text, peak RSS %.1f MiB, cgroup peak %.1f MiB"
              % (len(out), peak_rss / MiB, peak_cg / MiB))
        assert out.strip(), "no text generated"
        assert 0 < peak_rss < cap and peak_cg <= cap
    finally:
        for _ in range(50):
            try:
                os.rmdir(cgroup)
                break
            except OSError:
                subprocess.run(["sleep", "0.1"])
    print("PASS")


if __name__ == "__main__":
    main()
