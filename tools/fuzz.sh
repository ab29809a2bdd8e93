#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang in build-fuzz and runs each for a fixed
# time, starting from its seed corpus in tests/fuzz/corpus (which includes every crash found so
# far, so each run is also a regression test). Fails on any crash, leak, timeout or OOM; the
# reproducer is left in build-fuzz/artifacts/.
#   tools/fuzz.sh [seconds-per-target] [target...]     (default 20 s, every target)
# Environment: MOELITE_FUZZ_JOBS=N runs N fuzzing processes per target (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_gguf_load fuzz_tokenizer fuzz_chat_template fuzz_profile fuzz_trace fuzz_session
                               fuzz_openai_request fuzz_cli_options)
jobs=${MOELITE_FUZZ_JOBS:-1}
bash tools/install_deps.sh --test

# Vulkan and CUDA off: every target parses or loads on the CPU backend, and the GPU backends (the
# SIMT emulator's kernels above all) were a large part of this instrumented build.
if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOELITE_FUZZ=ON \
    -DMOELITE_TESTS=OFF -DMOELITE_VULKAN=OFF -DMOELITE_CUDA=OFF >/dev/null
fi
cmake --build build-fuzz --target fuzz_all

mkdir -p build-fuzz/artifacts build-fuzz/logs
export TMPDIR=${TMPDIR:-/tmp}
# One target per core at a time (MOELITE_FUZZ_PARALLEL, default: the cores over the jobs per target):
# each fuzzer is one process, so on CI's two cores the targets run two at once and the stage takes
# half the time for the same seconds per target. Each target writes its own log and summary line.
parallel=${MOELITE_FUZZ_PARALLEL:-$(( $(nproc) / jobs > 1 ? $(nproc) / jobs : 1 ))}
fuzz_one() {
  local t=$1 work=build-fuzz/corpus/$1  # new inputs go there, the repository's seeds stay as they are
  local log=build-fuzz/logs/$t.log rc=0 cpu execs cov
  mkdir -p "$work"
  rm -f "$log.rc"
  local args=(-max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
              -artifact_prefix="build-fuzz/artifacts/$t-" "$work" "tests/fuzz/corpus/$t")
  TIMEFORMAT='%U %S'
  cpu=$( { time {
    if ((jobs > 1)); then
      # -fork runs the jobs as child processes and merges their coverage; a crash still fails.
      build-fuzz/bin/$t -fork="$jobs" "${args[@]}" >"$log" 2>&1 || echo "rc=$?" >"$log.rc"
    else
      build-fuzz/bin/$t "${args[@]}" >"$log" 2>&1 || echo "rc=$?" >"$log.rc"
    fi
  } ; } 2>&1 | awk '{printf "%.0f", $1 + $2}')
  if [[ -f $log.rc ]]; then
    rc=$(sed 's/rc=//' "$log.rc")
    rm -f "$log.rc"
  fi
  # A crashed fuzzer prints no final stats: no match is not an error of this script.
  execs=$( (grep -h 'stat::number_of_executed_units' "$log" || true) | awk '{s += $2} END {print s + 0}')
  cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | awk '{print $2}')
  if ((rc != 0)); then
    echo "FAILED ($rc): see $log"
    grep -m3 -E 'ERROR|SUMMARY|Test unit written' "$log" || tail -5 "$log"
  fi
  printf '%-20s %6ss  cpu %6ss  execs %10s  cov %6s  %s\n' "$t" "$secs" "$cpu" "${execs:-?}" "${cov:-?}" \
    "$( ((rc == 0)) && echo ok || echo FAILED)" >"build-fuzz/logs/$t.summary"
}
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  echo "== $t: ${secs}s x $jobs"
  rm -f "build-fuzz/logs/$t.summary"
  fuzz_one "$t" &
done
wait
status=0
for t in "${targets[@]}"; do
  # A target whose summary is missing died in this script: a failure too.
  if [[ -f build-fuzz/logs/$t.summary ]]; then cat "build-fuzz/logs/$t.summary"; else echo "$t: no summary"; fi
  grep -q ' ok$' "build-fuzz/logs/$t.summary" 2>/dev/null || status=1
done
exit $status
