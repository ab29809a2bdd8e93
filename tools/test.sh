#!/usr/bin/env bash
# Builds and runs the whole test suite. With --sanitize, in a separate build tree under
# AddressSanitizer + UndefinedBehaviorSanitizer. With --tsan, a focused job under
# ThreadSanitizer in build-tsan: only the concurrency tests (contexts of one model evaluating at
# once with a budget, predictors and the io_uring store; aborts from other threads; a context
# refusing a second thread) are built and run (ctest label "tsan"), so it stays within minutes on
# two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh --test
# The generated test models, shared by this script's runs (plain, sanitized) and tools/test_aarch64.sh:
# tools/make_tiny_model.py copies a model from here when its arguments and source match, instead
# of generating it again in every stage (see model_cache_path there).
export MOELITE_MODEL_CACHE=${MOELITE_MODEL_CACHE:-$PWD/build-models}
build=build
# MOELITE_TESTS=ON explicitly: tools/run.sh configures the same build/ without tests (and without
# the CUDA emulator, which the tests run the CUDA backend on).
# The test build's fatbin holds one architecture (Turing machine code + its PTX, which the driver
# compiles for any later GPU) instead of the product's seven: what the tests check of the fatbin (the
# entry points, test_cuda_fatbin.py) is the same in each, and nvcc's seven took ~5 of the build's
# CPU minutes on two cores. tools/run.sh and a plain configure build all seven.
flags=(-DCMAKE_BUILD_TYPE=Release -DMOELITE_TESTS=ON -DMOELITE_CUDA_EMULATOR=ON "-DMOELITE_CUDA_ARCHITECTURES=75-real;75-virtual")
if [[ "${1:-}" == "--sanitize" ]]; then
  build=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOELITE_SANITIZE=ON -DMOELITE_TESTS=ON -DMOELITE_CUDA_EMULATOR=ON)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
elif [[ "${1:-}" == "--tsan" ]]; then
  # Vulkan and CUDA off: the job is about core's threads (contexts, store loaders, thread pool) on
  # the CPU backend, and Mesa's threads or the SIMT emulator (its largest source file, which the
  # concurrency test never runs) would only add noise and build time. halt_on_error: any race fails.
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOELITE_TSAN=ON -DMOELITE_VULKAN=OFF \
    -DMOELITE_CUDA=OFF >/dev/null
  cmake --build build-tsan --target moelite_concurrency moelite_context_busy
  ctest --test-dir build-tsan --output-on-failure --no-tests=error -L tsan
  exit 0
fi
cmake -S . -B "$build" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$build"
# --no-tests=error: a build that found no tests is a failure, not a pass.
ctest --test-dir "$build" --output-on-failure --no-tests=error -j2
# The Rust and Node bindings against the same build (plain build only: the sanitized library
# would need its runtime preloaded into cargo's test binaries and node).
if [[ "$build" == build ]]; then
  bash tools/test_rust.sh "$build"
  bash tools/test_node.sh "$build"
fi
