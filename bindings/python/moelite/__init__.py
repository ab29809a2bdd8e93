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
"""
import ctypes
import enum
import queue
import threading
import weakref

from . import _lib
from ._lib import lib as _c

try:  # numpy is optional: logits come back as numpy arrays when it is importable, else lists.
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None

__all__ = [
    "__version__", "version_number", "library_path", "supported_archs", "Status", "StopReason",
    "MoeliteError", "Model", "Context", "set_log_callback", "platform_info", "platform_memory_available",
]

__version__ = _c.moelite_version_string().decode("ascii")
library_path = _lib.library_path


def version_number():
    """The linked library's version as MAJOR*10000 + MINOR*100 + PATCH."""
    return int(_c.moelite_version_number())


def supported_archs():
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


class Status(enum.IntEnum):
    """moelite_status values (include/moelite.h)."""
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
    ERR_CANCELLED = 43
    ERR_INTERNAL = 99


class StopReason(enum.IntEnum):
    """moelite_stop_reason: why a generate() call ended."""
    END_TOKEN = 0
    MAX_TOKENS = 1
    STRING = 2
    CALLBACK = 3
    CONTEXT_FULL = 4


class MoeliteError(Exception):
    """A moelite call failed. `.status` is the moelite_status (int), `.status_name` its C name
    ("MOELITE_ERR_FILE_NOT_FOUND") and `.message` the library's moelite_last_error() text."""

    def __init__(self, status, message=""):
        self.status = int(status)
        self.status_name = _c.moelite_status_name(self.status).decode("ascii", "replace")
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message) if message else self.status_name)


def _last_error():
    return _c.moelite_last_error().decode("utf-8", "replace")


def _check(status):
    # moelite_last_error() is per thread: read it right after the failing call, on its thread.
    if status != 0:
        raise MoeliteError(status, _last_error())


def _as_bytes(text, what="text"):
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError("%s must be str or bytes, not %s" % (what, type(text).__name__))


def _token_array(tokens):
    tokens = list(tokens)
    for t in tokens:
        if not isinstance(t, int) and not (hasattr(t, "__index__")):
            raise TypeError("token ids must be integers, got %r" % (t,))
    arr = (ctypes.c_int32 * max(len(tokens), 1))(*[int(t) for t in tokens])
    return arr, len(tokens)


def _two_call_text(call, guess):
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


_log_callback_ref = None  # keeps the installed ctypes log callback alive


def set_log_callback(fn, min_level=2):
    """Routes library log lines to fn(level: int, text: str); None restores the default sink
    (stderr, WARN and above). Levels: 0 debug, 1 info, 2 warn, 3 error, 4 none. fn may be called
    from the library's worker threads and must not raise (exceptions are swallowed)."""
    global _log_callback_ref
    if fn is None:
        _c.moelite_set_log_callback(_lib.LOG_FN(), None, int(min_level))
        _log_callback_ref = None
        return

    def _cb(level, text, _user):
        try:
            fn(int(level), text.decode("utf-8", "replace") if text else "")
        except BaseException:  # noqa: BLE001 - never let an exception unwind into C
            pass

    ref = _lib.LOG_FN(_cb)
    _c.moelite_set_log_callback(ref, None, int(min_level))
    _log_callback_ref = ref  # replaced only after the library stopped using the old one


_BACKENDS = {"auto": 0, "cpu": 1, "vulkan": 2, "cuda": 3}

# moelite_model_key values
_KEYS = {
    "n_layers": 0, "n_experts": 1, "n_experts_used": 2, "n_shared_experts": 3, "n_vocab": 4,
    "n_embd": 5, "n_head": 6, "n_head_kv": 7, "head_dim": 8, "n_ff_expert": 9,
    "n_ff_shared": 10, "n_ctx_train": 11, "expert_bytes": 12, "dense_bytes": 13, "n_params": 14,
    "n_active_params": 15, "threads": 16, "backend_id": 17, "active_bytes": 18,
    "expert_budget": 19, "expert_pool_bytes": 20, "expert_peak_bytes": 21, "expert_slots": 22,
    "budget_auto": 23, "budget_auto_room": 24, "budget_auto_context_bytes": 25, "budget_auto_headroom": 26,
    "experts_all_fit": 27, "expert_min_budget": 28,
}


def platform_memory_available():
    """Bytes this process may still allocate: min(MemAvailable, cgroup limit - usage)
    (moelite_platform_get(MOELITE_PLATFORM_MEM_AVAILABLE_BYTES))."""
    return int(_c.moelite_platform_get(1))


