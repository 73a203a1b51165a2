"""Shared-memory budget of the Triton kernels: tile edge, ``num_warps`` and ``num_stages``.

On an H100 every compiled call failed with ``Shared memory size limit exceeded: requested
295424, available: 232448`` at 128-wide tiles. This module is the one place that models what
a kernel asks for and picks the largest tiling that fits the device.

The model (``smem_bytes``), per program, for f32 tiles of edge ``b`` and feature widths padded
as ``pallas_gpu`` pads them (next power of two, at least 16):

- every key-side tile the band loop loads (k ``[b, d]``, y ``[b, m]``, z ``[b, mx]``, the key
  offsets ``[b]``) is staged by Triton's software pipeliner in ``num_stages`` buffers;
- every dot operand that is not such a tile needs one layout-conversion buffer: q ``[b, d]``,
  the plan tile ``[b, b]`` (the A of ``p @ y``), x ``[b, mx]``;
- one ``[b]`` row of reduction scratch (the LSE's max and sum).

Kernels that read a stored band (``KernelShape.stored`` with d = 0) stage a ``[b, b]`` band
tile where the others stage k, and may hold one transposed copy of it (the column walk). The
kernel that writes the band (stored with d > 0) converts each score tile's layout for its
store (a ``[b, b]`` buffer: with tf32x3 dots Triton asks for it).

It counts every buffer as live at once, so it bounds Triton's allocation from above (Triton
reuses buffers whose lifetimes do not overlap). Checked against Triton itself: PyPI ``triton``
3.9 compiles the lowered kernels for sm_90 / sm_80 / sm_86 on a CPU host
(``tests/test_gpu_budget.py``, skipped without it). main's tiling of the benchmark's
modulated product (d = dv = 64, R = 2: mx = 68 -> 128; 128-wide tiles, 2 stages) asks for
exactly the 295,424 bytes the H100 refused, where the model says 427,520; over the kernels and
tilings measured, the model is 1.0-1.6x Triton's figure and never below it. The real figure
on hardware is XLA's Triton's, checked by ``pytest -m gpu``.

Registers bound the tile edge before shared memory does. On an H100 (2026-11-24, jax 0.11.2,
``scripts/tune_triton.py``, L = 4096, W = 256, d = m = 64, ms per call, in-graph loop):

    kernel       edge/warps:  32/4    64/4    64/8   128/4   128/8
    band_lse                 0.059   0.131   0.101   1.49    1.50
    band_product             0.068   1.90    0.120   5.29      -

A ``[b, b]`` f32 tile takes ``b² / (32 num_warps)`` registers a thread; past ~16 the kernels
spill (64/4, 128/*). ``MAX_EDGE`` caps the edge at the fastest measured, 32 with 4 warps.
Triton and ptxas on this CPU host (PyPI ``triton`` 3.9, sm_90, ``cuobjdump -res-usage``)
agree: the same kernels at d = m = 64 use 168 (LSE) and 96 (product) registers at 32/4 with no
spill, and spill at 128/4 (13 and 20 KB of stack), 128/8 and the product's 64/4.

The stored-band kernels (``KernelShape.stored``) hold a program's row-side operands (x, the
accumulator) and walked tiles (z, the band, the plan) instead of q and k. Their heaviest, the
modulated product that keeps its band (``stored_product(keep_band=True)``; modulation read as
16-wide pieces, a vector y unpadded), at 32-wide tiles (same compiler, sm_90, 2026-11-29;
stack bytes at 2 / 1 stages, "tf32x3" and "ieee" dots; ``live_values`` a thread at 4 warps in
brackets):

    m / mx:           16/20 [36]  32/36 [48]  64/68 [72]  128/132 [120]
    4 warps tf32x3:      0 / 0       0 / 8      0 / 16      0 / 24 (254 registers)
    4 warps ieee:        0 / 0       0 / 0      0 / 16      0 / 440
    8 warps tf32x3:      0 / 24      0 / 0      0 / 0       0 / 0
    8 warps ieee:        0 / 0       0 / 0      0 / 0       0 / 0

At 8 warps a 32-row tile's dot operands and exponentials are replicated across warps: the
64/68 product's shared-memory cycles a tile double (sm_90 SASS: 2,344 against 1,220 at 4
warps, ``scripts/triton_static_cost.py``'s count). So ``num_warps`` gives them 4 warps up to
``LIVE_PER_THREAD`` and 8 past it. (With the modulation padded to a power of two, as the kernels
were until 2026-11-28, 4 warps spilled from 64/68 on, which set the earlier threshold of 64.)
``tests/test_gpu_budget.py`` compiles the chosen tiling of every kernel shape the benchmark and
the training configurations use and fails on any spill (where PyPI ``triton`` is installed).
"""

