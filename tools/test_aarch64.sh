#!/usr/bin/env bash
# Cross-builds moelite for 64-bit ARM Linux (the Jetson build: CUDA kernels for sm_87 embedded)
# with Debian's g++-aarch64-linux-gnu and runs a subset of the tests under qemu-user with an
# ARMv8.0 core (cortex-a53) and the newest qemu models (max): the C API test on the shipped model,
# the SIMT emulator (its aarch64 context switch) and the CUDA kernels through it, and the CUDA
# backend end to end on an emulated discrete GPU against the x86-64 build's result; the quant kernels
# (the NEON table against the scalar one).
#   tools/test_aarch64.sh            (after tools/test.sh, which leaves build/bin/moelite)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh --test
export MOELITE_MODEL_CACHE=${MOELITE_MODEL_CACHE:-$PWD/build-models}  # as in tools/test.sh
missing=()
for p in g++-aarch64-linux-gnu qemu-user; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=Release -DMOELITE_TESTS=ON -DMOELITE_CUDA_EMULATOR=ON -DMOELITE_VULKAN=OFF \
  -DMOELITE_CUDA_ARCHITECTURES="87-real;87-virtual" >/dev/null
cmake --build build-aarch64 --target moelite moelite_static moelite_kernel_tests test_c_api moelite_cli
run() { qemu-aarch64 -L /usr/aarch64-linux-gnu "$@"; }
model=models/moelite-tiny-qwen3moe-Q8_0.gguf
tokens=1,17,250,3,99,42,7,300,511,0
# The kernel tables differ per CPU model; the SIMT emulator's fibers and the CUDA kernels it runs
# do not, so they run once (on the ARMv8.0 baseline). They are the stage's longest single-threaded
# run (~50 s under qemu), so they run in the background while the rest of the stage uses the other core.
simt_log=build-aarch64/simt-cudaops.log
QEMU_CPU=cortex-a53 run build-aarch64/bin/moelite_kernel_tests --gtest_brief=1 --gtest_filter='Simt*:CudaOps*' \
  >"$simt_log" 2>&1 &
simt_pid=$!
trap 'kill "$simt_pid" 2>/dev/null || true' EXIT  # a failing step below ends the stage, and the run with it
for cpu in cortex-a53 cortex-a76 max; do
  # cortex-a53: ARMv8.0 (neon table); cortex-a76: + SDOT (dotprod); max: + SMMLA (i8mm).
  echo "== qemu-aarch64 -cpu $cpu"
  export QEMU_CPU=$cpu
  run build-aarch64/bin/moelite info -m "$model" | grep -E '^backend'
  run build-aarch64/bin/test_c_api "$model"
  run build-aarch64/bin/moelite_kernel_tests --gtest_brief=1 --gtest_filter='QuantKernels*'
done
unset QEMU_CPU
# The CUDA backend end to end on ARM (emulated discrete GPU, budget): the same logits as the
# x86-64 build up to float rounding (aarch64 compilers fuse multiply-adds).
MOELITE_CUDA_EMULATOR=discrete run build-aarch64/bin/moelite logits -m "$model" --tokens "$tokens" \
  --backend cuda --budget 40% --out build-aarch64/cuda.f32
MOELITE_CUDA_EMULATOR=discrete build/bin/moelite logits -m "$model" --tokens "$tokens" --backend cuda \
  --out build-aarch64/cuda-x86.f32
/usr/bin/python3 - <<'PY'
import numpy as np
a = np.fromfile("build-aarch64/cuda.f32", "<f4").astype(np.float64)
b = np.fromfile("build-aarch64/cuda-x86.f32", "<f4").astype(np.float64)
err = ((a - b) ** 2).sum() / (b ** 2).sum()
print("aarch64 vs x86-64 CUDA (emulated) logits: nmse %.3e" % err)
assert a.shape == b.shape and err < 1e-9, err
PY
# Every architecture x weight type under qemu on each dispatch path (cortex-a53: neon, cortex-a76:
# dotprod, max: i8mm) against the numpy reference and the x86-64 build, plus budget and batching
# exactness on ARM.
MOELITE_BIN="$PWD/build/bin/moelite" MOELITE_BIN_AARCH64="$PWD/build-aarch64/bin/moelite" \
  MOELITE_TEST_TMP="$PWD/build-aarch64/ref-tests" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/reference/test_aarch64_vs_reference.py
# The Jetson sample cross-built against the installed aarch64 package, answering from the shipped
# model under qemu (ARMv8.2 with dot products, like Orin's Cortex-A78AE).
QEMU_CPU=cortex-a76 bash tests/jetson_sample/run.sh build-aarch64 "$PWD/build-aarch64/jetson" "$model" \
  --cross "$PWD/cmake/toolchains/aarch64-linux-gnu.cmake" qemu-aarch64 -L /usr/aarch64-linux-gnu
echo "== qemu-aarch64 -cpu cortex-a53: the SIMT emulator and the CUDA kernels through it"
simt_rc=0
wait "$simt_pid" || simt_rc=$?
cat "$simt_log"
exit "$simt_rc"
