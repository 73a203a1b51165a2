"""Memory the aligner needs, estimated from the sequence lengths before any work.

A pair is solved on a square padded grid (both sequences padded to the longer one's bucket,
``padded_length``: the one padding rule, which the plan calls use too), and the dense plans of
both directions, costs, the solver's buffers and the pair-HMM's tables all scale with its
cells. Measured on CPU as ``pfamalign align`` runs a pair (``scripts/measure_align_memory.py``:
peak resident memory, random sequences; 2026-11-24): 0.54-0.67 / 0.86 / 2.20-2.27 / 4.39 GB at
1000 / 2048 / 4096 / 6000 residues, i.e. about 0.45-0.55 GB of model, compiled code and runtime
plus 104 bytes per cell; the shipped two-member ensemble 1.25 / 3.11-3.16 GB at 2048 / 4096
(175 per cell). ``estimate_align_bytes`` charges ``FIXED_BYTES`` plus ``BYTES_PER_CELL`` per
cell and plan model, 20-55 % above those peaks (a 20000 x 20000 pair: 53 GB);
``check_align_memory`` refuses a pair over the budget with the option that lifts it, and
``pairs_at_once`` plans only as many pairs together as the budget holds.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
from concurrent.futures import ThreadPoolExecutor

BYTES_PER_CELL = 128
FIXED_BYTES = 640 << 20
PAD_MULTIPLE = 64  # padded lengths are multiples of this: few shapes, few compilations
LONG_PAD_MULTIPLE = 256  # ... and of this beyond LONG_FROM residues (at most 22 lengths to 4096)
LONG_FROM = 512
DEFAULT_FRACTION = 0.8  # of ``machine_memory()``
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``512M``, ``8G``, ``1.5G`` or ``1000000``; ``0`` means no
    limit. Raises ValueError on anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"expected a size such as 8G, 512M or 0 (no limit), got {text!r}")
    size = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if 0 < size < 1:  # 0.5: a budget under one byte, not "no limit"
        raise ValueError(f"{text!r} is less than one byte: give a size such as 8G or 512M, or 0 for no limit")
    return int(size)


def format_size(n: int) -> str:
    """``1.5 GiB``, ``640 MiB``, ``1 KiB``, ``512 B``: never a budget of 1K shown as 0 MiB."""
    for shift, unit, digits in ((30, "GiB", 1), (20, "MiB", 0), (10, "KiB", 0)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.{digits}f} {unit}"
    return f"{n} B"


# A container's memory limit (cgroup v2, then v1): "max" or a huge number means none
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> int:
    """The memory this process may use in bytes: the machine's physical memory, or its
    container's (cgroup) limit when that is lower; 0 when unknown."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 0
    known = [physical] if physical > 0 else []
    for name in CGROUP_LIMIT_FILES:
        try:
            text = pathlib.Path(name).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) > 0:  # "max": no limit
            known.append(int(text))
    return min(known, default=0)


def default_budget() -> int:
    """The default ``--max-memory``: most of the memory this process may use (the machine's or
    its container's; 0, no limit, if unknown)."""
    return int(machine_memory() * DEFAULT_FRACTION)


