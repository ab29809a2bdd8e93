#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one run: a lent GPU machine's time is short and every
# start costs minutes, so everything is prepared where the project builds and this only runs.
#
#   tools/gpu_check.sh PACK_DIR OUT_DIR [STAGES]
#
# PACK_DIR holds a build made elsewhere (tools/gpu_pack.sh): bin/moelite, bin/moelite_tests,
# lib/libmoelite.so*, deps/ (the shared libraries the build needs that a CUDA image may lack) and
# optionally llama/llama-bench (llama.cpp built with CUDA, the peer). STAGES (default all):
#   ops    the CUDA op tests on the GPU (tests/test_cuda_ops.cpp, the `gpu` instances)
#   sanitize  the same under compute-sanitizer: memcheck (out-of-bounds and misaligned accesses)
#          and racecheck (shared-memory hazards), where the machine's runtime supports it
#   e2e    `moelite logits --backend cuda` on the GPU against the numpy reference and the emulator,
#          batching and budgets bitwise, several sequences, saved sessions, bench
#   concurrency  contexts of one model evaluating at the same time on the GPU (tests/concurrency:
#          resident and budgeted through the shared device tier, bitwise, aborts; its discrete
#          section then runs on the emulator)
#   vulkan the Vulkan end-to-end tests on the GPU's Vulkan driver (needs deps/libvulkan.so.1)
#   bench  moelite cuda vs cpu on the shipped model; the performance table on a bench-shaped model
#          against llama.cpp's CUDA build
#   products  the integer products against the float ones on the bench-shaped model, in the same
#          run: MOELITE_CUDA_PRODUCTS=int8 (the default) and float, prefill-64 and decode, 3 runs
#          each (needs the bench stage's model); compare with tools/cuda_perf_model.py's predictions
#   batch  decode of 1 and 8 sequences a step on the bench-shaped model, resident and at a 25 %
#          budget (needs the bench stage's model)
#   profile  each kernel's share of the GPU time of a short decode on the bench-shaped model (ncu,
#          one metric: gpu__time_duration; needs the bench stage's model)
# Each stage has its own time limit; its log and a line of results land in OUT_DIR.
set -u
PACK=$(realpath "$1")
OUT=$(realpath "$2")
STAGES=${3:-ops sanitize e2e concurrency vulkan bench products batch profile}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
# llama-bench (the peer) needs the CUDA runtime and cuBLAS: the toolkit's, or those of the CUDA
# wheels beside the image's Python.
CUDA_LIBS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null |
  tr '\n' ':')
export LD_LIBRARY_PATH="$PACK/lib:$PACK/deps:$CUDA_LIBS${LD_LIBRARY_PATH:-}"
export MOELITE_BIN="$PACK/bin/moelite" MOELITE_LIBRARY="$PACK/lib/libmoelite.so"
export MOELITE_TEST_TMP=/tmp/moelite-gpu-tests PYTHONUNBUFFERED=1
unset MOELITE_CUDA_EMULATOR
PY=${PYTHON:-python3}
# pytest-xdist where installed (the CUDA image has it): the reference tests are independent.
PARALLEL=()
"$PY" -c "import xdist" 2>/dev/null && PARALLEL=(-n 8)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

stage() {  # stage NAME LIMIT_S COMMAND...: run with a limit, log to OUT, one summary line
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$SUMMARY"
  tail -n 4 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
}

