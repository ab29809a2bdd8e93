"""Process exit: _ExitGuard keeps threads other than the main thread out of libmoelite once
the interpreter exits (see the package docstring's "Exit." paragraph), and the one guard of the
process, _exit_guard, whose at_exit is registered with atexit when the package is imported.
"""
from __future__ import annotations

import atexit
import threading
import weakref
from typing import TYPE_CHECKING, Callable, List

if TYPE_CHECKING:  # annotations only: generation.py is above this module
    from .generation import _Generation


class _ExitGuard:
    """Keeps threads other than the main thread out of libmoelite once the interpreter exits.

    Why: every C call that can call back into Python (eval and generate through the abort,
    routing and piece callbacks; model loading and calibration with a progress callback) must
    have returned before CPython finalizes. A thread that re-enters Python after that point is
    terminated by CPython inside the library's C++ frames (the process aborts, "FATAL: exception
    not rethrown") or, in newer CPythons, blocks forever, and a finalizer that joins it hangs.

    How: such calls are counted (enter/leave). The atexit hook, which runs before finalization
    while every thread can still run, sets `exiting`, stops every streaming generation (waking a
    worker parked between two pieces) and waits until the count is zero. From then on the
    callbacks of threads other than the main thread answer "stop" without calling user code
    (abort -> 1, progress -> 0 (cancel), piece -> 0), so each call returns within about one
    layer's computation; new calls from other threads and new generations are refused with
    RuntimeError. The main thread may still evaluate (its callbacks keep working). The wait is
    bounded (EXIT_WAIT_SECONDS) so a user callback that blocks cannot hang the exit."""

    EXIT_WAIT_SECONDS = 30.0

    def __init__(self) -> None:
        self.exiting = False
        self.cond = threading.Condition(threading.Lock())
        self.in_flight = 0
        self.generations: "weakref.WeakSet[_Generation]" = weakref.WeakSet()
        self.main_ident = threading.main_thread().ident
        self.get_ident = threading.get_ident
        # Run by at_exit once the calls have returned (or the wait timed out), in order: what
        # higher modules must undo then (log.py restores the library's default log sink).
        self.after_wait: "List[Callable[[], None]]" = []

    def stopping(self) -> bool:
        """True in a callback that must answer "stop": the process exits and this is not the
        main thread. Uses only attributes of self (safe while modules are torn down)."""
        return self.exiting and self.get_ident() != self.main_ident

    def enter(self, generation: bool = False) -> None:
        with self.cond:
            if self.exiting and (generation or threading.get_ident() != self.main_ident):
                raise RuntimeError("moelite: the interpreter is exiting; no new %s starts"
                                   % ("generation" if generation else "evaluation on this thread"))
            self.in_flight += 1

    def leave(self) -> None:
        with self.cond:
            self.in_flight -= 1
            if self.in_flight <= 0:
                self.cond.notify_all()

    def at_exit(self) -> None:
        with self.cond:
            self.exiting = True
            gens = list(self.generations)
        deadline = _monotonic() + self.EXIT_WAIT_SECONDS
        for g in gens:
            try:
                g.stop(timeout=max(0.0, deadline - _monotonic()))
            except BaseException:  # noqa: BLE001 - never fail the exit
                pass
        with self.cond:
            self.cond.wait_for(lambda: self.in_flight <= 0, timeout=max(0.0, deadline - _monotonic()))
        for hook in list(self.after_wait):
            hook()


def _monotonic() -> float:
    import time
    return time.monotonic()


_exit_guard = _ExitGuard()
atexit.register(_exit_guard.at_exit)
