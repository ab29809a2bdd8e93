"""Sampler: the token choice of generation (moelite_sampler_*) for loops that drive
Context.eval() themselves.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Iterable, Mapping, Optional

from ._callbacks import LogitsCallback, _CtxState, _make_logits_callback
from ._exit import _exit_guard
from ._lib import lib as _c
from ._util import _Closeable, _int_arg, _np, _token_array
from .context import Context
from .errors import MoeliteError, _check, _last_error
from .generation import _generate_params


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
            return self._call(lambda out: _c.moelite_sampler_sample(s, h, _int_arg(i, "i"), out))

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
