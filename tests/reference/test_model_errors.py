"""Bad model files reach the user as a specific status and message through the C API (here via
`moelite info`, which prints `moelite: error: loading PATH: STATUS: message`), never as a crash.

Each case starts from a valid generated model and changes one thing: the expected status is the one
the API documents for that defect (include/moelite.h).
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
from moelite_gguf import quants as Q  # noqa: E402
from moelite_gguf.reader import GGUFReader  # noqa: E402

sys.path.insert(0, HERE)
from gguf_edit import rewrite  # noqa: E402

PY = sys.executable
MAKE = os.path.join(ROOT, "tools", "make_tiny_model.py")
BIN = os.environ.get("MOELITE_BIN", os.path.join(ROOT, "build", "bin", "moelite"))
TMP = os.path.join(os.environ.get("MOELITE_TEST_TMP", "/tmp/moelite-ref-tests"), "errors")


def generated(arch, wtype):
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "base-%s-%s.gguf" % (arch, wtype))
    subprocess.run([PY, MAKE, "--arch", arch, "--type", wtype, "--seed", "5", "--out", path, "--quiet"], check=True)
    return path


@pytest.fixture(scope="module")
def base_model():
    return generated("qwen2moe", "Q4_K")


def load_error(path, *options):
    r = subprocess.run([BIN, "info", "-m", path, *options], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, "expected a load failure, got rc=%d\n%s%s" % (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Sanitizer" not in r.stderr
    return r.stderr


def out(name):
    return os.path.join(TMP, name + ".gguf")


def test_base_model_loads(base_model):
    r = subprocess.run([BIN, "info", "-m", base_model], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_missing_file():
    err = load_error(os.path.join(TMP, "does-not-exist.gguf"))
    assert "MOELITE_ERR_FILE_NOT_FOUND" in err and "does-not-exist.gguf" in err


def test_not_a_gguf():
    p = os.path.join(TMP, "text.gguf")
    open(p, "w").write("this is not a model\n")
    assert "MOELITE_ERR_GGUF_BAD_MAGIC" in load_error(p)


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_truncated_model(base_model, keep):
    p = out("truncated-%g" % keep)
    data = open(base_model, "rb").read()
    open(p, "wb").write(data[:int(len(data) * keep)])
    err = load_error(p)
    assert "MOELITE_ERR_GGUF_TRUNCATED" in err or "MOELITE_ERR_GGUF_OUT_OF_BOUNDS" in err


def test_unsupported_arch(base_model):
    p = rewrite(base_model, out("arch"), set_keys={"general.architecture": ("gptx", 8)})
    err = load_error(p)
    assert "MOELITE_ERR_UNSUPPORTED_ARCH" in err and "gptx" in err and "qwen3moe" in err


def test_dense_llama_is_rejected(base_model):
    r = GGUFReader(base_model)
    keys = {k: (v, r.value_types[k][0]) for k, v in r.metadata.items()
            if k.startswith("qwen2moe.") and r.value_types[k][0] != 9 and "expert" not in k}
    renamed = {"llama." + k[len("qwen2moe."):]: v for k, v in keys.items()}
    renamed["general.architecture"] = ("llama", 8)
    p = rewrite(base_model, out("dense-llama"), drop_keys=[k for k in r.metadata if k.startswith("qwen2moe.")],
                set_keys=renamed)
    err = load_error(p)
    assert "MOELITE_ERR_UNSUPPORTED_ARCH" in err and "expert" in err


def test_missing_tensor(base_model):
    p = rewrite(base_model, out("missing-tensor"), drop_tensors=["blk.1.ffn_up_exps.weight"])
    err = load_error(p)
    assert "MOELITE_ERR_MISSING_TENSOR" in err and "blk.1.ffn_up_exps.weight" in err


def test_wrong_shape(base_model):
    r = GGUFReader(base_model)
    ne = list(r.tensors["blk.0.attn_q.weight"]["ne"])
    p = rewrite(base_model, out("bad-shape"), reshape={"blk.0.attn_q.weight": [ne[0], ne[1] // 2]})
    err = load_error(p)
    assert "MOELITE_ERR_BAD_SHAPE" in err and "blk.0.attn_q.weight" in err


def test_unsupported_quant_type(base_model):
    # IQ4_XS (type 23, 136 bytes per 256 values) is a valid GGUF type moelite has no kernels for.
    Q.BLOCK.setdefault(23, (256, 136))
    Q.TYPE_NAMES.setdefault(23, "IQ4_XS")
    r = GGUFReader(base_model)
    ne = r.tensors["blk.0.ffn_gate_exps.weight"]["ne"]
    nb = int(np.prod(ne)) // 256 * 136
    p = rewrite(base_model, out("iq4xs"), retype={"blk.0.ffn_gate_exps.weight": (23, nb)})
    err = load_error(p)
    assert "MOELITE_ERR_UNSUPPORTED_TYPE" in err and "IQ4_XS" in err


@pytest.mark.parametrize("key", ["qwen2moe.block_count", "qwen2moe.expert_count",
                                 "qwen2moe.attention.layer_norm_rms_epsilon"])
def test_missing_metadata(base_model, key):
    p = rewrite(base_model, out("no-" + key), drop_keys=[key])
    err = load_error(p)
    assert "MOELITE_ERR_MISSING_METADATA" in err and key in err


def test_inconsistent_metadata(base_model):
    # More experts used per token than exist.
    p = rewrite(base_model, out("k-too-large"), set_keys={"qwen2moe.expert_used_count": (99, 4)})
    err = load_error(p)
    assert "MOELITE_ERR_BAD_METADATA" in err and "expert_used_count" in err


def test_user_file_is_untouched_after_failure(base_model):
    p = out("untouched")
    shutil.copyfile(base_model, p)
    data = open(p, "rb").read()
    with open(p, "r+b") as f:  # make it unloadable: cut the last tensor short
        f.truncate(len(data) - 100)
    before = open(p, "rb").read()
    load_error(p)
    assert open(p, "rb").read() == before


@pytest.mark.parametrize("keys,status,word", [
    ({"rope.scaling.type": ("yarn", 8), "rope.scaling.factor": (0.5, 6)}, "MOELITE_ERR_BAD_METADATA", "factor"),
    ({"rope.scaling.type": ("longrope", 8), "rope.scaling.factor": (4.0, 6)}, "MOELITE_ERR_UNSUPPORTED_ARCH",
     "longrope"),
    ({"rope.scaling.type": ("yarn", 8), "rope.scaling.factor": (4.0, 6), "rope.scaling.yarn_beta_fast": (-1.0, 6)},
     "MOELITE_ERR_BAD_METADATA", "beta"),
])
def test_bad_rope_scaling(base_model, keys, status, word):
    """rope.scaling is read for every architecture: a factor below 1, an unknown type and a negative
    YaRN beta are refused, not turned into NaN angles."""
    p = rewrite(base_model, out("rope-" + word), set_keys={"qwen2moe." + k: v for k, v in keys.items()})
    err = load_error(p)
    assert status in err and word in err


@pytest.fixture(scope="module")
def gpt_oss_model():
    return generated("gpt-oss", "Q8_0")


def test_gpt_oss_needs_its_window_and_sinks(gpt_oss_model):
    err = load_error(rewrite(gpt_oss_model, out("gpt-oss-no-window"), drop_keys=["gpt-oss.attention.sliding_window"]))
    assert "MOELITE_ERR_MISSING_METADATA" in err and "sliding_window" in err
    err = load_error(rewrite(gpt_oss_model, out("gpt-oss-no-sinks"), drop_tensors=["blk.1.attn_sinks.weight"]))
    assert "MOELITE_ERR_MISSING_TENSOR" in err and "attn_sinks" in err
    err = load_error(rewrite(gpt_oss_model, out("gpt-oss-no-bias"), drop_tensors=["blk.0.ffn_down_exps.bias"]))
    assert "MOELITE_ERR_MISSING_TENSOR" in err and "ffn_down_exps.bias" in err
    err = load_error(rewrite(gpt_oss_model, out("gpt-oss-bad-window"),
                             set_keys={"gpt-oss.attention.sliding_window": (0, 4)}))
    assert "MOELITE_ERR_BAD_METADATA" in err and "sliding_window" in err


@pytest.fixture(scope="module")
def deepseek2_model():
    return generated("deepseek2", "Q8_0")


D2 = "deepseek2."
U32, F32, STR = 4, 6, 8


@pytest.mark.parametrize("edit,status,word", [
    (dict(drop_keys=[D2 + "attention.kv_lora_rank"]), "MOELITE_ERR_MISSING_METADATA", "kv_lora_rank"),
    (dict(drop_keys=[D2 + "rope.dimension_count"]), "MOELITE_ERR_MISSING_METADATA", "rope.dimension_count"),
    (dict(drop_keys=[D2 + "attention.value_length_mla"]), "MOELITE_ERR_MISSING_METADATA", "value_length_mla"),
    (dict(set_keys={D2 + "attention.kv_lora_rank": (1 << 30, U32)}), "MOELITE_ERR_BAD_METADATA", "kv_lora_rank"),
    (dict(set_keys={D2 + "rope.dimension_count": (96, U32)}), "MOELITE_ERR_BAD_METADATA", "rope.dimension_count"),
    (dict(set_keys={D2 + "expert_gating_func": (7, U32)}), "MOELITE_ERR_UNSUPPORTED_ARCH", "expert_gating_func"),
    (dict(set_keys={D2 + "leading_dense_block_count": (2, U32)}), "MOELITE_ERR_BAD_METADATA", "leading_dense"),
    (dict(set_keys={D2 + "expert_group_count": (3, U32), D2 + "expert_group_used_count": (1, U32)}),
     "MOELITE_ERR_BAD_METADATA", "groups"),
    (dict(set_keys={D2 + "expert_group_count": (4, U32), D2 + "expert_group_used_count": (4, U32)}),
     "MOELITE_ERR_BAD_METADATA", "groups"),
    (dict(set_keys={D2 + "rope.scaling.type": ("yarn", STR), D2 + "rope.scaling.factor": (4.0, F32),
                    D2 + "rope.scaling.yarn_log_multiplier": (float("nan"), F32)}), "MOELITE_ERR_BAD_METADATA",
     "yarn_log_multiplier"),
    (dict(drop_tensors=["blk.1.attn_k_b.weight", "blk.1.attn_v_b.weight"]), "MOELITE_ERR_MISSING_TENSOR", "attn_kv_b"),
    (dict(drop_tensors=["blk.0.ffn_up.weight"]), "MOELITE_ERR_MISSING_TENSOR", "ffn_up"),
    (dict(drop_tensors=["blk.1.ffn_up_shexp.weight"]), "MOELITE_ERR_MISSING_TENSOR", "ffn_up_shexp"),
    (dict(reshape={"blk.1.attn_k_b.weight": [64, 128, 4]}), "MOELITE_ERR_BAD_SHAPE", "attn_k_b"),
    (dict(set_keys={D2 + "attention.q_lora_rank": (256, U32)}), "MOELITE_ERR_MISSING_TENSOR", "attn_q_a"),
])
def test_deepseek2_defects(deepseek2_model, edit, status, word):
    """Each of MLA's and DeepSeek routing's keys and tensors, missing or out of range: the documented
    status, a message naming what is wrong, never a crash."""
    name = "deepseek2-" + word.replace(".", "-") + "-" + str(abs(hash(str(sorted(edit.items())))) % 10000)
    err = load_error(rewrite(deepseek2_model, out(name), **edit))
    assert status in err and word in err, err


# ---- hyperparameters against their ranges and against the tensors (issue 61, item 3) ----------
Q2 = "qwen2moe."
ARR = 9
NAN, INF = float("nan"), float("inf")


def zero_width_experts(r, layers):
    """The routed experts of `layers` with no rows, and no expert_feed_forward_length to say so."""
    shapes = {}
    for l in layers:
        ne = r.tensors["blk.%d.ffn_gate_exps.weight" % l]["ne"]
        for m in ("gate", "up"):
            shapes["blk.%d.ffn_%s_exps.weight" % (l, m)] = [ne[0], 0, ne[2]]
        shapes["blk.%d.ffn_down_exps.weight" % l] = [0, ne[0], ne[2]]
    return dict(drop_keys=[Q2 + "expert_feed_forward_length"], reshape=shapes)


def vocabulary_of(r, n):
    """tokenizer.ggml.tokens (and token types) cut or padded to n entries."""
    tokens = list(r.metadata["tokenizer.ggml.tokens"]) + ["<pad%d>" % i for i in range(n)]
    types = list(r.metadata["tokenizer.ggml.token_type"]) + [1] * n
    return dict(set_keys={"tokenizer.ggml.tokens": (tokens[:n], ARR, STR),
                          "tokenizer.ggml.token_type": (types[:n], ARR, r.value_types["tokenizer.ggml.token_type"][1])})


def float_key(suffix, value):
    return lambda r: dict(set_keys={Q2 + suffix: (value, F32)})


HYPERPARAMETER_DEFECTS = [
    ("zero-ff", lambda r: zero_width_experts(r, [0, 1]), Q2 + "expert_feed_forward_length"),
    ("zero-ff-layer1", lambda r: zero_width_experts(r, [1]), Q2 + "expert_feed_forward_length"),
    ("eps-nan", float_key("attention.layer_norm_rms_epsilon", NAN), Q2 + "attention.layer_norm_rms_epsilon"),
    ("eps-zero", float_key("attention.layer_norm_rms_epsilon", 0.0), Q2 + "attention.layer_norm_rms_epsilon"),
    ("eps-neg", float_key("attention.layer_norm_rms_epsilon", -1e-6), Q2 + "attention.layer_norm_rms_epsilon"),
    ("base-zero", float_key("rope.freq_base", 0.0), Q2 + "rope.freq_base"),
    ("base-nan", float_key("rope.freq_base", NAN), Q2 + "rope.freq_base"),
    ("base-neg", float_key("rope.freq_base", -10000.0), Q2 + "rope.freq_base"),
    ("base-inf", float_key("rope.freq_base", INF), Q2 + "rope.freq_base"),
    ("weights-scale-nan", float_key("expert_weights_scale", NAN), Q2 + "expert_weights_scale"),
    ("attn-factor-zero", float_key("rope.scaling.attn_factor", 0.0), Q2 + "rope.scaling.attn_factor"),
    ("vocab-short", lambda r: vocabulary_of(r, 400), "tokenizer.ggml.tokens"),
    ("vocab-long", lambda r: vocabulary_of(r, 600), "tokenizer.ggml.tokens"),
    ("blocks-fewer", lambda r: dict(set_keys={Q2 + "block_count": (1, U32)}), Q2 + "block_count"),
    ("blocks-more", lambda r: dict(set_keys={Q2 + "block_count": (3, U32)}), Q2 + "block_count"),
    ("rope-type", lambda r: dict(set_keys={Q2 + "rope.scaling.type": ("ntk-by-parts", STR)}), Q2 + "rope.scaling.type"),
]


@pytest.mark.parametrize("name,edit,key", HYPERPARAMETER_DEFECTS, ids=[c[0] for c in HYPERPARAMETER_DEFECTS])
def test_bad_hyperparameters(base_model, name, edit, key):
    """Each would load and then compute something else (NaN logits, fewer layers, ids without text,
    experts of no width, a scaling not applied): BAD_METADATA naming the key, with or without a
    budget (the expert store sizes its slots from the experts' bytes)."""
    p = rewrite(base_model, out("hp-" + name), **edit(GGUFReader(base_model)))
    for options in ((), ("--budget", "1M")):
        err = load_error(p, *options)
        assert "MOELITE_ERR_BAD_METADATA" in err and "'%s'" % key in err, err


def test_gpt_oss_windowed_rope_base(gpt_oss_model):
    err = load_error(rewrite(gpt_oss_model, out("gpt-oss-swa-base"),
                             set_keys={"gpt-oss.rope.freq_base_swa": (INF, F32)}))
    assert "MOELITE_ERR_BAD_METADATA" in err and "'gpt-oss.rope.freq_base_swa'" in err, err


def test_deepseek2_prediction_blocks_may_be_left_out(deepseek2_model):
    """GLM's multi-token-prediction blocks (nextn_predict_layers, the last blocks) are never computed:
    a file without their tensors loads; a block_count beyond them still does not."""
    p = rewrite(deepseek2_model, out("deepseek2-nextn-absent"),
                set_keys={D2 + "block_count": (3, U32), D2 + "nextn_predict_layers": (1, U32)})
    r = subprocess.run([BIN, "info", "-m", p], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    err = load_error(rewrite(deepseek2_model, out("deepseek2-nextn-short"),
                             set_keys={D2 + "block_count": (4, U32), D2 + "nextn_predict_layers": (1, U32)}))
    assert "MOELITE_ERR_BAD_METADATA" in err and "'deepseek2.block_count'" in err, err
