#!/usr/bin/env bash
# libmoelite.so must load on a machine without a GPU stack: no DT_NEEDED entry for the Vulkan
# loader or the CUDA driver (both are dlopen()ed when asked for).
#   check_needed.sh LIBRARY
set -euo pipefail
needed=$(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[[ -n $needed ]] || { echo "FAIL: no NEEDED entries read from $1" >&2; exit 1; }
echo "$1 needs:" $needed
if grep -E 'libvulkan|libcuda' <<<"$needed"; then
  echo "FAIL: $1 links a GPU library at load time" >&2
  exit 1
fi
