#!/usr/bin/env bash
# The Node.js binding's tests (bindings/node, node's test runner) against the library of a build
# tree (default build/) and the shipped model. koffi comes from the npm registry at the version
# package-lock.json pins (a prebuilt package: no compiler, no header download).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
export MOELITE_LIBRARY="$PWD/$build/lib/libmoelite.so"
cd bindings/node
[[ -d node_modules/koffi ]] || npm ci --no-audit --no-fund --loglevel=error
node --test test/
