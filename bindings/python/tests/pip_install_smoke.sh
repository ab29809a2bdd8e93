#!/usr/bin/env bash
# `pip install ./bindings/python` into a fresh venv of Debian's python3, then use the installed
# package (not the checkout) to load a model and generate.
set -euo pipefail
src=$1 lib=$2 model=$3 scratch=$4
rm -rf "$scratch" && mkdir -p "$scratch"
/usr/bin/python3 -m venv --system-site-packages "$scratch/venv"
# --no-build-isolation: use the system setuptools instead of downloading one (no network in CI).
"$scratch/venv/bin/pip" install -q --no-build-isolation --no-deps "$src" 2>&1 | grep -v "^$" || true
cd "$scratch"
MOELITE_LIBRARY="$lib" "$scratch/venv/bin/python" - "$model" <<'PY'
import sys, moelite
assert "venv" in moelite.__file__, moelite.__file__   # the installed copy, not the checkout
with moelite.Model(sys.argv[1]) as m, moelite.Context(m, n_ctx=128) as ctx:
    text = "".join(ctx.generate("Hello", max_tokens=8, seed=1))
    print("moelite", moelite.__version__, "generated", len(text), "chars")
PY
