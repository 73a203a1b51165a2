"""XLA banded backend: the score band is kept resident as tiles ``[n_diag, N, nI, b, b]``.

Row reductions reduce each tile row across the block diagonals; column reductions reduce tile
columns and fold the partial results back onto key blocks (block ``I + kb - wb``) with
``n_diag`` static shifted slices. Nothing of size Lp x Lp is formed unless the band covers it.
Masked entries hold ``-inf`` scores, so every plan entry outside the support is exactly 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pfamalign.kernels.band import BandGeometry
from pfamalign.kernels.band_ops import BandOps
from pfamalign.kernels.config import einsum as _einsum
from pfamalign.kernels.config import log_or_neg_inf


class Band(NamedTuple):
    """Resident band of masked scores (``-inf`` outside the support)."""

    s: jax.Array  # [n_diag, N, nI, b, b]


class XlaBandOps(BandOps):
    """The ``BandOps`` primitives on a resident band of score tiles."""

    keeps_plans = True  # a plan's tiles are in memory: one plan can be kept and reused
    takes_shift = True  # declares the protocol's flag; each instance sets its own below

    def __init__(self, geom: BandGeometry, *, shifted_lse: bool = True):
        self.g = geom
        # True: one pass with the caller's shift (and its checked fallback); False
        # (TransportConfig.branch_free): a max pass and a sum pass
        self.takes_shift = shifted_lse

    # ---- layout helpers -------------------------------------------------------------------
    def _blocks(self, x):  # [N, Lp, ...] -> [N, nI, b, ...]
        g = self.g
        return x.reshape(x.shape[:1] + (g.n_blocks, g.block) + x.shape[2:])

    def _ext_blocks(self, x):  # [N, Lp, ...] -> [N, nI + 2 wb, b, ...] (keys padded with 0)
        g = self.g
        pad = [(0, 0), (g.wb * g.block, g.wb * g.block)] + [(0, 0)] * (x.ndim - 2)
        xe = jnp.pad(x, pad)
        return xe.reshape(x.shape[:1] + (g.n_blocks + 2 * g.wb, g.block) + x.shape[2:])

    def _windows(self, x):  # [N, Lp] -> [n_diag, N, nI, b]: key vector per tile
        xe = self._ext_blocks(x)
        return jnp.stack([xe[:, kb : kb + self.g.n_blocks] for kb in range(self.g.n_diag)])

    def _fold(self, part, reduce):
        """Partial column results per tile ``[n_diag, N, nI, b, ...]`` -> ``[N, Lp, ...]``.

        Tile (I, kb) covers key block J = I + kb - wb; ``reduce`` combines the n_diag tiles
        meeting each key block (tiles falling outside [0, nI) are dropped).
        """
        g = self.g
        fill = -jnp.inf if reduce is jnp.maximum else 0.0
        pad = [(0, 0), (0, 0), (g.wb, g.wb)] + [(0, 0)] * (part.ndim - 3)
        pp = jnp.pad(part, pad, constant_values=fill)
        out = None
        for kb in range(g.n_diag):
            start = 2 * g.wb - kb
            piece = pp[kb, :, start : start + g.n_blocks]
            out = piece if out is None else reduce(out, piece)
        return out.reshape(out.shape[:1] + (g.length,) + out.shape[3:])

    # ---- scores ---------------------------------------------------------------------------
    def scores(self, q, k, row_active, col_active, scale) -> Band:
        """Masked band of ``scale * <q_i, k_j>``; q, k ``[N, Lp, d]``, masks ``[N, Lp]``."""
        g = self.g
        qb = self._blocks(q)
        ke = self._ext_blocks(k)
        tiles = jnp.stack(
            [_einsum("nird,nicd->nirc", qb, ke[:, kb : kb + g.n_blocks]) for kb in range(g.n_diag)]
        )
        mask = (
            jnp.asarray(g.band_mask())[:, None, None]
            & self._blocks(row_active)[None, :, :, :, None]
            & self._windows(col_active)[:, :, :, None, :]
        )
        return Band(jnp.where(mask, tiles * scale, -jnp.inf))

    def rescale(self, band: Band, factor) -> Band:
        """``factor * S``."""
        return Band(band.s * factor)

    # ---- log-sum-exp half steps -----------------------------------------------------------
    def row_lse(self, band: Band, col_bias, shift=None):
        """``LSE_j (S_ij + col_bias_j)``: a max pass and a sum pass, or the sum pass alone
        stabilized by ``shift``."""
        x = band.s + self._windows(col_bias[:, : self.g.length])[:, :, :, None, :]
        if shift is None:
            mx = jnp.max(x, axis=(0, 4))  # [N, nI, b]
            shift = jnp.where(jnp.isfinite(mx), mx, 0.0)
        else:
            shift = self._blocks(shift)
        shift = jax.lax.stop_gradient(shift)  # the result does not depend on it
        ssum = jnp.sum(jnp.exp(x - shift[None, ..., None]), axis=(0, 4))
        return (log_or_neg_inf(ssum) + shift).reshape(shift.shape[0], -1)

    def col_lse(self, band: Band, row_bias, shift=None):
        """``LSE_i (S_ij + row_bias_i)``: as ``row_lse``, the partial sums folded onto key blocks."""
        x = band.s + self._blocks(row_bias[:, : self.g.length])[None, :, :, :, None]
        if shift is None:
            mx = self._fold(jnp.max(x, axis=3), jnp.maximum)  # [N, Lp]
            shift = jnp.where(jnp.isfinite(mx), mx, 0.0)
        shift = jax.lax.stop_gradient(shift)  # the result does not depend on it
        ssum = self._fold(jnp.sum(jnp.exp(x - self._windows(shift)[:, :, :, None, :]), axis=3), jnp.add)
        return log_or_neg_inf(ssum) + shift

    # ---- plans and their products ---------------------------------------------------------
    def plan(self, band: Band, row_pot, col_pot) -> Band:
        """``exp(S_ij + row_pot_i + col_pot_j)`` on the band (0 outside the support)."""
        return Band(jnp.exp(band.s + self._blocks(row_pot)[None, :, :, :, None]
                            + self._windows(col_pot)[:, :, :, None, :]))

    def _modulated(self, plan: Band, kb, x, z):
        """Plan tile kb times ``<x_i, z_j>`` (x on rows, z on columns) when given."""
        tile = plan.s[kb]
        if x is None:
            return tile
        ze = self._ext_blocks(z)[:, kb : kb + self.g.n_blocks]
        return tile * _einsum("nirm,nicm->nirc", self._blocks(x), ze)

    def plan_rows(self, plan: Band, y, x=None, z=None):
        """``out_i = sum_j P_ij <x_i, z_j> y_j``; y ``[N, Lp, m]`` on columns."""
        ye = self._ext_blocks(y)
        out = 0.0
        for kb in range(self.g.n_diag):
            out = out + _einsum("nirc,nicm->nirm", self._modulated(plan, kb, x, z),
                                   ye[:, kb : kb + self.g.n_blocks])
        return out.reshape(y.shape[0], self.g.length, y.shape[-1])

    def plan_cols(self, plan: Band, y, x=None, z=None):
        """``out_j = sum_i P_ij <x_i, z_j> y_i``; y ``[N, Lp, m]`` on rows."""
        yb = self._blocks(y)
        part = jnp.stack([_einsum("nirc,nirm->nicm", self._modulated(plan, kb, x, z), yb)
                          for kb in range(self.g.n_diag)])
        return self._fold(part, jnp.add)