from __future__ import annotations

import dataclasses

import jax

KIB = 1024
# Shared memory one block may use (the opt-in maximum), by device class.
SMEM_BUDGET = {"h100": 227 * KIB, "a100": 163 * KIB, "consumer": 99 * KIB}
# Compute capability -> device class; anything else gets the smallest listed budget.
_CLASS_BY_CC = {"9.0": "h100", "8.0": "a100", "8.7": "a100"}
MIN_DOT = 16  # smallest tl.dot operand dimension (and so the smallest compiled tile edge)
STAGES = (2, 1)  # pipeline depths tried, deepest first
MAX_EDGE = 32  # largest tile edge used: wider tiles spill registers (module docstring)
LIVE_PER_THREAD = 96  # stored-band kernels: 8 warps past this many live values a thread at 4 (docstring)


def padded(f: int) -> int:
    """A feature width as the Triton wrapper pads it: next power of two, at least ``MIN_DOT``."""
    return max(MIN_DOT, 1 << (max(int(f), 1) - 1).bit_length())


def in_pieces(f: int) -> int:
    """A modulation width as the Triton wrapper pads it, to be read in power-of-two pieces: the
    next multiple of ``MIN_DOT`` (68 -> 80, read as 64 + 16)."""
    return -(-max(int(f), 1) // MIN_DOT) * MIN_DOT


@dataclasses.dataclass(frozen=True)
class GpuTiling:
    """Launch settings of one Triton kernel call."""

    block: int  # square tile edge (rows and keys)
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class KernelShape:
    """The feature widths of one kernel call (unpadded): d of q and k, m of y (0 for the LSE
    kernel), mx of x and z (0 when unmodulated); ``stored``: the scores are read from a stored
    band (``pallas_gpu.band_scores``) instead of recomputed from q and k (d is then the
    scores kernel's own, or 0 for the kernels that read the band)."""

    d: int
    m: int = 0
    mx: int = 0
    stored: bool = False


def smem_bytes(shape: KernelShape, block: int, num_stages: int, itemsize: int = 4) -> int:
    """Upper bound on the shared memory (bytes) of one program; see the module docstring."""
    d = padded(shape.d) if shape.d else 0
    m = padded(shape.m) if shape.m else 0
    mx = padded(shape.mx) if shape.mx else 0
    if shape.stored and not d:  # a stored band tile in place of k, and one transposed copy of it
        staged = block * (block + m + mx + 1)  # band, y, z tiles and the walked lines' offsets
        once = block * mx + (block * block if m else 0) + block * block  # x, the plan tile, the transpose
    else:
        staged = block * (d + m + mx + 1)  # k, y, z tiles and the key offsets
        once = block * d + block * mx + (block * block if m else 0)  # q, x, the plan tile
        if shape.stored:  # the scores kernel: each tile leaves the dot's layout for its store
            once += block * block
    scratch = block  # reduction row
    return itemsize * (num_stages * staged + once + scratch)


def live_values(shape: KernelShape, block: int) -> int:
    """Values a program of a stored-band product keeps live (registers, modelled): the
    accumulator ``[b, m]`` (a vector for m = 1), x and one z tile ``[b, mx]`` (16-wide
    pieces), the plan and modulation tiles."""
    m = shape.m if shape.m <= 1 else padded(shape.m)
    mx = in_pieces(shape.mx) if shape.mx else 0
    return block * (m + 2 * mx) + 2 * block * block


def num_warps(block: int, shape: KernelShape | None = None) -> int:
    """8 warps for 128-wide tiles (a [128, 128] f32 tile is 64 registers a thread) and for
    stored-band kernels past ``LIVE_PER_THREAD`` at 4 warps, else 4 (as JAX's Pallas GPU
    attention; the fastest measured for the recomputing kernels at 32)."""
    if block >= 128:
        return 8
    if shape is not None and shape.stored and live_values(shape, block) > LIVE_PER_THREAD * 32 * 4:
        return 8
    return 4


# The one-pass step's rows kernel (``pallas_gpu.stored_one_pass_rows``) holds G rows of the
# stored band, ``[G, n_diag b]``, in registers. Triton 3.9 + ptxas for sm_90 on this host
# (2026-11-28, L 16384, W 1024: 2,080 values a row, launches forced): G 8 at 4 / 8 / 16 warps
# used 255 (1,160 B of stack: spilled) / 215 / 98 registers; G 16 spilled at every warp count
# (at 16 warps, 128 registers and 400 B). So at most ``ONE_PASS_PER_THREAD`` band values a
# thread (G 8 at 16 warps holds 33), and warps up to 16; tests/test_gpu_budget.py compiles the
# chosen launch at the benchmark's bands.
ONE_PASS_PER_THREAD = 40
ONE_PASS_MAX_WARPS = 16


def one_pass_launch(width: int, block: int) -> tuple[int, int]:
    """(rows a program G, num_warps) of the one-pass rows kernel on a stored band ``width``
    values a row: the fewest warps that keep ``ONE_PASS_PER_THREAD`` values a thread, at G 8
    (at most the tile edge), fewer rows where 16 warps would not."""
    per_program = lambda group: -(-group * width // (32 * ONE_PASS_PER_THREAD))  # warps needed
    group = min(8, block)
    while group > 1 and per_program(group) > ONE_PASS_MAX_WARPS:
        group //= 2
    warps = 4
    while warps < min(per_program(group), ONE_PASS_MAX_WARPS):
        warps *= 2
    return group, warps


def device_budget(device=None) -> int:
    """Shared-memory budget of ``device`` (default: the first local GPU). Without a GPU (for
    instance when lowering for "cuda" from a CPU host) the smallest listed budget, which fits
    every listed device."""
    if device is None:
        try:
            device = jax.local_devices(backend="gpu")[0]
        except RuntimeError:
            return min(SMEM_BUDGET.values())
    cc = str(getattr(device, "compute_capability", ""))
    return SMEM_BUDGET[_CLASS_BY_CC.get(cc, "consumer")]


def choose(shape: KernelShape, max_block: int, budget: int, max_edge: int | None = None) -> GpuTiling:
    """The largest tile edge (a power of two dividing ``max_block``, the band tiling's edge, and
    at most ``max_edge``, default ``MAX_EDGE``), then the deepest pipeline, whose modelled
    shared memory fits ``budget``.

    Raises ValueError when not even ``MIN_DOT``-wide tiles at one stage fit."""
    block = max_block
    while block > (MAX_EDGE if max_edge is None else max_edge):
        block //= 2
    while block >= MIN_DOT:
        for stages in STAGES:
            if smem_bytes(shape, block, stages) <= budget:
                return GpuTiling(block, num_warps(block, shape), stages)
        block //= 2
    raise ValueError(f"no Triton tiling of {shape} fits {budget} bytes of shared memory "
                     f"(tile edge at most {max_block})")
