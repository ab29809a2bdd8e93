"""Python binding of moelite, an embeddable engine for Mixture-of-Experts LLMs in GGUF files.

Pure Python over ctypes: it opens the libmoelite shared library built by CMake. The library is
looked for, in order, at $MOELITE_LIBRARY (full path), next to this package (libmoelite.so*),
in the build tree of a source checkout (<repo>/build/lib/libmoelite.so), and on the system's
library path.

    import moelite
    with moelite.Model("model.gguf") as model:
        ctx = moelite.Context(model, n_ctx=2048)
        for piece in ctx.generate("Once upon a time", max_tokens=64, temperature=0):
            print(piece, end="", flush=True)
        print(ctx.last_stats)

Lifetimes. Models are reference counted by the library: a context holds a reference to its
model, so the model's and the contexts' handles may be released in any order (finalizers at
interpreter exit run in no particular order). A Context also keeps its Model object alive.
Model.close() and Context.close() release memory deterministically; without them the garbage
collector does it.

Exit. Callbacks (abort, routing, progress, log, logits, and generate()'s streaming) are Python functions
called from C. A thread other than the main thread must not be inside the library when the
interpreter finalizes: a thread calling back into Python then is stopped by CPython in the
middle of C++ code (the process aborts) or blocks forever. An atexit hook therefore stops
every streaming generation, makes every callback of another thread ask the library to stop
(abort callbacks answer "abort", progress callbacks "cancel", logits callbacks "stop") and waits, bounded, until those
calls have returned; see _ExitGuard.
"""
from __future__ import annotations

import atexit
import os
import ctypes
import dataclasses
import enum
import json
import queue
import sys
import threading
import warnings
import weakref
from collections.abc import Mapping as _AbcMapping
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

from . import _lib
from ._lib import lib as _c

try:  # numpy is optional: logits come back as numpy arrays when it is importable, else lists.
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None

__all__ = [
    "__version__", "version_number", "library_path", "supported_archs", "Status", "StopReason",
    "MoeliteError", "Model", "Context", "Sampler", "Queue", "REQUEST_WAITING", "REQUEST_RUNNING", "Metadata", "ExpertStats", "PlatformField",
    "TokenizeFlag", "DetokenizeFlag", "TokenAttr", "set_log_callback", "platform_get", "platform_describe_json", "platform_info",
    "platform_memory_available",
]

__version__: str = _c.moelite_version_string().decode("ascii")
library_path: str = _lib.library_path

PathLike = Union[str, bytes, "os.PathLike[str]"]
_MISSING: Any = object()  # "no default given"
TextLike = Union[str, bytes, bytearray, memoryview]


def version_number() -> int:
    """The linked library's version as MAJOR*10000 + MINOR*100 + PATCH."""
    return int(_c.moelite_version_number())


def supported_archs() -> List[str]:
    """Architectures this build of the library implements, e.g. ['qwen2moe', 'qwen3moe', ...]
    (the library's comma-separated list, split outside parentheses)."""
    s = _c.moelite_supported_archs().decode("utf-8")
    out, cur, depth = [], "", 0
    for ch in s:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return [a for a in out if a]


# Deprecated enum aliases: (enum class name, alias) -> canonical member name. Reading one through
# the class (Status.ERR_CANCELLED, Status["ERR_CANCELLED"]) gives the canonical member (an IntEnum
# alias has the same value and identity) and emits a DeprecationWarning, like the C compiler's
# warning for the MOELITE_DEPRECATED enumerators of include/moelite.h.
_DEPRECATED_ALIASES: Dict[tuple, str] = {}


class _DeprecatedAliasMeta(enum.EnumMeta):
    def _warn_alias(cls, name: str) -> None:
        canonical = _DEPRECATED_ALIASES.get((type.__getattribute__(cls, "__name__"), name))
        if canonical is not None:
            owner = type.__getattribute__(cls, "__name__")
            warnings.warn("moelite.%s.%s is deprecated; use moelite.%s.%s" % (owner, name, owner, canonical),
                          DeprecationWarning, stacklevel=3)

    def __getattribute__(cls, name):
        if name[:1] != "_" and _DEPRECATED_ALIASES:
            type(cls)._warn_alias(cls, name)
        return super().__getattribute__(name)

    def __getitem__(cls, name):
        type(cls)._warn_alias(cls, name)
        return super().__getitem__(name)


class Status(enum.IntEnum, metaclass=_DeprecatedAliasMeta):
    """moelite_status values (include/moelite.h). ERR_CANCELLED is a deprecated alias of
    ERR_PROGRESS_ABORTED (same value; reading it warns with DeprecationWarning)."""
    OK = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_OUT_OF_MEMORY = 2
    ERR_FILE_NOT_FOUND = 3
    ERR_IO = 4
    ERR_BUFFER_TOO_SMALL = 5
    ERR_SYSTEM_LIMIT = 6
    ERR_GGUF_BAD_MAGIC = 10
    ERR_GGUF_BAD_VERSION = 11
    ERR_GGUF_TRUNCATED = 12
    ERR_GGUF_CORRUPT = 13
    ERR_GGUF_UNKNOWN_TYPE = 14
    ERR_GGUF_OUT_OF_BOUNDS = 15
    ERR_GGUF_OVERLAP = 16
    ERR_UNSUPPORTED_ARCH = 20
    ERR_UNSUPPORTED_TYPE = 21
    ERR_MISSING_TENSOR = 22
    ERR_BAD_SHAPE = 23
    ERR_MISSING_METADATA = 24
    ERR_BAD_METADATA = 25
    ERR_BACKEND_UNAVAILABLE = 30
    ERR_BUDGET_TOO_SMALL = 31
    ERR_NOT_IMPLEMENTED = 32
    ERR_BAD_PROFILE = 33
    ERR_BACKEND = 34
    ERR_CONTEXT_FULL = 40
    ERR_BAD_TOKEN = 41
    ERR_ABORTED = 42
    ERR_PROGRESS_ABORTED = 43  # a progress callback asked to stop loading or calibrating
    ERR_BAD_SESSION = 50  # a saved session is not one, truncated, corrupt or of another version
    ERR_SESSION_MISMATCH = 51  # a saved session of another model, or larger than the context
    ERR_INTERNAL = 99
    ERR_CANCELLED = 43  # deprecated alias of ERR_PROGRESS_ABORTED


class StopReason(enum.IntEnum, metaclass=_DeprecatedAliasMeta):
    """moelite_stop_reason: why a generation ended. CALLBACK is a deprecated alias of ABORTED."""
    END_TOKEN = 0     # the model produced an end-of-generation token
    MAX_TOKENS = 1
    STRING = 2        # a stop string
    ABORTED = 3       # a piece, token or logits callback asked to stop (an early break included)
    CONTEXT_FULL = 4  # the context is full (the call failed with ERR_CONTEXT_FULL)
    ERROR = 5         # the call failed (see the exception)
    CALLBACK = 3      # deprecated alias of ABORTED


_DEPRECATED_ALIASES.update({("Status", "ERR_CANCELLED"): "ERR_PROGRESS_ABORTED",
                            ("StopReason", "CALLBACK"): "ABORTED"})


class TokenizeFlag(enum.IntFlag):
    """Flags of moelite_tokenize (Model.tokenize(flags=...))."""
    NONE = 0
    ADD_SPECIAL = 1    # add BOS/EOS as the model's metadata asks
    PARSE_SPECIAL = 2  # text like "<|im_start|>" becomes that control token


class DetokenizeFlag(enum.IntFlag):
    """Flags of moelite_detokenize (Model.detokenize(flags=...))."""
    NONE = 0
    RENDER_SPECIAL = 1  # include the text of control tokens (BOS, <|im_end|>)


class TokenAttr(enum.IntFlag):
    """MOELITE_TOKEN_ATTR_* bit flags of a token (Model.token_attrs(); tokenizer.ggml.token_type)."""
    NONE = 0
    NORMAL = 1
    UNKNOWN = 2       # the unknown token
    CONTROL = 4       # a control token (BOS, <|im_start|>): renders as nothing unless RENDER_SPECIAL
    USER_DEFINED = 8  # an added token matched in text like a word
    UNUSED = 16
    BYTE = 32         # a byte token such as <0x0A>
    END = 64          # generation stops at it (Model.token_is_end)


class PlatformField(enum.IntEnum):
    """moelite_platform_field: the keys of platform_get()."""
    MEM_TOTAL_BYTES = 0
    MEM_AVAILABLE_BYTES = 1
    CGROUP_LIMIT_BYTES = 2
    CGROUP_USAGE_BYTES = 3
    IS_JETSON = 4
    UNIFIED_MEMORY = 5
    CPUS_ONLINE = 6
    CPUS_ALLOWED = 7
    BIG_CORES = 8
    DEFAULT_THREADS = 9
    AUTO_BACKEND = 10
    HAS_CUDA = 11
    HAS_VULKAN = 12


class MoeliteError(Exception):
    """A moelite call failed. `.status` is the moelite_status (int), `.status_name` its C name
    ("MOELITE_ERR_FILE_NOT_FOUND") and `.message` the library's moelite_last_error() text.
    `.stats` is None, except for a failed generation: the dict of its moelite_generate_stats
    (what was done before the failure; see Context.generate)."""

    def __init__(self, status: int, message: str = "", stats: Optional[Dict[str, Any]] = None):
        self.status = int(status)
        self.status_name = _c.moelite_status_name(self.status).decode("ascii", "replace")
        self.message = message
        self.stats = stats
        super().__init__("%s: %s" % (self.status_name, message) if message else self.status_name)


def _last_error() -> str:
    return _c.moelite_last_error().decode("utf-8", "replace")


def _check(status: int) -> None:
    # moelite_last_error() is per thread: read it right after the failing call, on its thread.
    if status != 0:
        raise MoeliteError(status, _last_error())


def _as_bytes(text: Any, what: str = "text") -> bytes:
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError("%s must be str or bytes, not %s" % (what, type(text).__name__))


def _token_array(tokens: Iterable[int]):
    tokens = list(tokens)
    for t in tokens:
        if not isinstance(t, int) and not (hasattr(t, "__index__")):
            raise TypeError("token ids must be integers, got %r" % (t,))
    arr = (ctypes.c_int32 * max(len(tokens), 1))(*[int(t) for t in tokens])
    return arr, len(tokens)


def _two_call_text(call, guess: int) -> bytes:
    """Runs a moelite function with the (buffer, capacity, *len) two-call convention."""
    cap = max(int(guess), 16)
    n = ctypes.c_size_t(0)
    for _ in range(4):
        buf = ctypes.create_string_buffer(cap)
        st = call(buf, cap, ctypes.byref(n))
        if st == Status.ERR_BUFFER_TOO_SMALL and n.value > cap:
            cap = n.value
            continue
        _check(st)
        return buf.raw[: n.value]
    raise MoeliteError(Status.ERR_INTERNAL, "buffer size kept growing")  # pragma: no cover


# ---- process exit ------------------------------------------------------------------------------

class _ExitGuard:
    """Keeps threads other than the main thread out of libmoelite once the interpreter exits.

    Why: every C call that can call back into Python (eval and generate through the abort,
    routing and piece callbacks; model loading and calibration with a progress callback) must
    have returned before CPython finalizes. A thread that re-enters Python after that point is
    terminated by CPython inside the library's C++ frames (the process aborts, "FATAL: exception
    not rethrown") or, in newer CPythons, blocks forever, and a finalizer that joins it hangs.

    How: such calls are counted (enter/leave). The atexit hook, which runs before finalization
    while every thread can still run, sets `exiting`, stops every streaming generation (waking a
    worker parked between two pieces) and waits until the count is zero. From then on the
    callbacks of threads other than the main thread answer "stop" without calling user code
    (abort -> 1, progress -> 0 (cancel), piece -> 0), so each call returns within about one
    layer's computation; new calls from other threads and new generations are refused with
    RuntimeError. The main thread may still evaluate (its callbacks keep working). The wait is
    bounded (EXIT_WAIT_SECONDS) so a user callback that blocks cannot hang the exit."""

    EXIT_WAIT_SECONDS = 30.0

    def __init__(self) -> None:
        self.exiting = False
        self.cond = threading.Condition(threading.Lock())
        self.in_flight = 0
        self.generations: "weakref.WeakSet[_Generation]" = weakref.WeakSet()
        self.main_ident = threading.main_thread().ident
        self.get_ident = threading.get_ident

    def stopping(self) -> bool:
        """True in a callback that must answer "stop": the process exits and this is not the
        main thread. Uses only attributes of self (safe while modules are torn down)."""
        return self.exiting and self.get_ident() != self.main_ident

    def enter(self, generation: bool = False) -> None:
        with self.cond:
            if self.exiting and (generation or threading.get_ident() != self.main_ident):
                raise RuntimeError("moelite: the interpreter is exiting; no new %s starts"
                                   % ("generation" if generation else "evaluation on this thread"))
            self.in_flight += 1

    def leave(self) -> None:
        with self.cond:
            self.in_flight -= 1
            if self.in_flight <= 0:
                self.cond.notify_all()

    def at_exit(self) -> None:
        with self.cond:
            self.exiting = True
            gens = list(self.generations)
        deadline = _monotonic() + self.EXIT_WAIT_SECONDS
        for g in gens:
            try:
                g.stop(timeout=max(0.0, deadline - _monotonic()))
            except BaseException:  # noqa: BLE001 - never fail the exit
                pass
        with self.cond:
            self.cond.wait_for(lambda: self.in_flight <= 0, timeout=max(0.0, deadline - _monotonic()))
        # Library threads (loaders, pools) may log at any time: stop calling Python for that.
        global _log_callback_ref
        if _log_callback_ref is not None:
            _c.moelite_set_log_callback(_lib.LOG_FN(), None, 2)
            _log_callback_ref = None


