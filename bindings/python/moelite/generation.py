"""One generation call of the library: why it stopped (StopReason), its statistics as a dict,
the moelite_generate_params built from Python options, and _Generation, which runs
moelite_generate on a helper thread so that Context.generate() can be an iterator.
"""
from __future__ import annotations

import ctypes
import enum
import queue
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from ._callbacks import LogitsCallback, _make_logits_callback
from ._exit import _exit_guard
from ._lib import lib as _c
from ._util import _int_arg
from .errors import _DEPRECATED_ALIASES, MoeliteError, Status, _check, _DeprecatedAliasMeta, _last_error

if TYPE_CHECKING:  # annotations only: context.py is above this module
    from .context import Context


class StopReason(enum.IntEnum, metaclass=_DeprecatedAliasMeta):
    """moelite_stop_reason: why a generation ended. CALLBACK is a deprecated alias of ABORTED."""
    END_TOKEN = 0     # the model produced an end-of-generation token
    MAX_TOKENS = 1
    STRING = 2        # a stop string
    ABORTED = 3       # a piece, token or logits callback asked to stop (an early break included)
    CONTEXT_FULL = 4  # the context is full (the call failed with ERR_CONTEXT_FULL)
    ERROR = 5         # the call failed (see the exception)
    CALLBACK = 3      # deprecated alias of ABORTED


_DEPRECATED_ALIASES[("StopReason", "CALLBACK")] = "ABORTED"

_STATS_FIELDS = [f[0] for f in _lib.GenerateStats._fields_ if f[0] != "struct_size"]


def _stats_dict(stats):
    """A moelite_generate_stats as the dict of Context.last_stats."""
    d = {name: getattr(stats, name) for name in _STATS_FIELDS}
    try:
        d["stop_reason_name"] = StopReason(d["stop_reason"]).name.lower()
    except ValueError:
        d["stop_reason_name"] = str(d["stop_reason"])
    return d


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
            _check(_c.moelite_generate_params_set_max_tokens(p, _int_arg(o["max_tokens"], "max_tokens")))
        if o.get("temperature") is not None:
            _check(_c.moelite_generate_params_set_temperature(p, float(o["temperature"])))
        if o.get("top_k") is not None:
            _check(_c.moelite_generate_params_set_top_k(p, _int_arg(o["top_k"], "top_k")))
        if o.get("top_p") is not None:
            _check(_c.moelite_generate_params_set_top_p(p, float(o["top_p"])))
        if o.get("min_p") is not None:
            _check(_c.moelite_generate_params_set_min_p(p, float(o["min_p"])))
        if o.get("repeat_penalty") is not None or o.get("repeat_last_n") is not None:
            pen = 1.0 if o.get("repeat_penalty") is None else float(o["repeat_penalty"])
            last_n = 64 if o.get("repeat_last_n") is None else _int_arg(o["repeat_last_n"], "repeat_last_n")
            _check(_c.moelite_generate_params_set_repeat_penalty(p, pen, last_n))
        if o.get("seed") is not None:
            seed = _int_arg(o["seed"], "seed")
            # A negative seed stands for its 64-bit two's complement (-1 is 2**64 - 1); beyond 64
            # bits the high bits would be dropped silently, so such a seed is refused.
            if not -(1 << 63) <= seed < (1 << 64):
                raise OverflowError("seed %d does not fit 64 bits" % seed)
            _check(_c.moelite_generate_params_set_seed(p, seed & 0xFFFFFFFFFFFFFFFF))
        for s in stops:
            _check(_c.moelite_generate_params_add_stop(p, s))
        for token, bias in (logit_bias or {}).items():
            _check(_c.moelite_generate_params_set_logit_bias(p, _int_arg(token, "logit_bias token"), float(bias)))
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
        self.consumer: Optional[int] = None  # ident of the thread iterating (Context._claim)
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
        """Starts the worker (the context has claimed this generation, Context._claim); frees
        `params` if it does not. RuntimeError once the interpreter exits. Stopped before it
        started (the context closed meanwhile by another thread), it starts nothing and the
        iterator ends."""
        ctx = self.ctx_ref()
        try:
            self.guard.enter(generation=True)
        except BaseException:
            _c.moelite_generate_params_free(params)
            self.stop()  # releases the claim
            raise
        # Under _stop_lock: a stop() from another thread sees either no worker (and this then
        # starts none) or a started one it can join -- never one created but not yet started.
        with self._stop_lock:
            if self.done:
                _c.moelite_generate_params_free(params)
                self.guard.leave()
                self.queue.put(("stopped",))
                return
            try:
                self.params = params
                self.worker = threading.Thread(target=self._work, args=(ctx._ptr, data),
                                               name="moelite-generate", daemon=True)
                with self.guard.cond:
                    self.guard.generations.add(self)
                self.state.begin()
                self.worker.start()
            except BaseException:
                self.worker, self.done, self.params = None, True, None
                self._release_claim()
                _c.moelite_generate_params_free(params)
                self.guard.leave()
                raise

    def _release_claim(self) -> None:
        ctx = self.ctx_ref()
        if ctx is not None:
            with ctx._gen_lock:
                if ctx._active is self:
                    ctx._active = None

    def _work(self, ptr: int, data: Union[bytes, Tuple[Any, int]]) -> None:
        stats = _lib.GenerateStats()
        stats.struct_size = ctypes.sizeof(_lib.GenerateStats)
        st, msg, exc = int(Status.ERR_INTERNAL), "generation did not run", None
        try:
            with self.ctx_lock:
                ctx = self.ctx_ref()
                if ctx is None or ctx._ptr != ptr or not ptr:
                    # Closed by another thread after generate() checked it: what any call on a
                    # closed context raises.
                    st, msg = int(Status.ERR_INVALID_ARGUMENT), "the context is closed"
                    exc = ValueError("the context is closed")
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
        d = _stats_dict(stats) if self.ran else None
        if ctx is not None and d is not None:
            ctx.last_stats = d
        if exc is not None:
            self.error = exc  # raised by the user's abort, routing or logits callback
        elif st != 0 and not (self.stopped.is_set() and st == Status.ERR_ABORTED):
            self.error = MoeliteError(st, msg, d)  # an abort we caused is not an error
        self._release_claim()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Idempotent; safe from the consumer's thread or another one, not from the worker.
        With a timeout the worker may still run on return (then `done` stays False)."""
        with self._stop_lock:
            if self.done or self.worker is None:
                self.done = True
                self._release_claim()
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
