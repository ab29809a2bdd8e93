#!/usr/bin/env bash
# The allocator split: the CLI runs on mimalloc when the build found it (EXPECT = mimalloc) and on
# libc's malloc otherwise, while the shared library never depends on mimalloc (loading
# libmoelite.so into an application must not replace the application's malloc).
#   check.sh CLI LIBMOELITE_SO EXPECT
set -euo pipefail
cli=$1 lib=$2 expect=$3
got=$("$cli" version | sed -n 's/^allocator //p')
echo "CLI allocator: $got (expected $expect)"
[[ $got == "$expect"* ]]
if readelf -d "$lib" | grep -i "NEEDED.*mimalloc"; then
  echo "libmoelite depends on mimalloc" >&2
  exit 1
fi
echo "library NEEDED: $(readelf -d "$lib" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
