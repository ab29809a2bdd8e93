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

Lifetimes. Models are reference counted by the library: a context holds a reference to its
model, so the model's and the contexts' handles may be released in any order (finalizers at
interpreter exit run in no particular order). A Context also keeps its Model object alive.
Model.close() and Context.close() release memory deterministically; without them the garbage
collector does it.

Exit. Callbacks (abort, routing, progress, log, logits, and generate()'s streaming) are Python functions
called from C. A thread other than the main thread must not be inside the library when the
interpreter finalizes: a thread calling back into Python then is stopped by CPython in the
middle of C++ code (the process aborts) or blocks forever. An atexit hook therefore stops
every streaming generation, makes every callback of another thread ask the library to stop
(abort callbacks answer "abort", progress callbacks "cancel", logits callbacks "stop") and waits, bounded, until those
calls have returned; see _ExitGuard (_exit.py).
"""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional

# Layout: one concern per module, each importing only modules above it in this list.
#   _lib           locating libmoelite; ctypes declarations of include/moelite.h
#   errors         Status, MoeliteError, _check
#   _util          optional numpy, text and token-id conversions, _Closeable
#   _exit          _ExitGuard and its atexit hook
#   _callbacks     the progress, abort, routing and logits callbacks called from C
#   log            set_log_callback
#   host           PlatformField, platform_get, platform_info, ...
#   stats          ExpertStats, QualityStats
#   model          Model, Metadata, TokenizeFlag, DetokenizeFlag, TokenAttr
#   generation     StopReason, generation parameters, _Generation (generate()'s helper thread)
#   context        Context
#   sampler        Sampler
#   request_queue  Queue, REQUEST_WAITING, REQUEST_RUNNING
from . import _lib
from ._lib import lib as _c
from .context import Context
from .errors import ContextBusyError, MoeliteError, Status
from .generation import StopReason
from .host import (PlatformField, platform_describe_json, platform_get, platform_info,
                   platform_memory_available)
from .log import set_log_callback
from .model import DetokenizeFlag, Metadata, Model, TokenAttr, TokenizeFlag
from .request_queue import REQUEST_RUNNING, REQUEST_WAITING, Queue
from .sampler import Sampler
from .stats import ExpertStats, QualityStats

# The helpers defined in this file before it was split into modules stay reachable as
# moelite.<name> (tests use moelite._exit_guard and moelite._KEYS).
from ._callbacks import (LogitsCallback, RoutingCallback, _CtxState, _make_abort_callback,  # noqa: F401
                         _make_logits_callback, _make_routing_callback, _progress_thunk)
from ._exit import _exit_guard, _ExitGuard, _monotonic  # noqa: F401
from ._util import (_MISSING, PathLike, TextLike, _as_bytes, _c_path, _Closeable, _np, _token_array,  # noqa: F401
                    _two_call_text)
from .errors import _DEPRECATED_ALIASES, _check, _DeprecatedAliasMeta, _last_error  # noqa: F401
from .generation import _STATS_FIELDS, _generate_params, _Generation  # noqa: F401
from .model import _BACKENDS, _KEYS, _AbcMapping, _chat_array, _key_property  # noqa: F401

__all__ = [
    "__version__", "version_number", "library_path", "supported_archs", "pack_experts", "Status", "StopReason",
    "MoeliteError", "ContextBusyError", "Model", "Context", "Sampler", "Queue", "REQUEST_WAITING", "REQUEST_RUNNING", "Metadata", "ExpertStats", "QualityStats", "PlatformField",
    "TokenizeFlag", "DetokenizeFlag", "TokenAttr", "set_log_callback", "platform_get", "platform_describe_json", "platform_info",
    "platform_memory_available",
]

__version__: str = _c.moelite_version_string().decode("ascii")
library_path: str = _lib.library_path


def pack_experts(model: PathLike, out: Optional[PathLike] = None,
                 progress: Optional[Callable[[float], Any]] = None) -> str:
    """Writes the model's packed expert file (moelite_pack_experts): every expert's gate, up and
    down in one 4 KiB-aligned record, so a budget reads a small expert in one request. `out`
    defaults to MODEL.experts beside the model, where loads look for it; the model file is not
    changed. progress: callable(float) -> bool with the share written; False (or an exception,
    raised again here) cancels and leaves no file. Returns the path written. MoeliteError on
    failure (the model itself as `out`, a full disk, a directory or device as `out`, ...)."""
    bpath = _c_path(model, "model")
    bout = _c_path(out, "out") if out is not None else None
    box: list = [None]
    ref = _progress_thunk(progress, box) if progress is not None else _lib.PROGRESS_FN()
    st = int(_c.moelite_pack_experts(bpath, bout, ref, None))
    msg = _last_error() if st else ""
    del ref
    if box[0] is not None:
        raise box[0]
    if st != 0:
        raise MoeliteError(st, msg)
    return os.fsdecode(bout if bout is not None else bpath + b".experts")


def version_number() -> int:
    """The linked library's version as MAJOR*10000 + MINOR*100 + PATCH."""
    return int(_c.moelite_version_number())


def supported_archs() -> List[str]:
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


# The public classes and functions (and the bases help() shows: _Closeable, _DeprecatedAliasMeta)
# keep "moelite" as their module, as when they were all defined in this file: tracebacks print
# moelite.MoeliteError, help() and pickles name moelite.Model.
for _obj in (Status, StopReason, MoeliteError, ContextBusyError, Model, Context, Sampler, Queue, Metadata, ExpertStats,
             PlatformField, TokenizeFlag, DetokenizeFlag, TokenAttr, set_log_callback, platform_get,
             platform_describe_json, platform_info, platform_memory_available, _Closeable,
             _DeprecatedAliasMeta):
    _obj.__module__ = __name__
del _obj

