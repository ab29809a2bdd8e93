#!/usr/bin/env bash
# Instructions per token of the CPU kernels, for each kernel table (MOELITE_ISA) and weight type:
# evidence of ARM kernel speed without ARM hardware. The aarch64 build runs under qemu-user with
# a TCG plugin that counts executed guest instructions (tools/qemu_insn_count/insn_count.c); the
# x86-64 build runs under valgrind's callgrind (total Ir). These are instruction counts, not time:
# see docs/performance.md for what they say about a real board. A measurement tool like
# tools/bench_kernels.cpp, not part of CI.
#
#   tools/arm_instruction_count.sh [--json FILE] [--types "Q8_0 Q4_0 Q4_K Q6_K"] [--no-x86] [--no-aarch64]
#                                  [--prefill N] [--decode N]
#
# Method: every count is the difference of two runs of `moelite bench -t 1 --no-warmup --no-membw`
# that differ only in the work measured, so loading, parsing and setup cancel:
#   prefill  -p 2N -n 0   minus  -p N -n 0          divided by N  (one batch of N resp. 2N tokens)
#   decode   -p 8 -n 2N   minus  -p 8 -n N          divided by N  (single-token steps)
# "kernel" counts only instructions inside the weight-type kernel objects (backends/cpu/quant_*.cpp
# and backends/cpu/simd/*.cpp: dot products, activation quantization, dequantization); the rest is
# attention, norms, routing, the graph and the allocator. Per weight byte divides by the model's
# active weight bytes per token (`moelite info`: attention + routed experts + output per token).
# ISAs: aarch64 scalar, neon, dotprod, i8mm under QEMU_CPU=max (all extensions); x86-64 scalar,
# avx2, avx512. An ISA the build (or CPU) lacks caps to the best available one (`moelite info`
# prints the table used); duplicates are skipped. valgrind does not emulate AVX-512 (it hides it
# from CPUID), so the avx512 table cannot be counted there and is reported as capped to avx2.
# Builds (-j2, or JOBS=N): build-aarch64 (cross, reused) and build (x86-64, reused), target moelite_cli.
set -euo pipefail
cd "$(dirname "$0")/.."
JSON="" TYPES="Q8_0 Q4_0 Q4_K Q6_K" X86=1 A64=1 PREFILL=32 DECODE=16
while (($#)); do
  case "$1" in
    --json) JSON="$2"; shift 2 ;;
    --types) TYPES="$2"; shift 2 ;;
    --prefill) PREFILL="$2"; shift 2 ;;
    --decode) DECODE="$2"; shift 2 ;;
    --no-x86) X86=0; shift ;;
    --no-aarch64) A64=0; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
JOBS=${JOBS:-2}
WORK=build-insn  # plugin, generated models, run outputs (ignored by git: /build*/)
mkdir -p "$WORK/models" "$WORK/runs"
start=$SECONDS

if ((A64)); then
  for tool in qemu-aarch64 aarch64-linux-gnu-g++; do
    command -v $tool >/dev/null || { echo "no $tool: aarch64 skipped (apt-get install qemu-user g++-aarch64-linux-gnu)" >&2; A64=0; }
  done
fi
if ((X86)) && ! command -v valgrind >/dev/null; then
  echo "no valgrind: x86-64 skipped (apt-get install valgrind)" >&2
  X86=0
fi

# The plugin: built with the host compiler against hand-written QEMU 7.2 declarations.
if ((A64)); then
  src=tools/qemu_insn_count/insn_count.c
  if [[ ! -f $WORK/insn_count.so || $src -nt $WORK/insn_count.so ]]; then
    gcc -O2 -Wall -Wextra -shared -fPIC -fvisibility=hidden -o "$WORK/insn_count.so" "$src"
  fi
fi

