#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs consumers of it the ways an
# app developer would: C and C++, shared and static, through find_package(moelite) and through
# pkg-config (shared: `pkg-config --libs`, static: `pkg-config --static --libs`). Each consumer
# loads MODEL and evaluates a few tokens.
#   run.sh BUILD_DIR SOURCE_DIR SCRATCH MODEL CC CXX HAVE_VULKAN(0|1)
# The consumers are built as on a machine without the Vulkan development files: CMake may not find
# Vulkan (CMAKE_DISABLE_FIND_PACKAGE_Vulkan) and pkg-config sees the scratch prefix only, so a
# package that asks for Vulkan (or for any .pc file besides its own) fails here.
set -euo pipefail
build=$1 src=$2 scratch=$3 model=$4 cc=$5 cxx=$6 have_vulkan=$7
rm -rf "$scratch" && mkdir -p "$scratch"
prefix="$scratch/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name moelite.pc)
config=$(find "$prefix" -name moeliteConfig.cmake)
libdir=$(dirname "$(dirname "$pc")")
fail() { echo "FAIL: $*" >&2; exit 1; }

if grep -iE 'find_(dependency|package)\(Vulkan|Vulkan::|-lvulkan|^Requires.*vulkan' "$pc" "$(dirname "$config")"/*.cmake; then
  fail "the installed package asks for Vulkan"
fi

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# A consumer binary: no Vulkan or CUDA library linked; libmoelite.so linked or not, as asked.
check_binary() {  # FILE shared|static
  local libs
  libs=$(needed "$1")
  if grep -E 'libvulkan|libcuda' <<<"$libs"; then fail "$1 links Vulkan/CUDA"; fi
  if [[ $2 == shared ]]; then
    grep -q '^libmoelite\.so' <<<"$libs" || fail "$1 does not link libmoelite.so"
  else
    if grep '^libmoelite' <<<"$libs"; then fail "$1 should contain the static archive, not link libmoelite.so"; fi
  fi
}
run_consumer() {  # FILE shared|static
  check_binary "$1" "$2"
  echo "== $(basename "$1")"
  if [[ $2 == shared ]]; then
    LD_LIBRARY_PATH="$libdir" "$1" "$model"
  else
    "$1" "$model"
  fi
}

export PKG_CONFIG_LIBDIR="$libdir/pkgconfig" PKG_CONFIG_PATH=""

# ---- CMake: find_package(moelite), one project per language.
for lang in C CXX; do
  dir="$scratch/cmake-$lang"
  cmake -S "$src" -B "$dir" -DCONSUMER_LANGUAGE=$lang -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -Dmoelite_DIR="$(dirname "$config")" \
    -DCMAKE_DISABLE_FIND_PACKAGE_Vulkan=ON >"$dir.log" 2>&1 || { cat "$dir.log"; fail "configuring the $lang consumer"; }
  cmake --build "$dir" >>"$dir.log" 2>&1 || { cat "$dir.log"; fail "building the $lang consumer"; }
  run_consumer "$dir/consumer_shared" shared
  run_consumer "$dir/consumer_static" static
done

# ---- pkg-config. -lmoelite takes libmoelite.so where both are installed, so the static consumers
# link against a copy of the prefix that holds the archive only (a static-only install).
static_prefix="$scratch/static-prefix"
cp -a "$prefix" "$static_prefix"
rm -f "$static_prefix/${libdir#"$prefix/"}"/libmoelite.so*
static_pc_dir="$static_prefix/${libdir#"$prefix/"}/pkgconfig"
for lang in c cxx; do
  if [[ $lang == c ]]; then compiler=$cc source="$src/main.c"; else compiler=$cxx source="$src/main.cpp"; fi
  out="$scratch/pkgconfig-$lang"
  # shellcheck disable=SC2046  # pkg-config's output is a list of words
  "$compiler" -o "$out-shared" "$source" $(pkg-config --cflags moelite) $(pkg-config --libs moelite)
  run_consumer "$out-shared" shared
  # shellcheck disable=SC2046
  "$compiler" -o "$out-static" "$source" $(PKG_CONFIG_LIBDIR="$static_pc_dir" pkg-config --cflags moelite) \
    $(PKG_CONFIG_LIBDIR="$static_pc_dir" pkg-config --static --libs moelite)
  run_consumer "$out-static" static
done

# ---- a machine without the Vulkan loader: the automatic backend runs on the CPU, and an explicit
# request for Vulkan is refused with the reason.
echo "== without the Vulkan loader"
missing=/nonexistent/libvulkan.so.1
MOELITE_VULKAN_LOADER=$missing LD_LIBRARY_PATH="$libdir" "$scratch/cmake-C/consumer_shared" "$model" auto |
  tee "$scratch/no-loader.txt"
grep -q '^backend: cpu' "$scratch/no-loader.txt" || fail "the automatic backend did not fall back to the CPU"
rc=0
MOELITE_VULKAN_LOADER=$missing LD_LIBRARY_PATH="$libdir" "$scratch/cmake-C/consumer_shared" "$model" vulkan \
  >"$scratch/no-loader-vulkan.txt" || rc=$?
cat "$scratch/no-loader-vulkan.txt"
[[ $rc == 3 ]] || fail "--backend vulkan without a loader: exit $rc, expected 3 (MOELITE_ERR_BACKEND_UNAVAILABLE)"
if [[ $have_vulkan == 1 ]]; then
  grep -q "$missing" "$scratch/no-loader-vulkan.txt" || fail "the refusal does not name the loader"
fi
# ---- the installed server finds the installed library by itself (RPATH $ORIGIN/../lib): no
# LD_LIBRARY_PATH, and from a prefix the dynamic loader knows nothing of.
if [[ -x "$prefix/bin/moelite-server" ]]; then
  echo "== the installed moelite-server"
  env -u LD_LIBRARY_PATH "$prefix/bin/moelite-server" --help >"$scratch/server-help.txt" 2>&1 ||
    fail "the installed moelite-server does not start: $(cat "$scratch/server-help.txt")"
  grep -q "usage: moelite-server" "$scratch/server-help.txt" || fail "moelite-server --help: $(cat "$scratch/server-help.txt")"
  rc=0
  env -u LD_LIBRARY_PATH timeout 60 "$prefix/bin/moelite-server" -m "$model" --port 0 -t 1 \
    >"$scratch/server-out.txt" 2>"$scratch/server-err.txt" & pid=$!
  for _ in $(seq 300); do grep -q "^listening on" "$scratch/server-out.txt" && break; sleep 0.1; done
  kill "$pid" 2>/dev/null || true
  wait "$pid" || rc=$?
  grep -q "^listening on" "$scratch/server-out.txt" || fail "the installed moelite-server did not listen: $(cat "$scratch/server-err.txt")"
fi
echo "install_and_consume: 8 consumers built and run"
