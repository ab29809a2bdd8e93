#!/usr/bin/env bash
# Builds samples/jetson against an installed moelite (find_package) and checks that it answers:
#   run.sh BUILD_DIR SCRATCH MODEL [--cross TOOLCHAIN_FILE RUNNER...]
# With --cross the sample is cross-built with the toolchain file and run through RUNNER (qemu).
# Two sessions with the same questions: one with plenty of memory, one told that memory ran short
# before the second turn (--assume-available). The second must shrink its expert budget, reload,
# and still give the same replies word for word (greedy decoding; the budget changes speed only).
set -euo pipefail
build=$1 scratch=$2 model=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
src="$here/../../samples/jetson"
cmake_args=() runner=()
if [[ ${1:-} == --cross ]]; then
  cmake_args=(-DCMAKE_TOOLCHAIN_FILE="$2")
  shift 2
  runner=("$@")
fi
rm -rf "$scratch" && mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
# moelite_DIR rather than CMAKE_PREFIX_PATH: a cross toolchain re-roots package searches into
# its sysroot, an explicit package directory is used as given.
cmake -S "$src" -B "$scratch/build" "${cmake_args[@]}" -DCMAKE_BUILD_TYPE=Release \
  -Dmoelite_DIR="$scratch/prefix/lib/cmake/moelite" >/dev/null
cmake --build "$scratch/build" >/dev/null
export LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}"
questions=$'What is a list in Python?\nHow do I open a file?\n/quit\n'
chat() { printf '%s' "$questions" | "${runner[@]}" "$scratch/build/jetson_chat" "$model" --max-tokens 24 "$@"; }
chat > "$scratch/plenty.txt"
# 64 GiB available at the first turn, 1 MiB at the second: below --min-free (128 MiB by default).
chat --assume-available 65536,1 > "$scratch/pressure.txt"
cat "$scratch/pressure.txt"
/usr/bin/python3 - "$scratch/plenty.txt" "$scratch/pressure.txt" <<'PY'
import re, sys
plenty, pressure = (open(p, encoding="utf-8").read() for p in sys.argv[1:3])
def replies(text):
    # Each turn: "assistant: " + the streamed reply + "\n[ttft ...]".
    return re.findall(r"assistant: (.*?)\n\[ttft ", text, re.S)
a, b = replies(plenty), replies(pressure)
assert len(a) == 2 and len(b) == 2, (a, b)
assert all(r.strip() for r in a), "empty reply: %r" % a
assert a == b, "replies differ with a smaller budget:\n%r\n%r" % (a, b)
m = re.search(r"expert budget ([0-9.]+) -> ([0-9.]+) MiB", pressure)
assert m and float(m.group(2)) < float(m.group(1)), "no budget shrink reported"
budgets = re.findall(r"budget ([0-9.]+) MiB", pressure)
assert "memory pressure" not in plenty
assert "experts hit" in pressure, "the reloaded, budgeted model reports no expert-store hit rate"
print("jetson sample: 2 turns answered identically; budget %s -> %s MiB under pressure" % m.groups())
PY
