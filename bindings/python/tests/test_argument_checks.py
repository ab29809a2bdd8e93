"""Integers and strings crossing into C (issue 61, item 2): ctypes keeps only the low bits of an
int (2**32 + 1 becomes 1 as an int32_t) and ends a C string at its first NUL. Each case below
did one of those silently; now an integer outside its C type raises OverflowError, a non-integer
TypeError, and a NUL in a NUL-terminated string ValueError -- before anything changed. Text the
C API takes with a length (prompts, tokenize) may hold NUL."""
import os

import pytest

from support import MODEL

import moelite

BIG = 2 ** 32  # + k: the low 32 bits are k


def test_token_ids_outside_int32_are_refused(model):
    ctx = moelite.Context(model, n_ctx=32)
    with pytest.raises(OverflowError, match="int32"):
        ctx.eval([BIG + 1])  # was: token 1 evaluated
    with pytest.raises(OverflowError):
        ctx.eval([-(2 ** 31) - 1])
    assert ctx.kv_length == 0
    with pytest.raises(TypeError):
        ctx.eval([1.0])
    with pytest.raises(OverflowError):
        ctx.eval_batch([1], [BIG])  # a sequence id: was sequence 0
    assert ctx.kv_length == 0
    with pytest.raises(OverflowError):
        list(ctx.generate([BIG + 1], max_tokens=1))
    with pytest.raises(OverflowError):
        model.detokenize([BIG + 1])
    with pytest.raises(OverflowError):
        model.token_text(BIG)  # was: token 0's text
    with pytest.raises(OverflowError):
        model.token_is_end(BIG + model.eos)  # was: True
    ctx.close()


def test_integer_options_outside_their_c_type_are_refused(model, tmp_path):
    with pytest.raises(OverflowError):
        moelite.Context(model, n_ctx=2 ** 40)  # was: the default context length
    with pytest.raises(OverflowError):
        moelite.Context(model, n_batch=BIG + 8)  # was: 8
    with pytest.raises(TypeError):
        moelite.Context(model, n_ctx=64.5)  # was: 64
    with pytest.raises(OverflowError):
        moelite.Model(MODEL, threads=BIG + 1)  # was: one thread
    ctx = moelite.Context(model, n_ctx=64)
    ctx.eval([1, 2, 3])
    with pytest.raises(OverflowError):
        ctx.truncate(BIG)  # was: truncate(0), the whole sequence gone
    assert ctx.kv_length == 3
    with pytest.raises(OverflowError):
        ctx.expert_stats(layer=BIG - 1)  # was: layer -1, every layer
    with pytest.raises(OverflowError):
        ctx.logits(BIG - 1)  # was: the last row
    with pytest.raises(OverflowError):
        moelite.Sampler().sample(ctx, BIG - 1)
    for bad in ({"max_tokens": BIG + 4}, {"top_k": BIG + 1}, {"seed": 2 ** 64}, {"repeat_last_n": BIG},
                {"logit_bias": {BIG + 5: -1.0}}):
        with pytest.raises(OverflowError):
            list(ctx.generate([1], **bad))
    assert ctx.kv_length == 3  # none of them ran
    # A negative seed is its 64-bit two's complement, as before.
    a = "".join(ctx.generate([1], max_tokens=4, seed=-1, temperature=1.0))
    b = "".join(ctx.generate([1], max_tokens=4, seed=2 ** 64 - 1, temperature=1.0))
    assert a == b
    ctx.close()


def test_nul_in_paths_and_c_strings_is_refused(model, tmp_path):
    with pytest.raises(ValueError, match="NUL"):
        moelite.Model(MODEL + "\0.ignored")  # was: MODEL loaded
    with pytest.raises(ValueError, match="NUL"):
        moelite.Model.inspect(MODEL + "\0")
    ctx = moelite.Context(model, n_ctx=32)
    ctx.eval([1, 2])
    target = tmp_path / "session"
    with pytest.raises(ValueError, match="NUL"):
        ctx.save(str(target) + "\0.tmp")  # was: written to `target`
    assert not os.path.exists(target)
    with pytest.raises(ValueError, match="NUL"):
        ctx.load(str(target) + "\0")
    with pytest.raises(ValueError, match="NUL"):
        model.trace_begin(str(tmp_path / "trace.json") + "\0x")
    assert not os.path.exists(tmp_path / "trace.json")
    with pytest.raises(ValueError, match="NUL"):
        model.meta("general.name\0whatever")  # was: general.name's value
    with pytest.raises(ValueError, match="NUL"):
        moelite.Model(MODEL, policy="lru\0x")
    ctx.close()


def test_nul_inside_text_with_a_length_is_kept(model):
    # moelite_tokenize and moelite_generate take a pointer and a length: NUL is text there.
    ids = model.tokenize("a\0b")
    assert model.detokenize_bytes(ids) == b"a\0b"
    assert len(ids) > len(model.tokenize("a"))
    ctx = moelite.Context(model, n_ctx=32)
    list(ctx.generate("a\0b", max_tokens=1))
    assert ctx.last_stats["n_prompt_tokens"] == len(model.tokenize("a\0b", add_special=True, parse_special=True))
    ctx.close()
