"""Queue: many generation requests decoded together by one context's sequences (continuous
batching, moelite_queue_*), and the states of a request (REQUEST_WAITING, REQUEST_RUNNING).
Not named queue.py, which would shadow the standard library's queue module.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from ._exit import _exit_guard
from ._lib import lib as _c
from ._util import TextLike, _as_bytes, _Closeable, _int_arg, _token_array
from .context import Context
from .errors import MoeliteError, Status, _check, _last_error
from .generation import _STATS_FIELDS, StopReason, _generate_params


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
            _check(_c.moelite_queue_request_state(self._handle(), _int_arg(request, "request"), ctypes.byref(out)))
            return int(out.value)

    def tokens(self, request: int) -> List[int]:
        """The tokens the request generated so far (an end token is not one of them)."""
        with self.ctx._lock:
            q, n = self._handle(), ctypes.c_int32(0)
            st = int(_c.moelite_queue_request_tokens(q, _int_arg(request, "request"), None, 0, ctypes.byref(n)))
            if st not in (0, int(Status.ERR_BUFFER_TOO_SMALL)):
                _check(st)
            buf = (ctypes.c_int32 * max(1, n.value))()
            _check(_c.moelite_queue_request_tokens(q, _int_arg(request, "request"), buf, n.value, ctypes.byref(n)))
            return list(buf[: n.value])

    def text(self, request: int, as_bytes: bool = False) -> Union[str, bytes]:
        """The text the request emitted so far (stop strings cut, UTF-8 characters whole)."""
        with self.ctx._lock:
            q, n = self._handle(), ctypes.c_size_t(0)
            st = int(_c.moelite_queue_request_text(q, _int_arg(request, "request"), None, 0, ctypes.byref(n)))
            if st not in (0, int(Status.ERR_BUFFER_TOO_SMALL)):
                _check(st)
            buf = ctypes.create_string_buffer(max(1, n.value))
            _check(_c.moelite_queue_request_text(q, _int_arg(request, "request"), buf, n.value, ctypes.byref(n)))
            data = buf.raw[: n.value]
        return data if as_bytes else data.decode("utf-8", "replace")

    def stats(self, request: int) -> Dict[str, Any]:
        """moelite_queue_request_stats as a dict (the fields of Context.last_stats): cached and
        evaluated prompt tokens, generated tokens, stop_reason (negative while it waits or runs),
        timings."""
        with self.ctx._lock:
            stats = _lib.GenerateStats()
            stats.struct_size = ctypes.sizeof(stats)
            _check(_c.moelite_queue_request_stats(self._handle(), _int_arg(request, "request"), ctypes.byref(stats)))
        d = {name: getattr(stats, name) for name in _STATS_FIELDS}
        d["stop_reason_name"] = ({REQUEST_WAITING: "waiting", REQUEST_RUNNING: "running"}.get(d["stop_reason"])
                                 or StopReason(d["stop_reason"]).name.lower())
        return d

    def cancel(self, request: int) -> None:
        """Ends a waiting or running request at once (StopReason.ABORTED), freeing its sequence."""
        with self.ctx._lock:
            _check(_c.moelite_queue_cancel(self._handle(), _int_arg(request, "request")))

    def remove(self, request: int) -> None:
        """Cancels the request if it runs and forgets it (the queue keeps finished ones until then)."""
        with self.ctx._lock:
            _check(_c.moelite_queue_remove(self._handle(), _int_arg(request, "request")))
