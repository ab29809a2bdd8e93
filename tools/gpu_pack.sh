#!/usr/bin/env bash
# Packs a build for tools/gpu_check.sh on a machine with a GPU that has none of this project's
# build dependencies: the CLI, the test binaries and the library, the shared libraries they load that
# a CUDA image may lack (mimalloc, liburing, zstd, the Vulkan loader and validation layer), and
# optionally llama.cpp's llama-bench built with CUDA (the peer), compressed into one archive.
#
#   tools/gpu_pack.sh BUILD_DIR ARCHIVE.tar.xz [LLAMA_BENCH]
#
# Build for the GPU's architecture only (-DMOELITE_CUDA_ARCHITECTURES=90-real for an H100/H200)
# to keep the archive small; unpack on the machine with `tar -xJf ARCHIVE -C DIR` (or Python's
# tarfile where xz is missing).
set -euo pipefail
BUILD=$(realpath "$1")
ARCHIVE=$(realpath -m "$2")
PEER=${3:-}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/pack/bin" "$STAGE/pack/lib" "$STAGE/pack/deps"
cp "$BUILD/bin/moelite" "$BUILD/bin/moelite_tests" "$BUILD/bin/moelite_concurrency" "$STAGE/pack/bin/"
cp -P "$BUILD"/lib/libmoelite.so* "$STAGE/pack/lib/"
strip --strip-debug "$STAGE/pack/bin/"* "$STAGE/pack/lib/libmoelite.so."*.*.*
deps() { ldd "$@" | awk '/=>/ {print $3}' | grep -E 'mimalloc|uring|zstd|gomp' | sort -u; }
for lib in $(deps "$BUILD/bin/moelite" "$BUILD/lib/libmoelite.so" ${PEER:+"$PEER"}); do
  cp -L "$lib" "$STAGE/pack/deps/"
done
for lib in /usr/lib/x86_64-linux-gnu/libvulkan.so.1 /usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so \
  /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json; do
  [ -e "$lib" ] && cp -L "$lib" "$STAGE/pack/deps/"
done
if [ -n "$PEER" ]; then
  mkdir -p "$STAGE/pack/llama"
  cp "$PEER" "$STAGE/pack/llama/llama-bench"
  strip --strip-debug "$STAGE/pack/llama/llama-bench"
fi
tar -C "$STAGE" -cJf "$ARCHIVE" pack
ls -la "$ARCHIVE"
