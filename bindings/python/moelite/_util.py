"""Helpers the modules above this one share: the optional numpy import, the argument types
(PathLike, TextLike), text and token-id conversions for C calls, the two-call buffer convention,
and _Closeable, the base of the objects that own a library handle (Context, Sampler, Queue).
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Iterable, Optional, Union

from .errors import MoeliteError, Status, _check

try:  # numpy is optional: logits come back as numpy arrays when it is importable, else lists.
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None

PathLike = Union[str, bytes, "os.PathLike[str]"]
_MISSING: Any = object()  # "no default given"
TextLike = Union[str, bytes, bytearray, memoryview]


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
