"""Per-tile maths of the banded Pallas kernels, shared by the TPU and Triton wrappers.

Pure functions of arrays (no refs, no grid): a wrapper loads one row block and one key block,
calls these, and decides where the running state lives (VMEM scratch across an "arbitrary"
grid axis on TPU, a loop carry on GPU). Row-indexed vectors are columns ``[b, 1]``,
key-indexed vectors are rows ``[1, bk]``, so everything broadcasts against a ``[b, bk]`` tile
on both backends without transposes.

Activity masks are folded into the additive offsets: a row offset ``a_i`` (or a key offset
``c_j``) of ``-inf`` switches the row (key) off, and the band mask sets ``-inf`` outside
``|i - j| <= W``. A masked logit is therefore ``-inf`` and its plan entry ``exp(-inf) = 0``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pfamalign.kernels.config import F32_PRECISION as _PRECISION  # Mosaic fp32, Triton "ieee"

_NT = (((1,), (1,)), ((), ()))  # contract the feature axis of both operands: a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b

# The dot arithmetics (``TransportConfig.triton_dots``; Mosaic always takes "ieee"): "ieee"
# fp32 products; "tf32x3" Triton's three TF32 tensor-core products; "tf32x3-emulated" the
# same arithmetic in plain f32 operations, which interpret mode runs in its place.
DOTS = ("ieee", "tf32x3", "tf32x3-emulated")
_TF32_KEEP = 0xFFFFE000  # sign, exponent and the 10 mantissa bits a TF32 operand keeps


def _tf32(x, round_nearest: bool):
    """``x`` as a TF32 value: rounded to nearest, ties away from zero (Triton's ``cvt.rna``), or
    truncated (what a TF32 tensor core reads of an f32 register)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    if round_nearest:
        bits = bits + jnp.uint32(0x1000)
    return jax.lax.bitcast_convert_type(bits & jnp.uint32(_TF32_KEEP), jnp.float32)


def _tf32x3_emulated(a, b, dims):
    """Triton's tf32x3 dot: ``a = a_hi + a_lo``, ``b = b_hi + b_lo`` with rounded TF32 high
    parts; ``a_hi b_hi + (a_lo b_hi + a_hi b_lo)`` (NaNs of the small terms dropped), every
    product exact in f32 (11-bit by 11-bit significands), sums in f32."""
    a_hi, b_hi = _tf32(a, True), _tf32(b, True)
    a_lo, b_lo = _tf32(a - a_hi, False), _tf32(b - b_hi, False)
    dot = lambda x, y: jax.lax.dot_general(x, y, dims, precision=_PRECISION, preferred_element_type=jnp.float32)
    small = dot(a_lo, b_hi) + dot(a_hi, b_lo)
    return dot(a_hi, b_hi) + jnp.where(jnp.isnan(small), 0.0, small)


def _dot(a, b, dims, dots: str):
    if dots == "tf32x3-emulated":
        return _tf32x3_emulated(a, b, dims)
    if dots not in DOTS:
        raise ValueError(f"dots must be one of {DOTS}, got {dots!r}")
    precision = _PRECISION if dots == "ieee" else jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def dot_nt(a, b, dots: str = "ieee"):
    """``a @ b.T`` in f32: a ``[r, f]``, b ``[c, f]`` -> ``[r, c]``."""
    return _dot(a, b, _NT, dots)


def dot_nn(a, b, dots: str = "ieee"):
    """``a @ b`` in f32: a ``[r, c]``, b ``[c, m]`` -> ``[r, m]``."""
    return _dot(a, b, _NN, dots)


def band_logits(q, k, row_off, col_off, *, row0, col0, half_band: int, dots: str = "ieee"):
    """Masked logits of one tile: ``<q_i, k_j> + a_i + c_j`` on the band, ``-inf`` elsewhere.

    Args:
      q: ``[b, d]`` row block (already multiplied by the score scale).
      k: ``[bk, d]`` key block.
      row_off: ``[b, 1]`` additive row offsets (``-inf`` = inactive row), or None for none.
      col_off: ``[1, bk]`` additive key offsets (``-inf`` = inactive key).
      row0, col0: global index of the tile's first row / key (traced int32 scalars).
      half_band: W.
      dots: the dot arithmetic (``DOTS``).

    Returns:
      ``[b, bk]`` f32 logits.
    """
    return mask_band(dot_nt(q, k, dots), row_off, col_off, row0=row0, col0=col0, half_band=half_band,
                     computed=True)


def mask_band(s, row_off, col_off, *, row0, col0, half_band: int, computed: bool = False):
    """``s_ij + a_i + c_j`` on the band ``|i - j| <= W``, ``-inf`` elsewhere: the logits of a
    tile whose scores ``s [b, bk]`` are given (computed, or read from a stored band). Arguments
    as ``band_logits``; the band is symmetric, so a transposed tile (keys as its rows) is
    masked with the keys' index as ``row0``. ``computed``: s is a dot's result in this kernel;
    the offsets are then added to the masked scores, not to the dot (below)."""
    shape = s.shape
    # i - j from the block offset plus in-tile offsets: small ints, no |.| on vectors needed.
    diff = (row0 - col0) + (jax.lax.broadcasted_iota(jnp.int32, shape, 0)
                            - jax.lax.broadcasted_iota(jnp.int32, shape, 1))
    inside = (diff <= half_band) & (diff >= -half_band)
    # a_i + c_j first: the transposed walk adds the same two offsets the other way round, and
    # a row and a column walk must round a plan entry alike (the adjoint's cancellations at cold
    # scores rest on every product seeing one plan; (s + a) + c and (s + c) + a differ by
    # u |S| in the exponent).
    off = col_off if row_off is None else row_off + col_off
    if computed:
        # Triton folds ``dot + x`` into the dot (its accumulator starts at x), and the offsets
        # are about -|S|: every partial sum of <q_i, k_j> then rounds at that size. At eps 1e-3,
        # T 0 the recomputing kernels' dq was 7.1e-4 from float64 so on an H200, against 2.2e-4
        # with the select in between (interpret mode: 1.6e-4; 2026-11-30, docs/design.md §3.5).
        return jnp.where(inside, s, -jnp.inf) + off
    # A stored tile's scale multiply stays beside the addition, as in the unmasked walks
    # (``pallas_gpu._tile_logits``): a compiler may contract the two into one FMA, and must then
    # do so in both (with the select in between, XLA's CPU compile rounded them 1.1e-4 apart).
    return jnp.where(inside, s + off, -jnp.inf)


_LOG2E = 1.4426950408889634
# False: ``jnp.exp``, as the kernels had it when measured on an H100 (2026-11-24; the static cost
# model's calibration compiles them so). Read at trace time.
EXP2 = True


def exp(x):
    """``e^x`` as ``2^(x log2 e)``: on a GPU a multiply and one MUFU.EX2, where ``jnp.exp``
    compiles to libdevice's ``expf`` (about 7 instructions: a third of a stored-band walk's, in
    sm_90 SASS). The multiply's rounding adds ``|x| 2^-24`` to the exponent, as the addition
    that formed x already does."""
    return jnp.exp2(x * _LOG2E) if EXP2 else jnp.exp(x)


def _finite_or_zero(m):
    # A running max of -inf (no entry seen yet) must not produce -inf - -inf = nan.
    return jnp.where(m == -jnp.inf, 0.0, m)


def lse_init(rows: int, axis: int = 1):
    """Empty online log-sum-exp state ``(max, sum)``, each ``[rows, 1]`` (or ``[1, rows]`` for
    a walk that reduces ``axis`` 0)."""
    shape = (rows, 1) if axis == 1 else (1, rows)
    return jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32)


