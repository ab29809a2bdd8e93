"""The Python functions the library calls back (progress, abort, routing, logits), wrapped as
ctypes callbacks. None of them lets an exception unwind into C: each stores it for the Python
caller to re-raise once the C call returned, and each answers "stop" without calling user code
once the interpreter exits (_exit_guard).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Optional

from . import _lib
from ._exit import _ExitGuard, _exit_guard
from ._util import _np

RoutingCallback = Callable[[int, int, Any, Any], Any]
LogitsCallback = Callable[[Any, Any], Any]


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
