"""What a failed call reports: the library's status codes (Status), the exception carrying one
(MoeliteError) and the helpers that turn a status into it (_check, _last_error).

The deprecated-alias machinery of the binding's enums lives here too, next to Status, the first
enum that uses it (StopReason, in generation.py, is the other).
"""
from __future__ import annotations

import enum
import warnings
from typing import Any, Dict, Optional

from ._lib import lib as _c

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
    ERR_BUSY = 44  # another thread is using the context
    ERR_BAD_SESSION = 50  # a saved session is not one, truncated, corrupt or of another version
    ERR_SESSION_MISMATCH = 51  # a saved session of another model, or larger than the context
    ERR_INTERNAL = 99
    ERR_CANCELLED = 43  # deprecated alias of ERR_PROGRESS_ABORTED


_DEPRECATED_ALIASES[("Status", "ERR_CANCELLED")] = "ERR_PROGRESS_ABORTED"


class MoeliteError(Exception):
    """A moelite call failed. `.status` is the moelite_status (int), `.status_name` its C name
    ("MOELITE_ERR_FILE_NOT_FOUND") and `.message` the library's moelite_last_error() text.
    `.stats` is None, except for a failed generation: the dict of its moelite_generate_stats
    (what was done before the failure; see Context.generate). A status of ERR_BUSY makes a
    ContextBusyError."""

    def __new__(cls, status: int, *args: Any, **kwargs: Any):
        if cls is MoeliteError and int(status) == Status.ERR_BUSY:
            cls = ContextBusyError
        return super().__new__(cls)

    def __init__(self, status: int, message: str = "", stats: Optional[Dict[str, Any]] = None):
        self.status = int(status)
        self.status_name = _c.moelite_status_name(self.status).decode("ascii", "replace")
        self.message = message
        self.stats = stats
        super().__init__("%s: %s" % (self.status_name, message) if message else self.status_name)


class ContextBusyError(MoeliteError, RuntimeError):
    """A call on a Context that another thread is using: its generation is under way (one
    generation per context at a time), or the library found the context in a call of another
    thread (MOELITE_ERR_BUSY). Raised at once, before anything is changed; the other thread's
    work goes on undisturbed. `.status` is Status.ERR_BUSY. Also a RuntimeError."""



def _last_error() -> str:
    return _c.moelite_last_error().decode("utf-8", "replace")


def _check(status: int) -> None:
    # moelite_last_error() is per thread: read it right after the failing call, on its thread.
    if status != 0:
        raise MoeliteError(status, _last_error())
