"""Memory the aligner needs, estimated from the sequence lengths before any work.

A pair is solved on a square padded grid (both sequences padded to the longer one's bucket,
``padded_length``: the one padding rule, which the plan calls use too), and the dense plan,
costs and the solver's buffers all scale with its cells. Measured on CPU (peak resident memory
of ``Predictor.align`` on random sequences of 3000 and 5000 residues): under 50 bytes per cell
over a fixed 0.5 GB of model, compiled code and runtime. ``estimate_align_bytes`` uses those
two numbers (a 20000 x 20000 pair: 20 GB); ``check_align_memory`` refuses a pair over the
budget with the option that lifts it.
"""

from __future__ import annotations

import os
import re

BYTES_PER_CELL = 50
FIXED_BYTES = 512 << 20
PAD_MULTIPLE = 64  # padded lengths are multiples of this: few shapes, few compilations
LONG_PAD_MULTIPLE = 256  # ... and of this beyond LONG_FROM residues (at most 22 lengths to 4096)
LONG_FROM = 512
DEFAULT_FRACTION = 0.8  # of the machine's physical memory
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``512M``, ``8G``, ``1.5G`` or ``1000000``; ``0`` means no
    limit. Raises ValueError on anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"expected a size such as 8G, 512M or 0 (no limit), got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def format_size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def machine_memory() -> int:
    """Physical memory of this machine in bytes (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_budget() -> int:
    """The default ``--max-memory``: most of the machine's memory (0, no limit, if unknown)."""
    return int(machine_memory() * DEFAULT_FRACTION)


def padded_length(length: int) -> int:
    """The bucket of a sequence length: the padded length its pair is computed at."""
    step = PAD_MULTIPLE if length <= LONG_FROM else LONG_PAD_MULTIPLE
    return max(step, -(-length // step) * step)


def estimate_align_bytes(len_a: int, len_b: int) -> int:
    pad = padded_length(max(len_a, len_b, 1))
    return FIXED_BYTES + BYTES_PER_CELL * pad * pad


def budget(value: int | str | None) -> int:
    """The memory budget in bytes of a ``--max-memory`` value: None, the default
    (``default_budget``); a size (``parse_size``); 0: no limit."""
    if value is None:
        return default_budget()
    return parse_size(value) if isinstance(value, str) else int(value)


def check_align_memory(len_a: int, len_b: int, budget: int | None) -> None:
    """Raises ValueError when aligning sequences of these lengths would need more than
    ``budget`` bytes (None or 0: no limit)."""
    if not budget:
        return
    need = estimate_align_bytes(len_a, len_b)
    if need > budget:
        raise ValueError(
            f"aligning {len_a} x {len_b} residues needs about {format_size(need)}, over the "
            f"memory budget of {format_size(budget)}; split the sequences into domains, or "
            f"raise the budget with --max-memory (e.g. --max-memory {-(-need >> 30) + 1}G; 0 "
            "lifts the limit)")
