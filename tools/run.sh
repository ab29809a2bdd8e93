#!/usr/bin/env bash
# The main job: install, build, and run the shipped default model (facts + speed). The model was
# trained on Python's documentation, so the prompt is one it can continue.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# -U: the default CUDA architectures again if tools/test.sh configured build/ with its one.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOELITE_TESTS=OFF -DMOELITE_CUDA_EMULATOR=OFF -UMOELITE_CUDA_ARCHITECTURES >/dev/null
cmake --build build
MODEL=${MODEL:-models/moelite-tiny-qwen3moe-Q8_0.gguf}
./build/bin/moelite run -m "$MODEL" -p "The open() function returns" -n 48 --seed 1
./build/bin/moelite info -m "$MODEL"
./build/bin/moelite bench -m "$MODEL" -p 64 -n 32