build() {  # build DIR [cmake args...]: configure once, then bring moelite_cli up to date
  local dir=$1
  shift
  if [[ ! -f $dir/CMakeCache.txt ]]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOELITE_TESTS=OFF -DMOELITE_VULKAN=OFF \
      -DMOELITE_CUDA=OFF "$@" >/dev/null
  fi
  cmake --build "$dir" -j"$JOBS" --target moelite_cli | grep -v "^\[" || true
}
((A64)) && build build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
((X86)) && build build

# Models: the shipped one, and one generated per type at the shipped model's shape (4 layers,
# 16 experts, top-2, vocab 2048; n_ff 256 so the K-quants' 256-element super-blocks fit).
models=(models/moelite-tiny-qwen3moe-Q8_0.gguf)
for t in $TYPES; do
  out=$WORK/models/qwen3moe-$t.gguf
  [[ -f $out ]] || /usr/bin/python3 tools/make_tiny_model.py --arch qwen3moe --type "$t" --seed 7 --n-layer 4 \
    --n-expert 16 --n-expert-used 2 --n-ff-exp 256 --vocab 2048 --out "$out" --quiet
  models+=("$out")
done
build_s=$((SECONDS - start))

A64=$A64 X86=$X86 WORK=$WORK JSON=$JSON PREFILL=$PREFILL DECODE=$DECODE BUILD_S=$build_s \
  /usr/bin/python3 - "${models[@]}" <<'PY'
import json, os, re, subprocess, sys, time

WORK = os.environ["WORK"]
P, N = int(os.environ["PREFILL"]), int(os.environ["DECODE"])
models = sys.argv[1:]
t0 = time.time()


def sh(cmd, env=None):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        sys.exit("failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-2000:]))
    return r.stdout


def kernel_objects(build):
    d = os.path.join(build, "CMakeFiles/moelite_cpu.dir/backends/cpu")
    objs = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith("quant_") and f.endswith(".o")]
    simd = os.path.join(d, "simd")
    if os.path.isdir(simd):
        objs += [os.path.join(simd, f) for f in sorted(os.listdir(simd)) if f.endswith(".o")]
    # the block layouts and reference decoders the kernels call (fp16 loads, nibble unpacking)
    objs.append(os.path.join(build, "CMakeFiles/moelite_base.dir/base/quant_ref.cpp.o"))
    return [o for o in objs if os.path.exists(o)]


def text_ranges(build, binary, prefix):
    """Link-time address ranges of the kernel objects' code inside the executable. Each .text*
    section of an object is placed whole (.text, and one .text.NAME per inline/template function),
    so a global or weak function symbol's address minus its offset in the section is where that
    section starts."""
    syms = {}
    for line in sh([prefix + "nm", "--defined-only", binary]).splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TtWw":
            syms.setdefault(f[2], []).append(int(f[0], 16))
    ranges = []
    for obj in kernel_objects(build):
        sizes = {}
        for line in sh([prefix + "objdump", "-h", obj]).splitlines():
            f = line.split()
            if len(f) > 3 and (f[1] == ".text" or f[1].startswith(".text.")) and int(f[2], 16):
                sizes[f[1]] = int(f[2], 16)
        for line in sh([prefix + "objdump", "-t", obj]).splitlines():
            # "0000000000000120 g     F .text  00000000000000f4 [.hidden] _ZN..." (w for weak)
            f = line.split()
            if len(f) in (6, 7) and f[1] in ("g", "w") and f[2] == "F" and f[3] in sizes and \
                    len(syms.get(f[-1], [])) == 1:
                lo = syms[f[-1]][0] - int(f[0], 16)
                ranges.append((lo, lo + sizes.pop(f[3])))
        for sec in sizes:
            if sec == ".text" or sec.startswith(".text._Z"):
                print("note: %s %s has no anchor symbol; counted as non-kernel" % (obj, sec), file=sys.stderr)
    ranges.sort()
    merged = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 16:  # alignment padding between sections
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def exec_segment(binary, prefix):
    # link-time address of the lowest executable PT_LOAD (what qemu_plugin_start_code() reports)
    for line in sh([prefix + "readelf", "-lW", binary]).splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and "E" in f[6:-1]:
            return int(f[2], 16)
    sys.exit("no executable segment in " + binary)


