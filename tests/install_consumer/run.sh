#!/usr/bin/env bash
# Installs the build tree into a scratch prefix and builds + runs a consumer against it.
set -euo pipefail
build=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
export PKG_CONFIG_PATH="$scratch/prefix/lib/pkgconfig"
cmake -S "$src" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
export LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}"
"$scratch/consumer/consumer_cmake"
"$scratch/consumer/consumer_pkgconfig"
