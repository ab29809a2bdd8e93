"""Every file moelite writes (timelines, saved sessions, calibration profiles) follows one rule
(platforms/platform.h, write_file_atomic): a regular file is replaced atomically and keeps its
permission bits; a symbolic link is followed and its target replaced; a special file (a device, a
FIFO) is written into, never replaced; a FIFO without a reader is an error at once, not a hang; a
directory is an error; temporaries left by a writer that died are removed. Before, a device or
FIFO at the path was replaced by a regular file (as root, `--trace-events /dev/full` destroyed
/dev/full), a symlinked session lost its link, and a 0600 session came back 0644.
Environment: MOELITE_BIN, MOELITE_TEST_TMP."""
import json
import os
import shutil
import stat
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "outputs")


@pytest.fixture()
def tmp():
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    return TMP


def traced_run(path, timeout=120):
    return subprocess.run([BIN, "run", "-m", MODEL, "-t", "2", "-p", "def main():", "-n", "4", "--temp", "0",
                           "--trace-events", path], capture_output=True, text=True, timeout=timeout)


def device(tmp, name, minor):
    """A character device node like /dev/null (1, 3) or /dev/full (1, 7), or None where this user
    may not make one."""
    path = os.path.join(tmp, name)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        return None
    return path


def test_a_character_device_is_written_into_not_replaced(tmp):
    null, full = device(tmp, "null", 3), device(tmp, "full", 7)
    if not null:
        pytest.skip("making device nodes needs root")
    r = traced_run(null)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat(null).st_mode), "the device was replaced"
    r = traced_run(full)
    assert r.returncode != 0 and "MOELITE_ERR_IO" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert stat.S_ISCHR(os.stat(full).st_mode), "the device was replaced"
    assert set(os.listdir(tmp)) == {"null", "full"}, "a temporary was left"


def test_a_fifo_is_written_into_and_one_without_a_reader_fails_at_once(tmp):
    fifo = os.path.join(tmp, "trace.fifo")
    os.mkfifo(fifo)
    r = traced_run(fifo, timeout=60)  # before: a regular file replaced it; a hang is the other failure
    assert r.returncode != 0 and "a FIFO with no reader" in r.stderr, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    # A reader as `cat` is (it stops at the first end of file) gets the whole trace: checking the
    # path at the start opens no FIFO (before, an empty trace written there ended its stream, and
    # the run's trace found no reader at the end).
    reader = subprocess.Popen(["cat", fifo], stdout=subprocess.PIPE)
    r = traced_run(fifo, timeout=60)
    out, _ = reader.communicate(timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(out)["traceEvents"], out[:200]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlink_is_followed_and_stays_a_link(tmp):
    os.makedirs(os.path.join(tmp, "data"))
    target = os.path.join(tmp, "data", "trace.json")
    with open(target, "w") as f:
        f.write("old")
    link = os.path.join(tmp, "link.json")
    os.symlink("data/trace.json", link)  # relative: resolved from the link's directory
    r = traced_run(link)
    assert r.returncode == 0, r.stderr
    assert os.path.islink(link) and os.readlink(link) == "data/trace.json"
    assert json.load(open(target))["traceEvents"]
    dangling = os.path.join(tmp, "dangling.json")
    os.symlink(os.path.join(tmp, "data", "new.json"), dangling)
    assert traced_run(dangling).returncode == 0
    assert os.path.islink(dangling) and json.load(open(os.path.join(tmp, "data", "new.json")))["traceEvents"]


def test_a_directory_is_an_error(tmp):
    r = traced_run(tmp)
    assert r.returncode != 0 and "it is a directory" in r.stderr, r.stderr


def test_a_session_keeps_its_mode_and_stale_temporaries_go(tmp):
    session = os.path.join(tmp, "chat.session")
    run = [BIN, "run", "-m", MODEL, "-t", "2", "-p", "def main():", "-n", "2", "--temp", "0", "--session", session]
    assert subprocess.run(run, capture_output=True, timeout=120).returncode == 0
    os.chmod(session, 0o600)
    # A temporary of a writer that died (no such process) and one of a live process (this one).
    dead = 4194303
    while True:
        try:
            os.kill(dead, 0)
            dead -= 1
        except ProcessLookupError:
            break
        except PermissionError:
            dead -= 1
    stale = "%s.tmp-%d-0" % (session, dead)
    live = "%s.tmp-%d-0" % (session, os.getpid())
    for p in (stale, live):
        open(p, "w").close()
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(session).st_mode) == 0o600, oct(os.stat(session).st_mode)
    assert not os.path.exists(stale), "a dead writer's temporary stayed"
    assert os.path.exists(live), "a live writer's temporary was removed"
    assert sorted(os.listdir(tmp)) == sorted(["chat.session", os.path.basename(live)])