def _monotonic() -> float:
    import time
    return time.monotonic()


_exit_guard = _ExitGuard()
atexit.register(_exit_guard.at_exit)


# ---- logging -----------------------------------------------------------------------------------

_log_callback_ref = None  # keeps the installed ctypes log callback alive


def set_log_callback(fn: Optional[Callable[[int, str], Any]], min_level: int = 2) -> None:
    """Routes library log lines to fn(level: int, text: str); None restores the default sink
    (stderr, WARN and above). Levels: 0 debug, 1 info, 2 warn, 3 error, 4 none. fn may be called
    from the library's worker threads and must not raise (exceptions are swallowed). At
    interpreter exit the default sink is restored."""
    global _log_callback_ref
    if fn is None:
        _c.moelite_set_log_callback(_lib.LOG_FN(), None, int(min_level))
        _log_callback_ref = None
        return
    guard = _exit_guard

    def _cb(level, text, _user):
        try:
            if guard.stopping():
                return
            fn(int(level), text.decode("utf-8", "replace") if text else "")
        except BaseException:  # noqa: BLE001 - never let an exception unwind into C
            pass

    ref = _lib.LOG_FN(_cb)
    _c.moelite_set_log_callback(ref, None, int(min_level))
    _log_callback_ref = ref  # replaced only after the library stopped using the old one


# ---- platform ----------------------------------------------------------------------------------

def platform_get(field: Union[PlatformField, int]) -> int:
    """moelite_platform_get: one PlatformField of the machine this process runs on (read afresh
    each call; 0 where the OS does not report it; -1 for an unknown field). Needs no model."""
    return int(_c.moelite_platform_get(int(field)))


def platform_memory_available() -> int:
    """Bytes this process may still allocate: min(MemAvailable, cgroup limit - usage)
    (moelite_platform_get(MOELITE_PLATFORM_MEM_AVAILABLE_BYTES))."""
    return platform_get(PlatformField.MEM_AVAILABLE_BYTES)


def platform_describe_json() -> str:
    """The platform as the library's JSON text (moelite_platform_describe_json). The text can
    differ between calls (memory figures change). Raises MoeliteError on failure."""
    needed = ctypes.c_size_t(0)
    st = _c.moelite_platform_describe_json(None, 0, ctypes.byref(needed))
    if st not in (Status.OK, Status.ERR_BUFFER_TOO_SMALL):
        _check(st)
    for _ in range(8):
        cap = needed.value + 4096  # slack: memory figures may grow between the two calls
        buf = ctypes.create_string_buffer(cap)
        st = _c.moelite_platform_describe_json(buf, cap, ctypes.byref(needed))
        if st != Status.ERR_BUFFER_TOO_SMALL:
            break
    _check(st)
    return buf.value.decode("utf-8")


def platform_info() -> Dict[str, Any]:
    """The machine as a dict (moelite_platform_describe_json): kind, model, cpu (big cores,
    capacities), memory (total, available, cgroup, room), backends built in, auto_backend."""
    return json.loads(platform_describe_json())


_BACKENDS = {"auto": 0, "cpu": 1, "vulkan": 2, "cuda": 3}

# moelite_model_key values
_KEYS = {
    "n_layers": 0, "n_experts": 1, "n_experts_used": 2, "n_shared_experts": 3, "n_vocab": 4,
    "n_embd": 5, "n_head": 6, "n_head_kv": 7, "head_dim": 8, "n_ff_expert": 9,
    "n_ff_shared": 10, "n_ctx_train": 11, "expert_bytes": 12, "dense_bytes": 13, "n_params": 14,
    "n_active_params": 15, "threads": 16, "backend_id": 17, "active_bytes": 18,
    "expert_budget": 19, "expert_pool_bytes": 20, "expert_peak_bytes": 21, "expert_slots": 22,
    "budget_auto": 23, "budget_auto_room": 24, "budget_auto_context_bytes": 25, "budget_auto_headroom": 26,
    "experts_all_fit": 27, "expert_min_budget": 28, "sliding_window": 29, "n_windowed_layers": 30,
    "n_dense_layers": 31, "kv_bytes_per_token": 32,
}


def _key_property(name: str, key: int) -> property:
    def get(self) -> int:
        return int(_c.moelite_model_get(self._handle(), key))
    get.__name__ = name
    get.__doc__ = ("moelite_model_get(MOELITE_MODEL_%s) (-1 when the library does not know the "
                   "key). Raises ValueError on a closed model." % name.upper())
    return property(get)


@dataclasses.dataclass(frozen=True)
class ExpertStats:
    """moelite_expert_stats: cumulative expert-store counters of one layer or of all layers.

    All zero except routed_tokens/routed_experts when every expert is resident (no budget).
    Identities the library keeps: hits + misses == activations; routed_experts ==
    routed_tokens x top-k with exact gating; read_busy_seconds is store-wide (0 in a layer's
    record)."""
    activations: int        # experts asked for by routing (one per expert and batch)
    hits: int               # ... that were resident or already loading
    misses: int             # ... that had to be loaded on demand
    prefetches_issued: int
    prefetches_used: int
    prefetches_wasted: int  # speculative loads evicted or dropped before use
    bytes_read: int         # from storage
    wait_seconds: float     # time computation waited for loads
    predicted: int          # activations whose expert a predictor named beforehand
    predictions: int        # distinct experts predicted
    ready_when_needed: int  # activations whose expert was fully loaded when asked for
    routed_tokens: int      # (token, layer) pairs routed, budget or not
    routed_experts: int     # experts they used after adaptive gating
    read_busy_seconds: float  # wall time with a storage read in flight (all layers only)

    @classmethod
    def _from_c(cls, s: "_lib.ExpertStats") -> "ExpertStats":
        return cls(**{f.name: getattr(s, f.name) for f in dataclasses.fields(cls)})

    def as_dict(self) -> Dict[str, Union[int, float]]:
        return dataclasses.asdict(self)


def _progress_thunk(fn: Callable[[float], Any], box: list):
    """A PROGRESS_FN calling fn(progress); False cancels. An exception raised by fn cancels too
    and is kept in box[0] to be raised by the caller once the C call returned."""
    guard = _exit_guard

    def _progress(p, _user):
        try:
            if box[0] is not None or guard.stopping():
                return 0
            return 0 if fn(float(p)) is False else 1
        except BaseException as e:  # noqa: BLE001 - never unwind into C; re-raised after the call
            if box[0] is None:
                box[0] = e
            return 0
    return _lib.PROGRESS_FN(_progress)