def kernel_names(build):
    names = set()
    for obj in kernel_objects(build):
        for line in sh(["nm", "-C", "--defined-only", obj]).splitlines():
            m = re.match(r"[0-9a-f]+ [TtWw] (.*)$", line)
            if m:
                names.add(m.group(1))
    return names


def callgrind_costs(path, kernel):
    """(total Ir, Ir inside functions named in `kernel`) of a callgrind output file (self cost: a
    cost line right after calls= is the callee's inclusive cost and is skipped)."""
    names, fn, total, inside, skip = {}, None, 0, 0, False
    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                m = re.match(r"fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                fn = names.get(m.group(1))
            elif line.startswith("cfn="):
                m = re.match(r"cfn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
            elif line.startswith("calls="):
                skip = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    ir = int(parts[1])
                    total += ir
                    if fn in kernel:
                        inside += ir
    return total, inside


class Arch:
    def __init__(self, name, build, isas):
        self.name, self.build, self.isas = name, build, isas
        self.binary = os.path.join(build, "bin/moelite")


class Aarch64(Arch):
    def __init__(self):
        super().__init__("aarch64", "build-aarch64", ["scalar", "neon", "dotprod", "i8mm"])
        pre = "aarch64-linux-gnu-"
        rel = exec_segment(self.binary, pre)
        self.plugin_args = "rel=%#x" % rel + "".join(",lo=%#x,hi=%#x" % r for r in text_ranges(self.build, self.binary, pre))
        self.emulator = "qemu-aarch64 (QEMU_CPU=max) + insn_count plugin"

    def env(self, isa):
        return dict(os.environ, QEMU_CPU="max", MOELITE_ISA=isa)

    def info(self, isa, model):
        return sh(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", self.binary, "info", "-m", model, "-t", "1"],
                  self.env(isa))

    def count(self, isa, args):
        out = os.path.join(WORK, "runs", "a64.txt")
        plugin = os.path.abspath(os.path.join(WORK, "insn_count.so"))
        sh(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-plugin", "%s,out=%s,%s" % (plugin, out, self.plugin_args),
            self.binary] + args, self.env(isa))
        f = open(out).read().split()
        return int(f[1]), int(f[3])


class X86(Arch):
    def __init__(self):
        super().__init__("x86-64", "build", ["scalar", "avx2", "avx512"])
        self.kernel = kernel_names(self.build)
        self.emulator = "valgrind --tool=callgrind (Ir)"

    def env(self, isa):
        return dict(os.environ, MOELITE_ISA=isa)

    def info(self, isa, model):  # under valgrind: its virtual CPU (no AVX-512) picks the table
        return sh(["valgrind", "--tool=none", "-q", self.binary, "info", "-m", model, "-t", "1"], self.env(isa))

    def count(self, isa, args):
        out = os.path.join(WORK, "runs", "x86.callgrind")
        sh(["valgrind", "--tool=callgrind", "--collect-atstart=yes", "--callgrind-out-file=" + out, self.binary] + args,
           self.env(isa))
        return callgrind_costs(out, self.kernel)


def field(info, key):
    m = re.search(r"^%s\s+(.*)$" % key, info, re.M)
    return m.group(1).strip() if m else None


def bench(model, p, n):
    return ["bench", "-m", model, "-t", "1", "-p", str(p), "-n", str(n), "-r", "1", "--no-warmup", "--no-membw"]


arches = ([Aarch64()] if os.environ["A64"] == "1" else []) + ([X86()] if os.environ["X86"] == "1" else [])
rows, notes = [], []
for arch in arches:
    tables = []  # (requested, used) with duplicates removed
    for isa in arch.isas:
        used = re.search(r"\((\w+)\)", field(arch.info(isa, models[0]), "backend")).group(1)
        if used != isa:
            notes.append("%s: MOELITE_ISA=%s runs the %s table (not in this build/CPU%s)" %
                         (arch.name, isa, used, ", valgrind hides AVX-512" if isa == "avx512" else ""))
        if used not in [u for _, u in tables]:
            tables.append((isa, used))
    for model in models:
        info = arch.info("scalar", model)
        wtype, active = field(info, "expert_type"), int(field(info, "active_bytes_per_token"))
        for isa, used in tables:
            pf1, pf2 = arch.count(isa, bench(model, P, 0)), arch.count(isa, bench(model, 2 * P, 0))
            dc1, dc2 = arch.count(isa, bench(model, 8, N)), arch.count(isa, bench(model, 8, 2 * N))
            row = {"arch": arch.name, "isa": used, "model": os.path.basename(model), "type": wtype,
                   "active_weight_bytes_per_token": active,
                   "decode_insns_per_token": (dc2[0] - dc1[0]) / N,
                   "decode_kernel_insns_per_token": (dc2[1] - dc1[1]) / N,
                   "prefill_insns_per_token": (pf2[0] - pf1[0]) / P,
                   "prefill_kernel_insns_per_token": (pf2[1] - pf1[1]) / P}
            row["decode_insns_per_weight_byte"] = row["decode_insns_per_token"] / active
            row["decode_kernel_insns_per_weight_byte"] = row["decode_kernel_insns_per_token"] / active
            rows.append(row)
            print("  %-7s %-7s %-34s decode %9.0f  prefill %9.0f" % (arch.name, used, row["model"],
                  row["decode_insns_per_token"], row["prefill_insns_per_token"]), file=sys.stderr, flush=True)

# Table: per type and ISA, and each ISA's decode relative to the arch's scalar table.
print("\ninstructions per token (thousands; difference of two runs, -t 1; kernel = quant kernel objects)")
print("%-7s %-31s %-5s %-7s %7s %7s %7s %7s %6s %6s %6s" % ("arch", "model", "type", "isa", "decode", "kernel",
      "prefill", "kernel", "insn/B", "kern/B", "scalar"))
for r in rows:
    base = next((s for s in rows if s["arch"] == r["arch"] and s["model"] == r["model"] and s["isa"] == "scalar"), None)
    rel = r["decode_insns_per_token"] / base["decode_insns_per_token"] if base else float("nan")
    print("%-7s %-31s %-5s %-7s %7.0f %7.0f %7.0f %7.0f %6.2f %6.2f %6.2f" % (
        r["arch"], r["model"], r["type"], r["isa"], r["decode_insns_per_token"] / 1e3,
        r["decode_kernel_insns_per_token"] / 1e3, r["prefill_insns_per_token"] / 1e3,
        r["prefill_kernel_insns_per_token"] / 1e3, r["decode_insns_per_weight_byte"],
        r["decode_kernel_insns_per_weight_byte"], rel))
for n in notes:
    print("note: " + n)
elapsed = time.time() - t0
print("insn/B, kern/B: decode instructions (all, kernel) per active weight byte; scalar: decode relative to "
      "the scalar table; measured in %.0f s (+ %s s builds/models)" %
      (elapsed, os.environ["BUILD_S"]))
if os.environ["JSON"]:
    with open(os.environ["JSON"], "w") as f:
        json.dump({"method": {"prefill": "(I(bench -p %d -n 0) - I(-p %d -n 0)) / %d" % (2 * P, P, P),
                              "decode": "(I(bench -p 8 -n %d) - I(-p 8 -n %d)) / %d" % (2 * N, N, N),
                              "threads": 1, "counters": {a.name: a.emulator for a in arches}},
                   "notes": notes, "rows": rows, "seconds": elapsed}, f, indent=1)
    print("wrote " + os.environ["JSON"])
PY
