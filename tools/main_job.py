#!/usr/bin/env python3
"""The main job's demonstration (tools/run.sh): one prompt run twice on the shipped model, with
every expert in memory and with a 25 % expert budget (the rest read from the file as routing asks
for them), then side by side what each held and did, and whether the two computed the same thing.

    python3 tools/main_job.py [--model M] [--budget 25%] [--prompt TEXT] [-n N] [--bin build/bin/moelite]

Measured here, not assumed: the peak RSS of each whole process (wait4's ru_maxrss; both on the
backend `moelite info` chooses, named so that the others are not probed), the expert
memory and the store's hit rate and reads (the CLI's statistics lines), decode tok/s of the run,
and the logits of the prompt and answer from both (`moelite logits`), compared byte for byte.
Standard library only (Debian's python3, any other 3.9+)."""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_measured(argv):
    """Runs argv; returns (stdout, stderr, peak RSS in bytes) or exits with its error."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
    if proc.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s" % (" ".join(argv), proc.returncode, stderr))
    return stdout, stderr, usage.ru_maxrss * 1024


def generation(a, budget):
    argv = [a.bin, "run", "-m", a.model, "-p", a.prompt, "-n", str(a.n), "--seed", "1", "--backend", a.backend]
    if budget:
        argv += ["--budget", budget]
    text, stderr, rss = run_measured(argv)
    stats = re.search(r"generated (\d+) tokens ([\d.]+) tok/s", stderr)
    experts = re.search(r"\[experts: (.*)\]", stderr)
    if not stats or not experts:
        sys.exit("unexpected output of moelite run:\n" + stderr)
    row = {"text": text, "rss": rss, "tok_s": float(stats.group(2)), "line": experts.group(1)}
    m = re.search(r"(\d+) of (\d+) in memory \(([\d.]+) of ([\d.]+) MiB\) \| hit rate ([\d.]+) \| ([\d.]+) MB", row["line"])
    if m:
        row.update(held="%s MiB (%s of %s experts)" % (m.group(3), m.group(1), m.group(2)), hit=m.group(5),
                   read="%s MB" % m.group(6))
    else:
        m = re.search(r"all (\d+) in memory \(([\d.]+) MiB\)", row["line"])
        row.update(held="%s MiB (all %s experts)" % (m.group(2), m.group(1)), hit="1 (all resident)", read="0")
    return row


def logits(a, tokens, budget, path):
    argv = [a.bin, "logits", "-m", a.model, "--tokens", ",".join(tokens), "--out", path, "--backend", a.backend]
    if budget:
        argv += ["--budget", budget]
    run_measured(argv)
    with open(path, "rb") as f:
        return f.read()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf"))
    p.add_argument("--budget", default="25%")
    p.add_argument("--prompt", default="The open() function returns")
    p.add_argument("-n", type=int, default=48)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "moelite"))
    a = p.parse_args()

    info, _, _ = run_measured([a.bin, "info", "-m", a.model])
    facts = dict(line.split(None, 1) for line in info.splitlines() if len(line.split(None, 1)) == 2)
    # The backend auto chose, named in the runs: probing the others (a CPU Vulkan driver such as
    # lavapipe loads tens of MiB) would count in the RSS of a run that does not use them.
    a.backend = facts["backend"].split()[0]
    print("model   %s: %s, %s layers x %s experts (top-%s), context %s" % (
        os.path.basename(a.model), facts["arch"], facts["n_layers"], facts["n_experts"], facts["n_experts_used"],
        facts["n_ctx_train"]))
    print("        %.1f MiB of experts, %.1f MiB of dense weights, on %s" % (
        int(facts["expert_bytes"]) / 1048576, int(facts["dense_bytes"]) / 1048576, facts["backend"]))
    print("prompt  %s\n" % a.prompt)

    resident = generation(a, None)
    budgeted = generation(a, a.budget)
    for name, row in (("every expert in memory", resident), ("a %s expert budget" % a.budget, budgeted)):
        print("--- %s ---\n%s%s" % (name, a.prompt, row["text"].rstrip("\n")))
        print()

    tokens, _, _ = run_measured([a.bin, "tokenize", "-m", a.model, "-p", a.prompt + resident["text"]])
    tokens = tokens.split()
    with tempfile.TemporaryDirectory() as tmp:
        same_logits = logits(a, tokens, None, os.path.join(tmp, "resident.f32")) == \
            logits(a, tokens, a.budget, os.path.join(tmp, "budget.f32"))

    rows = [("expert memory held", resident["held"], budgeted["held"]),
            ("peak RSS, whole process", "%.1f MiB" % (resident["rss"] / 1048576), "%.1f MiB" % (budgeted["rss"] / 1048576)),
            ("decode tok/s (this run)", "%.1f" % resident["tok_s"], "%.1f" % budgeted["tok_s"]),
            ("expert hit rate", resident["hit"], budgeted["hit"]),
            ("read from the file per token", resident["read"], budgeted["read"])]
    width = max(len(r[0]) for r in rows) + 2
    col = max(len(r[1]) for r in rows) + 3
    print("%-*s%-*s%s" % (width, "", col, "resident", "%s budget" % a.budget))
    for r in rows:
        print("%-*s%-*s%s" % (width, r[0], col, r[1], r[2]))
    same_text = resident["text"] == budgeted["text"]
    print("%-*s%s" % (width, "the same text", "yes" if same_text else "NO"))
    print("%-*s%s" % (width, "the same logits",
                      ("yes, byte for byte (%d positions x %s)" % (len(tokens), facts["n_vocab"])) if same_logits
                      else "NO"))
    print("\nExact mode: a budget changes what is held and read, never what is computed. This model is tiny,\n"
          "so the runtime is much of each RSS; in a real model's the experts are most of it.\n"
          "Speed: moelite bench -m MODEL [--budget 25%] (median of 3 runs, spread, bounds).")
    return 0 if same_text and same_logits else 1


if __name__ == "__main__":
    sys.exit(main())
