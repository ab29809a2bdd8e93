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
root=$PWD
export MOELITE_LIB_DIR="$root/$build/lib" CARGO_TARGET_DIR="$root/$build/rust-target"
cd bindings/rust
"$cargo" test --offline --quiet

# The Rust example (bindings/rust/moelite/examples/generate.rs) against an installed package,
# found by pkg-config as an application finds it: built and run without MOELITE_LIB_DIR or
# LD_LIBRARY_PATH (the rpath the crates set).
prefix="$root/$build/rust-install"
rm -rf "$prefix"
cmake --install "$root/$build" --prefix "$prefix" >/dev/null
pc_dir=$(dirname "$(find "$prefix" -name moelite.pc)")
env -u MOELITE_LIB_DIR -u LD_LIBRARY_PATH PKG_CONFIG_PATH="$pc_dir" CARGO_TARGET_DIR="$root/$build/rust-install-target" \
  "$cargo" build --offline --quiet --example generate -p moelite
out=$(env -u LD_LIBRARY_PATH "$root/$build/rust-install-target/debug/examples/generate" \
  "$root/models/moelite-tiny-qwen3moe-Q8_0.gguf" "def f(x):" "25%")
echo "$out"
grep -q "expert hit rate" <<<"$out" || { echo "test_rust.sh: the example did not run against the installed library" >&2; exit 1; }
