"""Locating libmoelite and declaring the C API (include/moelite.h) for ctypes.

Nothing here is compiled: the shared library built by CMake (libmoelite.so) is opened with
ctypes and every function the binding uses gets its argtypes/restype declared below.
"""
import ctypes
import ctypes.util
import glob
import operator
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_uint, c_uint32, c_uint64, c_uint8, c_void_p)

__all__ = ["lib", "library_path", "find_library"]

if sys.platform == "darwin":
    _LIB_GLOB, _LIB_NAME = "libmoelite*.dylib", "libmoelite.dylib"
elif sys.platform == "win32":
    _LIB_GLOB, _LIB_NAME = "moelite*.dll", "moelite.dll"
else:
    _LIB_GLOB, _LIB_NAME = "libmoelite.so*", "libmoelite.so"

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """Yields (description, path) in search order."""
    env = os.environ.get("MOELITE_LIBRARY")
    if env:
        # An explicit choice is final: no silent fallback to some other copy.
        yield "MOELITE_LIBRARY", env
        return
    # 1. A copy installed next to the package (e.g. copied in before `pip install`).
    copies = sorted(glob.glob(os.path.join(_PKG_DIR, _LIB_GLOB)))
    for p in copies:
        yield "package directory", p
    if not copies:
        yield "package directory", os.path.join(_PKG_DIR, _LIB_NAME)
    # 2. The build tree of a source checkout: <repo>/bindings/python/moelite -> <repo>/build/lib.
    repo = os.path.normpath(os.path.join(_PKG_DIR, os.pardir, os.pardir, os.pardir))
    if os.path.isfile(os.path.join(repo, "include", "moelite.h")):
        yield "source checkout build tree", os.path.join(repo, "build", "lib", _LIB_NAME)
    # 3. The system's library search path (ldconfig's cache, LD_LIBRARY_PATH).
    found = ctypes.util.find_library("moelite")
    yield "system library path", found or "libmoelite.so.0"


def find_library():
    """Opens the first libmoelite found; returns (CDLL, path). Raises ImportError listing the tries."""
    tried = []
    for how, path in _candidates():
        is_bare_name = os.path.sep not in path  # find_library may return just "libmoelite.so.0"
        if not is_bare_name and not os.path.exists(path):
            tried.append("%s: %s (does not exist)" % (how, path))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s: %s (%s)" % (how, path, e))
            if how == "MOELITE_LIBRARY":
                break
    raise ImportError(
        "moelite: cannot load the moelite shared library (%s). Set MOELITE_LIBRARY to its full path "
        "(e.g. build/lib/%s after `cmake -B build && cmake --build build`, or PREFIX/lib/%s after "
        "`cmake --install`), copy it next to the moelite package, or install it where the dynamic "
        "loader looks (ldconfig). Tried, in order:\n  %s" % (_LIB_NAME, _LIB_NAME, _LIB_NAME, "\n  ".join(tried)))


lib, library_path = find_library()

# ---- callback types and structs ---------------------------------------------------------------

LOG_FN = CFUNCTYPE(None, c_int, c_char_p, c_void_p)
PROGRESS_FN = CFUNCTYPE(c_int, c_float, c_void_p)
ABORT_FN = CFUNCTYPE(c_int, c_void_p)
# `piece` is declared as c_void_p (not c_char_p) because it is not NUL-terminated: read it with
# ctypes.string_at(piece, length).
PIECE_FN = CFUNCTYPE(c_int, c_void_p, c_size_t, c_void_p)
# moelite_routing_fn(layer, pos0, n_tokens, k, experts, weights, user_data)
ROUTING_FN = CFUNCTYPE(None, c_int32, c_int32, c_int32, c_int32, POINTER(c_int32), POINTER(c_float), c_void_p)
# moelite_token_fn(token, text, len, user_data); text is not NUL-terminated (and may be empty).
TOKEN_FN = CFUNCTYPE(c_int, c_int32, c_void_p, c_size_t, c_void_p)
# moelite_logits_fn(logits, n_vocab, history, n_history, user_data); logits are writable.
LOGITS_FN = CFUNCTYPE(c_int, POINTER(c_float), c_int32, POINTER(c_int32), c_int32, c_void_p)


class ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class GenerateStats(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("n_prompt_tokens", c_int32),
        ("n_cached_tokens", c_int32),
        ("n_generated_tokens", c_int32),
        ("stop_reason", c_int32),
        ("prompt_seconds", c_double),
        ("generate_seconds", c_double),
        ("time_to_first_token_seconds", c_double),
        ("prompt_tokens_per_second", c_double),
        ("generated_tokens_per_second", c_double),
    ]


class ExpertStats(Structure):
    """moelite_expert_stats, field for field (include/moelite.h)."""
    _fields_ = [
        ("struct_size", c_size_t),
        ("activations", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("prefetches_issued", c_uint64),
        ("prefetches_used", c_uint64),
        ("prefetches_wasted", c_uint64),
        ("bytes_read", c_uint64),
        ("wait_seconds", c_double),
        ("predicted", c_uint64),
        ("predictions", c_uint64),
        ("ready_when_needed", c_uint64),
        ("routed_tokens", c_uint64),
        ("routed_experts", c_uint64),
        ("read_busy_seconds", c_double),
        ("reads", c_uint64),
    ]


class QualityStats(Structure):
    """moelite_quality_stats, field for field (include/moelite.h)."""
    _fields_ = [
        ("struct_size", c_size_t),
        ("gated_tokens", c_uint64),
        ("predicted_loss", c_double),
        ("metered_tokens", c_uint64),
        ("kl_mean", c_double),
        ("kl_stderr", c_double),
        ("top1_agreement", c_double),
        ("top1_stderr", c_double),
        ("predicted_loss_metered", c_double),
        ("meter_evaluations", c_uint64),
        ("meter_seconds", c_double),
        ("threshold", c_double),
        ("target_kl", c_double),
        ("kl_per_predicted", c_double),
    ]


# ---- declarations -----------------------------------------------------------------------------

_status = c_int  # moelite_status (a C enum: int)
_p = c_void_p    # every opaque handle


class _SizedText(c_char_p):
    """A `const char*` passed with its length (moelite_tokenize, moelite_generate): any bytes,
    NUL included. Plain c_char_p arguments are NUL-terminated strings and refuse NUL."""


# Integer argument types -> (lowest, highest, C name). ctypes converts a Python int to a C integer
# by silently keeping its low bits (2**32 + 1 becomes 1 as an int32_t), and a bytes argument to a
# C string that ends at its first NUL; the checks below refuse both before the call.
_INT_RANGES = {}
for _t, _name in ((c_int32, "int32_t"), (c_uint32, "uint32_t"), (c_int64, "int64_t"), (c_uint64, "uint64_t"),
                  (c_uint8, "uint8_t")):
    _bits = 8 * ctypes.sizeof(_t)
    _signed = _t(-1).value < 0
    _INT_RANGES[_t] = (-(1 << (_bits - 1)) if _signed else 0, (1 << (_bits - (1 if _signed else 0))) - 1, _name)
del _t, _name, _bits, _signed


def _int_check(low, high, ctype):
    def check(fn, i, value):
        if isinstance(value, ctypes._SimpleCData):  # already a C value (c_int32(...))
            return
        v = operator.index(value)  # TypeError for a float: no silent truncation either
        if not low <= v <= high:
            raise OverflowError("%s: argument %d is %d, outside the range of %s (%d..%d)"
                                % (fn, i + 1, v, ctype, low, high))
    return check


def _cstr_check(fn, i, value):
    if isinstance(value, bytes) and b"\0" in value:
        raise ValueError("%s: argument %d contains a NUL byte, where the C string would end" % (fn, i + 1))


def _checked(fn, name, checks):
    def call(*args):
        for i, check in checks:
            if i < len(args):
                check(name, i, args[i])
        return fn(*args)
    call.__name__ = name
    call.__wrapped__ = fn
    return call


def _decl(name, restype, *argtypes):
    """Declares `name`; a function with integer or C-string arguments is replaced on `lib` by a
    wrapper that range-checks them (OverflowError) and refuses NUL in strings (ValueError)."""
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    checks = []
    for i, t in enumerate(argtypes):
        if t in _INT_RANGES:
            checks.append((i, _int_check(*_INT_RANGES[t])))
        elif t is c_char_p:  # exactly: _SizedText (pointer + length) may hold NUL
            checks.append((i, _cstr_check))
    if checks:
        setattr(lib, name, _checked(fn, name, checks))


_decl("moelite_version_number", c_uint)
_decl("moelite_version_string", c_char_p)
_decl("moelite_status_name", c_char_p, c_int)
_decl("moelite_last_error", c_char_p)
_decl("moelite_set_log_callback", None, LOG_FN, c_void_p, c_int)

_decl("moelite_model_params_create", _p)
_decl("moelite_model_params_free", None, _p)
_decl("moelite_model_params_set_threads", _status, _p, c_int32)
_decl("moelite_model_params_set_backend", _status, _p, c_int)
_decl("moelite_model_params_set_expert_budget", _status, _p, c_uint64)
_decl("moelite_model_params_set_expert_budget_auto", _status, _p, c_uint64)
_decl("moelite_platform_get", c_int64, c_int)
_decl("moelite_platform_describe_json", _status, c_char_p, c_size_t, POINTER(c_size_t))
_decl("moelite_model_params_set_use_mmap", _status, _p, c_int32)
_decl("moelite_model_params_set_expert_budget_fraction", _status, _p, c_double)
_decl("moelite_model_params_set_expert_budget_text", _status, _p, c_char_p)
_decl("moelite_parse_size", _status, c_char_p, POINTER(c_uint64))
_decl("moelite_model_params_set_cache_policy", _status, _p, c_char_p)
_decl("moelite_model_params_set_predictor", _status, _p, c_char_p)
_decl("moelite_model_params_set_chat_template", _status, _p, c_char_p)
_decl("moelite_model_params_set_predictor_depth", _status, _p, c_int32)
_decl("moelite_model_params_set_profile", _status, _p, c_char_p)
_decl("moelite_model_params_set_gating", _status, _p, c_char_p, c_float)
_decl("moelite_model_params_set_gating_penalty", _status, _p, c_float)
_decl("moelite_model_params_set_gating_substitutes", _status, _p, c_int32)
_decl("moelite_model_params_set_cache_allocation", _status, _p, c_char_p)
_decl("moelite_model_params_set_expert_per_layer", _status, _p, c_int32)
_decl("moelite_calibrate_params_create", _p)
_decl("moelite_calibrate_params_free", None, _p)
_decl("moelite_calibrate_params_set_window", _status, _p, c_int32)
_decl("moelite_calibrate_params_set_stride", _status, _p, c_int32)
_decl("moelite_calibrate_params_set_holdout", _status, _p, c_double)
_decl("moelite_calibrate_params_set_sensitivity_tokens", _status, _p, c_int64)
_decl("moelite_calibrate_params_set_progress_callback", _status, _p, PROGRESS_FN, c_void_p)
_decl("moelite_calibrate", _status, _p, POINTER(c_int32), c_int32, _p, c_char_p)
_decl("moelite_model_params_set_vocab_only", _status, _p, c_int32)
_decl("moelite_model_params_set_progress_callback", _status, _p, PROGRESS_FN, c_void_p)
_decl("moelite_model_load", _status, c_char_p, _p, POINTER(c_void_p))
_decl("moelite_model_inspect", _status, c_char_p, POINTER(c_void_p))
_decl("moelite_plan_params_create", _p)
_decl("moelite_plan_params_free", None, _p)
_decl("moelite_plan_params_set_max_sequences", _status, _p, c_int32)
_decl("moelite_plan_params_set_min_sequences", _status, _p, c_int32)
_decl("moelite_plan_params_set_memory", _status, _p, c_uint64)
_decl("moelite_plan_params_set_headroom", _status, _p, c_uint64)
_decl("moelite_plan_params_set_expert_budget", _status, _p, c_uint64)
_decl("moelite_plan_params_set_expert_budget_text", _status, _p, c_char_p)
_decl("moelite_plan_params_set_bandwidths", _status, _p, c_double, c_double)
_decl("moelite_plan_params_set_cache_allocation", _status, _p, c_char_p)
_decl("moelite_plan_params_set_profile", _status, _p, c_char_p)
_decl("moelite_plan_params_set_routing_trace", _status, _p, c_char_p)
_decl("moelite_plan_params_set_routing", _status, _p, c_int32, c_int32, c_int32, POINTER(c_int32))
_decl("moelite_plan_batch", _status, _p, _p, _p, POINTER(c_void_p))
_decl("moelite_batch_plan_json", c_char_p, _p)
_decl("moelite_batch_plan_free", None, _p)
_decl("moelite_model_free", None, _p)

_decl("moelite_model_get", c_int64, _p, c_int)
_decl("moelite_model_arch", c_char_p, _p)
_decl("moelite_model_name", c_char_p, _p)
_decl("moelite_model_expert_type", c_char_p, _p)
_decl("moelite_model_expert_file", c_char_p, _p)
_decl("moelite_pack_experts", _status, c_char_p, c_char_p, PROGRESS_FN, c_void_p)
_decl("moelite_model_backend_name", c_char_p, _p)
_decl("moelite_model_meta_count", c_int32, _p)
_decl("moelite_model_meta_key", c_char_p, _p, c_int32)
_decl("moelite_model_meta_value", _status, _p, c_char_p, c_void_p, c_size_t, POINTER(c_size_t))
_decl("moelite_model_measure_device_bandwidth", _status, _p, POINTER(c_double))
_decl("moelite_supported_archs", c_char_p)
_decl("moelite_model_expert_stats", _status, _p, c_int32, POINTER(ExpertStats))
_decl("moelite_model_reset_expert_stats", None, _p)
_decl("moelite_model_trace_begin", _status, _p, c_char_p)
_decl("moelite_model_trace_end", _status, _p)

_decl("moelite_context_params_create", _p)
_decl("moelite_context_params_free", None, _p)
_decl("moelite_context_params_set_n_ctx", _status, _p, c_int32)
_decl("moelite_context_params_set_n_batch", _status, _p, c_int32)
_decl("moelite_context_params_set_n_seq", _status, _p, c_int32)
_decl("moelite_context_params_set_quality_meter", _status, _p, c_double)
_decl("moelite_context_params_set_quality_target", _status, _p, c_char_p)
_decl("moelite_context_params_set_quality_bounds", _status, _p, c_double, c_double)
_decl("moelite_context_params_set_routing_callback", _status, _p, ROUTING_FN, c_void_p)
_decl("moelite_context_create", _status, _p, _p, POINTER(c_void_p))
_decl("moelite_context_free", None, _p)
_decl("moelite_context_set_abort_callback", _status, _p, ABORT_FN, c_void_p)
_decl("moelite_eval", _status, _p, POINTER(c_int32), c_int32, c_int32)
_decl("moelite_eval_batch", _status, _p, POINTER(c_int32), POINTER(c_int32), POINTER(c_uint8), c_int32)
_decl("moelite_get_logits", POINTER(c_float), _p, c_int32)
_decl("moelite_context_n_seq", c_int32, _p)
_decl("moelite_context_save", _status, _p, c_char_p)
_decl("moelite_context_load", _status, _p, c_char_p)
_decl("moelite_context_seq_length", c_int32, _p, c_int32)
_decl("moelite_context_seq_truncate", _status, _p, c_int32, c_int32)
_decl("moelite_context_kv_length", c_int32, _p)
_decl("moelite_context_n_ctx", c_int32, _p)
_decl("moelite_context_kv_bytes", c_uint64, _p)
_decl("moelite_context_kv_reset", None, _p)
_decl("moelite_context_kv_truncate", None, _p, c_int32)
_decl("moelite_context_get_tokens", _status, _p, POINTER(c_int32), c_int32, POINTER(c_int32))
_decl("moelite_context_expert_stats", _status, _p, c_int32, POINTER(ExpertStats))
_decl("moelite_context_quality_stats", _status, _p, POINTER(QualityStats))
_decl("moelite_context_reset_expert_stats", None, _p)

_decl("moelite_tokenize", _status, _p, _SizedText, c_size_t, c_uint32, POINTER(c_int32), c_int32,
      POINTER(c_int32))
_decl("moelite_detokenize", _status, _p, POINTER(c_int32), c_int32, c_uint32, c_void_p, c_size_t,
      POINTER(c_size_t))
_decl("moelite_token_bos", c_int32, _p)
_decl("moelite_token_eos", c_int32, _p)
_decl("moelite_token_is_end", c_int32, _p, c_int32)
_decl("moelite_chat_format", _status, _p, POINTER(ChatMessage), c_size_t, c_int32, c_void_p,
      c_size_t, POINTER(c_size_t))
_decl("moelite_chat_template_kind", c_char_p, _p)
_decl("moelite_chat_tokenize", _status, _p, POINTER(ChatMessage), c_size_t, c_int32, POINTER(c_int32), c_int32,
      POINTER(c_int32))
_decl("moelite_token_attrs", c_uint32, _p, c_int32)
_decl("moelite_token_text", c_char_p, _p, c_int32)

_decl("moelite_generate_params_create", _p)
_decl("moelite_generate_params_free", None, _p)
_decl("moelite_generate_params_set_max_tokens", _status, _p, c_int32)
_decl("moelite_generate_params_set_temperature", _status, _p, c_float)
_decl("moelite_generate_params_set_top_k", _status, _p, c_int32)
_decl("moelite_generate_params_set_top_p", _status, _p, c_float)
_decl("moelite_generate_params_set_min_p", _status, _p, c_float)
_decl("moelite_generate_params_set_repeat_penalty", _status, _p, c_float, c_int32)
_decl("moelite_generate_params_set_seed", _status, _p, c_uint64)
_decl("moelite_generate_params_add_stop", _status, _p, c_char_p)
_decl("moelite_generate_params_set_logit_bias", _status, _p, c_int32, c_float)
_decl("moelite_generate_params_clear_logit_bias", _status, _p)
_decl("moelite_generate_params_set_parse_special", _status, _p, c_int32)
_decl("moelite_generate_params_set_callback", _status, _p, PIECE_FN, c_void_p)
_decl("moelite_generate_params_set_token_callback", _status, _p, TOKEN_FN, c_void_p)
_decl("moelite_generate_params_set_logits_callback", _status, _p, LOGITS_FN, c_void_p)
_decl("moelite_generate", _status, _p, _SizedText, c_size_t, _p, POINTER(GenerateStats))
_decl("moelite_generate_tokens", _status, _p, POINTER(c_int32), c_int32, _p, POINTER(GenerateStats))

_decl("moelite_sampler_create", _status, _p, POINTER(c_void_p))
_decl("moelite_sampler_free", None, _p)
_decl("moelite_sampler_accept", _status, _p, POINTER(c_int32), c_int32)
_decl("moelite_sampler_sample", _status, _p, _p, c_int32, POINTER(c_int32))
_decl("moelite_sampler_sample_logits", _status, _p, POINTER(c_float), c_int32, POINTER(c_int32))
_decl("moelite_sampler_reset", None, _p)

_decl("moelite_queue_create", _status, _p, POINTER(c_void_p))
_decl("moelite_queue_free", None, _p)
_decl("moelite_queue_add", _status, _p, POINTER(c_int32), c_int32, _p, POINTER(c_int64))
_decl("moelite_queue_step", _status, _p, POINTER(c_int32))
_decl("moelite_queue_event", _status, _p, c_int32, POINTER(c_int64), POINTER(c_int32), POINTER(c_int32))
_decl("moelite_queue_waiting", c_int64, _p)
_decl("moelite_queue_running", c_int64, _p)
_decl("moelite_queue_finished", c_int64, _p)
_decl("moelite_queue_request_state", _status, _p, c_int64, POINTER(c_int32))
_decl("moelite_queue_request_stats", _status, _p, c_int64, POINTER(GenerateStats))
_decl("moelite_queue_request_tokens", _status, _p, c_int64, POINTER(c_int32), c_int32, POINTER(c_int32))
_decl("moelite_queue_request_text", _status, _p, c_int64, c_char_p, c_size_t, POINTER(c_size_t))
_decl("moelite_queue_cancel", _status, _p, c_int64)
_decl("moelite_queue_remove", _status, _p, c_int64)
