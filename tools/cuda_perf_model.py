#!/usr/bin/env python3
"""A performance model of the CUDA kernels that needs no GPU: what nvcc and ptxas say about each
product kernel, and what that predicts for a named GPU.

    python3 tools/cuda_perf_model.py [--arch 87] [--gpu orin,h200] [--json OUT] [--md OUT]
        [--baseline tools/cuda_perf_baseline.json] [--write-baseline]

For every matrix-product entry point of backends/cuda/kernels_gpu.cu (moelite_<kernel>_<type id>):
  - registers, spills and shared memory per thread block (`nvcc -cubin -Xptxas -v`), and the
    occupancy they allow on the named GPUs (resident warps per SM out of the maximum);
  - the instruction mix of its hot loop, from the PTX (`nvcc -ptx`): the innermost loop with the
    most dp4a, then multiply-adds, then instructions; its instructions per weight byte (a lane's iteration covers 8 weights per
    matrix: a 32-column step x kUnroll in the float kernels, a dp4a pair in the integer ones), and
    whether it holds dp4a (integer products) or mma (tensor cores);
  - for the bench-shaped decode (OLMoE shape, 4 layers, 8 experts of 1024 x 2048 a token) the
    bytes each launch moves and a predicted time per GPU: the larger of the bytes over the memory
    bandwidth and the hot loops' warp instructions over the SMs' issue rate (4 a clock).

With --baseline the run fails (exit 1) when a kernel's hot loop takes more than twice its
baseline instructions per byte, its occupancy falls below half the baseline's, it spills, or an
integer product's loop holds no dp4a: the CI check (ctest `cuda_perf_model`). --write-baseline
records the current numbers. Standard library only; needs nvcc (/usr/local/cuda/bin or PATH).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "backends", "cuda", "kernels_gpu.cu")

# Weight types by GGUF id: (name, block columns, block bytes).
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
         6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
         11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
         39: ("MXFP4", 32, 17)}

# Named GPUs: memory bandwidth (GB/s, what a copy reaches: the H200's as moelite bench measured it,
# Orin's the data sheet's), SMs, clock (GHz), and the SM's limits (threads, registers, shared
# memory in KB usable by blocks, blocks).
GPUS = {
    "h200": dict(arch=90, bandwidth=4100.0, sms=132, clock=1.98, threads=2048, regs=65536, smem=227, blocks=32),
    "orin": dict(arch=87, bandwidth=204.8, sms=16, clock=1.3, threads=1536, regs=65536, smem=163, blocks=16),
    "t4": dict(arch=75, bandwidth=320.0, sms=40, clock=1.59, threads=1024, regs=65536, smem=64, blocks=16),
}

THREADS_PER_BLOCK = 128  # the products' kMatmulWarps x 32


def nvcc():
    for c in (os.environ.get("CUDACXX"), "/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if c and os.path.exists(c):
            return c
    sys.exit("no nvcc (CUDA toolkit in /usr/local/cuda, or set CUDACXX)")


def compile_outputs(arch, tmp):
    base = [nvcc(), "-std=c++17", "-O3", "-I", ROOT, SOURCE]
    cubin = os.path.join(tmp, "k.cubin")
    ptx = os.path.join(tmp, "k.ptx")
    r = subprocess.run(base + ["-arch=sm_%d" % arch, "-cubin", "-Xptxas", "-v", "-o", cubin],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("nvcc -cubin failed:\n" + r.stderr[-4000:])
    p = subprocess.run(base + ["-arch=compute_%d" % arch, "-ptx", "-o", ptx], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("nvcc -ptx failed:\n" + p.stderr[-4000:])
    return r.stderr, open(ptx).read()


def parse_ptxas(text):
    """{entry: {registers, spill_bytes, smem}} from ptxas -v."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            out[current] = {"registers": 0, "spill_bytes": 0, "smem": 0}
            continue
        if not current:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[current]["spill_bytes"] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[current]["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            out[current]["smem"] = int(s.group(1)) if s else 0
    return out


def ptx_entries(ptx):
    """{entry: [instruction lines]} of the PTX, labels kept (as 'LABEL:')."""
    entries, name, body, depth = {}, None, [], 0
    for line in ptx.splitlines():
        m = re.match(r"\s*\.visible \.entry (\w+)\(", line) or re.match(r"\s*\.entry (\w+)\(", line)
        if m:
            name, body, depth = m.group(1), [], 0
            continue
        if name is None:
            continue
        depth += line.count("{") - line.count("}")
        s = line.strip()
        if s and not s.startswith("//") and not s.startswith(".") and s not in ("{", "}") and not s.startswith(")"):
            body.append(s)
        if depth == 0 and "}" in line and body:
            entries[name] = body
            name = None
    return entries


def hot_loop(body):
    """The product's inner loop: of the innermost loops, the one with the most dot products (dp4a,
    then float multiply-adds), then the most instructions: (its instructions, count by class)."""
    labels = {}
    for i, s in enumerate(body):
        m = re.match(r"(\$L\w+):$", s)
        if m:
            labels[m.group(1)] = i
    loops = []
    for j, s in enumerate(body):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L\w+);", s)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            loops.append((labels[m.group(1)], j))
    inner = [(i, j) for (i, j) in loops if not any(i < a and b < j for (a, b) in loops if (a, b) != (i, j))]
    if not inner:
        return [], {}
    def score(loop):
        ins = [s for s in body[loop[0]:loop[1] + 1] if not s.endswith(":")]
        return (sum("dp4a" in s for s in ins), sum(s.startswith(("fma.", "mad.")) for s in ins), len(ins))

    i, j = max(inner, key=score)
    ins = [s for s in body[i:j + 1] if not s.endswith(":")]
    mix = {
        "dp4a": sum("dp4a" in s for s in ins),
        "mma": sum(s.startswith(("mma", "wmma")) or " mma." in s for s in ins),
        "fma_f32": sum(re.search(r"\bfma\.rn\.f32\b", s) is not None for s in ins),
        "cvt_f16": sum(re.search(r"\bcvt\.[\w.]*f16", s) is not None for s in ins),
        "ld_shared": sum(s.startswith(("ld.shared", "@")) and "ld.shared" in s for s in ins),
        "ld_global": sum("ld.global" in s for s in ins),
    }
    return ins, mix