def platform_info():
    """The machine as a dict (moelite_platform_describe_json): kind, model, cpu (big cores,
    capacities), memory (total, available, cgroup, room), backends built in, auto_backend."""
    import json
    needed = ctypes.c_size_t(0)
    st = _c.moelite_platform_describe_json(None, 0, ctypes.byref(needed))
    for _ in range(4):
        cap = needed.value + 4096  # slack: memory figures may grow between the two calls
        buf = ctypes.create_string_buffer(cap)
        st = _c.moelite_platform_describe_json(buf, cap, ctypes.byref(needed))
        if st != Status.ERR_BUFFER_TOO_SMALL:
            break
    _check(st)
    return json.loads(buf.value.decode("utf-8"))


def _key_property(name, key):
    def get(self):
        return int(_c.moelite_model_get(self._handle(), key))
    get.__name__ = name
    get.__doc__ = "moelite_model_get(%s) (-1 when unknown)" % name
    return property(get)


class Model:
    """A loaded GGUF model (moelite_model). Immutable and thread-safe once loaded.

    Model(path, threads=None, backend="auto", vocab_only=False, use_mmap=True,
          expert_budget=None, progress=None, policy=None, predictor=None, predictor_depth=None,
          profile=None, gating=None, threshold=0.0, allocation=None, budget_headroom=None,
          gating_penalty=None)

    backend: "auto", "cpu", "vulkan", "cuda" (or the moelite_backend int). threads: None for the
    library default (physical cores). vocab_only: load only the tokenizer (tokenize/detokenize/
    chat_format work, contexts cannot be created). progress: optional callable(float) -> bool,
    returning False cancels the load (MoeliteError ERR_CANCELLED). expert_budget (bytes), policy,
    predictor, predictor_depth, profile (a calibration profile path), gating ("exact",
    "sensitivity", "score", "cache-aware") with threshold (and gating_penalty, cache-aware's
    factor for non-resident experts, None: 4), and allocation ("auto", "global", "uniform", "dp")
    are the expert-store and adaptive options of include/moelite.h, None meaning the default.
    expert_budget="auto" sizes the budget at load from the memory available then
    (moelite_model_params_set_expert_budget_auto), leaving budget_headroom bytes (None: the
    library's default, max(64 MiB, 10 % of the available memory)).

    Use as a context manager or call close(); close() first closes the model's live contexts.
    """

    def __init__(self, path, threads=None, backend="auto", vocab_only=False, use_mmap=True,
                 expert_budget=None, progress=None, policy=None, predictor=None, predictor_depth=None,
                 profile=None, gating=None, threshold=0.0, allocation=None, budget_headroom=None,
                 gating_penalty=None):
        self._ptr = None
        self._contexts = weakref.WeakSet()
        self._free = _c.moelite_model_free  # kept for __del__ during interpreter shutdown
        self.path = path
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
        progress_ref = None
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
            for setter, value in ((_c.moelite_model_params_set_expert_policy, policy),
                                  (_c.moelite_model_params_set_expert_predictor, predictor),
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
            if progress is not None:
                def _progress(p, _user):
                    try:
                        r = progress(float(p))
                        return 0 if r is False else 1
                    except BaseException:  # noqa: BLE001 - a raising callback cancels the load
                        return 0
                progress_ref = _lib.PROGRESS_FN(_progress)  # alive for the whole load call
                _check(_c.moelite_model_params_set_progress_callback(params, progress_ref, None))
            out = ctypes.c_void_p()
            _check(_c.moelite_model_load(bpath, params, ctypes.byref(out)))
            self._ptr = out.value
        finally:
            _c.moelite_model_params_free(params)
            del progress_ref
        self.vocab_only = bool(vocab_only)

    def calibrate(self, tokens, profile_path, window=256, stride=1, holdout=0.25, sensitivity_tokens=-1):
        """Writes a calibration profile of this model on `tokens` (a corpus's token ids) to
        profile_path (moelite_calibrate): per-layer sensitivities, hit curves, fitted predictors.
        sensitivity_tokens: tokens the sensitivity passes run on (-1: the default sample, 0: all)."""
        arr = (ctypes.c_int32 * max(len(tokens), 1))(*[int(t) for t in tokens])
        params = _c.moelite_calibrate_params_create()
        if not params:
            raise MemoryError("moelite_calibrate_params_create failed")
        try:
            _check(_c.moelite_calibrate_params_set_window(params, int(window)))
            _check(_c.moelite_calibrate_params_set_stride(params, int(stride)))
            _check(_c.moelite_calibrate_params_set_holdout(params, float(holdout)))
            _check(_c.moelite_calibrate_params_set_sensitivity_tokens(params, int(sensitivity_tokens)))
            _check(_c.moelite_calibrate(self._handle(), arr, len(tokens), params,
                                        _as_bytes(str(profile_path), "profile_path")))
        finally:
            _c.moelite_calibrate_params_free(params)

    # ---- lifetime ----
    def _handle(self):
        if not self._ptr:
            raise ValueError("the model is closed")
        return self._ptr

    @property
    def closed(self):
        return not self._ptr

    def close(self):
        """Frees the model, after closing every context still open on it. Idempotent."""
        if not self._ptr:
            return
        for ctx in list(self._contexts):
            ctx.close()
        ptr, self._ptr = self._ptr, None
        self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self):
        if not self._ptr:
            return "<moelite.Model closed>"
        return "<moelite.Model %s %r n_vocab=%d>" % (self.arch, self.name, self.n_vocab)

    # ---- properties ----
    def _str(self, fn):
        s = fn(self._handle())
        return s.decode("utf-8", "replace") if s is not None else None

    @property
    def arch(self):
        """general.architecture, e.g. "qwen3moe"."""
        return self._str(_c.moelite_model_arch)

    @property
    def name(self):
        """general.name ("" if absent)."""
        return self._str(_c.moelite_model_name)

    @property
    def expert_type(self):
        """Weight type holding most expert bytes, e.g. "Q4_K"."""
        return self._str(_c.moelite_model_expert_type)

    @property
    def backend_name(self):
        """Backend in use with its SIMD level, e.g. "cpu (avx512)"."""
        return self._str(_c.moelite_model_backend_name)

    def measure_device_bandwidth(self):
        """Memory bandwidth of the GPU the model computes on, in GB/s (copies within device memory;
        about a second). Raises MoeliteError (NOT_IMPLEMENTED) for the CPU backend."""
        gbs = ctypes.c_double(0.0)
        _check(_c.moelite_model_measure_device_bandwidth(self._handle(), ctypes.byref(gbs)))
        return gbs.value

    @property
    def chat_template_kind(self):
        """Recognised chat template family: chatml, mistral, llama3, tulu or plain."""
        return self._str(_c.moelite_chat_template_kind)

    @property
    def backend(self):
        """The backend actually chosen, as a name ("cpu", ...)."""
        b = self.backend_id
        for k, v in _BACKENDS.items():
            if v == b:
                return k
        return b

    @property
    def bos(self):
        """BOS token id, -1 if none."""
        return int(_c.moelite_token_bos(self._handle()))

    @property
    def eos(self):
        """EOS token id, -1 if none."""
        return int(_c.moelite_token_eos(self._handle()))

    def is_end_token(self, token):
        """True if generation stops at `token` (EOS, end-of-turn...)."""
        return bool(_c.moelite_token_is_end(self._handle(), int(token)))

    def info(self):
        """All numeric properties and names as a dict."""
        d = {k: getattr(self, k) for k in _KEYS}
        d.update(arch=self.arch, name=self.name, expert_type=self.expert_type,
                 backend_name=self.backend_name, backend=self.backend)
        return d

    # ---- text ----
    def tokenize(self, text, add_special=False, parse_special=False):
        """Token ids (list of int) of `text` (str, UTF-8 encoded, or raw bytes)."""
        data = _as_bytes(text)
        flags = (1 if add_special else 0) | (2 if parse_special else 0)
        cap = len(data) + 8
        n = ctypes.c_int32(0)
        for _ in range(4):
            buf = (ctypes.c_int32 * cap)()
            st = _c.moelite_tokenize(self._handle(), data, len(data), flags, buf, cap, ctypes.byref(n))
            if st == Status.ERR_BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            _check(st)
            return list(buf[: n.value])
        raise MoeliteError(Status.ERR_INTERNAL, "token count kept growing")  # pragma: no cover

    def detokenize_bytes(self, tokens, special=False):
        """The bytes the tokens stand for (may end inside a UTF-8 character)."""
        arr, n = _token_array(tokens)
        flags = 1 if special else 0
        h = self._handle()
        return _two_call_text(
            lambda buf, cap, plen: _c.moelite_detokenize(h, arr, n, flags, buf, cap, plen),
            16 * n + 16)

    def detokenize(self, tokens, special=False, errors="replace"):
        """The text the tokens stand for, decoded as UTF-8 (invalid bytes -> U+FFFD by default)."""
        return self.detokenize_bytes(tokens, special).decode("utf-8", errors)

    def chat_format(self, messages, add_assistant_prompt=True):
        """Formats [{"role": ..., "content": ...}, ...] with the model's chat template -> str."""
        msgs = list(messages)
        keep = []  # the encoded strings must outlive the call
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
        h = self._handle()
        guess = sum(len(k) for k in keep) + 64 * len(msgs) + 64
        out = _two_call_text(
            lambda buf, cap, plen: _c.moelite_chat_format(h, arr, len(msgs),
                                                          1 if add_assistant_prompt else 0,
                                                          buf, cap, plen),
            guess)
        return out.decode("utf-8", "replace")