class Model:
    """A loaded GGUF model (moelite_model). Immutable and thread-safe once loaded.

    backend: "auto", "cpu", "vulkan", "cuda" (or the moelite_backend int). threads: None for the
    library default (physical cores). vocab_only: load only the tokenizer (tokenize/detokenize/
    chat_format work, contexts cannot be created). use_mmap: False reads the weights into owned
    memory instead of computing on the file mapping.
    progress: optional callable(float) -> bool called on the loading thread with progress in
    [0, 1]; returning False cancels the load (MoeliteError ERR_PROGRESS_ABORTED); an exception
    raised by it cancels the load too and is re-raised by Model() itself.

    Model.inspect(path) reads a file's header, metadata and tokenizer without loading weights.

    chat_template: a template family ("chatml", "mistral", "llama3", "tulu", "harmony", "plain") or a
    template source (Jinja text as in GGUF files) used instead of the file's
    tokenizer.chat_template (moelite_model_params_set_chat_template; MoeliteError
    ERR_INVALID_ARGUMENT for text that is neither).

    Expert store: expert_budget (bytes; "auto" sizes it at load from the memory available then,
    leaving budget_headroom bytes, None: max(64 MiB, 10 % of the room)), or budget_fraction (a
    share in (0, 1] of what holding every expert takes: 1.0 keeps them all resident once read;
    ERR_INVALID_ARGUMENT outside that range, ERR_BUDGET_TOO_SMALL below the minimum working
    set), policy ("lru", "lfu",
    "decay", "static", "belady"), predictor ("none", "next-gate", "first-layer", "learned",
    "correlation", "pregate") with predictor_depth (next-gate's layers ahead), profile (a
    calibration profile path), gating ("exact", "sensitivity", "cache-aware", "score") with
    threshold, gating_penalty (cache-aware's factor for non-resident experts, None: 4) and
    gating_substitutes (cache-aware's resident stand-ins among the router's next N, None: 0, off),
    allocation ("auto", "global", "uniform", "dp"). expert_per_layer=True is a deprecated
    spelling of allocation="uniform" (DeprecationWarning; ValueError when allocation is given
    too). None always means the library default; the meaning of each option is that of the
    moelite_model_params_set_* function of include/moelite.h (policy: set_cache_policy,
    predictor: set_predictor).

    Errors: MoeliteError with the status of moelite_model_load or of the setter that refused a
    value (e.g. ERR_INVALID_ARGUMENT for threads=-1, ERR_FILE_NOT_FOUND, ERR_BAD_PROFILE,
    ERR_BUDGET_TOO_SMALL); ValueError for an unknown backend name or budget_headroom without
    expert_budget="auto".

    Lifetime: close() (or the `with` block) closes the model's contexts still open and then
    releases the model. Without close() the handle is released when the object is collected;
    a Context keeps its Model object alive, and the library keeps the model's memory until its
    last context is freed, so collection order never matters.
    """

    def __init__(self, path: PathLike, threads: Optional[int] = None, backend: Union[str, int] = "auto",
                 vocab_only: bool = False, use_mmap: bool = True,
                 expert_budget: Union[int, str, None] = None,
                 progress: Optional[Callable[[float], Any]] = None, policy: Optional[str] = None,
                 predictor: Optional[str] = None, predictor_depth: Optional[int] = None,
                 profile: Optional[PathLike] = None, gating: Optional[str] = None, threshold: float = 0.0,
                 allocation: Optional[str] = None, budget_headroom: Optional[int] = None,
                 gating_penalty: Optional[float] = None, expert_per_layer: Optional[bool] = None,
                 budget_fraction: Optional[float] = None, chat_template: Optional[TextLike] = None,
                 gating_substitutes: Optional[int] = None):
        self._ptr = None
        self._contexts: "weakref.WeakSet[Context]" = weakref.WeakSet()
        self._free = _c.moelite_model_free  # kept for __del__ during interpreter shutdown
        self.path = path
        self.inspected = False
        if expert_per_layer is not None:
            warnings.warn("Model(expert_per_layer=...) is deprecated; use allocation=\"uniform\"",
                          DeprecationWarning, stacklevel=2)
            if allocation is not None:
                raise ValueError("give allocation or the deprecated expert_per_layer, not both")
            if expert_per_layer:
                allocation = "uniform"
        if budget_fraction is not None and (expert_budget is not None or budget_headroom is not None):
            raise ValueError("give expert_budget or budget_fraction, not both")
        bpath = _as_bytes(path if isinstance(path, (str, bytes)) else str(path), "path")
        if isinstance(backend, str):
            if backend.lower() not in _BACKENDS:
                raise ValueError("backend must be one of %s, not %r" % (sorted(_BACKENDS), backend))
            backend_id = _BACKENDS[backend.lower()]
        else:
            backend_id = int(backend)

        params = _c.moelite_model_params_create()
        if not params:
            raise MemoryError("moelite_model_params_create failed")
        progress_ref, box = None, [None]
        try:
            if threads is not None:
                _check(_c.moelite_model_params_set_threads(params, int(threads)))
            _check(_c.moelite_model_params_set_backend(params, backend_id))
            _check(_c.moelite_model_params_set_use_mmap(params, 1 if use_mmap else 0))
            _check(_c.moelite_model_params_set_vocab_only(params, 1 if vocab_only else 0))
            if isinstance(expert_budget, str) and expert_budget == "auto":
                _check(_c.moelite_model_params_set_expert_budget_auto(
                    params, 0 if budget_headroom is None else int(budget_headroom)))
            elif budget_headroom is not None:
                raise ValueError("budget_headroom goes with expert_budget='auto'")
            elif expert_budget is not None:
                _check(_c.moelite_model_params_set_expert_budget(params, int(expert_budget)))
            if budget_fraction is not None:
                _check(_c.moelite_model_params_set_expert_budget_fraction(params, float(budget_fraction)))
            if chat_template is not None:
                tpl = _as_bytes(chat_template, "chat_template")
                if b"\0" in tpl:
                    raise ValueError("chat_template cannot contain NUL")
                _check(_c.moelite_model_params_set_chat_template(params, tpl))
            for setter, value in ((_c.moelite_model_params_set_cache_policy, policy),
                                  (_c.moelite_model_params_set_predictor, predictor),
                                  (_c.moelite_model_params_set_cache_allocation, allocation)):
                if value is not None:
                    _check(setter(params, _as_bytes(value, "option")))
            if predictor_depth is not None:
                _check(_c.moelite_model_params_set_predictor_depth(params, int(predictor_depth)))
            if profile is not None:
                _check(_c.moelite_model_params_set_profile(params, _as_bytes(str(profile), "profile")))
            if gating is not None:
                _check(_c.moelite_model_params_set_gating(params, _as_bytes(gating, "gating"), float(threshold)))
            if gating_penalty is not None:
                _check(_c.moelite_model_params_set_gating_penalty(params, float(gating_penalty)))
            if gating_substitutes is not None:
                _check(_c.moelite_model_params_set_gating_substitutes(params, int(gating_substitutes)))
            out = ctypes.c_void_p()
            if progress is not None:
                progress_ref = _progress_thunk(progress, box)  # alive for the whole load call
                _check(_c.moelite_model_params_set_progress_callback(params, progress_ref, None))
                _exit_guard.enter()
                try:
                    st = int(_c.moelite_model_load(bpath, params, ctypes.byref(out)))
                    msg = _last_error() if st else ""
                finally:
                    _exit_guard.leave()
            else:
                st = int(_c.moelite_model_load(bpath, params, ctypes.byref(out)))
                msg = _last_error() if st else ""
            if box[0] is not None:  # the progress callback raised: the load is cancelled
                if st == 0:
                    self._free(out.value)
                raise box[0]
            if st != 0:
                raise MoeliteError(st, msg)
            self._ptr = out.value
        finally:
            _c.moelite_model_params_free(params)
            del progress_ref, box
        self.vocab_only = bool(vocab_only)

    @classmethod
    def inspect(cls, path: PathLike) -> "Model":
        """Reads what a model file is without loading it (moelite_model_inspect): header,
        metadata and tokenizer, tensors checked against the architecture, no weight read, no
        backend, no budget. The result answers the size and hyperparameter properties
        (expert_bytes, expert_min_budget, n_layers...; runtime ones such as threads or
        expert_budget are 0), metadata, tokens and chat functions; `inspected` is True and
        Context() refuses it (MoeliteError ERR_INVALID_ARGUMENT). Raises MoeliteError with every
        status Model() gives for a bad file (ERR_FILE_NOT_FOUND, ERR_GGUF_*, ERR_MISSING_TENSOR,
        ...). Close it like a loaded model (close(), `with`, or the garbage collector)."""
        self = cls.__new__(cls)
        self._ptr = None
        self._contexts = weakref.WeakSet()
        self._free = _c.moelite_model_free
        self.path = path
        self.inspected = True
        self.vocab_only = False
        bpath = _as_bytes(path if isinstance(path, (str, bytes)) else str(path), "path")
        out = ctypes.c_void_p()
        _check(_c.moelite_model_inspect(bpath, ctypes.byref(out)))
        self._ptr = out.value
        return self

    def calibrate(self, tokens: Sequence[int], profile_path: PathLike, window: int = 256, stride: int = 1,
                  holdout: float = 0.25, sensitivity_tokens: int = -1,
                  progress: Optional[Callable[[float], Any]] = None) -> None:
        """Writes a calibration profile of this model on `tokens` (a corpus's token ids) to
        profile_path (moelite_calibrate; plus profile_path + ".bin"): per-layer sensitivities,
        hit curves, fitted predictors. window: tokens per evaluation window (>= 2); stride:
        layers ahead the learned predictors look (>= 1); holdout: share of tokens kept out of
        fitting, in (0, 1); sensitivity_tokens: tokens the sensitivity passes run on (-1: the
        default sample, 0: all). progress: callable(float) -> bool after every forward pass;
        False cancels (MoeliteError ERR_CANCELLED), an exception cancels and is re-raised.

        The model must have been loaded with exact gating and no context of it may evaluate
        meanwhile. Errors: MoeliteError ERR_INVALID_ARGUMENT (bad parameter, fewer than 2 tokens,
        bad tokens, non-exact gating), ERR_IO (cannot write), ERR_CANCELLED, evaluation errors;
        existing files are replaced only once complete."""
        arr, n = _token_array(tokens)
        params = _c.moelite_calibrate_params_create()
        if not params:
            raise MemoryError("moelite_calibrate_params_create failed")
        box, progress_ref = [None], None
        try:
            _check(_c.moelite_calibrate_params_set_window(params, int(window)))
            _check(_c.moelite_calibrate_params_set_stride(params, int(stride)))
            _check(_c.moelite_calibrate_params_set_holdout(params, float(holdout)))
            _check(_c.moelite_calibrate_params_set_sensitivity_tokens(params, int(sensitivity_tokens)))
            if progress is not None:
                progress_ref = _progress_thunk(progress, box)
                _check(_c.moelite_calibrate_params_set_progress_callback(params, progress_ref, None))
            h = self._handle()
            path = _as_bytes(str(profile_path), "profile_path")
            _exit_guard.enter()
            try:
                st = int(_c.moelite_calibrate(h, arr, n, params, path))
                msg = _last_error() if st else ""
            finally:
                _exit_guard.leave()
            if box[0] is not None:
                raise box[0]
            if st != 0:
                raise MoeliteError(st, msg)
        finally:
            _c.moelite_calibrate_params_free(params)
            del progress_ref, box

    def plan_batch(self, n_ctx: Optional[int] = None, n_batch: Optional[int] = None, max_sequences: int = 16,
                   min_sequences: int = 1,
                   memory: int = 0, headroom: int = 0, expert_budget: Union[str, int] = "auto",
                   storage_gb_s: float = 0.0, compute_gb_s: float = 0.0, allocation: str = "auto",
                   profile: Optional[PathLike] = None, routing_trace: Optional[PathLike] = None,
                   routing: Optional[Sequence[Sequence[Sequence[int]]]] = None) -> dict:
        """How many sequences to decode together and how much memory the experts get
        (moelite_plan_batch), as a dict: n_seq, expert_budget_bytes, kv_bytes, lookahead,
        predicted_decode_tok_s, reason, the inputs and a row per candidate 1..max_sequences; the
        choice is among min_sequences..max_sequences (equal: the budget and pools for exactly n).
        On an inspected model the planner sizes the budget (expert_budget "auto"), or plans the
        sequences for a fixed budget in bytes, or "resident"; a loaded model keeps its own budget
        and pools.
        memory: 0 for the room now; headroom: 0 for max(64 MiB, 10 %). storage_gb_s is needed
        unless resident. allocation: "auto" (the plan picks global or per-layer pools), "global",
        "uniform" or "dp". profile: a calibration profile whose expert counts give the routing
        shares (default: the model's own profile, else uniform routing). routing_trace: a routing
        trace of one sequence (`moelite trace record`) replayed instead, which measures a
        sequence's reuse of its recent experts (not with profile). routing: the same from memory
        (moelite_plan_params_set_routing), one entry per token of one sequence, each a list of the
        MoE layers' expert ids in model order (what a routing callback saw; -1 or fewer ids for
        dropped slots); not with routing_trace. Raises MoeliteError
        ERR_INVALID_ARGUMENT (bad values, no storage bandwidth, a trace of another model),
        ERR_BUDGET_TOO_SMALL (not one sequence fits), ERR_BAD_PROFILE (a profile of another
        model), ERR_FILE_NOT_FOUND (no such trace)."""
        budget = {"auto": 0, "resident": (1 << 64) - 1}.get(expert_budget, expert_budget)
        if not isinstance(budget, int):
            raise ValueError('expert_budget is "auto", "resident" or bytes')
        params = _c.moelite_plan_params_create()
        cparams = _c.moelite_context_params_create()
        plan = ctypes.c_void_p()
        try:
            if not params or not cparams:
                raise MemoryError("creating plan parameters failed")
            _check(_c.moelite_plan_params_set_max_sequences(params, int(max_sequences)))
            _check(_c.moelite_plan_params_set_min_sequences(params, int(min_sequences)))
            _check(_c.moelite_plan_params_set_memory(params, int(memory)))
            _check(_c.moelite_plan_params_set_headroom(params, int(headroom)))
            _check(_c.moelite_plan_params_set_expert_budget(params, budget))
            _check(_c.moelite_plan_params_set_bandwidths(params, float(storage_gb_s), float(compute_gb_s)))
            _check(_c.moelite_plan_params_set_cache_allocation(params, _as_bytes(allocation, "allocation")))
            if profile is not None:
                _check(_c.moelite_plan_params_set_profile(params, _as_bytes(str(profile), "profile")))
            if routing_trace is not None and routing is not None:
                raise ValueError("give routing_trace or routing, not both")
            if routing_trace is not None:
                _check(_c.moelite_plan_params_set_routing_trace(params, _as_bytes(str(routing_trace), "routing_trace")))
            if routing is not None:
                tokens = [[list(layer) for layer in token] for token in routing]
                if not tokens or not tokens[0]:
                    raise ValueError("routing needs at least one token of at least one layer")
                n_layers = len(tokens[0])
                if any(len(token) != n_layers for token in tokens):
                    raise ValueError("every token of routing needs the same number of layers")
                k = max(self.n_experts_used, max(len(ids) for token in tokens for ids in token))
                flat = [x for token in tokens for ids in token for x in list(ids) + [-1] * (k - len(ids))]
                array = (ctypes.c_int32 * len(flat))(*flat)
                _check(_c.moelite_plan_params_set_routing(params, len(tokens), n_layers, k, array))
            if n_ctx is not None:
                _check(_c.moelite_context_params_set_n_ctx(cparams, int(n_ctx)))
            if n_batch is not None:
                _check(_c.moelite_context_params_set_n_batch(cparams, int(n_batch)))
            _check(_c.moelite_plan_batch(self._handle(), cparams, params, ctypes.byref(plan)))
            return json.loads(_c.moelite_batch_plan_json(plan).decode())
        finally:
            if plan:
                _c.moelite_batch_plan_free(plan)
            _c.moelite_context_params_free(cparams)
            _c.moelite_plan_params_free(params)

    # ---- lifetime ----
    def _handle(self) -> int:
        if not self._ptr:
            raise ValueError("the model is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        """True after close()."""
        return not self._ptr

    def close(self) -> None:
        """Closes every context still open on this model (stopping their generations), then
        releases the model. Idempotent."""
        if not self._ptr:
            return
        for ctx in list(self._contexts):
            ctx.close()
        self._release()

    def _release(self) -> None:
        # Only this object's reference: the library keeps the model for contexts still open.
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._free(ptr)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # Not close(): a finalizer must not touch the contexts. In a garbage cycle they may be
        # finalized in any order and the WeakSet is already empty; the library's reference
        # counting keeps the model for them.
        try:
            self._release()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self) -> str:
        if not self._ptr:
            return "<moelite.Model closed>"
        return "<moelite.Model %s %r n_vocab=%d>" % (self.arch, self.name, self.n_vocab)

    # ---- properties ----
    def _str(self, fn) -> Optional[str]:
        s = fn(self._handle())
        return s.decode("utf-8", "replace") if s is not None else None

    @property
    def arch(self) -> str:
        """general.architecture, e.g. "qwen3moe"."""
        return self._str(_c.moelite_model_arch)

    @property
    def name(self) -> str:
        """general.name ("" if absent)."""
        return self._str(_c.moelite_model_name)

    @property
    def expert_type(self) -> str:
        """Weight type holding most expert bytes, e.g. "Q4_K"."""
        return self._str(_c.moelite_model_expert_type)

    @property
    def backend_name(self) -> str:
        """Backend in use with its SIMD level, e.g. "cpu (avx512)"."""
        return self._str(_c.moelite_model_backend_name)

    def measure_device_bandwidth(self) -> float:
        """Memory bandwidth of the GPU the model computes on, in GB/s (copies within device memory;
        about a second). Raises MoeliteError: ERR_NOT_IMPLEMENTED for the CPU backend,
        ERR_INVALID_ARGUMENT for a vocabulary-only model, ERR_OUT_OF_MEMORY, ERR_BACKEND."""
        gbs = ctypes.c_double(0.0)
        _check(_c.moelite_model_measure_device_bandwidth(self._handle(), ctypes.byref(gbs)))
        return gbs.value

    @property
    def chat_template_kind(self) -> str:
        """Recognised chat template family: chatml, mistral, llama3, tulu, harmony, deepseek2, deepseek3 or plain."""
        return self._str(_c.moelite_chat_template_kind)

    @property
    def backend(self) -> Union[str, int]:
        """The backend actually chosen, as a name ("cpu", ...)."""
        b = self.backend_id
        for k, v in _BACKENDS.items():
            if v == b:
                return k
        return b

    @property
    def bos(self) -> int:
        """BOS token id, -1 if none."""
        return int(_c.moelite_token_bos(self._handle()))

    @property
    def eos(self) -> int:
        """EOS token id, -1 if none."""
        return int(_c.moelite_token_eos(self._handle()))

    def token_is_end(self, token: int) -> bool:
        """True if generation stops at `token` (EOS, end-of-turn and similar control tokens;
        moelite_token_is_end). False for ids outside the vocabulary."""
        return bool(_c.moelite_token_is_end(self._handle(), int(token)))

    def is_end_token(self, token: int) -> bool:
        """Deprecated alias of token_is_end() (the C name is moelite_token_is_end)."""
        warnings.warn("Model.is_end_token() is deprecated; use Model.token_is_end()",
                      DeprecationWarning, stacklevel=2)
        return self.token_is_end(token)

    def info(self) -> Dict[str, Any]:
        """All numeric properties and names as a dict."""
        d = {k: getattr(self, k) for k in _KEYS}
        d.update(arch=self.arch, name=self.name, expert_type=self.expert_type,
                 backend_name=self.backend_name, backend=self.backend)
        return d

    # ---- expert store statistics ----
    def expert_stats(self, layer: int = -1) -> ExpertStats:
        """Cumulative expert-store counters of one layer, or of all layers for layer=-1
        (moelite_model_expert_stats). Thread-safe. MoeliteError ERR_INVALID_ARGUMENT for a
        layer outside [-1, n_layers)."""
        s = _lib.ExpertStats()
        s.struct_size = ctypes.sizeof(_lib.ExpertStats)
        _check(_c.moelite_model_expert_stats(self._handle(), int(layer), ctypes.byref(s)))
        return ExpertStats._from_c(s)

    def expert_stats_per_layer(self) -> List[ExpertStats]:
        """expert_stats(l) for every layer l (each read separately: counters of a model that
        is evaluating meanwhile may move between layers)."""
        return [self.expert_stats(layer) for layer in range(self.n_layers)]

    def reset_expert_stats(self) -> None:
        """Zeroes the expert-store counters (moelite_model_reset_expert_stats), e.g. between a
        warm-up and a measurement."""
        _c.moelite_model_reset_expert_stats(self._handle())

    def trace_begin(self, path: PathLike) -> None:
        """Starts recording a timeline of this model's work (routing, expert reads, computation,
        waits, prefetches) in the Chrome trace-event format that Perfetto opens
        (moelite_model_trace_begin). Raises MoeliteError(IO) at once when `path` cannot be written."""
        _check(_c.moelite_model_trace_begin(self._handle(), os.fsencode(os.fspath(path))))

    def trace_end(self) -> None:
        """Stops the timeline and writes it (moelite_model_trace_end)."""
        _check(_c.moelite_model_trace_end(self._handle()))

    # ---- text ----
    def tokenize(self, text: TextLike, add_special: bool = False, parse_special: bool = False, *,
                 flags: Union[TokenizeFlag, int] = 0) -> List[int]:
        """Token ids (list of int) of `text` (str, UTF-8 encoded, or raw bytes; any bytes).
        add_special adds BOS/EOS as the model's metadata asks (TokenizeFlag.ADD_SPECIAL);
        parse_special turns text like "<|im_start|>" into that control token
        (TokenizeFlag.PARSE_SPECIAL). `flags` is OR-ed with them. Raises ValueError for unknown
        flag bits, MoeliteError ERR_MISSING_METADATA for a model file without a tokenizer."""
        data = _as_bytes(text)
        flags = int(flags)
        if flags & ~int(TokenizeFlag.ADD_SPECIAL | TokenizeFlag.PARSE_SPECIAL):
            raise ValueError("unknown tokenize flags 0x%x" % flags)
        flags |= (TokenizeFlag.ADD_SPECIAL if add_special else 0) | (TokenizeFlag.PARSE_SPECIAL if parse_special else 0)
        cap = len(data) + 8
        n = ctypes.c_int32(0)
        for _ in range(4):
            buf = (ctypes.c_int32 * cap)()
            st = _c.moelite_tokenize(self._handle(), data, len(data), int(flags), buf, cap, ctypes.byref(n))
            if st == Status.ERR_BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            _check(st)
            return list(buf[: n.value])
        raise MoeliteError(Status.ERR_INTERNAL, "token count kept growing")  # pragma: no cover

    def detokenize_bytes(self, tokens: Iterable[int], special: bool = False, *,
                         flags: Union[DetokenizeFlag, int] = 0) -> bytes:
        """The bytes the tokens stand for (may end inside a UTF-8 character). special (or
        flags=DetokenizeFlag.RENDER_SPECIAL) includes the text of control tokens. Raises
        MoeliteError ERR_BAD_TOKEN for an id out of range, ValueError for unknown flag bits."""
        arr, n = _token_array(tokens)
        flags = int(flags)
        if flags & ~int(DetokenizeFlag.RENDER_SPECIAL):
            raise ValueError("unknown detokenize flags 0x%x" % flags)
        flags |= int(DetokenizeFlag.RENDER_SPECIAL) if special else 0
        h = self._handle()
        return _two_call_text(
            lambda buf, cap, plen: _c.moelite_detokenize(h, arr, n, flags, buf, cap, plen),
            16 * n + 16)

    def detokenize(self, tokens: Iterable[int], special: bool = False, errors: str = "replace", *,
                   flags: Union[DetokenizeFlag, int] = 0) -> str:
        """The text the tokens stand for, decoded as UTF-8 (invalid bytes -> U+FFFD by default).
        Same flags and errors as detokenize_bytes()."""
        return self.detokenize_bytes(tokens, special, flags=flags).decode("utf-8", errors)

    def chat_format(self, messages: Iterable[Mapping[str, TextLike]], add_assistant_prompt: bool = True) -> str:
        """Formats [{"role": ..., "content": ...}, ...] with the model's chat template
        (moelite_chat_format; an unknown template falls back to "role: content" lines) -> str.
        add_assistant_prompt appends the opening of the assistant's reply. The text is for
        display and logs: to evaluate a conversation use chat_tokenize() (or Context.chat()),
        since tokenizing this text with parse_special would turn message content such as
        "<|im_end|>" into real turn markers. TypeError for a message that is not such a
        mapping, ValueError for text containing NUL."""
        arr, n, keep = _chat_array(messages)
        h = self._handle()
        guess = sum(len(k) for k in keep) + 64 * n + 64
        out = _two_call_text(
            lambda buf, cap, plen: _c.moelite_chat_format(h, arr, n, 1 if add_assistant_prompt else 0,
                                                          buf, cap, plen),
            guess)
        return out.decode("utf-8", "replace")

    def chat_tokenize(self, messages: Iterable[Mapping[str, TextLike]],
                      add_assistant_prompt: bool = True) -> List[int]:
        """The token ids of the conversation formatted as chat_format() formats it, tokenized so
        that message content (and roles) is always text (moelite_chat_tokenize): control tokens
        come only from the template, so content that spells "<|im_end|>" or "[INST]" becomes
        the tokens of those characters, never a turn marker. BOS/EOS are added as the
        vocabulary asks. Evaluate these ids (Context.generate(ids), Context.chat()) to run a
        chat with untrusted content. Same TypeError/ValueError as chat_format(); MoeliteError
        ERR_MISSING_METADATA for a model without a tokenizer."""
        arr, n, keep = _chat_array(messages)
        h = self._handle()
        add = 1 if add_assistant_prompt else 0
        cap = sum(len(k) for k in keep) + 32 * n + 64
        count = ctypes.c_int32(0)
        for _ in range(4):
            buf = (ctypes.c_int32 * cap)()
            st = _c.moelite_chat_tokenize(h, arr, n, add, buf, cap, ctypes.byref(count))
            if st == Status.ERR_BUFFER_TOO_SMALL and count.value > cap:
                cap = count.value
                continue
            _check(st)
            return list(buf[: count.value])
        raise MoeliteError(Status.ERR_INTERNAL, "token count kept growing")  # pragma: no cover

    # ---- vocabulary ----
    def token_attrs(self, token: int) -> "TokenAttr":
        """The TokenAttr flags of `token` (moelite_token_attrs): NORMAL, CONTROL, BYTE, END...
        TokenAttr.NONE (0) for an id outside the vocabulary or a model without a tokenizer."""
        return TokenAttr(int(_c.moelite_token_attrs(self._handle(), int(token))))

    def token_text(self, token: int) -> str:
        """The vocabulary string of `token` as stored in the file (moelite_token_text), e.g.
        "<|im_end|>" or "\u0120the" for byte-level BPE (decoded as UTF-8, invalid bytes
        replaced); detokenize() gives the text a token stands for. IndexError for an id outside
        the vocabulary."""
        t = _c.moelite_token_text(self._handle(), int(token))
        if t is None:
            raise IndexError("token %d is outside the vocabulary" % int(token))
        return t.decode("utf-8", "replace")

    # ---- file metadata ----
    def meta_keys(self) -> List[str]:
        """The GGUF metadata keys, in file order (moelite_model_meta_count/_key)."""
        h = self._handle()
        keys = []
        for i in range(int(_c.moelite_model_meta_count(h))):
            k = _c.moelite_model_meta_key(h, i)
            if k is not None:
                keys.append(k.decode("utf-8", "replace"))
        return keys

    def meta(self, key: str, default: Any = _MISSING) -> Any:
        """The value of metadata `key` as the library's text (moelite_model_meta_value): strings
        as stored, integers in decimal, floats with round-trip precision, booleans "true" /
        "false", arrays as a JSON array (json.loads() parses it). KeyError when the key is
        absent unless a default is given."""
        h = self._handle()
        bkey = _as_bytes(key, "key")
        n = ctypes.c_size_t(0)
        st = _c.moelite_model_meta_value(h, bkey, None, 0, ctypes.byref(n))
        if st == Status.ERR_MISSING_METADATA:
            if default is _MISSING:
                raise KeyError(key)
            return default
        if st not in (Status.OK, Status.ERR_BUFFER_TOO_SMALL):
            _check(st)
        data = _two_call_text(lambda buf, cap, plen: _c.moelite_model_meta_value(h, bkey, buf, cap, plen),
                              n.value + 1)
        return data.decode("utf-8", "replace")

    @property
    def metadata(self) -> "Metadata":
        """A read-only mapping over the GGUF metadata: keys in file order, values as meta()."""
        return Metadata(self)


class Metadata(_AbcMapping):
    """Read-only, live view of a model's GGUF metadata (Model.metadata): `m[key]` is
    Model.meta(key) (text; KeyError when absent), iteration gives the keys in file order. Values
    are read on access; the view keeps its Model object alive."""

    def __init__(self, model: "Model"):
        self._model = model

    def __getitem__(self, key: str) -> str:
        return self._model.meta(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._model.meta_keys())

    def __len__(self) -> int:
        return int(_c.moelite_model_meta_count(self._model._handle()))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._model.meta(key, None) is not None


def _chat_array(messages: Iterable[Mapping[str, TextLike]]):
    """(moelite_chat_message array, count, the encoded strings that must outlive the call)."""
    msgs = list(messages)
    keep: List[bytes] = []
    arr = (_lib.ChatMessage * max(len(msgs), 1))()
    for i, m in enumerate(msgs):
        try:
            role, content = m["role"], m["content"]
        except (KeyError, TypeError):
            raise TypeError("each message must be a mapping with 'role' and 'content'") from None
        r, c = _as_bytes(role, "role"), _as_bytes(content, "content")
        if b"\0" in r or b"\0" in c:
            raise ValueError("chat messages cannot contain NUL characters")
        keep += [r, c]
        arr[i].role, arr[i].content = r, c
    return arr, len(msgs), keep


for _name, _key in _KEYS.items():
    setattr(Model, _name, _key_property(_name, _key))
del _name, _key


class _CtxState:
    """What a context's C callbacks read; holds no reference to the Context (no cycle).

    `pending` is the first exception a callback (the user's abort or routing function) raised
    during the current eval/generate call: the callback cannot unwind through C, so it stores
    the exception, the abort callback then answers "abort", and the Python caller re-raises it
    once the C call returned."""

    def __init__(self, user_abort, user_routing):
        self.cancel = threading.Event()
        self.user_abort = user_abort
        self.user_routing = user_routing
        self.pending: Optional[BaseException] = None

    def begin(self) -> None:
        self.cancel.clear()
        self.pending = None

    def fail(self, exc: BaseException) -> None:
        if self.pending is None:
            self.pending = exc

    def take(self) -> Optional[BaseException]:
        exc, self.pending = self.pending, None
        return exc


def _make_abort_callback(state: _CtxState, guard: _ExitGuard):
    def _abort(_user):
        try:
            if state.pending is not None or state.cancel.is_set() or guard.stopping():
                return 1
            if state.user_abort is not None and state.user_abort():
                return 1
            return 0
        except BaseException as e:  # noqa: BLE001 - never unwind into C; re-raised after the call
            state.fail(e)
            return 1
    return _lib.ABORT_FN(_abort)


def _make_routing_callback(state: _CtxState, guard: _ExitGuard):
    np = _np

    def _routing(layer, pos0, n_tokens, k, experts, weights, _user):
        try:
            if state.pending is not None or guard.stopping():
                return
            n = n_tokens * k
            if np is not None:
                if n > 0:
                    e = np.ctypeslib.as_array(experts, shape=(n,)).reshape(n_tokens, k).copy()
                    w = np.ctypeslib.as_array(weights, shape=(n,)).reshape(n_tokens, k).copy()
                else:
                    e = np.zeros((n_tokens, k), np.int32)
                    w = np.zeros((n_tokens, k), np.float32)
            else:
                e = [list(experts[t * k:(t + 1) * k]) for t in range(n_tokens)]
                w = [list(weights[t * k:(t + 1) * k]) for t in range(n_tokens)]
            state.user_routing(int(layer), int(pos0), e, w)
        except BaseException as exc:  # noqa: BLE001 - never unwind into C; re-raised after the call
            state.fail(exc)
    return _lib.ROUTING_FN(_routing)


LogitsCallback = Callable[[Any, Any], Any]


def _make_logits_callback(fn: LogitsCallback, sink: "_CtxState", guard: _ExitGuard):
    """A LOGITS_FN calling fn(logits, history); returning False stops, anything else (None
    included: a masking function need not return anything) continues. logits: a writable numpy
    float32 view (n_vocab,) of the library's copy (a ctypes float array without numpy), valid
    during the call only; history: the sequence's token ids so far (a numpy int32 copy, else a
    list). An exception stops too and is kept in sink to be re-raised once
    the C call returned."""
    np = _np

    def _logits(ptr, n_vocab, history, n_history, _user):
        try:
            if sink.pending is not None or guard.stopping():
                return 0
            if np is not None:
                view = np.ctypeslib.as_array(ptr, shape=(int(n_vocab),))
                hist = (np.ctypeslib.as_array(history, shape=(int(n_history),)).copy() if n_history > 0
                        else np.zeros(0, np.int32))
            else:
                view = (ctypes.c_float * int(n_vocab)).from_address(ctypes.addressof(ptr.contents))
                hist = list(history[:n_history]) if n_history > 0 else []
            return 0 if fn(view, hist) is False else 1
        except BaseException as exc:  # noqa: BLE001 - never unwind into C; re-raised after the call
            sink.fail(exc)
            return 0
    return _lib.LOGITS_FN(_logits)


def _generate_params(opts: Mapping[str, Any], stops: Sequence[bytes] = (),
                     logit_bias: Optional[Mapping[int, float]] = None, parse_special: Optional[bool] = None,
                     piece_ref=None, token_ref=None, logits_ref=None):
    """A moelite_generate_params from the Python options (None: the library default); the
    caller frees it. Raises MoeliteError (a setter refused a value) after freeing it."""
    p = _c.moelite_generate_params_create()
    if not p:
        raise MemoryError("moelite_generate_params_create failed")
    try:
        o = opts
        if o.get("max_tokens") is not None:
            _check(_c.moelite_generate_params_set_max_tokens(p, int(o["max_tokens"])))
        if o.get("temperature") is not None:
            _check(_c.moelite_generate_params_set_temperature(p, float(o["temperature"])))
        if o.get("top_k") is not None:
            _check(_c.moelite_generate_params_set_top_k(p, int(o["top_k"])))
        if o.get("top_p") is not None:
            _check(_c.moelite_generate_params_set_top_p(p, float(o["top_p"])))
        if o.get("min_p") is not None:
            _check(_c.moelite_generate_params_set_min_p(p, float(o["min_p"])))
        if o.get("repeat_penalty") is not None or o.get("repeat_last_n") is not None:
            pen = 1.0 if o.get("repeat_penalty") is None else float(o["repeat_penalty"])
            last_n = 64 if o.get("repeat_last_n") is None else int(o["repeat_last_n"])
            _check(_c.moelite_generate_params_set_repeat_penalty(p, pen, last_n))
        if o.get("seed") is not None:
            _check(_c.moelite_generate_params_set_seed(p, int(o["seed"]) & 0xFFFFFFFFFFFFFFFF))
        for s in stops:
            _check(_c.moelite_generate_params_add_stop(p, s))
        for token, bias in (logit_bias or {}).items():
            _check(_c.moelite_generate_params_set_logit_bias(p, int(token), float(bias)))
        if parse_special is not None:
            _check(_c.moelite_generate_params_set_parse_special(p, 1 if parse_special else 0))
        if piece_ref is not None:
            _check(_c.moelite_generate_params_set_callback(p, piece_ref, None))
        if token_ref is not None:
            _check(_c.moelite_generate_params_set_token_callback(p, token_ref, None))
        if logits_ref is not None:
            _check(_c.moelite_generate_params_set_logits_callback(p, logits_ref, None))
    except BaseException:
        _c.moelite_generate_params_free(p)
        raise
    return p


class _Generation:
    """One moelite_generate / moelite_generate_tokens call running on a helper thread, handing
    pieces (or (token, text) pairs) to the iterator.

    Why a thread: moelite_generate pushes text through a piece callback and returns only when
    the generation ends, while a Python iterator pulls; without a helper thread generate() could
    not yield pieces as they come. A Sampler + eval loop on the caller's thread could pull
    tokens, but it would re-implement in Python what the library's call does besides sampling
    (reuse of the cached prefix, the stop-string and UTF-8 hold-back of the text stream, end
    tokens, the context-full check, stats), so generation stays one library call.

    The worker (a daemon thread) runs at most one piece ahead of the consumer: after queuing a
    piece, the piece callback waits until the consumer has taken the previous one (`demand`).
    So an iterator abandoned without being closed leaves a paused generation, never a runaway
    one. stop() (from the iterator's close/break/exception, Context.close, Model.close, any other
    call on the context, or the atexit hook of _ExitGuard) makes the piece callback return 0,
    aborts a prompt evaluation in progress through the abort callback and joins the worker:
    bounded by one forward pass.

    Exit: the worker is registered with _exit_guard, whose atexit hook stops it before the
    interpreter finalizes. Should stop() still find it alive during finalization (the hook
    timed out or was removed), it neither wakes nor joins it -- a thread frozen by finalization
    can be neither joined nor safely resumed -- and marks the generation `abandoned`: the
    context then leaks its handle instead of freeing memory a parked thread still uses."""

    _is_finalizing = staticmethod(sys.is_finalizing)
    _current_thread = staticmethod(threading.current_thread)

    def __init__(self, ctx: "Context", yield_tokens: bool = False,
                 logits: Optional[LogitsCallback] = None):
        self.ctx_ref = weakref.ref(ctx)
        self.state = ctx._state
        self.ctx_lock = ctx._lock
        self.guard = _exit_guard
        self.queue: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self.demand = threading.Semaphore(0)
        self.stopped = threading.Event()
        self.worker: Optional[threading.Thread] = None
        self.params = None
        self.done = False
        self.abandoned = False
        self.returned = False  # set by the worker once moelite_generate has returned
        self.error: Optional[BaseException] = None
        self.got_piece = False
        self.ran = False  # the C call ran (its stats are filled, whatever its status)
        self._stop_lock = threading.Lock()

        stopped, q, demand, guard = self.stopped, self.queue, self.demand, self.guard

        def _on_piece(ptr, length, _user):
            try:
                if stopped.is_set() or guard.exiting:
                    return 0
                q.put(("piece", ctypes.string_at(ptr, length) if length else b""))
                self.got_piece = True
                demand.acquire()
                return 0 if (stopped.is_set() or guard.exiting) else 1
            except BaseException:  # noqa: BLE001 - never unwind into C
                return 0

        def _on_token(token, ptr, length, _user):
            try:
                if stopped.is_set() or guard.exiting:
                    return 0
                q.put(("token", int(token), ctypes.string_at(ptr, length) if length else b""))
                self.got_piece = True
                demand.acquire()
                return 0 if (stopped.is_set() or guard.exiting) else 1
            except BaseException:  # noqa: BLE001 - never unwind into C
                return 0

        # Alive as long as this object (past the join). One of the two streams the consumer.
        self.piece_ref = None if yield_tokens else _lib.PIECE_FN(_on_piece)
        self.token_ref = _lib.TOKEN_FN(_on_token) if yield_tokens else None
        self.logits_ref = _make_logits_callback(logits, self.state, guard) if logits is not None else None

    def on_worker(self) -> bool:
        return self.worker is not None and self.worker is self._current_thread()

    def start(self, data: Union[bytes, Tuple[Any, int]], params) -> None:
        """Starts the worker; frees `params` if it cannot. RuntimeError once the interpreter exits."""
        ctx = self.ctx_ref()
        try:
            self.guard.enter(generation=True)
        except BaseException:
            _c.moelite_generate_params_free(params)
            raise
        try:
            self.params = params
            self.worker = threading.Thread(target=self._work, args=(ctx._ptr, data),
                                           name="moelite-generate", daemon=True)
            with self.guard.cond:
                self.guard.generations.add(self)
            ctx._active = self
            self.state.begin()
            self.worker.start()
        except BaseException:
            ctx._active = None
            self.worker, self.done, self.params = None, True, None
            _c.moelite_generate_params_free(params)
            self.guard.leave()
            raise

    def _work(self, ptr: int, data: Union[bytes, Tuple[Any, int]]) -> None:
        stats = _lib.GenerateStats()
        stats.struct_size = ctypes.sizeof(_lib.GenerateStats)
        st, msg, exc = int(Status.ERR_INTERNAL), "generation did not run", None
        try:
            with self.ctx_lock:
                ctx = self.ctx_ref()
                if ctx is None or ctx._ptr != ptr or not ptr:
                    st, msg = int(Status.ERR_INVALID_ARGUMENT), "the context is closed"
                else:
                    del ctx
                    if isinstance(data, bytes):
                        st = int(_c.moelite_generate(ptr, data, len(data), self.params,
                                                     ctypes.byref(stats)))
                    else:
                        st = int(_c.moelite_generate_tokens(ptr, data[0], data[1], self.params,
                                                            ctypes.byref(stats)))
                    self.ran = True
                    msg = _last_error() if st != 0 else ""  # same thread as the failing call
                    exc = self.state.take()
        finally:
            _c.moelite_generate_params_free(self.params)
            self.params = None
            self.guard.leave()
            self.queue.put(("done", st, msg, stats, exc))
            self.returned = True

    def finish(self, item: tuple) -> None:
        """Records the worker's result: the context's last_stats, or the error to raise."""
        if self.done:
            return
        self.done = True
        _, st, msg, stats, exc = item
        if self.worker is not None and not self.on_worker():
            self.worker.join()
        ctx = self.ctx_ref()
        # The library fills the stats on failure too (what was done before it).
        d = Context._stats_dict(stats) if self.ran else None
        if ctx is not None and d is not None:
            ctx.last_stats = d
        if exc is not None:
            self.error = exc  # raised by the user's abort, routing or logits callback
        elif st != 0 and not (self.stopped.is_set() and st == Status.ERR_ABORTED):
            self.error = MoeliteError(st, msg, d)  # an abort we caused is not an error
        if ctx is not None and ctx._active is self:
            ctx._active = None

    def stop(self, timeout: Optional[float] = None) -> None:
        """Idempotent; safe from the consumer's thread or another one, not from the worker.
        With a timeout the worker may still run on return (then `done` stays False)."""
        with self._stop_lock:
            if self.done or self.worker is None:
                self.done = True
                return
            if self._is_finalizing() and not self.returned:
                # Not worker.is_alive(): finalization deletes the other threads' states, so a
                # thread parked in C already counts as dead.
                self.abandoned = True  # see the class comment
                return
            self.stopped.set()
            if not self.got_piece:
                # Still evaluating the prompt (possibly long): abort it. Once pieces flow, the
                # worker is at most one token away from the callback, which now answers 0, so
                # the call ends normally (STOP_ABORTED) and its stats are kept.
                self.state.cancel.set()
            self.demand.release()
            if not self.on_worker():
                self.worker.join(timeout)
                if self.worker.is_alive():
                    return
            self.state.cancel.clear()
            leftovers = []
            while True:
                try:
                    leftovers.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            for item in leftovers:
                if item[0] == "done":
                    self.finish(item)
            self.queue.put(("stopped",))  # wakes a consumer blocked in get()


_STATS_FIELDS = [f[0] for f in _lib.GenerateStats._fields_ if f[0] != "struct_size"]

RoutingCallback = Callable[[int, int, Any, Any], Any]


class _Closeable:
    """A library handle freed by close() (idempotent): `with` closes it, and so does the garbage
    collector. Subclasses set _ptr and _kind and define close()."""

    _ptr: Optional[int] = None
    _kind = "object"

    def _handle(self) -> int:
        if not self._ptr:
            raise ValueError("the %s is closed" % self._kind)
        return self._ptr

    @property
    def closed(self) -> bool:
        """True after close()."""
        return not self._ptr

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class Context(_Closeable):
    """One inference stream (KV cache + scratch) on a Model; use from one thread at a time.

    n_ctx: tokens the KV cache holds (None: min(training context, 4096)); n_batch: most tokens
    per forward pass (None: 512); n_seq: sequences the context holds, each with its own KV cache
    of n_ctx tokens (None: 1; see eval_batch; the other methods act on sequence 0). Errors: MoeliteError ERR_INVALID_ARGUMENT (bad value, or a
    vocabulary-only model), ERR_OUT_OF_MEMORY; ValueError for a closed model.

    abort: optional callable() -> bool polled between layers (and every 10 ms while waiting for
    another context of the model or for expert reads); True aborts eval/generate with
    MoeliteError ERR_ABORTED. It can be replaced later through the `abort` property. routing: optional callable(layer, pos0, experts, weights) called
    once per MoE layer of every forward pass; experts/weights have shape (n_tokens, k) (numpy
    int32/float32 arrays when numpy is importable, else lists of lists) for the tokens at
    positions pos0.. in top-k order, weights as applied (an expert dropped by adaptive gating is
    -1 with weight 0). Both run on the thread that evaluates: the caller's for eval(), the
    generation's helper thread for generate(). An exception raised by either aborts the call and
    is re-raised by eval() / the generate() iterator in place of a MoeliteError (so a
    KeyboardInterrupt or SystemExit is not swallowed); the context is then as before the call
    for eval(), usable for generate().

    Lifetime: the context keeps its Model object alive (and the library keeps the model's memory
    for it). Model.close() closes the model's contexts first. close() stops a generation in
    progress and frees the context; otherwise the garbage collector does, in any order
    relative to the model.
    """

    def __init__(self, model: Model, n_ctx: Optional[int] = None, n_batch: Optional[int] = None,
                 abort: Optional[Callable[[], Any]] = None, routing: Optional[RoutingCallback] = None,
                 n_seq: Optional[int] = None):
        if not isinstance(model, Model):
            raise TypeError("model must be a moelite.Model")
        self._ptr = None
        self._free = _c.moelite_context_free  # kept for __del__ during interpreter shutdown
        self.model = model
        self.last_stats: Optional[Dict[str, Any]] = None
        self._lock = threading.RLock()
        self._active: Optional[_Generation] = None  # the generation in progress, if any
        self._queues: "weakref.WeakSet[Queue]" = weakref.WeakSet()  # closed before the context
        self._n_vocab = model.n_vocab  # ValueError for a closed model
        self._state = _CtxState(abort, routing)
        self._abort_ref = _make_abort_callback(self._state, _exit_guard)  # alive as long as the context
        self._routing_ref = _make_routing_callback(self._state, _exit_guard) if routing is not None else None
        params = _c.moelite_context_params_create()
        if not params:
            raise MemoryError("moelite_context_params_create failed")
        try:
            if n_ctx is not None:
                _check(_c.moelite_context_params_set_n_ctx(params, int(n_ctx)))
            if n_batch is not None:
                _check(_c.moelite_context_params_set_n_batch(params, int(n_batch)))
            if n_seq is not None:
                _check(_c.moelite_context_params_set_n_seq(params, int(n_seq)))
            if self._routing_ref is not None:
                _check(_c.moelite_context_params_set_routing_callback(params, self._routing_ref, None))
            out = ctypes.c_void_p()
            _check(_c.moelite_context_create(model._handle(), params, ctypes.byref(out)))
            # The binding's own abort callback is always installed: it also stops generations
            # and calls at exit; Context.abort only swaps the user function it consults.
            st = int(_c.moelite_context_set_abort_callback(out.value, self._abort_ref, None))
            if st != 0:
                msg = _last_error()
                _c.moelite_context_free(out.value)
                raise MoeliteError(st, msg)
            self._ptr = out.value
        finally:
            _c.moelite_context_params_free(params)
        model._contexts.add(self)

    # ---- lifetime (_Closeable: _handle, closed, with, the finalizer) ----
    _kind = "context"

    def close(self) -> None:
        """Frees the context (stopping a generation in progress first). Idempotent."""
        gen = self._active
        if gen is not None and not gen.on_worker():
            gen.stop()
            if gen.abandoned:
                self._ptr = None  # deliberately leaked: a parked worker still uses it
                return
        with self._lock:
            if not self._ptr:
                return
            for q in list(self._queues):  # they borrow the context's handle
                q.close()
            ptr, self._ptr = self._ptr, None
            self._free(ptr)

    def __repr__(self) -> str:
        if not self._ptr:
            return "<moelite.Context closed>"
        return "<moelite.Context n_ctx=%d kv_length=%d>" % (self.n_ctx, self.kv_length)

    # ---- KV cache ----
    @property
    def n_ctx(self) -> int:
        """Maximum tokens the KV cache holds."""
        self._preempt()
        with self._lock:
            return int(_c.moelite_context_n_ctx(self._handle()))

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV cache, all layers, keys and values (moelite_context_kv_bytes)."""
        self._preempt()
        with self._lock:
            return int(_c.moelite_context_kv_bytes(self._handle()))

    @property
    def kv_length(self) -> int:
        """Tokens currently held in the KV cache (moelite_context_kv_length)."""
        self._preempt()
        with self._lock:
            return int(_c.moelite_context_kv_length(self._handle()))

    def reset(self) -> None:
        """Forgets the whole sequence (moelite_context_kv_reset)."""
        self._preempt()
        with self._lock:
            _c.moelite_context_kv_reset(self._handle())

    def truncate(self, n_keep: int) -> None:
        """Keeps the first n_keep tokens (clamped to [0, kv_length]; moelite_context_kv_truncate).
        A sliding-window model may keep none (its cache's ring no longer reaches back): read
        kv_length afterwards."""
        self._preempt()
        with self._lock:
            _c.moelite_context_kv_truncate(self._handle(), int(n_keep))

    def tokens(self) -> List[int]:
        """The token ids the KV cache holds, in order (moelite_context_get_tokens): what eval()
        appended, or after generate() the prompt and the generated tokens but the last one
        (sampled, not evaluated)."""
        self._preempt()
        with self._lock:
            h = self._handle()
            cap = max(int(_c.moelite_context_kv_length(h)), 1)
            n = ctypes.c_int32(0)
            buf = (ctypes.c_int32 * cap)()
            _check(_c.moelite_context_get_tokens(h, buf, cap, ctypes.byref(n)))
            return list(buf[: n.value])

    # ---- abort callback ----
    @property
    def abort(self) -> Optional[Callable[[], Any]]:
        """The user's abort function (None: none). Assigning replaces it for the next calls
        (moelite_context_set_abort_callback's role; the binding's C callback stays installed
        and consults it). Assigning while a generation of this context is suspended stops that
        generation first; the context is for one thread at a time, so do not assign it from
        another thread during an eval (to stop an eval from another thread, make the function
        return True)."""
        return self._state.user_abort

    @abort.setter
    def abort(self, fn: Optional[Callable[[], Any]]) -> None:
        if fn is not None and not callable(fn):
            raise TypeError("abort must be callable or None")
        self._preempt()
        with self._lock:
            self._handle()
            self._state.user_abort = fn

    # ---- expert store statistics of this context ----
    def expert_stats(self, layer: int = -1) -> "ExpertStats":
        """Expert-store counters of this context's evaluations alone, of one layer or of all
        layers (layer -1) (moelite_context_expert_stats); Model.expert_stats() counts every
        context of the model. Speculative loads that complete or are wasted after an evaluation
        returned count for the model only. MoeliteError ERR_INVALID_ARGUMENT for a layer outside
        [-1, n_layers)."""
        self._preempt()
        with self._lock:
            s = _lib.ExpertStats()
            s.struct_size = ctypes.sizeof(_lib.ExpertStats)
            _check(_c.moelite_context_expert_stats(self._handle(), int(layer), ctypes.byref(s)))
            return ExpertStats._from_c(s)

    def reset_expert_stats(self) -> None:
        """Zeroes this context's counters, not the model's (moelite_context_reset_expert_stats)."""
        self._preempt()
        with self._lock:
            _c.moelite_context_reset_expert_stats(self._handle())

    # ---- evaluation ----
    def eval(self, tokens: Iterable[int], logits_all: bool = False) -> None:
        """Appends `tokens` to the sequence and runs the model on them; logits_all keeps the
        logits of every token (else only the last one's). On error the context is unchanged:
        MoeliteError (ERR_BAD_TOKEN, ERR_CONTEXT_FULL, ERR_ABORTED, ERR_IO...), or the exception
        the abort/routing callback raised. RuntimeError on a thread other than the main thread
        once the interpreter exits."""
        arr, n = _token_array(tokens)
        self._evaluate(lambda h: _c.moelite_eval(h, arr, n, 1 if logits_all else 0))

    def _evaluate(self, call) -> None:
        """Runs call(handle), an evaluation, with the callbacks armed. An exception a callback raised
        replaces the status; raised in the last layer's callback the call succeeded, so every
        sequence is cut back to its length before it, as an abort would leave it."""
        self._preempt()
        with self._lock:
            h = self._handle()
            state = self._state
            before = [int(_c.moelite_context_seq_length(h, q)) for q in range(int(_c.moelite_context_n_seq(h)))]
            _exit_guard.enter()
            try:
                state.begin()
                st = int(call(h))
                msg = _last_error() if st else ""
            finally:
                _exit_guard.leave()
            exc = state.take()
            if exc is not None:
                if st == 0:
                    for q, length in enumerate(before):
                        _c.moelite_context_seq_truncate(h, q, length)
                raise exc
            if st != 0:
                raise MoeliteError(st, msg)

    def eval_batch(self, tokens: Sequence[int], seq_ids: Sequence[int],
                   want_logits: Optional[Sequence[bool]] = None) -> None:
        """Evaluates tokens of several sequences in one forward pass (moelite_eval_batch): token i
        is appended to sequence seq_ids[i]; want_logits[i] keeps its logits (None: the last token
        of each sequence in the batch), read with logits(i). Each sequence's logits are bitwise
        those of evaluating it alone. On error every sequence is as before the call; errors as
        eval(), plus ERR_INVALID_ARGUMENT for a sequence id out of range."""
        arr, n = _token_array(tokens)
        ids = list(seq_ids)
        if len(ids) != n:
            raise ValueError("seq_ids must have one id per token")
        id_arr = (ctypes.c_int32 * max(n, 1))(*ids)
        want_arr = None
        if want_logits is not None:
            flags = [1 if w else 0 for w in want_logits]
            if len(flags) != n:
                raise ValueError("want_logits must have one flag per token")
            want_arr = (ctypes.c_uint8 * max(n, 1))(*flags)
        self._evaluate(lambda h: _c.moelite_eval_batch(h, arr, id_arr, want_arr, n))

    def save(self, path: PathLike) -> None:
        """Saves every sequence's tokens and KV cache to `path`, atomically (moelite_context_save)."""
        self._preempt()
        with self._lock:
            _check(_c.moelite_context_save(self._handle(), os.fsencode(os.fspath(path))))

    def load(self, path: PathLike) -> None:
        """Restores a state saved with save() (moelite_context_load); the context is unchanged on
        ERR_FILE_NOT_FOUND, ERR_BAD_SESSION or ERR_SESSION_MISMATCH."""
        self._preempt()
        with self._lock:
            _check(_c.moelite_context_load(self._handle(), os.fsencode(os.fspath(path))))

    @property
    def n_seq(self) -> int:
        """Sequences the context holds (moelite_context_n_seq)."""
        self._preempt()
        with self._lock:
            return int(_c.moelite_context_n_seq(self._handle()))

    def seq_length(self, seq: int) -> int:
        """Tokens held in sequence seq's KV cache (moelite_context_seq_length)."""
        self._preempt()
        with self._lock:
            h = self._handle()
            if not 0 <= int(seq) < int(_c.moelite_context_n_seq(h)):
                raise IndexError("sequence %d is out of range" % seq)
            return int(_c.moelite_context_seq_length(h, int(seq)))

    def seq_truncate(self, seq: int, n_keep: int) -> None:
        """Keeps the first n_keep tokens of sequence seq (0 resets it; moelite_context_seq_truncate)."""
        self._preempt()
        with self._lock:
            _check(_c.moelite_context_seq_truncate(self._handle(), int(seq), int(n_keep)))

    def logits(self, i: int = -1):
        """Logits (n_vocab floats) of token i of the last eval or eval_batch (negative i counts
        from the end; without logits_all only the last token has logits; after eval_batch i is
        the batch index and only wanted tokens have logits). A numpy float32 array when numpy is
        importable, else a list of floats. Always a copy. IndexError if token i has no logits."""
        self._preempt()
        with self._lock:
            ptr = _c.moelite_get_logits(self._handle(), int(i))
            if not ptr:
                raise IndexError("no logits for token index %d of the last eval" % i)
            n = self._n_vocab
            if _np is not None:
                return _np.ctypeslib.as_array(ptr, shape=(n,)).copy()
            return ptr[:n]

    # ---- generation ----
    def generate(self, prompt: Union[TextLike, Sequence[int]], max_tokens: Optional[int] = None,
                 temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 min_p: Optional[float] = None, repeat_penalty: Optional[float] = None,
                 repeat_last_n: Optional[int] = None, seed: Optional[int] = None,
                 stop: Union[TextLike, Sequence[TextLike], None] = None, as_bytes: bool = False, *,
                 parse_special: Optional[bool] = None, logit_bias: Optional[Mapping[int, float]] = None,
                 logits: Optional[LogitsCallback] = None,
                 yield_tokens: bool = False) -> Iterator[Union[str, bytes, Tuple[int, Union[str, bytes]]]]:
        """Generates a continuation of `prompt`, which is the whole sequence (the KV cache's
        shared prefix is reused):
          - text (str or bytes): moelite_generate; tokenized with BOS/EOS as the vocabulary asks,
            and control-token text such as "<|im_start|>" becomes those tokens unless
            parse_special=False. Never build a prompt by pasting untrusted text into a template:
            use chat() or chat_tokenize() + generate(ids);
          - a sequence of token ids (list, tuple, numpy array): moelite_generate_tokens, taken
            as given (nothing added); MoeliteError ERR_BAD_TOKEN for an id outside the
            vocabulary, ERR_INVALID_ARGUMENT for an empty list.

        Returns an iterator of str pieces yielded as they are produced (pieces never split a
        UTF-8 character nor contain a stop string). as_bytes=True yields the library's bytes
        instead (each piece is decoded on its own with errors="replace" otherwise).
        yield_tokens=True yields (token_id, text) pairs instead, one per generated token in
        order (moelite_token_fn): text is what that token released to the stream, possibly ""
        while an unfinished character or a possible stop string is held back; text still held
        back at the end comes in a last pair with token -1. The end token is not yielded.

        Sampling: None for a parameter means the library default (max_tokens 256, temperature
        0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 over 64, seed 0x5eed);
        temperature 0 is greedy. logit_bias: {token_id: bias} added to those logits at every
        step (-inf bans the token; ids outside the vocabulary are ignored). logits: optional
        callable(logits, history), called on the generating thread before
        each token is drawn (after the logit bias, before the repetition penalty, temperature
        and filters) with a writable numpy float32 view of the n_vocab logits (valid during the
        call only; set an entry to -inf to mask a token) and the sequence's token ids so far (a
        numpy int32 copy: prompt, then generated). Returning False stops the generation (stop
        reason ABORTED); any other return, None included, goes on; an exception stops it and is re-raised by the
        iterator.

        Generation starts on the first next() and runs on a helper thread at most one piece (or
        pair) ahead of the consumer. Leaving the loop early (break, an exception, or close() on
        the iterator) stops it (stop reason ABORTED); an iterator abandoned without being closed
        is stopped by the next call on this context, by Context.close()/Model.close(), or at
        interpreter exit.

        Results and errors: `self.last_stats` is None while a generation runs and then holds
        the dict of moelite_generate_stats (stop_reason, stop_reason_name, token counts,
        timings), also after an early stop and after a failure (the library fills the stats with
        what was done before it). A failure raises MoeliteError from the iterator, with the same
        dict as `.stats`: ERR_CONTEXT_FULL when the prompt does not fit (nothing evaluated) or
        when generation reached the end of the context -- then every piece was yielded before
        the exception, stats["stop_reason"] is StopReason.CONTEXT_FULL and
        stats["n_generated_tokens"] says how many tokens came; ERR_ABORTED from the abort
        callback; ERR_INVALID_ARGUMENT when the logit bias or the logits callback left no token
        to draw; evaluation errors (ERR_IO...). An exception raised by the abort, routing or
        logits callback is re-raised instead of the MoeliteError. After any error the context
        keeps what it evaluated (see tokens()) and stays usable. Raised by generate() itself:
        ValueError for an empty stop string or one containing NUL, or for a closed context;
        TypeError for a prompt that is neither text nor integers. RuntimeError from the first
        next() once the interpreter exits."""
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            data: Union[bytes, Tuple[Any, int]] = _as_bytes(prompt, "prompt")
        else:
            try:
                data = _token_array(prompt)
            except TypeError:
                raise TypeError("prompt must be text (str/bytes) or a sequence of token ids, not %s"
                                % type(prompt).__name__) from None
        stops = [stop] if isinstance(stop, (str, bytes)) else list(stop or [])
        stops = [_as_bytes(s, "stop string") for s in stops]
        for s in stops:
            if not s or b"\0" in s:
                raise ValueError("stop strings must be non-empty and contain no NUL")
        if logits is not None and not callable(logits):
            raise TypeError("logits must be callable")
        opts = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                    seed=seed)
        bias = dict(logit_bias) if logit_bias is not None else None
        self._handle()  # fail now, not on first next(), for a closed context
        return self._generate(data, opts, stops, bool(as_bytes), bias, parse_special, logits,
                              bool(yield_tokens))

    def chat(self, messages: Iterable[Mapping[str, TextLike]], add_assistant_prompt: bool = True,
             **kwargs: Any) -> Iterator[Union[str, bytes, Tuple[int, Union[str, bytes]]]]:
        """Generates the assistant's reply to a conversation: generate(model.chat_tokenize(
        messages, add_assistant_prompt), **kwargs). The conversation is tokenized so that
        message content never becomes control tokens (moelite_chat_tokenize) and generated from
        those ids (moelite_generate_tokens). The whole conversation is the sequence, so
        resending it with a new turn reuses the cached prefix. Same iterator, options and errors
        as generate() (parse_special does not apply)."""
        if "parse_special" in kwargs:
            raise TypeError("chat() takes no parse_special: the conversation is tokenized by the template")
        ids = self.model.chat_tokenize(messages, add_assistant_prompt)
        return self.generate(ids, **kwargs)

    def _generate(self, data, opts, stops, as_bytes, bias, parse_special, logits, yield_tokens):
        self._preempt()
        with self._lock:
            self._handle()
            self.last_stats = None
            gen = _Generation(self, yield_tokens, logits)
            params = _generate_params(opts, stops, bias, parse_special, gen.piece_ref, gen.token_ref,
                                      gen.logits_ref)
        gen.start(data, params)
        try:
            while True:
                item = gen.queue.get()
                kind = item[0]
                if kind == "piece" or kind == "token":
                    gen.demand.release()  # let the worker compute the next piece meanwhile
                    text = item[-1] if as_bytes else item[-1].decode("utf-8", "replace")
                    yield (item[1], text) if kind == "token" else text
                    if gen.stopped.is_set():  # preempted by another call on this context
                        return
                    continue
                if kind == "done":
                    gen.finish(item)
                    if gen.error is not None:
                        raise gen.error
                return  # "stopped": preempted while we were waiting
        finally:
            gen.stop()

    def _preempt(self):
        """Stops a generation left suspended by its consumer before running another call."""
        gen = self._active
        if gen is not None and not gen.on_worker():
            gen.stop()

    @staticmethod
    def _stats_dict(stats):
        d = {name: getattr(stats, name) for name in _STATS_FIELDS}
        try:
            d["stop_reason_name"] = StopReason(d["stop_reason"]).name.lower()
        except ValueError:
            d["stop_reason_name"] = str(d["stop_reason"])
        return d

