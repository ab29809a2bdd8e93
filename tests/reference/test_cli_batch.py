"""`moelite batch`: JSON-lines requests decoded together. A request's output must not depend on what
it was batched with (its logits are those of running it alone and its sampler is seeded from --seed
and its line), so the results of --n-seq 4 must equal those of --n-seq 1 line for line, and a
request's text must equal `moelite run` on the same prompt with the same seed. Bad lines are
answered in place; results come out in input order. Also `moelite bench --n-seq`'s JSON."""
import json
import math
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "cli-batch")
MODEL = os.path.join(ROOT, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")

REQUESTS = [
    {"id": "first", "prompt": "def fibonacci(n):", "max_tokens": 24},
    {"id": 7, "prompt": "import os\n", "max_tokens": 5},
    {"prompt": "The Python standard library", "max_tokens": 40},
    "this line is not JSON",
    {"id": "chat", "messages": [{"role": "user", "content": "What is a list comprehension?"}], "max_tokens": 16},
    {"id": "no prompt", "max_tokens": 3},
    {"id": "zero", "prompt": "x", "max_tokens": 0},
    {"id": "last", "prompt": "class Point:\n    def __init__(self", "max_tokens": 30},
]


def write_requests():
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "requests.jsonl")
    with open(path, "w") as f:
        for r in REQUESTS:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n\n")  # blank lines are skipped
    return path


def batch(n_seq, *extra):
    out = os.path.join(TMP, "out-%d.jsonl" % n_seq)
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", write_requests(), "-o", out, "--n-seq", str(n_seq),
                        "-c", "256", "-b", "16", "--temp", "0.8", "--seed", "11", *extra], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "requests" in r.stderr
    return [json.loads(line) for line in open(out)]


def test_results_do_not_depend_on_the_batch():
    one, four = batch(1), batch(4)
    assert one == four
    assert [r["index"] for r in four] == list(range(len(REQUESTS)))
    assert [r.get("id") for r in four] == ["first", 7, None, None, "chat", "no prompt", "zero", "last"]
    assert "error" in four[3] and "line 4" in four[3]["error"]
    assert "error" in four[5] and "prompt" in four[5]["error"]
    assert four[6]["generated_tokens"] == 0 and four[6]["text"] == ""
    assert four[1]["generated_tokens"] <= 5
    for r in (four[0], four[2], four[4], four[7]):
        assert r["stop"] in ("end", "length") and 0 < r["generated_tokens"]
        assert r["generated_tokens"] <= REQUESTS[r["index"]]["max_tokens"]
        assert (r["stop"] == "length") == (r["generated_tokens"] == REQUESTS[r["index"]]["max_tokens"])


