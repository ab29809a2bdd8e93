#!/usr/bin/env bash
# `pip install ./bindings/python` into fresh venvs, offline (no package index), then use the
# installed package (not the checkout) to load a model and generate: with Debian's python3, and
# with the first other python3 on PATH (a pyenv's, with neither setuptools nor wheel) where there is
# one. The package's build backend is in the tree and needs only the standard library.
set -euo pipefail
src=$1 lib=$2 model=$3 scratch=$4
rm -rf "$scratch" && mkdir -p "$scratch"
# The modules are Python 3.9 syntax (the oldest interpreter the package supports).
for f in "$src"/moelite/*.py "$src"/build_backend/*.py; do
  /usr/bin/python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1], feature_version=(3, 9))" "$f"
done
pythons=(/usr/bin/python3)
other=$(type -a -P python3 | grep -v '^/usr/bin/python3$' | grep -v '^/bin/python3$' | head -1 || true)
[[ -n "$other" ]] && pythons+=("$other")
i=0
for py in "${pythons[@]}"; do
  venv="$scratch/venv$i"
  i=$((i + 1))
  "$py" -m venv "$venv"
  PIP_NO_INDEX=1 "$venv/bin/pip" install -q --disable-pip-version-check "$src" 2>&1 | grep -v "^$" || true
  (cd "$scratch" && MOELITE_LIBRARY="$lib" "$venv/bin/python" - "$model" <<'PY'
import sys, moelite
assert "venv" in moelite.__file__, moelite.__file__   # the installed copy, not the checkout
with moelite.Model(sys.argv[1]) as m, moelite.Context(m, n_ctx=128) as ctx:
    text = "".join(ctx.generate("Hello", max_tokens=8, seed=1))
    print("moelite", moelite.__version__, "with Python", sys.version.split()[0], "generated", len(text), "chars")
PY
  )
done