def test_logits_follow_the_rule_and_reach_a_pipe_through_dev_stdout(tmp):
    """`moelite logits --out`: a regular file is replaced whole (an existing one stays as it was
    until then), a pipe reached through /dev/stdout (a link to /proc/self/fd/1, whose target
    readlink spells "pipe:[N]") is written into, a missing directory is an error naming it."""
    args = [BIN, "logits", "-m", MODEL, "-t", "2", "--tokens", "1,2,3"]
    out = os.path.join(tmp, "logits.f32")
    open(out, "wb").write(b"old")
    os.chmod(out, 0o600)
    r = subprocess.run(args + ["--out", out], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    whole = open(out, "rb").read()
    assert len(whole) == 3 * 2048 * 4 and stat.S_IMODE(os.stat(out).st_mode) == 0o600
    r = subprocess.run(args + ["--out", "/dev/stdout"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == whole
    r = subprocess.run(args + ["--out", os.path.join(tmp, "missing", "x.f32")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "missing" in r.stderr and "No such file" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp)) == ["logits.f32"], "a temporary was left"


def batch_run(requests, out, *extra, env=None):
    return subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", requests, "-o", out, "-c", "128", "-n", "4",
                           "--temp", "0", "--n-seq", "2", *extra], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def test_batch_results_replace_a_file_only_when_whole_and_stream_into_a_pipe(tmp):
    """`moelite batch -o`: before, the output was opened with fopen("w") before the model loaded,
    so a run that failed (a missing model, a full disk) left the user's old results empty. Now a
    regular file is replaced once every result is in it, an output that cannot be written fails
    before the model loads, and a pipe (through /dev/stdout) still gets each result as it comes."""
    requests = os.path.join(tmp, "requests.jsonl")
    with open(requests, "w") as f:
        for i in range(3):
            f.write(json.dumps({"id": i, "prompt": "def f%d():" % i}) + "\n")
    out = os.path.join(tmp, "results.jsonl")
    open(out, "w").write("old results\n")
    os.chmod(out, 0o640)
    # A run that cannot start (no such model): the old results stay.
    r = subprocess.run([BIN, "batch", "-m", os.path.join(tmp, "missing.gguf"), "-f", requests, "-o", out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert open(out).read() == "old results\n", "a failed run destroyed the old results"
    # The disk fills at the second result: the run fails naming it, the old results stay, no temporary.
    r = batch_run(requests, out, env={"MOELITE_FAULT_INJECT": "write:2"})
    assert r.returncode == 1 and "No space left on device" in r.stderr, r.stderr
    assert open(out).read() == "old results\n", "a failed write destroyed the old results"
    assert sorted(os.listdir(tmp)) == ["requests.jsonl", "results.jsonl"], "a temporary was left"
    # A whole run replaces the file, keeping its mode.
    r = batch_run(requests, out)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in open(out)]
    assert [row["id"] for row in rows] == [0, 1, 2] and all(row["generated_tokens"] == 4 for row in rows), rows
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    # Into a pipe through /dev/stdout: the same lines.
    r = batch_run(requests, "/dev/stdout")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == rows
    # A directory as the output fails at once, before the model loads.
    r = batch_run(requests, tmp)
    assert r.returncode == 1 and "it is a directory" in r.stderr and "tokens generated" not in r.stderr, r.stderr
    assert sorted(os.listdir(tmp)) == ["requests.jsonl", "results.jsonl"]


def test_trace_record_checks_its_output_first_and_follows_the_rule(tmp):
    """`moelite trace record -o`: a directory (or a missing one) as the output fails before the
    recording, not after it; a regular file is replaced whole; /dev/stdout into a pipe is written
    into (before: fopen("w") at the end, truncating an old trace before a write that could fail)."""
    text = os.path.join(tmp, "text.txt")
    open(text, "w").write("def main():\n    return 0\n")
    args = [BIN, "trace", "record", "-m", MODEL, "-t", "2", "-f", text, "--ctx", "64", "-o"]
    r = subprocess.run(args + [os.path.join(tmp, "missing", "trace.jsonl")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "No such file" in r.stderr and "wrote" not in r.stderr, r.stderr
    trace = os.path.join(tmp, "trace.jsonl")
    open(trace, "w").write("old\n")
    r = subprocess.run(args + [trace], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = open(trace).read().splitlines()
    assert json.loads(lines[0]) == {"n_layers": 4, "n_experts": 16, "top_k": 2}
    assert len(lines) > 1 and all(len(json.loads(x)["experts"]) == 2 for x in lines[1:])
    r = subprocess.run(args + ["/dev/stdout"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == lines
    assert sorted(os.listdir(tmp)) == ["text.txt", "trace.jsonl"]
