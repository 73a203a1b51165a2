"""TPU (Mosaic) wrapper of the banded kernels: one score tile per grid step.

Grid ``(N, nI, n_diag)``: problem, row block ``I``, block diagonal ``kb``. TPU grids run in
order, so the block-diagonal axis is "arbitrary" and the running state (online LSE or the
product accumulator) lives in VMEM scratch, initialised at ``kb == 0`` and written out at
``kb == n_diag - 1``. The key block is ``clip(I + kb - wb)``: a fixed band needs no scalar
prefetch, and the clipped duplicates at the edges are skipped with ``pl.when`` (flash
attention's causal trick).

Layouts (Mosaic wants the last two block dims to be multiples of (8, 128) or the full dims):
row-indexed vectors are broadcast to 128 lanes (``[N, Lp, 128]``, as flash attention keeps
its l and m), key-indexed vectors are ``[N, 1, Lp]``; feature dims are taken whole. Each
tile's scores are recomputed from q and k: nothing of size O(L W) is stored.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pfamalign.kernels import tile_math
from pfamalign.kernels.band import BandGeometry

LANES = 128  # TPU vreg lane count: row vectors are broadcast to it


def check_geometry(geom: BandGeometry) -> None:
    """Raises ValueError unless the tiles are legal Mosaic blocks."""
    if geom.block % 8 or (geom.block % LANES and geom.n_blocks > 1):
        raise ValueError(
            f"TPU tiles must be multiples of {LANES} (or one tile of a multiple of 8 covering the "
            f"whole padded length); got block={geom.block} with n_blocks={geom.n_blocks}")


# ---- grid position, block specs, layouts ------------------------------------------------------


class _Step(NamedTuple):
    """Where the current grid step is. Read once at the kernel's top level: the HLO
    interpreter substitutes ``program_id`` there but not inside ``pl.when`` bodies."""

    i_blk: jax.Array  # row block I
    j_blk: jax.Array  # key block I + kb - wb (outside [0, nI): a clipped duplicate)
    first: jax.Array  # kb == 0: initialise the scratch
    inside: jax.Array  # the key block exists: process the tile
    last: jax.Array  # kb == n_diag - 1: write the output


def _step(geom: BandGeometry) -> _Step:
    i_blk, kb = pl.program_id(1), pl.program_id(2)
    j_blk = i_blk + kb - geom.wb
    return _Step(i_blk, j_blk, kb == 0, (j_blk >= 0) & (j_blk < geom.n_blocks), kb == geom.n_diag - 1)


def _row_map(n, i, kb):
    return n, i, 0


def _key_map(geom: BandGeometry):
    """Index map of key-indexed ``[N, Lp, f]`` operands: key block ``clip(I + kb - wb)``."""
    return lambda n, i, kb: (n, jnp.clip(i + kb - geom.wb, 0, geom.n_blocks - 1), 0)


def _col_offset_spec(geom: BandGeometry):
    """Key offsets ``[N, 1, Lp]`` -> ``[1, b]`` blocks of the current key block."""
    key = _key_map(geom)
    return pl.BlockSpec((None, 1, geom.block), lambda n, i, kb: (n, 0, key(n, i, kb)[1]))


def _lanes(row_vec):
    """``[N, Lp]`` -> ``[N, Lp, 128]``: a row vector in a legal, sublane-indexed layout."""
    n, lp = row_vec.shape
    return jnp.broadcast_to(row_vec.astype(jnp.float32)[..., None], (n, lp, LANES))


def _tile_logits(q_ref, k_ref, a_ref, c_ref, step: _Step, geom: BandGeometry):
    """Masked logits ``[b, b]`` of the current tile (no row offsets when ``a_ref`` is None)."""
    return tile_math.band_logits(q_ref[...], k_ref[...], None if a_ref is None else a_ref[:, :1],
                                 c_ref[...], row0=step.i_blk * geom.block,
                                 col0=step.j_blk * geom.block, half_band=geom.half_band)


def _call(kernel, geom: BandGeometry, *, in_specs, out_spec, out_shape, scratch, interpret, name):
    return pl.pallas_call(
        kernel,
        grid=(out_shape.shape[0], geom.n_blocks, geom.n_diag),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name=name,
    )


# ---- band log-sum-exp ------------------------------------------------------------------------


def _lse_kernel(q_ref, k_ref, c_ref, out_ref, m_scr, l_scr, *, geom: BandGeometry):
    step = _step(geom)
    lanes = lambda x: jnp.broadcast_to(x, m_scr.shape)  # [b, 1] -> [b, 128]

    @pl.when(step.first)
    def _init():
        m0, l0 = tile_math.lse_init(geom.block)
        m_scr[...] = lanes(m0)
        l_scr[...] = lanes(l0)

    @pl.when(step.inside)
    def _tile():
        x = _tile_logits(q_ref, k_ref, None, c_ref, step, geom)  # [b, b]
        m, l = tile_math.lse_update(m_scr[:, :1], l_scr[:, :1], x)
        m_scr[...] = lanes(m)
        l_scr[...] = lanes(l)

    @pl.when(step.last)
    def _store():
        out_ref[...] = lanes(tile_math.lse_finalize(m_scr[:, :1], l_scr[:, :1]))


@functools.partial(jax.jit, static_argnames=("geom", "interpret"))
def band_lse(q, k, col_off, *, geom: BandGeometry, interpret=False):
    """``out_i = LSE_{j: |i-j| <= W} (<q_i, k_j> + c_j)``; -inf where no entry is finite.

    Args:
      q: ``[N, Lp, d]`` rows (score scale already applied); k: ``[N, Lp, d]`` keys.
      col_off: ``[N, Lp]`` key offsets c_j (-inf = inactive key).
      geom: the band tiling; interpret: False, True or a ``pltpu.InterpretParams``.

    Returns:
      ``[N, Lp]`` f32.
    """
    n, lp, d = q.shape
    if not interpret:
        check_geometry(geom)
    b = geom.block
    out = _call(
        functools.partial(_lse_kernel, geom=geom), geom,
        in_specs=[pl.BlockSpec((None, b, d), _row_map),  # q  [b, d]
                  pl.BlockSpec((None, b, d), _key_map(geom)),  # k  [b, d]
                  _col_offset_spec(geom)],  # c  [1, b]
        out_spec=pl.BlockSpec((None, b, LANES), _row_map),  # [b, 128]
        out_shape=jax.ShapeDtypeStruct((n, lp, LANES), jnp.float32),
        scratch=[pltpu.VMEM((b, LANES), jnp.float32)] * 2,  # running max and sum
        interpret=interpret, name="band_lse",
    )(q, k, col_off.astype(jnp.float32)[:, None, :])
    return out[..., 0]


# ---- plan products ---------------------------------------------------------------------------


def _product_kernel(q_ref, k_ref, a_ref, c_ref, y_ref, *refs, geom: BandGeometry, modulated: bool):
    x_ref, z_ref, out_ref, acc_scr = refs if modulated else (None, None) + refs
    step = _step(geom)

    @pl.when(step.first)
    def _init():
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(step.inside)
    def _tile():
        p = tile_math.plan_tile(_tile_logits(q_ref, k_ref, a_ref, c_ref, step, geom))  # [b, b]
        if modulated:
            p = tile_math.modulate(p, x_ref[...], z_ref[...])
        acc_scr[...] = tile_math.accumulate(acc_scr[...], p, y_ref[...])

    @pl.when(step.last)
    def _store():
        out_ref[...] = acc_scr[...].astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("geom", "interpret"))
def band_product(q, k, row_off, col_off, y, x=None, z=None, *, geom: BandGeometry, interpret=False):
    """``out_i = Σ_j P_ij <x_i, z_j> y_j`` with ``P_ij = exp(<q_i, k_j> + a_i + c_j)`` on the band.

    Args:
      q, k: ``[N, Lp, d]`` (scale applied to q); row_off, col_off: ``[N, Lp]`` potentials a, c
        (-inf = inactive line).
      y: ``[N, Lp, m]`` on keys; x: ``[N, Lp, mx]`` on rows and z: ``[N, Lp, mx]`` on keys,
        both or neither (neither: no modulation).
      geom: the band tiling; interpret: False, True or a ``pltpu.InterpretParams``.

    Returns:
      ``[N, Lp, m]`` f32.
    """
    n, lp, d = q.shape
    m = y.shape[-1]
    modulated = x is not None
    if not interpret:
        check_geometry(geom)
    b, key = geom.block, _key_map(geom)
    in_specs = [pl.BlockSpec((None, b, d), _row_map),  # q  [b, d]
                pl.BlockSpec((None, b, d), key),  # k  [b, d]
                pl.BlockSpec((None, b, LANES), _row_map),  # a  [b, 128]
                _col_offset_spec(geom),  # c  [1, b]
                pl.BlockSpec((None, b, m), key)]  # y  [b, m]
    operands = [q, k, _lanes(row_off), col_off.astype(jnp.float32)[:, None, :], y]
    if modulated:
        mx = x.shape[-1]
        in_specs += [pl.BlockSpec((None, b, mx), _row_map),  # x  [b, mx]
                     pl.BlockSpec((None, b, mx), key)]  # z  [b, mx]
        operands += [x, z]
    return _call(
        functools.partial(_product_kernel, geom=geom, modulated=modulated), geom,
        in_specs=in_specs,
        out_spec=pl.BlockSpec((None, b, m), _row_map),
        out_shape=jax.ShapeDtypeStruct((n, lp, m), jnp.float32),
        scratch=[pltpu.VMEM((b, m), jnp.float32)],  # accumulator
        interpret=interpret, name="band_product",
    )(*operands)
