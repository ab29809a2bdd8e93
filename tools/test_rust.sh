#!/usr/bin/env bash
# The Rust bindings' tests (bindings/rust: the -sys declarations against include/moelite.h, the
# safe crate against the shipped model), linked against the library of a build tree (default
# build/). Offline: the crates use nothing from outside. Cargo is rustup's when present, else
# Debian's (tools/install_deps.sh --test installs it where none is found).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
cargo="$(command -v cargo || true)"
[[ -n "$cargo" ]] || [[ ! -x "$HOME/.cargo/bin/cargo" ]] || cargo="$HOME/.cargo/bin/cargo"
if [[ -z "$cargo" ]]; then
  echo "test_rust.sh: no cargo found (install Debian's: apt-get install cargo)" >&2
  exit 1
fi
export PATH="$(dirname "$cargo"):$PATH"
export MOELITE_LIB_DIR="$PWD/$build/lib" CARGO_TARGET_DIR="$PWD/$build/rust-target"
cd bindings/rust
"$cargo" test --offline --quiet