for _name, _key in _KEYS.items():
    setattr(Model, _name, _key_property(_name, _key))
del _name, _key


class _CtxState:
    """What the context's abort callback reads; holds no reference to the Context (no cycle)."""

    def __init__(self, user_abort):
        self.cancel = threading.Event()
        self.user_abort = user_abort


def _make_abort_callback(state):
    def _abort(_user):
        if state.cancel.is_set():
            return 1
        if state.user_abort is not None:
            try:
                return 1 if state.user_abort() else 0
            except BaseException:  # noqa: BLE001 - a raising abort callback aborts
                return 1
        return 0
    return _lib.ABORT_FN(_abort)



class _Generation:
    """One moelite_generate call running on a helper thread, handing pieces to the iterator.

    The worker runs at most one piece ahead of the consumer: after queuing a piece, the piece
    callback waits until the consumer has taken the previous one (`demand`). So an iterator that
    is abandoned without being closed leaves a paused generation, never a runaway one, and stop()
    (from the iterator's close/break, Context.close or any other call on the context) makes the
    callback return 0, aborts a prompt evaluation in progress and joins the worker."""

    def __init__(self, ctx):
        self.ctx_ref = weakref.ref(ctx)
        self.ctx_state = ctx._state
        self.ctx_lock = ctx._lock
        self.queue = queue.SimpleQueue()
        self.demand = threading.Semaphore(0)
        self.stopped = threading.Event()
        self.worker = None
        self.params = None
        self.done = False
        self.error = None
        self.got_piece = False
        self._stop_lock = threading.Lock()

        stopped, q, demand = self.stopped, self.queue, self.demand

        def _on_piece(ptr, length, _user):
            try:
                if stopped.is_set():
                    return 0
                q.put(("piece", ctypes.string_at(ptr, length) if length else b""))
                self.got_piece = True
                demand.acquire()
                return 0 if stopped.is_set() else 1
            except BaseException:  # noqa: BLE001 - never unwind into C
                return 0

        self.piece_ref = _lib.PIECE_FN(_on_piece)  # alive as long as this object (past the join)

    def start(self, data, params):
        ctx = self.ctx_ref()
        self.params = params
        self.worker = threading.Thread(target=self._work, args=(ctx._ptr, data),
                                       name="moelite-generate", daemon=True)
        ctx._active = self
        self.ctx_state.cancel.clear()
        self.worker.start()

    def _work(self, ptr, data):
        stats = _lib.GenerateStats()
        stats.struct_size = ctypes.sizeof(_lib.GenerateStats)
        st, msg = int(Status.ERR_INTERNAL), "generation did not run"
        try:
            with self.ctx_lock:
                ctx = self.ctx_ref()
                if ctx is None or ctx._ptr != ptr or not ptr:
                    st, msg = int(Status.ERR_INVALID_ARGUMENT), "the context is closed"
                else:
                    del ctx
                    st = int(_c.moelite_generate(ptr, data, len(data), self.params,
                                                 ctypes.byref(stats)))
                    msg = _last_error() if st != 0 else ""  # same thread as the failing call
        finally:
            _c.moelite_generate_params_free(self.params)
            self.params = None
            self.queue.put(("done", st, msg, stats))

    def finish(self, item):
        """Records the worker's result: the context's last_stats, or the error to raise."""
        if self.done:
            return
        self.done = True
        _, st, msg, stats = item
        if self.worker is not None and self.worker is not threading.current_thread():
            self.worker.join()
        ctx = self.ctx_ref()
        if st == 0:
            if ctx is not None:
                ctx.last_stats = Context._stats_dict(stats)
        elif not (self.stopped.is_set() and st == Status.ERR_ABORTED):
            self.error = MoeliteError(st, msg)  # an abort we caused is not an error
        if ctx is not None and ctx._active is self:
            ctx._active = None

    def stop(self):
        """Idempotent; safe from the consumer's thread or another one, not from the worker."""
        with self._stop_lock:
            if self.done or self.worker is None:
                self.done = True
                return
            self.stopped.set()
            if not self.got_piece:
                # Still evaluating the prompt (possibly long): abort it. Once pieces flow, the
                # worker is at most one token away from the callback, which now answers 0, so
                # the call ends normally (STOP_CALLBACK) and its stats are kept.
                self.ctx_state.cancel.set()
            self.demand.release()
            if self.worker is not threading.current_thread():
                self.worker.join()
            self.ctx_state.cancel.clear()
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