def kernel_of(entry):
    m = re.match(r"moelite_(\w+?)_(\d+)$", entry)
    return (m.group(1), int(m.group(2))) if m else (None, None)


def occupancy(k, gpu):
    """Resident warps per SM / the SM's maximum, from registers, shared memory and threads."""
    regs_per_warp = ((max(k["registers"], 1) * 32 + 255) // 256) * 256
    warps_per_block = THREADS_PER_BLOCK // 32
    by_regs = (gpu["regs"] // regs_per_warp) // warps_per_block
    by_smem = (gpu["smem"] * 1024) // (k["smem"] + 1024) if k["smem"] else gpu["blocks"]
    by_threads = gpu["threads"] // THREADS_PER_BLOCK
    blocks = max(0, min(by_regs, by_smem, by_threads, gpu["blocks"]))
    return blocks * warps_per_block / (gpu["threads"] // 32)


# The bench-shaped decode (docs/gpu-notes.md): per token and layer 8 experts' gate/up (fused,
# 2 x 1024 x 2048) and down (2048 x 1024) in one grouped launch each.
DECODE_LAUNCHES = [("grouped_gate_up_q_vec_kernel", 8 * 2 * 1024, 2048), ("grouped_matmul_q_vec_kernel", 8 * 2048, 1024),
                   ("grouped_gate_up_vec_kernel", 8 * 2 * 1024, 2048), ("grouped_matmul_vec_kernel", 8 * 2048, 1024)]


def model(arch, gpus):
    with tempfile.TemporaryDirectory() as tmp:
        ptxas, ptx = compile_outputs(arch, tmp)
    res, entries = parse_ptxas(ptxas), ptx_entries(ptx)
    rows = []
    for entry in sorted(res):
        kernel, tid = kernel_of(entry)
        if kernel is None or "matmul" not in kernel and "gate_up" not in kernel:
            continue
        name, bcols, bbytes = TYPES[tid]
        matrices = 2 if "gate_up" in kernel else 1
        tokens = 1 if kernel.endswith("_vec_kernel") else 8
        ins, mix = hot_loop(entries.get(entry, []))
        # nvcc may unroll the loop: its body holds as many of a lane's iterations as its dot
        # products say (an integer iteration: 2 dp4a per matrix and token; a float one: 8 fma).
        per_iteration = (2 if "_q_" in kernel else 8) * matrices * tokens
        unrolled = max(1, round((mix.get("dp4a", 0) if "_q_" in kernel else mix.get("fma_f32", 0)) / per_iteration))
        lane_bytes = unrolled * 8 * matrices * bbytes / bcols  # a lane's weight bytes per pass of the loop
        row = dict(entry=entry, kernel=kernel, type=name, integer="_q_" in kernel, tokens=tokens, **res[entry],
                   loop_instructions=len(ins), unrolled=unrolled,
                   instructions_per_byte=round(len(ins) / lane_bytes, 3), **mix)
        row["occupancy"] = {g: round(occupancy(res[entry], GPUS[g]), 3) for g in gpus}
        rows.append(row)
    predictions = []
    for kernel, n_rows, cols in DECODE_LAUNCHES:
        for tid, (name, bcols, bbytes) in TYPES.items():
            r = next((x for x in rows if x["kernel"] == kernel and x["type"] == name), None)
            if not r:
                continue
            weight_bytes = n_rows * cols * bbytes / bcols
            lane_iterations = n_rows * cols / 8 / (2 if "gate_up" in kernel else 1)
            warp_instructions = r["loop_instructions"] / r["unrolled"] * lane_iterations / 32
            for g in gpus:
                gpu = GPUS[g]
                t_mem = weight_bytes / (gpu["bandwidth"] * 1e3)  # microseconds
                t_issue = warp_instructions / (gpu["sms"] * 4 * gpu["clock"] * 1e3)
                predictions.append(dict(gpu=g, kernel=kernel, type=name, weight_mb=round(weight_bytes / 1e6, 2),
                                        memory_us=round(t_mem, 2), issue_us=round(t_issue, 2),
                                        predicted_us=round(max(t_mem, t_issue), 2),
                                        bound="memory" if t_mem >= t_issue else "issue",
                                        occupancy=r["occupancy"][g]))
    return rows, predictions


def markdown(arch, rows, predictions, gpus):
    out = ["### Product kernels, sm_%d (nvcc -cubin -Xptxas -v, -ptx)" % arch, "",
           "| kernel | type | regs | spills | smem | hot-loop instr. | instr./weight byte | dp4a | mma | cvt.f16 | "
           + " | ".join("occupancy %s" % g for g in gpus) + " |",
           "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(gpus)]
    for r in rows:
        out.append("| %s | %s | %d | %d | %d | %d | %.2f | %d | %d | %d | %s |" % (
            r["kernel"], r["type"], r["registers"], r["spill_bytes"], r["smem"], r["loop_instructions"],
            r["instructions_per_byte"], r["dp4a"], r["mma"], r["cvt_f16"],
            " | ".join("%.2f" % r["occupancy"][g] for g in gpus)))
    out += ["", "### Predicted decode launches (bench shape: one token, 8 experts of 1024 x 2048)", "",
            "| GPU | kernel | type | weight MB | memory bound µs | issue bound µs | predicted µs | bound |",
            "|---|---|---|---|---|---|---|---|"]
    for p in predictions:
        out.append("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %s |" % (
            p["gpu"], p["kernel"], p["type"], p["weight_mb"], p["memory_us"], p["issue_us"], p["predicted_us"],
            p["bound"]))
    return "\n".join(out) + "\n"


def check(rows, baseline):
    failures = []
    base = {r["entry"]: r for r in baseline["kernels"]}
    for r in rows:
        if r["spill_bytes"]:
            failures.append("%s spills %d bytes" % (r["entry"], r["spill_bytes"]))
        if r["integer"] and r["dp4a"] == 0:
            failures.append("%s: an integer product whose hot loop holds no dp4a" % r["entry"])
        b = base.get(r["entry"])
        if not b:
            continue
        if b["instructions_per_byte"] and r["instructions_per_byte"] > 2 * b["instructions_per_byte"]:
            failures.append("%s: %.2f instructions per weight byte, more than twice the baseline's %.2f" % (
                r["entry"], r["instructions_per_byte"], b["instructions_per_byte"]))
        for g, occ in r["occupancy"].items():
            if g in b["occupancy"] and occ < 0.5 * b["occupancy"][g]:
                failures.append("%s: occupancy %.2f on %s, below half the baseline's %.2f" % (
                    r["entry"], occ, g, b["occupancy"][g]))
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=87, help="the architecture compiled (87: Jetson Orin)")
    ap.add_argument("--gpu", default="orin,h200", help="named GPUs to predict for: " + ",".join(GPUS))
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--baseline")
    ap.add_argument("--write-baseline", action="store_true")
    a = ap.parse_args()
    gpus = [g for g in a.gpu.split(",") if g]
    for g in gpus:
        if g not in GPUS:
            ap.error("unknown GPU %r (known: %s)" % (g, ", ".join(GPUS)))
    rows, predictions = model(a.arch, gpus)
    if not rows:
        sys.exit("no product kernels found in the compiled output")
    report = dict(arch=a.arch, gpus={g: GPUS[g] for g in gpus}, kernels=rows, decode_predictions=predictions)
    md = markdown(a.arch, rows, predictions, gpus)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    print(md)
    if a.write_baseline:
        with open(a.baseline or os.path.join(ROOT, "tools", "cuda_perf_baseline.json"), "w") as f:
            json.dump(dict(arch=a.arch, kernels=[{k: r[k] for k in ("entry", "instructions_per_byte", "occupancy")}
                                                 for r in rows]), f, indent=1)
            f.write("\n")
        return 0
    if a.baseline:
        baseline = json.load(open(a.baseline))
        if baseline.get("arch") != a.arch:
            sys.exit("the baseline is for sm_%s, this run compiled sm_%d" % (baseline.get("arch"), a.arch))
        failures = check(rows, baseline)
        if failures:
            print("\n".join(["REGRESSIONS:"] + failures))
            return 1
        print("checked against %s: no kernel regressed" % a.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
