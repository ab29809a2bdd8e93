#!/usr/bin/env bash
# The main job: install, build, then run one prompt on the shipped model twice, with every expert in
# memory and with a 25% expert budget, and show side by side what each held, how fast it ran, what
# it read, and that both computed the same logits (tools/main_job.py). The model was trained on
# Python's documentation, so the prompt is one it can continue.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# -U: the default CUDA architectures again if tools/test.sh configured build/ with its one.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOELITE_TESTS=OFF -DMOELITE_CUDA_EMULATOR=OFF -UMOELITE_CUDA_ARCHITECTURES >/dev/null
cmake --build build
python3 tools/main_job.py --model "${MODEL:-models/moelite-tiny-qwen3moe-Q8_0.gguf}" --budget "${BUDGET:-25%}"
