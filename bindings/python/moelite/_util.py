"""Helpers the modules above this one share: the optional numpy import, the argument types
(PathLike, TextLike), text and token-id conversions for C calls, the two-call buffer convention,
and _Closeable, the base of the objects that own a library handle (Context, Sampler, Queue).
"""
from __future__ import annotations

import ctypes
import operator
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


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def _int32_array(values: Iterable[int], what: str = "token ids"):
    """(a ctypes int32_t array, its length). A ctypes array keeps only the low 32 bits of what it
    is given (2**32 + 1 would become 1), so each value is checked first: TypeError for a
    non-integer (a float is not truncated either), OverflowError outside int32_t."""
    values = [_int_arg(v, what) for v in values]
    for i, v in enumerate(values):
        if not _INT32_MIN <= v <= _INT32_MAX:
            raise OverflowError("%s[%d] is %d, outside the range of int32_t" % (what, i, v))
    if len(values) > _INT32_MAX:
        raise OverflowError("%d %s do not fit an int32_t count" % (len(values), what))
    arr = (ctypes.c_int32 * max(len(values), 1))(*values)
    return arr, len(values)


def _token_array(tokens: Iterable[int]):
    return _int32_array(tokens, "token ids")


def _int_arg(value: Any, what: str) -> int:
    """An integer argument as an int: operator.index, so a float (or a str) is a TypeError rather
    than silently truncated by int(). The range of the C type is checked at the call (_lib)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an integer, not %s" % (what, type(value).__name__)) from None


def _c_path(path: Any, what: str = "path") -> bytes:
    """A path (str, bytes, os.PathLike) as the NUL-terminated bytes the C API takes; ValueError
    for a NUL inside it, which would end the C string early and name another file."""
    if isinstance(path, (bytes, bytearray, memoryview)):
        data = bytes(path)
    else:
        try:
            data = os.fsencode(os.fspath(path))
        except TypeError:
            raise TypeError("%s must be str, bytes or os.PathLike, not %s" % (what, type(path).__name__)) from None
    if b"\0" in data:
        raise ValueError("%s contains a NUL byte" % what)
    return data


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