class Context:
    """One inference stream (KV cache + scratch) on a Model; use from one thread at a time.

    Context(model, n_ctx=None, n_batch=None, abort=None)

    The context keeps its model alive; Model.close() closes the model's contexts first.
    abort: optional callable() -> bool polled between layers; True aborts eval/generate with
    MoeliteError ERR_ABORTED (the context stays as it was before the call).
    """

    def __init__(self, model, n_ctx=None, n_batch=None, abort=None):
        if not isinstance(model, Model):
            raise TypeError("model must be a moelite.Model")
        self._ptr = None
        self._free = _c.moelite_context_free
        self.model = model
        self.last_stats = None
        self._lock = threading.RLock()
        self._active = None  # the _Generation in progress, if any
        self._state = _CtxState(abort)
        self._abort_ref = _make_abort_callback(self._state)  # alive as long as the context
        params = _c.moelite_context_params_create()
        if not params:
            raise MemoryError("moelite_context_params_create failed")
        try:
            if n_ctx is not None:
                _check(_c.moelite_context_params_set_n_ctx(params, int(n_ctx)))
            if n_batch is not None:
                _check(_c.moelite_context_params_set_n_batch(params, int(n_batch)))
            _check(_c.moelite_context_params_set_abort_callback(params, self._abort_ref, None))
            out = ctypes.c_void_p()
            _check(_c.moelite_context_create(model._handle(), params, ctypes.byref(out)))
            self._ptr = out.value
        finally:
            _c.moelite_context_params_free(params)
        model._contexts.add(self)

    # ---- lifetime ----
    def _handle(self):
        if not self._ptr:
            raise ValueError("the context is closed")
        return self._ptr

    @property
    def closed(self):
        return not self._ptr

    def close(self):
        """Frees the context (stopping a generation in progress first). Idempotent."""
        self._preempt()
        with self._lock:
            if not self._ptr:
                return
            ptr, self._ptr = self._ptr, None
            self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self):
        if not self._ptr:
            return "<moelite.Context closed>"
        return "<moelite.Context n_ctx=%d kv_length=%d>" % (self.n_ctx, self.kv_length)

    # ---- KV cache ----
    @property
    def n_ctx(self):
        """Maximum tokens the KV cache holds."""
        self._preempt()
        with self._lock:
            return int(_c.moelite_context_n_ctx(self._handle()))

    @property
    def kv_length(self):
        """Tokens currently held in the KV cache."""
        self._preempt()
        with self._lock:
            return int(_c.moelite_kv_length(self._handle()))

    def reset(self):
        """Forgets the whole sequence."""
        self._preempt()
        with self._lock:
            _c.moelite_kv_reset(self._handle())

    def truncate(self, n_keep):
        """Keeps the first n_keep tokens (clamped to [0, kv_length])."""
        self._preempt()
        with self._lock:
            _c.moelite_kv_truncate(self._handle(), int(n_keep))

    # ---- evaluation ----
    def eval(self, tokens, logits_all=False):
        """Appends `tokens` to the sequence and runs the model on them. On error (MoeliteError:
        ERR_BAD_TOKEN, ERR_CONTEXT_FULL, ERR_ABORTED...) the context is unchanged."""
        arr, n = _token_array(tokens)
        self._preempt()
        with self._lock:
            self._state.cancel.clear()
            _check(_c.moelite_eval(self._handle(), arr, n, 1 if logits_all else 0))

    def logits(self, i=-1):
        """Logits (n_vocab floats) of token i of the last eval (negative i counts from the end;
        without logits_all only the last token has logits). A numpy float32 array when numpy is
        importable, else a list of floats. Always a copy. IndexError if token i has no logits."""
        self._preempt()
        with self._lock:
            ptr = _c.moelite_get_logits(self._handle(), int(i))
            if not ptr:
                raise IndexError("no logits for token index %d of the last eval" % i)
            n = self.model.n_vocab
            if _np is not None:
                return _np.ctypeslib.as_array(ptr, shape=(n,)).copy()
            return ptr[:n]

    # ---- generation ----
    def generate(self, prompt, max_tokens=None, temperature=None, top_k=None, top_p=None,
                 min_p=None, repeat_penalty=None, repeat_last_n=None, seed=None, stop=None,
                 as_bytes=False):
        """Generates a continuation of `prompt` (str or bytes; the whole sequence: the KV cache's
        shared prefix is reused). Returns an iterator of str pieces yielded as they are produced
        (pieces never split a UTF-8 character nor contain a stop string). None for a parameter
        means the library default (max_tokens 256, temperature 0.8, top_k 40, top_p 0.95,
        min_p 0.05, repeat_penalty 1.0 over 64, seed 0x5eed). temperature 0 is greedy.
        as_bytes=True yields the pieces as the library's bytes instead of str (each piece is
        decoded on its own with errors="replace" otherwise).

        Generation starts on the first next() and runs on a helper thread at most one piece ahead
        of the consumer. Leaving the loop early (break, or close() on the iterator) stops it; an
        iterator abandoned without being closed is stopped by the next call on this context.
        `self.last_stats` is None while a generation runs and then holds the dict of
        moelite_generate_stats (also after an early stop; not after an error or a stop during
        the prompt evaluation). Errors raise MoeliteError; the context stays usable."""
        data = _as_bytes(prompt, "prompt")
        stops = [stop] if isinstance(stop, (str, bytes)) else list(stop or [])
        stops = [_as_bytes(s, "stop string") for s in stops]
        for s in stops:
            if not s or b"\0" in s:
                raise ValueError("stop strings must be non-empty and contain no NUL")
        opts = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                    seed=seed)
        self._handle()  # fail now, not on first next(), for a closed context
        return self._generate(data, opts, stops, bool(as_bytes))

    def _make_generate_params(self, o, stops, piece_ref):
        p = _c.moelite_generate_params_create()
        if not p:
            raise MemoryError("moelite_generate_params_create failed")
        try:
            if o["max_tokens"] is not None:
                _check(_c.moelite_generate_params_set_max_tokens(p, int(o["max_tokens"])))
            if o["temperature"] is not None:
                _check(_c.moelite_generate_params_set_temperature(p, float(o["temperature"])))
            if o["top_k"] is not None:
                _check(_c.moelite_generate_params_set_top_k(p, int(o["top_k"])))
            if o["top_p"] is not None:
                _check(_c.moelite_generate_params_set_top_p(p, float(o["top_p"])))
            if o["min_p"] is not None:
                _check(_c.moelite_generate_params_set_min_p(p, float(o["min_p"])))
            if o["repeat_penalty"] is not None or o["repeat_last_n"] is not None:
                pen = 1.0 if o["repeat_penalty"] is None else float(o["repeat_penalty"])
                last_n = 64 if o["repeat_last_n"] is None else int(o["repeat_last_n"])
                _check(_c.moelite_generate_params_set_repeat_penalty(p, pen, last_n))
            if o["seed"] is not None:
                _check(_c.moelite_generate_params_set_seed(p, int(o["seed"]) & 0xFFFFFFFFFFFFFFFF))
            for s in stops:
                _check(_c.moelite_generate_params_add_stop(p, s))
            _check(_c.moelite_generate_params_set_callback(p, piece_ref, None))
        except BaseException:
            _c.moelite_generate_params_free(p)
            raise
        return p

    def _generate(self, data, opts, stops, as_bytes):
        self._preempt()
        with self._lock:
            self._handle()
            self.last_stats = None
            gen = _Generation(self)
            params = self._make_generate_params(opts, stops, gen.piece_ref)
        gen.start(data, params)
        try:
            while True:
                item = gen.queue.get()
                kind = item[0]
                if kind == "piece":
                    gen.demand.release()  # let the worker compute the next piece meanwhile
                    yield item[1] if as_bytes else item[1].decode("utf-8", "replace")
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
        if gen is not None and gen.worker is not threading.current_thread():
            gen.stop()

    @staticmethod
    def _stats_dict(stats):
        d = {name: getattr(stats, name) for name in _STATS_FIELDS}
        try:
            d["stop_reason_name"] = StopReason(d["stop_reason"]).name.lower()
        except ValueError:
            d["stop_reason_name"] = str(d["stop_reason"])
        return d
