"""Routing the library's log lines to Python (set_log_callback). At interpreter exit the
library's default sink is restored, once no other thread is inside the library (_exit_guard).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from . import _lib
from ._exit import _exit_guard
from ._lib import lib as _c

_log_callback_ref = None  # keeps the installed ctypes log callback alive


def set_log_callback(fn: Optional[Callable[[int, str], Any]], min_level: int = 2) -> None:
    """Routes library log lines to fn(level: int, text: str); None restores the default sink
    (stderr, WARN and above). Levels: 0 debug, 1 info, 2 warn, 3 error, 4 none. fn may be called
    from the library's worker threads and must not raise (exceptions are swallowed). At
    interpreter exit the default sink is restored."""
    global _log_callback_ref
    if fn is None:
        _c.moelite_set_log_callback(_lib.LOG_FN(), None, int(min_level))
        _log_callback_ref = None
        return
    guard = _exit_guard

    def _cb(level, text, _user):
        try:
            if guard.stopping():
                return
            fn(int(level), text.decode("utf-8", "replace") if text else "")
        except BaseException:  # noqa: BLE001 - never let an exception unwind into C
            pass

    ref = _lib.LOG_FN(_cb)
    _c.moelite_set_log_callback(ref, None, int(min_level))
    _log_callback_ref = ref  # replaced only after the library stopped using the old one


def _restore_default_sink() -> None:
    # Library threads (loaders, pools) may log at any time: stop calling Python for that.
    global _log_callback_ref
    if _log_callback_ref is not None:
        _c.moelite_set_log_callback(_lib.LOG_FN(), None, 2)
        _log_callback_ref = None


_exit_guard.after_wait.append(_restore_default_sink)
