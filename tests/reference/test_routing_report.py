"""tools/routing_report.py on a model whose routing is known by construction: with all-zero
routers every expert gets the same probability, so the stable top-k always picks experts
0..k-1 and every statistic has a closed form."""
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
import routing_report  # noqa: E402
from moelite_gguf.reader import GGUFReader  # noqa: E402

TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "routing")


def test_zero_router_gives_closed_form_statistics():
    os.makedirs(TMP, exist_ok=True)
    src = os.path.join(TMP, "base.gguf")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_tiny_model.py"), "--arch", "olmoe",
                    "--type", "F32", "--n-layer", "3", "--n-expert", "8", "--n-expert-used", "2", "--out", src,
                    "--quiet"], check=True)
    dst = os.path.join(TMP, "zero-router.gguf")
    shutil.copyfile(src, dst)
    r = GGUFReader(src)
    data = bytearray(open(dst, "rb").read())
    for il in range(3):
        t = r.tensors["blk.%d.ffn_gate_inp.weight" % il]
        data[t["offset"]:t["offset"] + t["nbytes"]] = bytes(t["nbytes"])
    open(dst, "wb").write(bytes(data))

    rep = routing_report.report(dst, list(range(1, 41)), ctx=16)
    assert rep["chance_recall"] == 2 / 8
    for row in rep["layers"]:
        assert math.isclose(row["usage_entropy"], math.log(2) / math.log(8), rel_tol=1e-9)
        assert math.isclose(row["usage_max_share"], 0.5)
        assert row["usage_min_share"] == 0.0
        assert math.isclose(row["distinct_sets_share"], 1 / 40)
        assert math.isclose(row["top1_weight_mean"], 1 / 8)  # olmoe: weights not renormalised
        if "next_gate_recall" in row:
            assert row["next_gate_recall"] == 1.0  # the next router is just as constant
            assert -1.0 <= row["cos_next_hidden"] <= 1.0