REQUEST_WAITING = -2  # Queue.state(): not yet admitted into a sequence
REQUEST_RUNNING = -1  # Queue.state(): being evaluated; a finished request's state is its StopReason


class Queue(_Closeable):
    """Many generation requests decoded together by one context's sequences (moelite_queue_*):
    continuous batching. Up to ctx.n_seq requests run at once; each step() evaluates the next
    token of every running request with prompt chunks of newly admitted ones in one forward pass,
    so they share the weight reads and, under an expert budget, each expert's load. A request's
    tokens, text and stop reason are exactly what Context.generate() gives for it alone with the
    same options, whatever runs beside it; a request whose prompt starts with what a free
    sequence holds (a shared system prompt, a conversation's next turn) evaluates only the rest.

        ctx = moelite.Context(model, n_seq=4)
        with moelite.Queue(ctx) as q:
            ids = [q.add(p, max_tokens=64, seed=i) for i, p in enumerate(prompts)]
            for request, token, state in q.run():   # or: while q.busy: q.step()
                ...
            texts = [q.text(i) for i in ids]

    add() takes text (tokenized as generate() does) or token ids and generate()'s sampling
    options; requests have no callbacks here: read tokens and states from the events step()
    returns, and tokens()/text()/stats() at any time. The queue borrows the context: while it
    lives, do not evaluate the context yourself (a running request whose sequence changed ends
    with StopReason.ERROR). Context.close() closes its queues first. One thread at a time, as
    the context. Errors: MoeliteError with the library's status (ERR_BAD_TOKEN, ERR_CONTEXT_FULL
    for a prompt longer than n_ctx, ERR_INVALID_ARGUMENT for an unknown id, evaluation errors
    from step(), after which nothing changed and the next step() tries again); ValueError for a
    closed queue or context."""

    def __init__(self, ctx: Context):
        if not isinstance(ctx, Context):
            raise TypeError("ctx must be a moelite.Context")
        self._ptr = None
        self._free = _c.moelite_queue_free  # kept for __del__ during interpreter shutdown
        self.ctx = ctx
        ctx._preempt()
        with ctx._lock:
            out = ctypes.c_void_p()
            _check(_c.moelite_queue_create(ctx._handle(), ctypes.byref(out)))
            self._ptr = out.value
            ctx._queues.add(self)

    _kind = "queue"

    def close(self) -> None:
        """Frees the queue and its requests (the context stays). Idempotent."""
        with self.ctx._lock:
            ptr, self._ptr = self._ptr, None
            if ptr:
                self._free(ptr)

    def add(self, prompt: Union[TextLike, Sequence[int]], *, max_tokens: Optional[int] = None,
            temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
            min_p: Optional[float] = None, repeat_penalty: Optional[float] = None,
            repeat_last_n: Optional[int] = None, seed: Optional[int] = None,
            stop: Union[None, TextLike, Sequence[TextLike]] = None,
            logit_bias: Optional[Mapping[int, float]] = None, parse_special: bool = True) -> int:
        """Queues a request and returns its id (0, 1, 2 ... in order of addition). Text is
        tokenized with the vocabulary's BOS/EOS and, unless parse_special=False, control-token
        text as control tokens (as generate()); token ids are taken as given."""
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            ids = self.ctx.model.tokenize(prompt, add_special=True, parse_special=parse_special)
        else:
            ids = prompt
        arr, n = _token_array(ids)
        stops = [stop] if isinstance(stop, (str, bytes)) else list(stop or [])
        stops = [_as_bytes(x, "stop string") for x in stops]
        for x in stops:
            if not x or b"\0" in x:
                raise ValueError("stop strings must be non-empty and contain no NUL")
        opts = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
        params = _generate_params(opts, stops, dict(logit_bias) if logit_bias is not None else None)
        try:
            with self.ctx._lock:
                out = ctypes.c_int64(-1)
                _check(_c.moelite_queue_add(self._handle(), arr, n, params, ctypes.byref(out)))
                return int(out.value)
        finally:
            _c.moelite_generate_params_free(params)

    def step(self) -> List[Tuple[int, int, int]]:
        """One step; returns its events: (request id, the token it generated or -1, its state
        after the step: REQUEST_RUNNING or a StopReason value). [] when nothing waits or runs.
        The context's abort callback is honoured (MoeliteError ERR_ABORTED; an exception it
        raises is re-raised), and then nothing changed."""
        ctx = self.ctx
        ctx._preempt()
        with ctx._lock:
            ctx._handle()
            q = self._handle()
            state = ctx._state
            n = ctypes.c_int32(0)
            _exit_guard.enter()
            try:
                state.begin()
                st = int(_c.moelite_queue_step(q, ctypes.byref(n)))
                msg = _last_error() if st else ""
            finally:
                _exit_guard.leave()
            exc = state.take()
            events = []
            if st == 0:
                rid, tok, stt = ctypes.c_int64(), ctypes.c_int32(), ctypes.c_int32()
                for i in range(int(n.value)):
                    _check(_c.moelite_queue_event(q, i, ctypes.byref(rid), ctypes.byref(tok), ctypes.byref(stt)))
                    events.append((int(rid.value), int(tok.value), int(stt.value)))
            self.last_events = events
        if exc is not None:
            raise exc  # after a successful step its events stay in last_events
        if st != 0:
            raise MoeliteError(st, msg)
        return events

    def run(self) -> Iterator[Tuple[int, int, int]]:
        """Steps until no request waits or runs, yielding every event."""
        while self.busy:
            yield from self.step()

    def _count(self, fn) -> int:
        with self.ctx._lock:
            return int(fn(self._handle()))

    @property
    def waiting(self) -> int:
        return self._count(_c.moelite_queue_waiting)

    @property
    def running(self) -> int:
        return self._count(_c.moelite_queue_running)

    @property
    def finished(self) -> int:
        """Finished requests not yet removed."""
        return self._count(_c.moelite_queue_finished)

    @property
    def busy(self) -> bool:
        return self.waiting + self.running > 0

    def state(self, request: int) -> int:
        """REQUEST_WAITING, REQUEST_RUNNING, or the StopReason it finished with."""
        with self.ctx._lock:
            out = ctypes.c_int32()
            _check(_c.moelite_queue_request_state(self._handle(), int(request), ctypes.byref(out)))
            return int(out.value)

    def tokens(self, request: int) -> List[int]:
        """The tokens the request generated so far (an end token is not one of them)."""
        with self.ctx._lock:
            q, n = self._handle(), ctypes.c_int32(0)
            st = int(_c.moelite_queue_request_tokens(q, int(request), None, 0, ctypes.byref(n)))
            if st not in (0, int(Status.ERR_BUFFER_TOO_SMALL)):
                _check(st)
            buf = (ctypes.c_int32 * max(1, n.value))()
            _check(_c.moelite_queue_request_tokens(q, int(request), buf, n.value, ctypes.byref(n)))
            return list(buf[: n.value])

    def text(self, request: int, as_bytes: bool = False) -> Union[str, bytes]:
        """The text the request emitted so far (stop strings cut, UTF-8 characters whole)."""
        with self.ctx._lock:
            q, n = self._handle(), ctypes.c_size_t(0)
            st = int(_c.moelite_queue_request_text(q, int(request), None, 0, ctypes.byref(n)))
            if st not in (0, int(Status.ERR_BUFFER_TOO_SMALL)):
                _check(st)
            buf = ctypes.create_string_buffer(max(1, n.value))
            _check(_c.moelite_queue_request_text(q, int(request), buf, n.value, ctypes.byref(n)))
            data = buf.raw[: n.value]
        return data if as_bytes else data.decode("utf-8", "replace")

    def stats(self, request: int) -> Dict[str, Any]:
        """moelite_queue_request_stats as a dict (the fields of Context.last_stats): cached and
        evaluated prompt tokens, generated tokens, stop_reason (negative while it waits or runs),
        timings."""
        with self.ctx._lock:
            stats = _lib.GenerateStats()
            stats.struct_size = ctypes.sizeof(stats)
            _check(_c.moelite_queue_request_stats(self._handle(), int(request), ctypes.byref(stats)))
        d = {name: getattr(stats, name) for name in _STATS_FIELDS}
        d["stop_reason_name"] = ({REQUEST_WAITING: "waiting", REQUEST_RUNNING: "running"}.get(d["stop_reason"])
                                 or StopReason(d["stop_reason"]).name.lower())
        return d

    def cancel(self, request: int) -> None:
        """Ends a waiting or running request at once (StopReason.ABORTED), freeing its sequence."""
        with self.ctx._lock:
            _check(_c.moelite_queue_cancel(self._handle(), int(request)))

    def remove(self, request: int) -> None:
        """Cancels the request if it runs and forgets it (the queue keeps finished ones until then)."""
        with self.ctx._lock:
            _check(_c.moelite_queue_remove(self._handle(), int(request)))


