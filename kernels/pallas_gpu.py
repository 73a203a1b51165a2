"""GPU (Triton) wrapper of the banded kernels: one row block per program, band tiles in a loop.

Grid ``(N, nI)``: GPU programs run in parallel, so each one owns a row block and walks its key
blocks ``max(I - wb, 0) .. min(I + wb, nI - 1)`` in a ``fori_loop`` with the running state
(online LSE or the product accumulator) as the loop carry. The problem's keys stay in global
memory and are sliced one tile at a time; each tile's scores are recomputed from q and k.

Triton wants every loaded array to be a power of two in size and ``tl.dot`` operands of at
least 16 in every dimension: the tile edge must be such a power of two, and feature dims are
zero-padded to one here (zero features change no inner product; padded output columns are
cut off).

Shared memory: each call re-tiles the band with the edge, ``num_warps`` and ``num_stages`` that
``gpu_budget.choose`` picks for the device's budget (the band tiling's edge divided by a power
of two; the band mask is exact at any edge). Interpret mode runs the same tiling.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pfamalign.kernels import gpu_budget, tile_math
from pfamalign.kernels.band import BandGeometry, make_geometry
from pfamalign.kernels.gpu_budget import MIN_DOT, GpuTiling, KernelShape


def check_geometry(geom: BandGeometry) -> None:
    """Raises ValueError unless the tile edge is a legal Triton block."""
    b = geom.block
    if b < MIN_DOT or b & (b - 1):
        raise ValueError(f"Triton tiles must be powers of two >= {MIN_DOT}, got block={b}")


# ---- layouts, specs, the band loop ------------------------------------------------------------


def _pad_features(x):
    """``[N, Lp, f]`` -> ``[N, Lp, f']``, f' the next power of two >= max(f, 16), zero filled."""
    f = x.shape[-1]
    fp = gpu_budget.padded(f)
    return x if fp == f else jnp.pad(x, ((0, 0), (0, 0), (0, fp - f)))


# Launch settings forced per kernel shape ({KernelShape: GpuTiling}), for the tiling sweep of
# scripts/tune_triton.py; empty otherwise. Read at trace time.
FORCED_TILING: dict[KernelShape, GpuTiling] = {}


def tiling(geom: BandGeometry, shape: KernelShape) -> tuple[BandGeometry, GpuTiling]:
    """The band re-tiled for this device's shared memory, and the launch settings. Tiles below
    ``MIN_DOT`` (interpret mode only) are kept as they are."""
    if geom.block < MIN_DOT:
        return geom, GpuTiling(geom.block, gpu_budget.num_warps(geom.block), gpu_budget.STAGES[0])
    t = FORCED_TILING.get(shape) or gpu_budget.choose(shape, geom.block, gpu_budget.device_budget())
    return make_geometry(geom.length, geom.half_band, t.block, pallas=True), t


def _rows(b: int, f: int | None = None):
    """Spec of this program's row block of a ``[N, Lp(, f)]`` operand."""
    if f is None:
        return pl.BlockSpec((None, b), lambda n, i: (n, i))
    return pl.BlockSpec((None, b, f), lambda n, i: (n, i, 0))


def _whole(lp: int, f: int | None = None):
    """Spec of a problem's whole ``[N, Lp(, f)]`` operand: the kernel slices its key tiles."""
    if f is None:
        return pl.BlockSpec((None, lp), lambda n, i: (n, 0))
    return pl.BlockSpec((None, lp, f), lambda n, i: (n, 0, 0))


def _key_range(i_blk, geom: BandGeometry):
    """``[lo, hi)`` of the key blocks that row block ``i_blk`` meets (no clipped duplicates)."""
    return jnp.maximum(i_blk - geom.wb, 0), jnp.minimum(i_blk + geom.wb + 1, geom.n_blocks)


def _tile_logits(q, a, k_ref, c_ref, i_blk, j_blk, geom: BandGeometry):
    """Masked logits ``[b, b]`` of row block ``i_blk`` (q and a loaded; a may be None) against
    key block ``j_blk`` (sliced from the refs that hold all keys)."""
    b = geom.block
    keys = pl.ds(j_blk * b, b)
    return tile_math.band_logits(q, k_ref[keys, :], a, c_ref[keys][None, :],
                                 row0=i_blk * b, col0=j_blk * b, half_band=geom.half_band)


def _call(kernel, geom: BandGeometry, launch: GpuTiling, *, in_specs, out_spec, out_shape, interpret,
          name):
    return pl.pallas_call(
        kernel,
        grid=(out_shape.shape[0], geom.n_blocks),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=launch.num_warps,
                                                num_stages=launch.num_stages),
        interpret=interpret,
        name=name,
    )


# ---- band log-sum-exp ------------------------------------------------------------------------


