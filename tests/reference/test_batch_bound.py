"""tools/batch_bound.py on routing traces small enough to work out by hand (in the comments): the
steps of several sequences, the warm-up pass, LRU and Belady's bound, per layer and global."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "tools", "batch_bound.py")
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "batch-bound")


def write_trace(name, routing, n_layers, n_experts):
    """routing[token][layer] = the token's experts in that layer."""
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(json.dumps({"n_layers": n_layers, "n_experts": n_experts, "top_k": len(routing[0][0])}) + "\n")
        for t, layers in enumerate(routing):
            for layer, experts in enumerate(layers):
                f.write(json.dumps({"token": t, "layer": layer, "experts": experts,
                                    "weights": [1.0 / len(experts)] * len(experts)}) + "\n")
    return path


def bound(path, *args):
    r = subprocess.run([sys.executable, TOOL, path, "--json", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {row["n_seq"]: row for row in json.loads(r.stdout)["rows"]}


def test_alternating_experts_are_shared_by_two_sequences():
    # One layer, tokens routed to 0, 1, 0, 1; one slot. One sequence: LRU loads at every step (1 per
    # token); Belady computes 0 without keeping it and keeps 1, so only the two visits of 0 load
    # (0.5). Two sequences (tokens 0,1 and 2,3) step {0}, {1}: LRU loads once a step, each load
    # serving two tokens (0.5); Belady keeps 0 and loads 1 once (at the last step: 1 / 4 tokens).
    # Two slots hold both experts after the warm-up pass: nothing loads.
    path = write_trace("alternating.jsonl", [[[0]], [[1]], [[0]], [[1]]], 1, 4)
    rows = bound(path, "--capacity", "1", "--n-seq", "1,2")
    assert rows[1]["steps"] == 4 and rows[2]["steps"] == 2
    assert (rows[1]["lru_loads_per_token"], rows[1]["belady_loads_per_token"]) == (1.0, 0.5)
    assert (rows[2]["lru_loads_per_token"], rows[2]["belady_loads_per_token"]) == (0.5, 0.25)
    assert rows[2]["lru_fewer_than_first"] == 2.0 and rows[2]["belady_fewer_than_first_lru"] == 4.0
    rows = bound(path, "--capacity", "50%", "--n-seq", "1")  # 50 % of 4 experts: 2 slots
    assert rows[1]["lru_loads_per_token"] == 0.0 and rows[1]["belady_loads_per_token"] == 0.0


def test_belady_keeps_what_is_used_soonest_where_lru_misses_every_time():
    # One layer, a cycle 0 1 2 0 1 2 through two slots. LRU always evicts the expert needed next:
    # 6 loads in the counted pass (1 per token). Belady keeps 0 and 1 and computes 2 without
    # keeping it: in the counted pass only the two visits of 2 load (2 / 6).
    path = write_trace("cycle.jsonl", [[[e]] for e in (0, 1, 2, 0, 1, 2)], 1, 3)
    row = bound(path, "--capacity", "2", "--n-seq", "1")[1]
    assert row["lru_loads_per_token"] == 1.0
    assert row["belady_loads_per_token"] == round(2 / 6, 4)
    assert row["belady_fewer_than_first_lru"] == 3.0


def test_a_step_larger_than_the_cache_is_computed_whole_and_layers_share_a_global_pool():
    # Two layers; token t routes layer 0 to expert t % 3 and layer 1 to expert 0. Three sequences
    # (tokens 0-1, 2-3, 4-5) step {0, 1, 2} twice in layer 0 and {0} in layer 1. One slot per layer:
    # layer 0's three experts all run, one stays and hits at the next step, two load; layer 1's
    # stays: 2 loads per 3 tokens, under either policy.
    routing = [[[t % 3], [0]] for t in range(6)]
    path = write_trace("wide.jsonl", routing, 2, 3)
    rows = bound(path, "--capacity", "1", "--n-seq", "3")
    assert rows[3]["steps"] == 2
    assert rows[3]["lru_loads_per_token"] == round(2 / 3, 4) and rows[3]["belady_loads_per_token"] == round(2 / 3, 4)
    # One global pool of 2 slots: the layers compete. LRU keeps two of layer 0's experts after its
    # step, so layer 1's expert loads, and then keeps it and one of layer 0's: 2 + 1 loads a step
    # (1 per token). Belady keeps layer 1's expert, used next, and one of layer 0's: 2 loads a step.
    rows = bound(path, "--capacity", "2", "--global", "--n-seq", "3")
    assert rows[3]["lru_loads_per_token"] == 1.0 and rows[3]["belady_loads_per_token"] == round(2 / 3, 4)


def test_bad_arguments_are_refused_with_a_reason():
    path = write_trace("small.jsonl", [[[0]], [[1]]], 1, 2)
    r = subprocess.run([sys.executable, TOOL, path, "--capacity", "1", "--n-seq", "3"], capture_output=True, text=True)
    assert r.returncode != 0 and "outside 1..2" in r.stderr
    r = subprocess.run([sys.executable, TOOL, path, "--capacity", "0"], capture_output=True, text=True)
    assert r.returncode != 0 and "below one expert" in r.stderr
