"""numba, for the engines of many pairs: when a process uses it, and how kernels are compiled.

numba's compiled loops take a third of the CPU of the XLA and numpy paths per pair
(``pairhmm_numba``, ``decode``'s MEA DP), but starting numba costs a process about 0.4 s
(importing it, and its compiler's first use even when the kernels come from its disk cache).
So a process starts using numba when it meets a job of ``BULK_PAIRS`` or more pairs
(``start``), and from then on uses it for every job; one or a few pairs (``pfamalign align A
B``) keep the paths that load in milliseconds. Both paths give the same results (tested).
"""

from __future__ import annotations

BULK_PAIRS = 16  # a job of this many pairs or more starts numba

_started = False


def start() -> None:
    """From now on this process uses the numba kernels (each compiles or loads on first use)."""
    global _started
    _started = True


def started() -> bool:
    return _started


def njit(**flags):
    """``numba.njit`` with the GIL released and numba's disk cache (keyed by the kernel's
    source; under the command line's cache directory, ``compile_cache.enable``, else beside
    the module or in the user's cache; where none is writable, no disk cache: each process
    compiles); starts numba."""
    import numba

    start()

    def decorate(fn):
        try:
            return numba.njit(nogil=True, cache=True, error_model="numpy", **flags)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(nogil=True, cache=False, error_model="numpy", **flags)(fn)

    return decorate