def padded_length(length: int) -> int:
    """The bucket of a sequence length: the padded length its pair is computed at."""
    step = PAD_MULTIPLE if length <= LONG_FROM else LONG_PAD_MULTIPLE
    return max(step, -(-length // step) * step)


def estimate_align_bytes(len_a: int, len_b: int, models: int = 1) -> int:
    """Peak bytes of aligning a pair of these lengths with ``models`` plan models (an
    ensemble's members)."""
    pad = padded_length(max(len_a, len_b, 1))
    return FIXED_BYTES + BYTES_PER_CELL * pad * pad * models


def budget(value: int | str | None) -> int:
    """The memory budget in bytes of a ``--max-memory`` value: None, the default
    (``default_budget``); a size (``parse_size``); 0: no limit."""
    if value is None:
        return default_budget()
    return parse_size(value) if isinstance(value, str) else int(value)


def check_align_memory(len_a: int, len_b: int, budget: int | None, models: int = 1) -> None:
    """Raises ValueError when aligning sequences of these lengths (with ``models`` plan models)
    would need more than ``budget`` bytes (None or 0: no limit)."""
    check_memory(estimate_align_bytes(len_a, len_b, models), budget, f"aligning {len_a} x {len_b} residues",
                 fixed=FIXED_BYTES)


# A batch's pairs are charged this many times the cells of one pair alone: a window plans one
# batch while the pair-HMM of the next runs (2026-11-30, `align --pairs` of pairs of 2,000
# residues, padded to 2,048, where one pair alone charges 0.5 GiB of cells: peaks of 1.88 GiB
# for batches of 2, 3.08 for 4, 3.9-4.5 for 8, 0.65 for one pair alone).
BATCH_CELL_MARGIN = 1.5


def pairs_at_once(pad: int, budget: int | None, models: int, sizes) -> int:
    """The largest of the batch ``sizes`` (ascending) whose pairs at padded length ``pad`` fit
    together in ``budget`` (``estimate_align_bytes``'s fixed part once, the cells of each pair
    times ``BATCH_CELL_MARGIN``) and in the address space a ``ulimit -v`` leaves
    (``check_memory``'s rule); the smallest when none does (each pair was checked alone). A
    batch checked pair by pair ran 8 pairs of 3,000 residues at 10 GB under a 2 GB budget."""
    per_pair = int(BATCH_CELL_MARGIN * BYTES_PER_CELL * pad * pad * models)
    left = address_space_left()

    def fits(n: int) -> bool:
        mapping = int(ADDRESS_SPACE_PER_BYTE * n * per_pair) + ADDRESS_SPACE_SLACK
        return (not budget or FIXED_BYTES + n * per_pair <= budget) and (left is None or mapping <= left)

    return max((n for n in sizes if fits(n)), default=sizes[0])


def check_budget_usable(budget: int | None, models: int = 1) -> None:
    """Raises ValueError when ``budget`` cannot hold even the smallest pair (a batch would
    refuse every record, one by one)."""
    need = estimate_align_bytes(1, 1, models)
    if budget and need > budget:
        raise ValueError(f"the memory budget of {format_size(budget)} is below the {format_size(need)} that "
                         f"aligning any pair needs: raise it with --max-memory (e.g. --max-memory "
                         f"{-(-need >> 30) + 1}G; 0 lifts the limit; max_memory= in Python)")


# `certify` solves the pair's dense problem to convergence in float64, several times (the CETA
# and softmax bounds, the perturbed plans): measured peaks 0.93 / 1.18 / 2.68 GB at 500 / 1000 /
# 2000 residues (2026-11-25, random sequences), i.e. about 0.85 GB plus 460 bytes per cell.
CERTIFY_BYTES_PER_CELL = 512
CERTIFY_FIXED_BYTES = 1 << 30


def estimate_certify_bytes(len_a: int, len_b: int) -> int:
    """Peak bytes of ``pfamalign certify`` on a pair of these lengths."""
    pad = padded_length(max(len_a, len_b, 1))
    return CERTIFY_FIXED_BYTES + CERTIFY_BYTES_PER_CELL * pad * pad


# What a pair maps beyond what its memory estimate counts, under a ``ulimit -v`` (2026-11-30,
# this host, `align` of random pairs under several limits, address space left when the pair
# was checked): 14 residues failed with 0.19 GB left and ran with 0.48; 2000 failed with 0.67
# and 0.81; 3000 ran with 1.38 and 1.55 and failed with 1.65; 4500 failed with 2.55 and ran
# with 2.99 (estimates beyond the fixed part: 0.54 / 1.21 / 2.72 GB at 2000 / 3000 / 4500).
# It varies from run to run (glibc maps 64 MiB of address space for each thread's malloc
# arena as XLA's threads start), so the margin is wide: refusing a pair that a limit would
# just hold is better than failing inside XLA, or its abort or segfault.
ADDRESS_SPACE_PER_BYTE = 1.1
ADDRESS_SPACE_SLACK = 384 << 20


def address_space_left() -> int | None:
    """Bytes of address space this process may still map under its ``ulimit -v`` (the soft
    ``RLIMIT_AS``), or None without such a limit (or where it cannot be read). The limit counts
    mappings, not memory in use: jax's runtime maps about 1.5 GB at start where 0.2 GB is
    resident, so a pair that fits the memory budget can still fail under it, inside XLA."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        status = pathlib.Path("/proc/self/status").read_text(encoding="ascii")
        mapped = int(re.search(r"^VmSize:\s+(\d+) kB", status, re.MULTILINE).group(1)) << 10
    except (ImportError, OSError, ValueError, AttributeError):  # no resource module, no /proc
        return None
    return max(soft - mapped, 0)


def check_memory(need: int, budget: int | None, doing: str, fixed: int = 0) -> None:
    """Raises ValueError when ``doing`` (what the work is, for the message) would need more
    than ``budget`` bytes (None or 0: no limit), naming the option that lifts it; or when its
    growth beyond ``fixed`` (the part already mapped: runtime, model) is more than the address
    space a ``ulimit -v`` leaves, which no budget lifts (XLA would fail midway, or abort)."""
    left = address_space_left()
    mapping = int(ADDRESS_SPACE_PER_BYTE * (need - fixed)) + ADDRESS_SPACE_SLACK
    if left is not None and mapping > left:
        raise ValueError(
            f"{doing} needs about {format_size(mapping)} more address space, over the "
            f"{format_size(left)} this process's limit leaves (ulimit -v): raise the limit "
            "(ulimit -v unlimited), or split the sequences into domains")
    if budget and need > budget:
        raise ValueError(
            f"{doing} needs about {format_size(need)}, over the "
            f"memory budget of {format_size(budget)}; split the sequences into domains, or "
            f"raise the budget with --max-memory (e.g. --max-memory {-(-need >> 30) + 1}G; 0 "
            "lifts the limit; max_memory= in Python)")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one: a container's
    cpuset, ``taskset``), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def thread_pool(name: str, workers: int | None = None) -> ThreadPoolExecutor:
    """The process's one pool named ``name``, ``workers`` threads (default: ``usable_cpus()``),
    made on first use and reused by every later call: the pair-HMM, the prefilter and the
    overlapped stages each keep theirs rather than paying a pool per call."""
    return ThreadPoolExecutor(max_workers=workers or usable_cpus(), thread_name_prefix=f"pfamalign-{name}")
