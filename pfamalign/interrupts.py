"""Signals that stop a command, none of them lost.

SIGTERM and SIGHUP (a closed terminal) become ``Terminated``, a KeyboardInterrupt, so that a
command unwinds as from Ctrl-C and its atomic writes remove their temporaries (the default
action kills the process where it stands). Every signal handled here is also recorded:
Python drops an exception raised inside a garbage-collector callback ("Exception ignored
in ...", and jax registers one), so a Ctrl-C arriving there would vanish and the command
finish as if none came. ``check`` raises a recorded one: long loops call it at each step of
their progress (``commands._common.batch_progress``, certify's stages), atomic outputs before
they commit, and the command line reports it after a command that returned anyway. Inside
``handled`` the interrupt such a callback drops is not printed ("Exception ignored ...
KeyboardInterrupt" and its traceback): it is recorded, and raised at the next check.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP as an exception (see the module docstring)."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__()
        self.signum = signum


UNWINDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_received: int | None = None  # since the last ``handled`` began (kept after it, to report)
_active = False  # inside ``handled``


def received() -> int | None:
    """The signal recorded since the last ``handled`` began (None: none)."""
    return _received


def check() -> None:
    """Inside ``handled``, raises the recorded signal's exception (nothing when none was
    recorded, or outside: the Python API's own callers keep Python's handling)."""
    if _active and _received is not None:
        raise KeyboardInterrupt if _received == signal.SIGINT else Terminated(_received)


def _handle(signum, frame):
    global _received
    _received = signum
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)  # a second one kills at once
    raise Terminated(signum)


def _unraisable(hook):
    """``sys.unraisablehook`` that leaves out the interrupts ``_handle`` raised where Python
    drops them (recorded: ``check`` raises them again) and passes the rest to ``hook``."""
    def unraisable(info):
        if not (isinstance(info.exc_value, KeyboardInterrupt) and _received is not None):
            hook(info)
    return unraisable


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Inside, SIGINT (where Python's own handler is in place) and ``UNWINDING_SIGNALS``
    (where the default action is) raise and are recorded; the handlers before are restored
    after. (``train`` installs its own while it trains: it saves a checkpoint first.)"""
    global _received, _active
    _received, _active = None, True
    previous = {}
    # only the main thread may set handlers (a command run in-process from a worker thread,
    # CliRunner in a thread pool, failed with "signal only works in main thread"): signals
    # are delivered there anyway, so another thread's command runs without its own
    in_main = threading.current_thread() is threading.main_thread()
    for signum, default in ((signal.SIGINT, signal.default_int_handler),
                            *((s, signal.SIG_DFL) for s in UNWINDING_SIGNALS)):
        if in_main and signal.getsignal(signum) is default:
            previous[signum] = signal.signal(signum, _handle)
    ours = _unraisable(sys.unraisablehook)
    hook, sys.unraisablehook = sys.unraisablehook, ours
    try:
        yield
    finally:
        _active = False
        # a hook chained on ours meanwhile stays (checkpoint's silencer of orphaned reads,
        # installed once per process: restoring ``hook`` dropped it before the exit it is for)
        if sys.unraisablehook is ours:
            sys.unraisablehook = hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
