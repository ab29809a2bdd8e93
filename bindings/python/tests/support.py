"""What the binding's test modules share: the repository's paths, the model they load, and the
repo's own Python GGUF reader (tools/gguf) as an independent view of the model file."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_DIR = os.path.normpath(os.path.join(HERE, os.pardir))
REPO = os.path.normpath(os.path.join(PKG_DIR, os.pardir, os.pardir))
if PKG_DIR not in sys.path:
    sys.path.insert(0, PKG_DIR)
_GGUF_TOOLS = os.path.join(REPO, "tools", "gguf")
if _GGUF_TOOLS not in sys.path:
    sys.path.insert(0, _GGUF_TOOLS)

from moelite_gguf.reader import GGUFReader  # noqa: E402,F401

MODEL = os.environ.get("MOELITE_EXIT_TEST_MODEL") or os.path.join(REPO, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
HEADER = os.path.join(REPO, "include", "moelite.h")


def tiny_model(name, *args):
    """A model made by tools/make_tiny_model.py with `args`, cached under MOELITE_TEST_TMP by name."""
    import subprocess
    tmp = os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-py-tests")
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "py-%s.gguf" % name)
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_tiny_model.py"), *args, "--out", path,
                        "--quiet"], check=True)
    return path


# The backends the device tests run on: "cuda" is the emulated device, in builds that carry the
# SIMT emulator (-DMOELITE_CUDA_EMULATOR=ON, as tools/test.sh configures); "cuda-gpu" a real GPU (a
# load there answers ERR_BACKEND_UNAVAILABLE without one, and the test skips).
import moelite  # noqa: E402

DEVICE_BACKENDS = ["cpu", "vulkan"] + (["cuda"] if moelite.platform_info()["backends"].get("cuda_emulator") else []) \
    + ["cuda-gpu"]


def backend_for(backend, monkeypatch):
    """Sets MOELITE_CUDA_EMULATOR for one of DEVICE_BACKENDS and returns the name to load with."""
    if backend == "cuda":
        monkeypatch.setenv("MOELITE_CUDA_EMULATOR", "1")
    elif backend == "cuda-gpu":
        monkeypatch.delenv("MOELITE_CUDA_EMULATOR", raising=False)
        return "cuda"
    return backend
