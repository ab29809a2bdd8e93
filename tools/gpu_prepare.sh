#!/usr/bin/env bash
# Prepares a lent GPU's run before asking for the machine: builds moelite with CUDA kernels for the
# GPU's architecture only (build-gpu/), and packs it with the libraries a CUDA image lacks and,
# where given, llama.cpp's CUDA llama-bench as the peer (tools/gpu_pack.sh), into .gpu/ (ignored
# by git, so the device tool needs it named in `carry`). Loans have been paused minutes after the
# first run twice (docs/gpu-notes.md), so everything that can happen here happens before the lease.
#
#   tools/gpu_prepare.sh [ARCH] [LLAMA_BENCH]     ARCH default 90-real (H100/H200); 87-real: Orin
#
# Then, on the machine (one `run`, carry [".gpu"]):
#   mkdir -p /tmp/p $OUT/r && python3 -c "import tarfile;tarfile.open('.gpu/pack.tar.xz').extractall('/tmp/p')" &&
#   timeout -k 5 420 bash tools/gpu_check.sh /tmp/p/pack $OUT/r "ops e2e bench products batch profile sanitize";
#   cd $OUT && tar czf logs.tgz r && rm -rf r
# (at most 8 files come back from $OUT: hence one archive of the logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-90-real}
PEER=${2:-}
if [ -z "$PEER" ] && [ -x /work/peers/llama/build-cuda/bin/llama-bench ]; then
  PEER=/work/peers/llama/build-cuda/bin/llama-bench  # where this workplace keeps the peer's CUDA build
fi
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOELITE_CUDA=ON -DMOELITE_CUDA_EMULATOR=ON -DMOELITE_CUDA_ARCHITECTURES="$ARCH" >/dev/null
cmake --build build-gpu -j "$(nproc)" --target moelite moelite_cli moelite_tests
mkdir -p .gpu
bash tools/gpu_pack.sh build-gpu .gpu/pack.tar.xz ${PEER:+"$PEER"}
if [ -n "$PEER" ]; then echo "peer: $PEER"; else echo "peer: none (no llama.cpp CUDA build found: the bench stage reports moelite alone)"; fi
