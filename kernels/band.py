"""Geometry of the banded support in tiles, shared by the XLA and Pallas paths.

A padded square problem of ``Lp = n_blocks * block`` rows and columns is cut into
``block x block`` tiles. Row block ``I`` meets the key blocks ``I + kb - wb`` for
``kb in [0, n_diag)`` with ``wb = ceil(W / block)`` and ``n_diag = 2 wb + 1``: ``kb`` indexes
block diagonals. Only those tiles are ever formed; entries with ``|i - j| > W`` inside them
are masked. Rectangular pairs are padded to the longer side and carry their lengths as masks.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class BandGeometry:
    """Static tiling of one padded problem (hashable: usable as a jit static argument)."""

    half_band: int  # W
    block: int  # tile edge b
    n_blocks: int  # nI: row (and column) blocks
    wb: int  # block diagonals on each side of the main one

    @property
    def length(self) -> int:
        """Padded length Lp."""
        return self.block * self.n_blocks

    @property
    def n_diag(self) -> int:
        return 2 * self.wb + 1

    def band_mask(self) -> np.ndarray:
        """``[n_diag, b, b]``: entry (r, c) of diagonal kb is inside |i - j| <= W."""
        kb = np.arange(self.n_diag)[:, None, None]
        r = np.arange(self.block)[None, :, None]
        c = np.arange(self.block)[None, None, :]
        return np.abs((self.wb - kb) * self.block + r - c) <= self.half_band


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def make_geometry(length: int, half_band: int, block: int | None = None, *,
                  pallas: bool = False) -> BandGeometry:
    """Tiling for a padded problem of at least ``length`` rows and columns.

    With ``block=None``: one dense tile when the band covers the whole problem (the band then
    costs nothing extra) or the length is at most 128, else 128-wide tiles. With ``pallas=True`` the choice is legal for
    both kernel wrappers: a single power-of-two tile (>= 16) when the length fits in 128
    (Triton wants powers of two; Mosaic accepts a block equal to the full padded length), else
    128 (the TPU lane width) even for a full band, since a dense tile must fit in VMEM.
    """
    length = max(int(length), 1)
    if block is None:
        if pallas:
            block = max(16, 1 << (length - 1).bit_length()) if length <= 128 else 128
        elif half_band >= length - 1 or length <= 128:
            block = _round_up(length, 8)
        else:
            block = 128
    n_blocks = -(-length // block)
    wb = min(math.ceil(half_band / block), n_blocks - 1)
    return BandGeometry(half_band=half_band, block=block, n_blocks=n_blocks, wb=wb)


def active_entries(lq: int, lk: int, half_band: int) -> int:
    """Exact number of (i, j) with i < Lq, j < Lk, |i - j| <= W (``L(2W+1) - W(W+1)`` square)."""
    i = np.arange(lq)
    lo = np.maximum(i - half_band, 0)
    hi = np.minimum(i + half_band, lk - 1)
    return int(np.maximum(hi - lo + 1, 0).sum())
