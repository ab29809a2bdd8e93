#!/usr/bin/env bash
# Installs the Debian 12 packages moelite needs to build (and, with --test, to run its tests).
# Packages already present are skipped, so this is cheap to run every time.
set -euo pipefail
# libvulkan-dev + glslc build the Vulkan backend; the CPU backend needs neither.
pkgs=(g++ cmake ninja-build pkg-config liburing-dev libvulkan-dev glslc libmimalloc-dev
      # tools/run.sh's tools/main_job.py (standard library only)
      python3
      # samples/server (moelite-server): HTTP and JSON
      libcpp-httplib-dev nlohmann-json3-dev)
if [[ "${1:-}" == "--test" ]]; then
  # Tests run the Vulkan backend for real on lavapipe (Mesa's CPU Vulkan), under the Khronos
  # validation layer.
  pkgs+=(libgtest-dev python3-numpy python3-pytest python3-venv python3-pip python3-setuptools
         mesa-vulkan-drivers vulkan-validationlayers
         # tools/fuzz.sh: clang with libFuzzer (its runtime is in libclang-rt-14-dev).
         clang libclang-rt-14-dev
         # tests/server: the chat page in headless Chromium; tools/plot_report.py: matplotlib
         chromium python3-matplotlib
         # tests/reference/test_valgrind.py: memcheck over a generation under a budget
         valgrind)
  # tools/test_rust.sh: rustup's cargo where installed, else Debian's.
  command -v cargo >/dev/null || [[ -x "$HOME/.cargo/bin/cargo" ]] || pkgs+=(cargo)
  # tools/test_node.sh: node 18 or later with npm (Debian's where none is installed).
  command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
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
