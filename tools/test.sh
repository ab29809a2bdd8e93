#!/usr/bin/env bash
# Builds and runs the whole test suite. With --sanitize, in a separate build tree under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh --test
build=build
# MOELITE_TESTS=ON explicitly: tools/run.sh configures the same build/ without tests.
flags=(-DCMAKE_BUILD_TYPE=Release -DMOELITE_TESTS=ON)
if [[ "${1:-}" == "--sanitize" ]]; then
  build=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOELITE_SANITIZE=ON -DMOELITE_TESTS=ON)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
cmake -S . -B "$build" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$build"
# --no-tests=error: a build that found no tests is a failure, not a pass.
ctest --test-dir "$build" --output-on-failure --no-tests=error -j2