class Sampler(_Closeable):
    """The token choice of generation, for loops that drive Context.eval() themselves
    (moelite_sampler_*). Built from the same sampling settings as Context.generate()
    (temperature, top_k, top_p, min_p, repeat_penalty/repeat_last_n, seed, logit_bias, logits;
    None: the library default). It keeps a history of accepted tokens (for the repetition
    penalty and the logits callback): accept() the prompt's tokens, eval() them, then repeat
    sample() + eval([token]). With the same settings and seed such a loop draws exactly the
    tokens generate() draws.

        s = moelite.Sampler(temperature=0.8, seed=1)
        s.accept(ids); ctx.eval(ids)
        for _ in range(n):
            t = s.sample(ctx)
            if model.token_is_end(t): break
            ctx.eval([t])

    logits: callable(logits, history), called on the thread that calls
    sample()/sample_logits() with a writable numpy float32 view of the logits (after the logit
    bias; valid during the call) and the history (numpy int32 copy); returning False makes the
    call raise MoeliteError ERR_ABORTED, an exception it raises is re-raised instead.

    A sampler is for one thread at a time. Lifetime: close() (or `with`) frees it, else the
    garbage collector; it holds no reference to any context or model. Errors: MoeliteError
    ERR_INVALID_ARGUMENT for a value outside its range (as the moelite_generate_params_set_*
    setters), TypeError for a logits argument that is not callable."""

    def __init__(self, temperature: Optional[float] = None, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, min_p: Optional[float] = None,
                 repeat_penalty: Optional[float] = None, repeat_last_n: Optional[int] = None,
                 seed: Optional[int] = None, logit_bias: Optional[Mapping[int, float]] = None,
                 logits: Optional[LogitsCallback] = None):
        self._ptr = None
        self._free = _c.moelite_sampler_free  # kept for __del__ during interpreter shutdown
        self._lock = threading.Lock()
        if logits is not None and not callable(logits):
            raise TypeError("logits must be callable")
        self._state = _CtxState(None, None)  # collects the logits callback's exception
        self._logits_ref = _make_logits_callback(logits, self._state, _exit_guard) if logits is not None else None
        opts = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
        params = _generate_params(opts, (), logit_bias, None, logits_ref=self._logits_ref)
        try:
            out = ctypes.c_void_p()
            _check(_c.moelite_sampler_create(params, ctypes.byref(out)))
            self._ptr = out.value
        finally:
            _c.moelite_generate_params_free(params)

    _kind = "sampler"

    def close(self) -> None:
        """Frees the sampler. Idempotent."""
        with self._lock:
            ptr, self._ptr = self._ptr, None
            if ptr:
                self._free(ptr)

    def accept(self, tokens: Iterable[int]) -> None:
        """Appends tokens to the history (e.g. the prompt's); ids are not checked here."""
        arr, n = _token_array(tokens)
        with self._lock:
            _check(_c.moelite_sampler_accept(self._handle(), arr, n))

    def reset(self) -> None:
        """Forgets the history and restarts the random generator from the seed."""
        with self._lock:
            _c.moelite_sampler_reset(self._handle())

    def _call(self, fn) -> int:
        out = ctypes.c_int32(-1)
        guarded = self._logits_ref is not None  # calls back into Python: keep exit safe
        if guarded:
            _exit_guard.enter()
        try:
            self._state.begin()
            st = int(fn(ctypes.byref(out)))
            msg = _last_error() if st else ""
        finally:
            if guarded:
                _exit_guard.leave()
        exc = self._state.take()
        if exc is not None:
            raise exc
        if st != 0:
            raise MoeliteError(st, msg)
        return int(out.value)

    def sample(self, ctx: "Context", i: int = -1) -> int:
        """Draws a token from the logits of row i of ctx's last evaluation (as Context.logits;
        -1 the last) and accepts it into the history. MoeliteError ERR_INVALID_ARGUMENT when
        that row has no logits or no token is left to draw (all banned or masked), ERR_ABORTED
        when the logits callback returned False; ValueError for a closed sampler or
        context."""
        if not isinstance(ctx, Context):
            raise TypeError("ctx must be a moelite.Context")
        ctx._preempt()
        with ctx._lock, self._lock:
            h, s = ctx._handle(), self._handle()
            return self._call(lambda out: _c.moelite_sampler_sample(s, h, int(i), out))

    def sample_logits(self, logits: Any) -> int:
        """Draws a token from any logits (a sequence of n_vocab >= 1 floats, e.g. Context.logits()
        modified by the application) and accepts it into the history. Same errors as sample();
        ValueError for empty logits."""
        if _np is not None:
            arr = _np.ascontiguousarray(logits, dtype=_np.float32).reshape(-1)
            n = int(arr.shape[0])
            ptr = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        else:
            vals = [float(x) for x in logits]
            n = len(vals)
            arr = (ctypes.c_float * max(n, 1))(*vals)
            ptr = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
        if n < 1:
            raise ValueError("logits must hold at least one value")
        with self._lock:
            s = self._handle()
            return self._call(lambda out: _c.moelite_sampler_sample_logits(s, ptr, n, out))
