"""numba, for the engines of many pairs: when a process uses it, and how kernels are compiled.

numba's compiled loops take a third of the CPU of the XLA and numpy paths per pair
(``pairhmm_numba``, ``decode``'s MEA and affine DPs), but starting numba costs a process about 0.4 s
(importing it, and its compiler's first use even when the kernels come from its disk cache).
So a process starts using numba when it meets a job of ``BULK_PAIRS`` or more pairs
(``for_job``), and from then on uses it for every job; one or a few pairs (``pfamalign align A
B``) keep the paths that load in milliseconds. Both paths give the same results (tested).
"""

from __future__ import annotations

import functools
import threading

BULK_PAIRS = 16  # a job of this many pairs or more starts numba

_started = False
_kernels: list = []  # every dispatcher made by ``njit``, for ``counts``


def start() -> None:
    """From now on this process uses the numba kernels (each compiles or loads on first use)."""
    global _started
    _started = True


def started() -> bool:
    return _started


def for_job(pairs: int) -> bool:
    """Whether a job of ``pairs`` pairs runs on numba: from ``BULK_PAIRS`` on (starting it),
    or whatever its size once this process has started it."""
    if pairs >= BULK_PAIRS:
        start()
    return _started


def njit(variant: str | None = None, **flags):
    """``numba.njit`` with the GIL released and numba's disk cache (keyed by the kernel's
    source; under the command line's cache directory, ``compile_cache.enable``, else beside
    the module or in the user's cache; where none is writable, no disk cache: each process
    compiles); starts numba. ``variant``: what tells apart the kernels a ``kernel_factory``
    builds from one source (e.g. ``"2gaps"``). numba names a kernel's symbols and environment
    by its qualified name and a per-process counter, so two variants compiled by different
    processes and read from the disk cache into one shared them (and failed: "descr is
    NULL"); the variant goes into the name (and gives it a cache index of its own)."""
    import numba

    start()

    def decorate(fn):
        if variant is not None:
            fn.__qualname__ = f"{fn.__qualname__}_{variant}"
        try:
            kernel = numba.njit(nogil=True, cache=True, error_model="numpy", **flags)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            kernel = numba.njit(nogil=True, cache=False, error_model="numpy", **flags)(fn)
        _recompile_damaged_entries(kernel)
        _kernels.append(kernel)
        return kernel

    return decorate


def _recompile_damaged_entries(kernel) -> None:
    """A damaged entry of numba's disk cache (a file truncated by a crash, emptied, garbage)
    raises from numba's loader (EOFError, UnpicklingError, ...) in every later process: such
    an entry is dropped (its index emptied) and the kernel compiled, as on a cold cache."""
    cache = getattr(kernel, "_cache", None)
    load = getattr(cache, "load_overload", None)
    if load is None:
        return

    def load_overload(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        except Exception:  # noqa: BLE001 -- any failure to read it: compile instead
            try:
                cache.flush()
            except Exception:  # noqa: BLE001 -- an unwritable cache: compiled each time
                pass
            return None

    cache.load_overload = load_overload


def counts() -> tuple[int, int]:
    """``(compiled, loaded)``: the kernels this process compiled, and those it read from
    numba's disk cache (``align --verbose``)."""
    loaded = sum(sum(k.stats.cache_hits.values()) for k in _kernels)
    return sum(len(k.signatures) for k in _kernels) - loaded, loaded


def kernel_factory(make):
    """``make(*args)`` (a function that builds kernels with ``njit``) cached per arguments,
    under a lock: threads that ask at once for the same kernel (a pool's first tasks) share
    one, instead of each compiling its own."""
    cached = functools.lru_cache(maxsize=None)(make)
    lock = threading.Lock()

    @functools.wraps(make)
    def get(*args):
        with lock:
            return cached(*args)

    return get