def test_a_request_equals_moelite_run():
    results = batch(4)
    # Request 0 has the sampler seed 11 + 0: the same draws as `run --seed 11`.
    r = subprocess.run([BIN, "run", "-m", MODEL, "-t", "2", "-p", REQUESTS[0]["prompt"], "-n", "24", "--temp", "0.8",
                        "--seed", "11"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == results[0]["text"]


def test_stop_strings_cut_the_text():
    results = batch(2, "--stop", "(")
    for r in results:
        if "text" in r:
            assert "(" not in r["text"]
    assert any(r.get("stop") == "stop" for r in results)


def test_a_request_sets_its_own_sampling():
    """A request line's temperature, top_k, top_p, min_p, seed and stop apply to it (each equals
    `moelite run` with those options); wrong types, out-of-range values and unknown fields are errors
    naming the field. Before, "temperature": "hot" and any other field but the prompt's were ignored."""
    os.makedirs(TMP, exist_ok=True)
    prompt = "def fibonacci(n):"
    lines = [{"id": "greedy", "prompt": prompt, "max_tokens": 12, "temperature": 0},
             {"id": "seeded", "prompt": prompt, "max_tokens": 12, "temperature": 1.2, "top_k": 20, "top_p": 0.9,
              "min_p": 0.02, "seed": 99},
             {"id": "stopped", "prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": ["(", ":"]},
             {"id": "hot", "prompt": prompt, "temperature": "hot"},
             {"id": "typo", "prompt": prompt, "max_token": 5},
             {"id": "nul", "prompt": prompt, "stop": ["a\u0000"]},
             {"id": "k", "prompt": prompt, "top_k": 2.5}]
    path, out = os.path.join(TMP, "sampling.jsonl"), os.path.join(TMP, "sampling-out.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", path, "-o", out, "--n-seq", "2", "--temp", "0.8",
                        "--seed", "11"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    results = {x["id"]: x for x in map(json.loads, open(out))}

    def run(*opts):
        rr = subprocess.run([BIN, "run", "-m", MODEL, "-t", "2", "-p", prompt, "-n", "12", *opts], capture_output=True,
                            text=True, timeout=120)
        assert rr.returncode == 0, rr.stderr
        return rr.stdout

    assert results["greedy"]["text"] == run("--temp", "0")
    assert results["seeded"]["text"] == run("--temp", "1.2", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.02",
                                            "--seed", "99")
    assert results["stopped"]["text"] == run("--temp", "0", "--stop", "(", "--stop", ":")
    assert "temperature" in results["hot"]["error"]
    assert "unknown field" in results["typo"]["error"] and "max_token" in results["typo"]["error"]
    assert "stop" in results["nul"]["error"] and "top_k" in results["k"]["error"]


def test_bad_arguments():
    for args, message in ((["--n-seq", "0"], "--n-seq"), (["--n-seq", "257"], "--n-seq"), ([], "-f")):
        full = [BIN, "batch", "-m", MODEL, *args] + ([] if "-f" == message else ["-f", write_requests()])
        r = subprocess.run(full, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_bench_reports_all_sequences():
    r = subprocess.run([BIN, "bench", "-m", MODEL, "-t", "2", "-p", "8", "-n", "4", "--n-seq", "3", "--no-membw",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["n_seq"] == 3
    assert abs(d["decode_tok_s_per_seq"] * 3 - d["decode_tok_s"]) < 1e-2 * d["decode_tok_s"]


def test_run_reuses_a_saved_session():
    session = os.path.join(TMP, "run.session")
    if os.path.exists(session):
        os.remove(session)
    os.makedirs(TMP, exist_ok=True)
    args = [BIN, "run", "-m", MODEL, "-t", "2", "-p", "def fibonacci(n):\n    if n < 2:", "-n", "10", "--temp", "0",
            "--session", session]
    first = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "(0 cached)" in first.stderr and os.path.getsize(session) > 0
    second = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "restored" in second.stderr and "(0 cached)" not in second.stderr
    assert second.stdout == first.stdout  # the restored cache gives the same greedy answer
    with open(session, "r+b") as f:  # a corrupt session is an error, not a silent recompute
        f.seek(60)
        b = f.read(1)
        f.seek(60)
        f.write(bytes([b[0] ^ 0xFF]))
    bad = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "MOELITE_ERR_BAD_SESSION" in bad.stderr, bad.stderr


def test_chat_session_restores_the_conversation():
    """`moelite chat --session` keeps its conversation beside the session (FILE.chat.json): a second
    chat continues it, reuses the saved tokens, and answers as one chat of both turns does. Before,
    it said "N tokens restored" but formatted only the new message (4 tokens reused) and its save
    replaced the saved turns."""
    os.makedirs(TMP, exist_ok=True)
    session = os.path.join(TMP, "chat.session")
    for p in (session, session + ".chat.json"):
        if os.path.exists(p):
            os.remove(p)
    args = [BIN, "chat", "-m", MODEL, "-t", "2", "-n", "16", "--temp", "0"]
    turns = ["What does a dictionary do?\n", "And a list?\n"]
    first = subprocess.run(args + ["--session", session], input=turns[0], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    prompt1 = int(re.search(r"\[prompt (\d+) tokens", first.stderr).group(1))
    second = subprocess.run(args + ["--session", session], input=turns[1], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "conversation of 2 messages restored" in second.stderr, second.stderr
    cached = int(re.search(r"\((\d+) cached\)", second.stderr).group(1))
    assert cached > prompt1, second.stderr  # the first turn's prompt and answer, not just a few tokens
    whole = subprocess.run(args, input="".join(turns), capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0 and whole.stdout == first.stdout + second.stdout
    with open(session + ".chat.json") as f:
        saved = json.load(f)
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in saved["messages"][0::2]] == [t.strip() for t in turns]
    with open(session + ".chat.json", "w") as f:  # not a transcript: refused, never replaced
        f.write('{"notes": "mine"}')
    bad = subprocess.run(args + ["--session", session], input=turns[1], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "not a moelite chat transcript" in bad.stderr, bad.stderr
    with open(session + ".chat.json") as f:
        assert f.read() == '{"notes": "mine"}'


def model_info():
    r = subprocess.run([BIN, "info", "-m", MODEL, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


PLAN_ARGS = ["--budget", "auto", "--memory", "11MiB", "--budget-headroom", "1MiB", "--storage-gbs", "2"]


def test_plan_gives_each_sequence_kv_memory_the_experts_lose():
    """--n-seq auto with --budget auto: the planner splits the memory between the sequences' KV
    caches and the expert cache. Checked against the model's shape from its metadata: each
    sequence's cache is n_ctx x kv_bytes_per_token (all layers attend fully in this model), and
    every further sequence takes exactly that from the experts' budget, down to the store's
    minimum working set, below which a row does not fit."""
    info = model_info()
    kv = 256 * info["n_layers"] * 2 * info["n_head_kv"] * info["head_dim"] * 4
    assert kv == 256 * info["kv_bytes_per_token"]
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", write_requests(), "-c", "256", "-b", "16", "--plan",
                        *PLAN_ARGS], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["memory_bytes"] == 11 << 20 and plan["headroom_bytes"] == 1 << 20
    assert plan["kv_bytes_per_sequence"] == kv and plan["dense_bytes"] == info["dense_bytes"]
    rows = plan["rows"]
    assert [row["n_seq"] for row in rows] == list(range(1, 9))  # one per request line
    left = [plan["memory_bytes"] - plan["dense_bytes"] - plan["context_base_bytes"] - row["n_seq"] * kv -
            plan["headroom_bytes"] for row in rows]
    for row, room in zip(rows, left):
        assert row["kv_bytes"] == row["n_seq"] * kv
        minimum = info["expert_min_budget"] * (info["n_layers"] if row["allocation"] == "uniform" else 1)
        assert row["fits"] == (room >= minimum)
        if row["fits"]:
            assert row["expert_budget_bytes"] == room
    assert rows[0]["fits"] and not rows[-1]["fits"]
    chosen = rows[plan["n_seq"] - 1]
    assert chosen["fits"] and plan["expert_budget_bytes"] == chosen["expert_budget_bytes"]
    # The plan is the best predicted row, or the fewest sequences within 5 % of it.
    best = max(row["decode_tok_s"] for row in rows if row["fits"])
    assert chosen["decode_tok_s"] >= 0.95 * best
    assert all(row["decode_tok_s"] < 0.95 * best for row in rows[:plan["n_seq"] - 1] if row["fits"])


def test_a_planned_batch_runs_with_its_budget_and_stays_exact():
    out = os.path.join(TMP, "out-plan.jsonl")
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", write_requests(), "-o", out, "-c", "256", "-b", "16",
                        "--temp", "0.8", "--seed", "11", "--verbose", *PLAN_ARGS], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert " at once (of 8 requests" in r.stderr, r.stderr
    planned = [json.loads(line) for line in open(out)]
    assert planned == batch(1)  # resident, one at a time: the budget and the batch change nothing


def test_a_plan_that_cannot_fit_says_why():
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", write_requests(), "-c", "256", "--plan", "--budget", "auto",
                        "--memory", "3MiB", "--budget-headroom", "1MiB", "--storage-gbs", "2"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and r.stdout == ""
    assert "batch plan: 3145728 bytes of memory" in r.stderr and "dense weights" in r.stderr, r.stderr
    for args in (["--plan"], ["--memory", "1GiB"], ["--storage-gbs", "2"]):
        r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", write_requests(), "--n-seq", "2", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--n-seq auto" in r.stderr, r.stderr


def test_a_given_budget_gets_per_layer_pools_where_a_step_outgrows_one():
    """--budget 25% with --n-seq auto: the budget stays the user's, and rows whose decode step uses
    more experts than one global pool holds (L x E (1 - (1 - k/E)^n) of them, uniform routing)
    are planned with a pool per layer; the run loads with the plan's pools and stays exact."""
    info = model_info()
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", write_requests(), "-c", "256", "--plan", "--budget", "25%",
                        "--memory", "1GiB", "--storage-gbs", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    slot = info["expert_min_budget"] // (info["n_experts_used"] + 1)  # a share: its experts + the reserve
    experts = (info["n_layers"] - info["n_dense_layers"]) * info["n_experts"]
    assert plan["fixed_budget"] and plan["expert_budget_bytes"] == (1 + math.ceil(0.25 * experts)) * slot
    slots = plan["expert_budget_bytes"] // plan["slot_bytes"]
    E, k, L = info["n_experts"], info["n_experts_used"], info["n_layers"]
    for row in plan["rows"]:
        step = L * E * (1 - (1 - k / E) ** row["n_seq"])
        assert row["allocation"] == ("uniform" if step > slots - 1 else "global"), (row, step, slots)
    assert plan["rows"][0]["allocation"] == "global" and plan["rows"][-1]["allocation"] == "uniform"
    out = os.path.join(TMP, "out-plan-25.jsonl")
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", write_requests(), "-o", out, "-c", "256", "-b",
                        "16", "--temp", "0.8", "--seed", "11", "--budget", "25%", "--storage-gbs", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert ("%s pools" % plan["allocation"]) in r.stderr, r.stderr
    assert [json.loads(line) for line in open(out)] == batch(1)


def test_a_given_number_of_sequences_gets_its_pools():
    out = os.path.join(TMP, "out-n8-25.jsonl")
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", write_requests(), "-o", out, "--n-seq", "8", "-c",
                        "256", "-b", "16", "--temp", "0.8", "--seed", "11", "--budget", "25%"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # 8 tokens use about 4 x 16 x (1 - (7/8)^8) = 42 experts a step; 25 % holds 16.
    assert "uniform expert pools for 8 sequences" in r.stderr, r.stderr
    assert [json.loads(line) for line in open(out)] == batch(1)


def test_more_sequences_than_requests_decode_one_per_request():
    # 8 requests: --n-seq 16 makes 8 sequences (no KV caches for sequences that never run) and says so.
    out = os.path.join(TMP, "out-n16.jsonl")
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", write_requests(), "-o", out, "--n-seq", "16", "-c",
                        "256", "-b", "16", "--temp", "0.8", "--seed", "11"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "--n-seq 16 but 8 requests: decoding 8 sequences" in r.stderr, r.stderr
    assert [json.loads(line) for line in open(out)] == batch(1)


def test_a_given_number_of_sequences_plans_its_auto_budget_in_the_given_memory():
    # --n-seq 2 --budget auto --memory M: the budget is what M leaves after exactly two KV caches,
    # the dense weights and the headroom, so 2 MiB more memory is 2 MiB more for the experts; the
    # results stay those of the resident single-sequence run.
    experts = []
    for memory in ("10MiB", "8MiB"):
        out = os.path.join(TMP, "out-n2-mem.jsonl")
        r = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "-f", write_requests(), "-o", out, "--n-seq", "2",
                            "-c", "256", "-b", "16", "--temp", "0.8", "--seed", "11", "--budget", "auto", "--memory",
                            memory, "--budget-headroom", "1MiB"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "for 2 sequences" in r.stderr, r.stderr
        experts.append(float(re.search(r"experts get ([0-9.]+) MiB", r.stderr).group(1)))
        assert [json.loads(line) for line in open(out)] == batch(1)
    assert abs(experts[0] - experts[1] - 2.0) < 0.11, experts


def replayed_hit_share(trace, n, per_layer, capacity, n_layers, n_experts):
    """The planner's replay, written again from its description in core/serve/batch_plan.h: n copies of
    the trace started tokens/n apart, a step's layer reads the union of their experts (first
    sequence first), LRU; the second pass over the steps counts. Per-layer pools: each access's
    stack distance within its layer, hits interpolated between whole slots; one global pool: an
    LRU list of (layer, expert), none of a step's layer entry evicted while it loads."""
    tokens = sorted(trace)
    T = len(tokens)
    steps = []
    for s in range(min(T, 1024)):
        for layer in range(n_layers):
            union = []
            for i in range(n):
                for x in trace[tokens[(i * T // n + s) % T]].get(layer, []):
                    if x not in union:
                        union.append(x)
            steps.append((layer, union))
    if per_layer:
        lo = int(capacity)
        frac = capacity - lo
        hits = [0.0, 0.0]  # second pass, at lo and lo + 1 slots
        accesses = 0
        stacks = [[] for _ in range(n_layers)]
        for p in range(2):
            for layer, union in steps:
                st = stacks[layer]
                for x in union:
                    depth = st.index(x) if x in st else n_experts
                    if p == 1:
                        accesses += 1
                        hits[0] += depth < lo
                        hits[1] += depth < min(lo + 1, n_experts)
                stacks[layer] = list(reversed(union)) + [x for x in st if x not in union]
        return ((1 - frac) * hits[0] + frac * hits[1]) / accesses
    slots = int(capacity)
    if slots < max(len(u) for _, u in steps):
        return 0.0
    cache = []  # least recent first
    hits = accesses = 0
    for p in range(2):
        for layer, union in steps:
            for x in union:
                key = (layer, x)
                if key in cache:
                    cache.remove(key)
                    hits += p
                elif len(cache) >= slots:
                    cache.pop(next(i for i, k in enumerate(cache) if k[0] != layer or k[1] not in union))
                cache.append(key)
                accesses += p
    return hits / accesses


def test_a_routing_trace_plans_from_the_replayed_steps():
    """--plan-trace: the planner replays a trace `moelite trace record` wrote for this model. Every
    row's distinct experts and hit share equal the replay written again above, for both pool
    layouts (--budget 25%: the first rows have one global pool, the last a pool per layer)."""
    info = model_info()
    text = os.path.join(TMP, "trace-text.txt")
    os.makedirs(TMP, exist_ok=True)
    with open(os.path.join(ROOT, "tools", "train", "data", "heldout.txt"), encoding="utf-8") as f:
        with open(text, "w", encoding="utf-8") as out:
            out.write(f.read()[:1500])
    trace_path = os.path.join(TMP, "routing.trace")
    r = subprocess.run([BIN, "trace", "record", "-m", MODEL, "-t", "2", "-f", text, "--ctx", "64", "-o", trace_path],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    trace = {}
    for line in open(trace_path):
        e = json.loads(line)
        if "experts" in e:
            trace.setdefault(e["token"], {})[e["layer"]] = sorted(e["experts"])  # a trace's entries are sets
    L, E = info["n_layers"], info["n_experts"]
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", write_requests(), "-c", "256", "--plan", "--budget", "25%",
                        "--memory", "1GiB", "--storage-gbs", "2", "--plan-trace", trace_path],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["routing"] == "trace"
    slots = plan["expert_budget_bytes"] // plan["slot_bytes"]
    layouts = set()
    for row in plan["rows"]:
        per_layer = row["allocation"] == "uniform"
        layouts.add(per_layer)
        capacity = (slots - L) / L if per_layer else slots - 1
        want = replayed_hit_share(trace, row["n_seq"], per_layer, capacity, L, E)
        assert abs(row["hit_share"] - want) < 5e-5, (row, want)
    assert layouts == {False, True}
    # The shipped model reuses its experts from token to token: one sequence hits more than the
    # cache's share of the experts, which uniform routing predicts (0.26 against 0.20 here).
    assert plan["rows"][0]["hit_share"] > plan["rows"][0]["cache_share"], plan["rows"][0]
    # A profile and a trace together are refused; a missing trace is named.
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", write_requests(), "--plan", "--budget", "25%",
                        "--storage-gbs", "2", "--plan-trace", os.path.join(TMP, "none.trace")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "none.trace" in r.stderr, r.stderr


def test_a_plan_recorded_from_the_prompts_is_the_plan_of_their_trace():
    """--plan-record N: the batch records the routing of its requests' prompts (each from position
    0, one after another, N tokens at most) and plans from it. The plan equals the one from a trace
    `moelite trace record` wrote of the same prompts, joined in the same order and cut at N; under a
    budget (the recording loads the model at its smallest budget) and resident. The batch then runs
    as it would without it."""
    os.makedirs(TMP, exist_ok=True)
    with open(os.path.join(ROOT, "tools", "train", "data", "heldout.txt"), encoding="utf-8") as f:
        held = f.read()
    prompts = [held[:400], held[400:700]]
    requests = os.path.join(TMP, "record-requests.jsonl")
    with open(requests, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "max_tokens": 4}) + "\n")
    traces = []
    for i, p in enumerate(prompts):
        text, trace_path = os.path.join(TMP, "record-%d.txt" % i), os.path.join(TMP, "record-%d.trace" % i)
        with open(text, "w", encoding="utf-8") as f:
            f.write(p)
        r = subprocess.run([BIN, "trace", "record", "-m", MODEL, "-f", text, "--ctx", "256", "-o", trace_path],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        lines = open(trace_path).read().splitlines()
        traces.append((lines[0], [json.loads(line) for line in lines[1:]]))
    first = max(e["token"] for e in traces[0][1]) + 1

    def joined(limit):
        path = os.path.join(TMP, "record-joined-%d.trace" % limit)
        with open(path, "w") as f:
            f.write(traces[0][0] + "\n")
            for offset, (_, entries) in zip((0, first), traces):
                for e in entries:
                    if offset + e["token"] < limit:
                        f.write(json.dumps(dict(e, token=offset + e["token"])) + "\n")
        return path

    def plan(*extra):
        r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", requests, "-c", "256", "--plan", "--memory", "1GiB",
                            "--storage-gbs", "2", *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr

    for limit in (10000, first + 3):
        recorded, said = plan("--budget", "25%", "--plan-record", str(limit))
        assert "recorded the routing of %d tokens of 2 prompts" % min(limit, first + max(
            e["token"] for e in traces[1][1]) + 1) in said, said
        assert json.loads(recorded)["routing"] == "trace"
        assert recorded == plan("--budget", "25%", "--plan-trace", joined(limit))[0]
    recorded, _ = plan("--plan-record", "64")  # resident: recorded with the loaded model
    assert json.loads(recorded)["routing"] == "trace"
    assert recorded == plan("--plan-trace", joined(64))[0]

    out = os.path.join(TMP, "record-out.jsonl")
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", requests, "-c", "256", "-o", out, "--budget", "25%",
                        "--storage-gbs", "2", "--plan-record", "64"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ran = [json.loads(line) for line in open(out)]
    r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", requests, "-c", "256", "-o", out, "--n-seq", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ran == [json.loads(line) for line in open(out)]
    for bad in (["--plan-record", "0"], ["--plan-record", "8", "--n-seq", "2"],
                ["--plan-record", "8", "--plan-trace", joined(8)]):
        r = subprocess.run([BIN, "batch", "-m", MODEL, "-f", requests, *bad], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and "--plan-record" in r.stderr, (bad, r.stderr)


def test_results_are_valid_json_when_the_text_is_not_utf8():
    """A random-weight model emits byte tokens that form no UTF-8 character: each such byte is
    written as U+FFFD, so every result line is valid UTF-8 JSON."""
    os.makedirs(TMP, exist_ok=True)
    model = os.path.join(TMP, "random-qwen3moe.gguf")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_tiny_model.py"), "--arch", "qwen3moe",
                    "--type", "Q8_0", "--seed", "1", "--out", model, "--quiet"], check=True, timeout=300)
    requests = os.path.join(TMP, "random-requests.jsonl")
    with open(requests, "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": "def f(x):", "max_tokens": 48}) + "\n")
    out = os.path.join(TMP, "random-out.jsonl")
    r = subprocess.run([BIN, "batch", "-m", model, "-t", "2", "-f", requests, "-o", out, "--n-seq", "2",
                        "--temp", "1.0", "--seed", "1"], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with open(out, "rb") as f:
        lines = [json.loads(line.decode("utf-8")) for line in f]  # strict: raises on bytes that are not UTF-8
    assert len(lines) == 4
    assert any("\ufffd" in line["text"] for line in lines), "the case is not exercised"
