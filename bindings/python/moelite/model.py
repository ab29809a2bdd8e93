"""Model: a loaded (or inspected) GGUF model -- loading options, sizes and hyperparameters,
the expert store's counters, calibration and batch planning, tokenizer, chat formatting and file
metadata (Metadata) -- and the tokenizer's flag enums.
"""
from __future__ import annotations

import contextlib
import ctypes
import enum
import json
import threading
import warnings
import weakref
from collections.abc import Mapping as _AbcMapping
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Union)

from . import _lib
from ._callbacks import _progress_thunk
from ._exit import _exit_guard
from ._lib import lib as _c
from ._util import (_MISSING, PathLike, TextLike, _as_bytes, _c_path, _int32_array, _int_arg, _token_array,
                    _two_call_text)
from .errors import MoeliteError, Status, _check, _last_error
from .stats import ExpertStats

if TYPE_CHECKING:  # annotations only: context.py is above this module
    from .context import Context


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
        return int(self._call(_c.moelite_model_get, key))
    get.__name__ = name
    get.__doc__ = ("moelite_model_get(MOELITE_MODEL_%s) (-1 when the library does not know the "
                   "key). Raises ValueError on a closed model." % name.upper())
    return property(get)



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

    Expert store: expert_budget, spelled as everywhere in moelite and parsed by the library
    (moelite_model_params_set_expert_budget_text): bytes as an int, or text -- "2GiB", "512MiB",
    "1.5G", "25%" (that share of the experts get a slot; "100%" keeps them all resident once read),
    "auto" (sized at load from the memory available then, leaving budget_headroom bytes; None:
    max(64 MiB, 10 % of the room)) or "none"; ERR_INVALID_ARGUMENT for other text,
    ERR_BUDGET_TOO_SMALL below the minimum working set. budget_fraction=0.25 is the same as
    expert_budget="25%". policy ("cyclic", the default, "lru", "lfu",
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
    expert_budget="auto". Integer arguments: TypeError for a non-integer, OverflowError outside
    the C type's range; text and paths: ValueError for a NUL character.

    Threads: any number of threads may call a model's methods at once. close() (or the end of a
    `with` block) may be called from any thread: it waits for the calls running on other threads,
    and every call after it raises ValueError("the model is closed").

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
        self._init_lifetime()
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
        bpath = _c_path(path)
        if isinstance(backend, str):
            if backend.lower() not in _BACKENDS:
                raise ValueError("backend must be one of %s, not %r" % (sorted(_BACKENDS), backend))
            backend_id = _BACKENDS[backend.lower()]
        else:
            backend_id = _int_arg(backend, "backend")

        params = _c.moelite_model_params_create()
        if not params:
            raise MemoryError("moelite_model_params_create failed")
        progress_ref, box = None, [None]
        try:
            if threads is not None:
                _check(_c.moelite_model_params_set_threads(params, _int_arg(threads, "threads")))
            _check(_c.moelite_model_params_set_backend(params, backend_id))
            _check(_c.moelite_model_params_set_use_mmap(params, 1 if use_mmap else 0))
            _check(_c.moelite_model_params_set_vocab_only(params, 1 if vocab_only else 0))
            if isinstance(expert_budget, bool) or not isinstance(expert_budget, (int, str, type(None))):
                raise TypeError("expert_budget is bytes (int) or text such as '2GiB', '25%%' or 'auto', not %r"
                                % (expert_budget,))
            if isinstance(expert_budget, str):
                _check(_c.moelite_model_params_set_expert_budget_text(params, _as_bytes(expert_budget, "expert_budget")))
            elif expert_budget is not None:
                if expert_budget < 0:
                    raise OverflowError("expert_budget must be >= 0 bytes")
                _check(_c.moelite_model_params_set_expert_budget(params, expert_budget))
            if budget_headroom is not None:
                if expert_budget != "auto":
                    raise ValueError("budget_headroom goes with expert_budget='auto'")
                _check(_c.moelite_model_params_set_expert_budget_auto(params, _int_arg(budget_headroom, "budget_headroom")))
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
                _check(_c.moelite_model_params_set_predictor_depth(params, _int_arg(predictor_depth, "predictor_depth")))
            if profile is not None:
                _check(_c.moelite_model_params_set_profile(params, _c_path(profile, "profile")))
            if gating is not None:
                _check(_c.moelite_model_params_set_gating(params, _as_bytes(gating, "gating"), float(threshold)))
            if gating_penalty is not None:
                _check(_c.moelite_model_params_set_gating_penalty(params, float(gating_penalty)))
            if gating_substitutes is not None:
                _check(_c.moelite_model_params_set_gating_substitutes(params, _int_arg(gating_substitutes, "gating_substitutes")))
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
        self._init_lifetime()
        self._contexts = weakref.WeakSet()
        self._free = _c.moelite_model_free
        self.path = path
        self.inspected = True
        self.vocab_only = False
        bpath = _c_path(path)
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
            _check(_c.moelite_calibrate_params_set_window(params, _int_arg(window, "window")))
            _check(_c.moelite_calibrate_params_set_stride(params, _int_arg(stride, "stride")))
            _check(_c.moelite_calibrate_params_set_holdout(params, float(holdout)))
            _check(_c.moelite_calibrate_params_set_sensitivity_tokens(params, _int_arg(sensitivity_tokens, "sensitivity_tokens")))
            if progress is not None:
                progress_ref = _progress_thunk(progress, box)
                _check(_c.moelite_calibrate_params_set_progress_callback(params, progress_ref, None))
            with self._use() as h:
                path = _c_path(profile_path, "profile_path")
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
        sequences for a fixed budget (bytes as an int, or text as for Model: "2GiB", "25%"), or
        "resident" (also "none"); a loaded model keeps its own budget and pools.
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
        if expert_budget == "resident":
            expert_budget = "none"
        if isinstance(expert_budget, bool) or not isinstance(expert_budget, (int, str)):
            raise ValueError('expert_budget is "auto", "resident", bytes or text such as "2GiB" or "25%"')
        params = _c.moelite_plan_params_create()
        cparams = _c.moelite_context_params_create()
        plan = ctypes.c_void_p()
        try:
            if not params or not cparams:
                raise MemoryError("creating plan parameters failed")
            _check(_c.moelite_plan_params_set_max_sequences(params, _int_arg(max_sequences, "max_sequences")))
            _check(_c.moelite_plan_params_set_min_sequences(params, _int_arg(min_sequences, "min_sequences")))
            _check(_c.moelite_plan_params_set_memory(params, _int_arg(memory, "memory")))
            _check(_c.moelite_plan_params_set_headroom(params, _int_arg(headroom, "headroom")))
            if isinstance(expert_budget, str):
                _check(_c.moelite_plan_params_set_expert_budget_text(params, _as_bytes(expert_budget, "expert_budget")))
            else:
                _check(_c.moelite_plan_params_set_expert_budget(params, expert_budget))
            _check(_c.moelite_plan_params_set_bandwidths(params, float(storage_gb_s), float(compute_gb_s)))
            _check(_c.moelite_plan_params_set_cache_allocation(params, _as_bytes(allocation, "allocation")))
            if profile is not None:
                _check(_c.moelite_plan_params_set_profile(params, _c_path(profile, "profile")))
            if routing_trace is not None and routing is not None:
                raise ValueError("give routing_trace or routing, not both")
            if routing_trace is not None:
                _check(_c.moelite_plan_params_set_routing_trace(params, _c_path(routing_trace, "routing_trace")))
            if routing is not None:
                tokens = [[list(layer) for layer in token] for token in routing]
                if not tokens or not tokens[0]:
                    raise ValueError("routing needs at least one token of at least one layer")
                n_layers = len(tokens[0])
                if any(len(token) != n_layers for token in tokens):
                    raise ValueError("every token of routing needs the same number of layers")
                k = max(self.n_experts_used, max(len(ids) for token in tokens for ids in token))
                flat = [x for token in tokens for ids in token for x in list(ids) + [-1] * (k - len(ids))]
                array, _ = _int32_array(flat, "routing expert ids")
                _check(_c.moelite_plan_params_set_routing(params, len(tokens), n_layers, k, array))
            if n_ctx is not None:
                _check(_c.moelite_context_params_set_n_ctx(cparams, _int_arg(n_ctx, "n_ctx")))
            if n_batch is not None:
                _check(_c.moelite_context_params_set_n_batch(cparams, _int_arg(n_batch, "n_batch")))
            _check(self._call(_c.moelite_plan_batch, cparams, params, ctypes.byref(plan)))
            return json.loads(_c.moelite_batch_plan_json(plan).decode())
        finally:
            if plan:
                _c.moelite_batch_plan_free(plan)
            _c.moelite_context_params_free(cparams)
            _c.moelite_plan_params_free(params)

    # ---- lifetime ----
    def _init_lifetime(self) -> None:
        # The calls in flight, by thread (ident -> depth): close() frees the handle only once
        # they have returned. The library cannot do this itself: a call entering with a handle
        # another thread has just freed reads freed memory before it could take a reference.
        self._calls: Dict[int, int] = {}
        self._calls_cond = threading.Condition(threading.Lock())
        self._closing = False

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        """The handle, valid until the block ends: close() on another thread waits for the
        block, and refuses (ValueError) new ones once it has begun."""
        me = threading.get_ident()
        with self._calls_cond:
            if not self._ptr or self._closing:
                raise ValueError("the model is closed")
            self._calls[me] = self._calls.get(me, 0) + 1
        try:
            yield self._ptr
        finally:
            with self._calls_cond:
                depth = self._calls.pop(me) - 1
                if depth:
                    self._calls[me] = depth
                elif not self._calls:
                    self._calls_cond.notify_all()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(handle, *args) as one call in flight (see _use)."""
        with self._use() as h:
            return fn(h, *args)

    def _handle(self) -> int:
        # Only for checks: a handle used in a call is taken with _use(), which keeps it valid.
        if not self._ptr or self._closing:
            raise ValueError("the model is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        """True after close()."""
        return not self._ptr

    def close(self) -> None:
        """Closes every context still open on this model (stopping their generations), then
        releases the model. Idempotent and thread-safe: calls on the model already running on
        other threads (tokenize(), calibrate()...) finish first -- close() waits for them --,
        and calls made after it began raise ValueError("the model is closed"). RuntimeError when
        called from inside a call on this model on the same thread (a progress callback of
        calibrate()), which could never finish before the model is freed."""
        me = threading.get_ident()
        with self._calls_cond:
            if not self._ptr:
                return
            if me in self._calls:
                raise RuntimeError("Model.close() called from inside a call on this model (e.g. its progress "
                                   "callback); close it after that call has returned")
            self._closing = True
            self._calls_cond.wait_for(lambda: not self._calls)
        try:
            for ctx in list(self._contexts):
                ctx.close()
        finally:
            self._release()

    def _release(self) -> None:
        # Only this object's reference: the library keeps the model for contexts still open.
        # Under the lock: two threads closing at once must not both free it.
        with self._calls_cond:
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
        s = self._call(fn)
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
    def expert_file(self) -> str:
        """The file a budget reads experts from: the packed expert file beside the model
        (moelite.pack_experts) when it matches this model, else the model file."""
        return self._str(_c.moelite_model_expert_file)

    @property
    def backend_name(self) -> str:
        """Backend in use with its SIMD level, e.g. "cpu (avx512)"."""
        return self._str(_c.moelite_model_backend_name)

    def measure_device_bandwidth(self) -> float:
        """Memory bandwidth of the GPU the model computes on, in GB/s (copies within device memory;
        about a second). Raises MoeliteError: ERR_NOT_IMPLEMENTED for the CPU backend,
        ERR_INVALID_ARGUMENT for a vocabulary-only model, ERR_OUT_OF_MEMORY, ERR_BACKEND."""
        gbs = ctypes.c_double(0.0)
        _check(self._call(_c.moelite_model_measure_device_bandwidth, ctypes.byref(gbs)))
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
        return int(self._call(_c.moelite_token_bos))

    @property
    def eos(self) -> int:
        """EOS token id, -1 if none."""
        return int(self._call(_c.moelite_token_eos))

    def token_is_end(self, token: int) -> bool:
        """True if generation stops at `token` (EOS, end-of-turn and similar control tokens;
        moelite_token_is_end). False for ids outside the vocabulary."""
        return bool(self._call(_c.moelite_token_is_end, _int_arg(token, "token")))

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
        _check(self._call(_c.moelite_model_expert_stats, _int_arg(layer, "layer"), ctypes.byref(s)))
        return ExpertStats._from_c(s)

    def expert_stats_per_layer(self) -> List[ExpertStats]:
        """expert_stats(l) for every layer l (each read separately: counters of a model that
        is evaluating meanwhile may move between layers)."""
        return [self.expert_stats(layer) for layer in range(self.n_layers)]

    def reset_expert_stats(self) -> None:
        """Zeroes the expert-store counters (moelite_model_reset_expert_stats), e.g. between a
        warm-up and a measurement."""
        self._call(_c.moelite_model_reset_expert_stats)

    def trace_begin(self, path: PathLike) -> None:
        """Starts recording a timeline of this model's work (routing, expert reads, computation,
        waits, prefetches) in the Chrome trace-event format that Perfetto opens
        (moelite_model_trace_begin). Raises MoeliteError(IO) at once when `path` cannot be written."""
        _check(self._call(_c.moelite_model_trace_begin, _c_path(path)))

    def trace_end(self) -> None:
        """Stops the timeline and writes it (moelite_model_trace_end)."""
        _check(self._call(_c.moelite_model_trace_end))

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
            st = self._call(_c.moelite_tokenize, data, len(data), int(flags), buf, cap, ctypes.byref(n))
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
        with self._use() as h:
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
        with self._use() as h:
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
        with self._use() as h:
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
        return TokenAttr(int(self._call(_c.moelite_token_attrs, _int_arg(token, "token"))))

    def token_text(self, token: int) -> str:
        """The vocabulary string of `token` as stored in the file (moelite_token_text), e.g.
        "<|im_end|>" or "\u0120the" for byte-level BPE (decoded as UTF-8, invalid bytes
        replaced); detokenize() gives the text a token stands for. IndexError for an id outside
        the vocabulary."""
        t = self._call(_c.moelite_token_text, _int_arg(token, "token"))
        if t is None:
            raise IndexError("token %d is outside the vocabulary" % _int_arg(token, "token"))
        return t.decode("utf-8", "replace")

    # ---- file metadata ----
    def meta_keys(self) -> List[str]:
        """The GGUF metadata keys, in file order (moelite_model_meta_count/_key)."""
        with self._use() as h:
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
        with self._use() as h:
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
        return int(self._model._call(_c.moelite_model_meta_count))

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