def _lse_kernel(q_ref, k_ref, c_ref, out_ref, *, geom: BandGeometry):
    i_blk = pl.program_id(1)
    q = q_ref[...]  # [b, d]

    def body(j_blk, carry):
        return tile_math.lse_update(*carry, _tile_logits(q, None, k_ref, c_ref, i_blk, j_blk, geom))

    lo, hi = _key_range(i_blk, geom)
    m, l = jax.lax.fori_loop(lo, hi, body, tile_math.lse_init(geom.block))
    out_ref[...] = tile_math.lse_finalize(m, l)[:, 0]


@functools.partial(jax.jit, static_argnames=("geom", "interpret"))
def band_lse(q, k, col_off, *, geom: BandGeometry, interpret=False):
    """``out_i = LSE_{j: |i-j| <= W} (<q_i, k_j> + c_j)``; -inf where no entry is finite.

    Same contract as ``pallas_tpu.band_lse``: q, k ``[N, Lp, d]`` (scale applied to q),
    col_off ``[N, Lp]`` (-inf = inactive key). Returns ``[N, Lp]`` f32.
    """
    n, lp, d = q.shape
    if not interpret:
        check_geometry(geom)
    geom, launch = tiling(geom, KernelShape(d))
    q, k = _pad_features(q), _pad_features(k)
    dp, b = q.shape[-1], geom.block
    return _call(
        functools.partial(_lse_kernel, geom=geom), geom, launch,
        in_specs=[_rows(b, dp), _whole(lp, dp), _whole(lp)],  # q [b, d'], k [Lp, d'], c [Lp]
        out_spec=_rows(b),  # [b]
        out_shape=jax.ShapeDtypeStruct((n, lp), jnp.float32),
        interpret=interpret, name="band_lse",
    )(q, k, col_off.astype(jnp.float32))


# ---- plan products ---------------------------------------------------------------------------


def _product_kernel(q_ref, k_ref, a_ref, c_ref, y_ref, *refs, geom: BandGeometry, modulated: bool):
    x_ref, z_ref, out_ref = refs if modulated else (None, None) + refs
    i_blk = pl.program_id(1)
    b = geom.block
    q, a = q_ref[...], a_ref[...][:, None]  # [b, d], [b, 1]
    x = x_ref[...] if modulated else None  # [b, mx]

    def body(j_blk, acc):
        p = tile_math.plan_tile(_tile_logits(q, a, k_ref, c_ref, i_blk, j_blk, geom))  # [b, b]
        keys = pl.ds(j_blk * b, b)
        if modulated:
            p = tile_math.modulate(p, x, z_ref[keys, :])
        return tile_math.accumulate(acc, p, y_ref[keys, :])

    lo, hi = _key_range(i_blk, geom)
    out_ref[...] = jax.lax.fori_loop(lo, hi, body, jnp.zeros(out_ref.shape, jnp.float32))


@functools.partial(jax.jit, static_argnames=("geom", "interpret"))
def band_product(q, k, row_off, col_off, y, x=None, z=None, *, geom: BandGeometry, interpret=False):
    """``out_i = Σ_j P_ij <x_i, z_j> y_j`` with ``P_ij = exp(<q_i, k_j> + a_i + c_j)`` on the band.

    Same contract as ``pallas_tpu.band_product``: row_off, col_off ``[N, Lp]``, y ``[N, Lp, m]``
    on keys, x ``[N, Lp, mx]`` on rows and z ``[N, Lp, mx]`` on keys (both or neither).
    Returns ``[N, Lp, m]`` f32.
    """
    n, lp, d = q.shape
    m = y.shape[-1]
    modulated = x is not None
    if not interpret:
        check_geometry(geom)
    geom, launch = tiling(geom, KernelShape(d, m, x.shape[-1] if modulated else 0))
    q, k, y = _pad_features(q), _pad_features(k), _pad_features(y)
    dp, mp, b = q.shape[-1], y.shape[-1], geom.block
    # q [b, d'], k [Lp, d'], a [b], c [Lp], y [Lp, m']
    in_specs = [_rows(b, dp), _whole(lp, dp), _rows(b), _whole(lp), _whole(lp, mp)]
    operands = [q, k, row_off.astype(jnp.float32), col_off.astype(jnp.float32), y]
    if modulated:
        x, z = _pad_features(x), _pad_features(z)
        in_specs += [_rows(b, x.shape[-1]), _whole(lp, z.shape[-1])]  # x [b, mx'], z [Lp, mx']
        operands += [x, z]
    out = _call(
        functools.partial(_product_kernel, geom=geom, modulated=modulated), geom, launch,
        in_specs=in_specs,
        out_spec=_rows(b, mp),  # [b, m']
        out_shape=jax.ShapeDtypeStruct((n, lp, mp), jnp.float32),
        interpret=interpret, name="band_product",
    )(*operands)
    return out[..., :m]
