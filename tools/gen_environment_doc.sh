#!/usr/bin/env bash
# Rewrites the generated table of docs/ENVIRONMENT.md from the options table (base/options.cpp).
# Usage: bash tools/gen_environment_doc.sh [BUILD_DIR]   (default build; needs its gen_environment_doc)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" --target gen_environment_doc >/dev/null
/usr/bin/python3 - "$build/bin/gen_environment_doc" <<'PY'
import re, subprocess, sys
table = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
path = "docs/ENVIRONMENT.md"
doc = open(path).read()
begin, end = "<!-- generated: tools/gen_environment_doc.sh -->\n", "<!-- end generated -->\n"
i, j = doc.index(begin) + len(begin), doc.index(end)
open(path, "w").write(doc[:i] + table + doc[j:])
print("docs/ENVIRONMENT.md: %d variables" % (table.count("\n") - 2))
PY
