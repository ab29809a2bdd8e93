"""moelite under valgrind's memcheck reports no errors: a generation with a quarter of the experts
in memory (the expert store reading from the file as it runs) and the default backend choice (the
Vulkan loader probed). The expert store reads with pread under valgrind, which memcheck follows;
through io_uring every read was reported as uninitialised memory (millions of false errors on a
real model). The CLI links mimalloc, whose malloc valgrind must be told to replace
(--soname-synonyms) and whose delete is an alias of its free (--show-mismatched-frees=no);
tools/valgrind/moelite.supp holds the one glibc report that is not moelite's."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
VALGRIND = ["valgrind", "-q", "--error-exitcode=99", "--soname-synonyms=somalloc=*mimalloc*",
            "--show-mismatched-frees=no", "--suppressions=" + os.path.join(ROOT, "tools", "valgrind", "moelite.supp")]


def memcheck(env=None):
    return subprocess.run(VALGRIND + [BIN, "run", "-m", MODEL, "--budget", "25%", "-p", "def main():", "-n", "8",
                                      "-t", "2", "--temp", "0", "--verbose"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, **(env or {})))


@pytest.mark.skipif(not shutil.which("valgrind"), reason="no valgrind (tools/install_deps.sh --test installs it)")
def test_memcheck_finds_nothing_in_a_generation_under_a_budget():
    r = memcheck()
    assert r.returncode == 0, r.stderr[-4000:]
    assert "under valgrind: expert reads use pread" in r.stderr, r.stderr[-2000:]
    assert "generated 8 tokens" in r.stderr, r.stderr[-2000:]