def lse_update(m, l, x, axis: int = 1):
    """Folds the logits ``x [b, bk]`` into the running row state ``m, l [b, 1]`` (``axis`` 0:
    the column state ``[1, bk]``, for a tile whose walked lines are its rows).

    Invariant: ``LSE(seen) = log(l) + m`` with ``m`` the largest logit seen (``-inf`` when
    none is finite, and then ``l = 0``).
    """
    m_new = jnp.maximum(m, jnp.max(x, axis=axis, keepdims=True))
    shift = _finite_or_zero(m_new)
    l_new = l * exp(m - shift) + jnp.sum(exp(x - shift), axis=axis, keepdims=True)
    return m_new, l_new


def lse_finalize(m, l):
    """``[b, 1]`` log-sum-exp of the state; ``-inf`` for rows that saw no finite logit."""
    return jnp.log(l) + _finite_or_zero(m)


def logaddexp(a, b):
    """``log(e^a + e^b)`` elementwise; ``-inf`` where both are (no NaN from ``-inf - -inf``)."""
    m = _finite_or_zero(jnp.maximum(a, b))
    return jnp.log(exp(a - m) + exp(b - m)) + m


def plan_tile(logits):
    """Plan entries ``exp(S_ij + row_pot_i + col_pot_j)``: 0 wherever the logit is masked."""
    return exp(logits)


def modulate(p, x, z, dots: str = "ieee"):
    """``P_ij <x_i, z_j>``: p ``[b, bk]``, x ``[b, mx]`` on rows, z ``[bk, mx]`` on keys; or x
    and z as lists of matching feature pieces, whose inner products add up."""
    if isinstance(x, (list, tuple)):
        return p * sum(dot_nt(xp, zp, dots) for xp, zp in zip(x, z))
    return p * dot_nt(x, z, dots)


def accumulate(acc, p, y, dots: str = "ieee"):
    """``acc + p @ y``: acc ``[b, m]``, p ``[b, bk]``, y ``[bk, m]`` on keys; a vector y ``[bk]``
    (m = 1) with acc ``[b]``: a multiply and a row sum (f32), no dot."""
    if y.ndim == 1:
        return acc + jnp.sum(p * y[None, :], axis=1)
    return acc + dot_nn(p, y, dots)