{
  echo "== machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  grep -m1 "model name" /proc/cpuinfo
  uname -r
  nproc
  "$PY" -c "import numpy, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
  "$MOELITE_BIN" info -m "$ROOT/models/moelite-tiny-qwen3moe-Q8_0.gguf" --backend cuda 2>&1 | grep -E "backend|expert_slots" || true
  [ -x "$PACK/llama/llama-bench" ] && { ldd "$PACK/llama/llama-bench" | grep "not found" || echo "llama-bench: libraries found"; }
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# The bench-shaped model (OLMoE shape, as in docs/performance.md) is generated while the
# tests run, with 4 of its 8 layers: numpy writes about 0.5 GB a layer in 25-40 s on one core.
BENCH_MODEL=/tmp/bench-q8-4l.gguf
if [[ " $STAGES " == *" bench "* ]]; then
  timeout 200 "$PY" "$ROOT/tools/make_tiny_model.py" --arch olmoe --type Q8_0 --n-embd 2048 --n-layer 4 --n-head 16 \
    --n-head-kv 16 --n-expert 64 --n-expert-used 8 --n-ff-exp 1024 --vocab 32000 --ctx 4096 \
    --out "$BENCH_MODEL" --quiet >"$OUT/make_bench_model.log" 2>&1 &
  MAKER=$!
fi

for s in $STAGES; do
  case $s in
    ops)
      stage ops 90 "$PACK/bin/moelite_tests" --gtest_filter='CudaOps/*/gpu:CudaOps.*' --gtest_brief=1 ;;
    sanitize)
      SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -n 1)
      if [ -n "$SAN" ]; then
        stage memcheck 150 "$SAN" --tool memcheck --error-exitcode 9 "$PACK/bin/moelite_tests" \
          --gtest_filter='CudaOps/*/gpu' --gtest_brief=1
        stage racecheck 150 "$SAN" --tool racecheck --error-exitcode 9 "$PACK/bin/moelite_tests" \
          --gtest_filter='CudaOps/*Matmul*/gpu:CudaOps/*Expert*/gpu:CudaOps/*Routing*/gpu' --gtest_brief=1
      else
        echo "sanitize: skipped (no compute-sanitizer)" | tee -a "$SUMMARY"
      fi ;;
    e2e)
      stage e2e 150 "$PY" -m pytest -q -rP -p no:cacheprovider "${PARALLEL[@]}" -k "gpu or devices_say" \
        "$ROOT/tests/reference/test_cuda_vs_reference.py" \
        "$ROOT/bindings/python/tests/test_multi_sequence.py" "$ROOT/bindings/python/tests/test_sessions.py" ;;
    concurrency)
      stage concurrency 300 "$PACK/bin/moelite_concurrency" "$ROOT/models/moelite-tiny-qwen3moe-Q8_0.gguf" cuda ;;
    vulkan)
      if [ -f "$PACK/deps/libvulkan.so.1" ]; then
        # The layer path and driver file go to this stage's commands only (env), not to later stages.
        vkenv=(VK_LAYER_PATH="$PACK/deps")
        [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] &&
          vkenv+=(VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json)
        env "${vkenv[@]}" "$MOELITE_BIN" info -m "$ROOT/models/moelite-tiny-qwen3moe-Q8_0.gguf" --backend vulkan \
          >"$OUT/vulkan_info.txt" 2>&1
        grep -E "backend" "$OUT/vulkan_info.txt" | tee -a "$SUMMARY"
        stage vulkan 90 env "${vkenv[@]}" "$PY" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" \
          "$ROOT/tests/reference/test_vulkan_vs_reference.py"
      else
        echo "vulkan: skipped (no deps/libvulkan.so.1 in the pack)" | tee -a "$SUMMARY"
      fi ;;
    bench)
      stage bench_shipped 40 bash -c "for b in cuda cpu; do \"$MOELITE_BIN\" bench -m \"$ROOT/models/moelite-tiny-qwen3moe-Q8_0.gguf\" \
        --backend \$b -t 8 -p 64 -n 64 -r 3 --json | tail -n 1; done"
      wait "$MAKER"
      echo "bench model: rc=$? $(ls -la $BENCH_MODEL 2>&1)" | tee -a "$SUMMARY"
      peer=()
      [ -x "$PACK/llama/llama-bench" ] && peer=(--llama-bench "$PACK/llama/llama-bench")
      stage perf_cuda 120 "$PY" "$ROOT/tools/perf_table.py" -m "$BENCH_MODEL" --moelite "$MOELITE_BIN" --backend cuda \
        -t 8 --rounds 2 --budgets 25% --policies lfu "${peer[@]}" --json "$OUT/perf_cuda.json" --md "$OUT/perf_cuda.md" ;;
    products)
      if [ -f "$BENCH_MODEL" ]; then
        stage products 120 bash -c "for p in int8 float int8 float; do MOELITE_CUDA_PRODUCTS=\$p \"$MOELITE_BIN\" bench \
          -m \"$BENCH_MODEL\" --backend cuda -p 64 -n 32 -r 3 --no-membw --json | tail -n 1 | \
          \"$PY\" -c 'import json,sys; j=json.load(sys.stdin); print(sys.argv[1], {k: j.get(k) for k in
          (\"prefill_tok_s\", \"prefill_tok_s_min\", \"prefill_tok_s_max\", \"decode_tok_s\", \"decode_tok_s_min\",
          \"decode_tok_s_max\")})' \$p; done"
      else
        echo "products: skipped (no bench model: run the bench stage first)" | tee -a "$SUMMARY"
      fi ;;
    batch)
      # Several sequences a step (issue 17's table on the GPU): resident, 1 and 8 sequences, and 8
      # under a 25 % budget; aggregate decode tok/s and bytes read per generated token.
      if [ -f "$BENCH_MODEL" ]; then
        stage batch 120 bash -c "for a in '--n-seq 1' '--n-seq 8' '--n-seq 8 --budget 25%'; do \"$MOELITE_BIN\" bench \
          -m \"$BENCH_MODEL\" --backend cuda -p 16 -n 32 -r 1 --no-membw --json \$a | tail -n 1 | \
          \"$PY\" -c 'import json,sys; j=json.load(sys.stdin); print(sys.argv[1], {k: j.get(k) for k in
          (\"decode_tok_s\", \"decode_tok_s_per_seq\", \"bytes_read_per_token\", \"hit_rate\")})' \"\$a\"; done"
      else
        echo "batch: skipped (no bench model: run the bench stage first)" | tee -a "$SUMMARY"
      fi ;;
    profile)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
      if [ -n "$NCU" ] && [ -f "$BENCH_MODEL" ]; then
        stage profile 120 "$NCU" --metrics gpu__time_duration.sum --print-summary per-kernel --launch-count 1500 \
          "$MOELITE_BIN" bench -m "$BENCH_MODEL" --backend cuda -p 1 -n 8 -r 1 --no-membw
      else
        echo "profile: skipped (ncu: '${NCU}', model: $(ls "$BENCH_MODEL" 2>&1))" | tee -a "$SUMMARY"
      fi ;;
  esac
done
echo "== summary"
cat "$SUMMARY"
