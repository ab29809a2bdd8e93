#!/usr/bin/env bash
# Installs the Debian 12 packages moelite needs to build (and, with --test, to run its tests).
# Packages already present are skipped, so this is cheap to run every time.
set -euo pipefail
# libvulkan-dev + glslc build the Vulkan backend; the CPU backend needs neither.
pkgs=(g++ cmake ninja-build pkg-config liburing-dev libvulkan-dev glslc libmimalloc-dev)
if [[ "${1:-}" == "--test" ]]; then
  # Tests run the Vulkan backend for real on lavapipe (Mesa's CPU Vulkan), under the Khronos
  # validation layer.
  pkgs+=(libgtest-dev python3-numpy python3-pytest python3-venv python3-pip python3-setuptools
         mesa-vulkan-drivers vulkan-validationlayers
         # tools/fuzz.sh: clang with libFuzzer (its runtime is in libclang-rt-14-dev).
         clang libclang-rt-14-dev)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
