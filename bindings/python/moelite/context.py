"""Context: one inference stream (KV cache + scratch) on a Model -- evaluation, logits, sessions,
sequences, its expert-store counters and streaming generation (generate(), chat()).
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from . import _lib
from ._callbacks import (LogitsCallback, RoutingCallback, _CtxState, _make_abort_callback,
                         _make_routing_callback)
from ._exit import _exit_guard
from ._lib import lib as _c
from ._util import PathLike, TextLike, _as_bytes, _c_path, _Closeable, _int32_array, _int_arg, _np, _token_array
from .errors import ContextBusyError, MoeliteError, Status, _check, _last_error
from .generation import _Generation, _generate_params, _stats_dict
from .model import Model
from .stats import ExpertStats, QualityStats

if TYPE_CHECKING:  # annotations only: request_queue.py is above this module
    from .request_queue import Queue


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

    Threads: one thread at a time, and one generation at a time. Calls from several threads are
    serialized, never run at once; while a generation is under way (its iterator started and
    not finished or closed), generate() and every other call from a thread other than the one
    iterating raise ContextBusyError at once, leaving that generation undisturbed. Integer
    arguments: TypeError for a non-integer, OverflowError outside the C type's range (nothing
    is truncated); paths: ValueError for a NUL character.

    Lifetime: the context keeps its Model object alive (and the library keeps the model's memory
    for it). Model.close() closes the model's contexts first. close() stops a generation in
    progress and frees the context; otherwise the garbage collector does, in any order
    relative to the model.
    """

    def __init__(self, model: Model, n_ctx: Optional[int] = None, n_batch: Optional[int] = None,
                 abort: Optional[Callable[[], Any]] = None, routing: Optional[RoutingCallback] = None,
                 n_seq: Optional[int] = None, quality_sample: Optional[float] = None,
                 quality_target: Optional[str] = None,
                 quality_bounds: Optional[Tuple[float, float]] = None):
        if not isinstance(model, Model):
            raise TypeError("model must be a moelite.Model")
        self._ptr = None
        self._free = _c.moelite_context_free  # kept for __del__ during interpreter shutdown
        self.model = model
        self.last_stats: Optional[Dict[str, Any]] = None
        self._lock = threading.RLock()  # held by every call into the library on this context
        self._active: Optional[_Generation] = None  # the generation in progress, if any
        self._gen_lock = threading.Lock()  # makes "is a generation active? then claim" one step
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
                _check(_c.moelite_context_params_set_n_ctx(params, _int_arg(n_ctx, "n_ctx")))
            if n_batch is not None:
                _check(_c.moelite_context_params_set_n_batch(params, _int_arg(n_batch, "n_batch")))
            if n_seq is not None:
                _check(_c.moelite_context_params_set_n_seq(params, _int_arg(n_seq, "n_seq")))
            if self._routing_ref is not None:
                _check(_c.moelite_context_params_set_routing_callback(params, self._routing_ref, None))
            # The quality meter and governor (lossy gating): a sampled share of decode steps compared
            # with exact routing; a target ("1%", "kl:0.01") the threshold is moved to hold.
            if quality_sample is not None:
                _check(_c.moelite_context_params_set_quality_meter(params, float(quality_sample)))
            if quality_target is not None:
                if not isinstance(quality_target, str):
                    raise TypeError("quality_target must be a str such as '1%' or 'kl:0.01'")
                target = quality_target.encode()
                if b"\0" in target:
                    raise ValueError("quality_target contains a NUL byte")
                _check(_c.moelite_context_params_set_quality_target(params, target))
            if quality_bounds is not None:
                lo, hi = quality_bounds
                _check(_c.moelite_context_params_set_quality_bounds(params, float(lo), float(hi)))
            out = ctypes.c_void_p()
            # A call in flight on the model (see Model._use): Model.close() on another thread
            # waits for it, and then finds this context among those it closes.
            with model._use() as model_handle:
                _check(_c.moelite_context_create(model_handle, params, ctypes.byref(out)))
                # The binding's own abort callback is always installed: it also stops generations
                # and calls at exit; Context.abort only swaps the user function it consults.
                st = int(_c.moelite_context_set_abort_callback(out.value, self._abort_ref, None))
                if st != 0:
                    msg = _last_error()
                    _c.moelite_context_free(out.value)
                    raise MoeliteError(st, msg)
                self._ptr = out.value
                model._contexts.add(self)
        finally:
            _c.moelite_context_params_free(params)

    # ---- lifetime (_Closeable: _handle, closed, with, the finalizer) ----
    _kind = "context"

    def close(self) -> None:
        """Frees the context (stopping a generation in progress first, whichever thread consumes
        it: its iterator then ends). Idempotent. From another thread it waits for the call in
        progress (an eval) to return; calls made after it raise ValueError("the context is
        closed"). RuntimeError from inside a call on this context on the same thread (its abort,
        routing or logits callback), which could not return once the context is freed."""
        if self._lock._is_owned():  # noqa: SLF001 - RLock: this thread is inside a call on us
            raise RuntimeError("Context.close() called from inside a call on this context (e.g. one of its "
                               "callbacks); close it after that call has returned")
        gen = self._active
        if gen is not None:
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
            _c.moelite_context_kv_truncate(self._handle(), _int_arg(n_keep, "n_keep"))

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
            _check(_c.moelite_context_expert_stats(self._handle(), _int_arg(layer, "layer"), ctypes.byref(s)))
            return ExpertStats._from_c(s)

    def quality_stats(self) -> "QualityStats":
        """What lossy gating cost this context (moelite_context_quality_stats): the quality
        meter's KL and top-1 agreement against exact routing, the sensitivity model's prediction,
        the governor's threshold and target."""
        self._preempt()
        with self._lock:
            s = _lib.QualityStats()
            s.struct_size = ctypes.sizeof(_lib.QualityStats)
            _check(_c.moelite_context_quality_stats(self._handle(), ctypes.byref(s)))
            return QualityStats._from_c(s)

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
        id_arr, n_ids = _int32_array(seq_ids, "seq_ids")
        if n_ids != n:
            raise ValueError("seq_ids must have one id per token")
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
            _check(_c.moelite_context_save(self._handle(), _c_path(path)))

    def load(self, path: PathLike) -> None:
        """Restores a state saved with save() (moelite_context_load); the context is unchanged on
        ERR_FILE_NOT_FOUND, ERR_BAD_SESSION or ERR_SESSION_MISMATCH."""
        self._preempt()
        with self._lock:
            _check(_c.moelite_context_load(self._handle(), _c_path(path)))

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
            if not 0 <= _int_arg(seq, "seq") < int(_c.moelite_context_n_seq(h)):
                raise IndexError("sequence %d is out of range" % seq)
            return int(_c.moelite_context_seq_length(h, _int_arg(seq, "seq")))

    def seq_truncate(self, seq: int, n_keep: int) -> None:
        """Keeps the first n_keep tokens of sequence seq (0 resets it; moelite_context_seq_truncate)."""
        self._preempt()
        with self._lock:
            _check(_c.moelite_context_seq_truncate(self._handle(), _int_arg(seq, "seq"), _int_arg(n_keep, "n_keep")))

    def logits(self, i: int = -1):
        """Logits (n_vocab floats) of token i of the last eval or eval_batch (negative i counts
        from the end; without logits_all only the last token has logits; after eval_batch i is
        the batch index and only wanted tokens have logits). A numpy float32 array when numpy is
        importable, else a list of floats. Always a copy. IndexError if token i has no logits."""
        self._preempt()
        with self._lock:
            ptr = _c.moelite_get_logits(self._handle(), _int_arg(i, "i"))
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
        is stopped by the next call on this context from the same thread, by
        Context.close()/Model.close(), or at interpreter exit. One generation per context at a
        time: the first next() raises ContextBusyError (nothing is evaluated) while another
        thread's generation on this context is under way, and so does any other call on the
        context from a thread other than the one iterating (the generation goes on).

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
        gen = _Generation(self, yield_tokens, logits)
        self._claim(gen)  # ContextBusyError while another thread's generation is under way
        try:
            with self._lock:
                self._handle()
                self.last_stats = None
                params = _generate_params(opts, stops, bias, parse_special, gen.piece_ref, gen.token_ref,
                                          gen.logits_ref)
        except BaseException:
            gen.stop()  # never started: releases the claim
            raise
        gen.start(data, params)
        try:
            while True:
                item = gen.queue.get()
                kind = item[0]
                if kind == "piece" or kind == "token":
                    gen.demand.release()  # let the worker compute the next piece meanwhile
                    text = item[-1] if as_bytes else item[-1].decode("utf-8", "replace")
                    yield (item[1], text) if kind == "token" else text
                    # Whoever resumes the iterator consumes it now (it may be handed over).
                    gen.consumer = threading.get_ident()
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

    def _busy(self) -> ContextBusyError:
        return ContextBusyError(Status.ERR_BUSY, "the context is in use: a generation on another thread is under "
                                "way (one generation per context at a time); finish or close its iterator first")

    def _claim(self, gen: _Generation) -> None:
        """Makes `gen` the context's generation. One of this thread's left suspended (an
        iterator not run to its end) is stopped first; one consumed by another thread, or this
        call made from inside a generation's callback, raises ContextBusyError: stopping it
        would silently end that thread's iteration (and a generation started from its own
        callback would wait for it forever)."""
        me = threading.get_ident()
        while True:
            with self._gen_lock:
                cur = self._active
                if cur is None or cur.done:
                    self._active = gen
                    gen.consumer = me
                    return
                if cur.consumer != me or cur.on_worker():
                    raise self._busy()
            cur.stop()  # this thread's own suspended generation: outside _gen_lock (finish() takes it)

    def _preempt(self):
        """Before another call on this context: stops a generation this thread left suspended;
        ContextBusyError when another thread's generation is under way (see _claim). A callback
        of the generation itself (on its worker thread) may call in."""
        gen = self._active
        if gen is None or gen.done or gen.on_worker():
            return
        if gen.consumer != threading.get_ident():
            raise self._busy()
        gen.stop()

    _stats_dict = staticmethod(_stats_dict)
