"""The banded Sinkhorn solve and its exact tail adjoint, written once for every backend.

A backend (``XlaBandOps`` or ``PallasBandOps``) supplies the banded primitives of the
``band_ops.BandOps`` contract — ``scores``, ``rescale``, ``row_lse``, ``col_lse``, ``plan``,
``plan_rows``, ``plan_cols`` — and this module adds the dustbin spokes (O(L) vectors), the
potentials, centering, the stopped base, the R-step tail and the custom VJP.

Extended index space: potentials are ``[N, Lp + 1]``; slot ``Lp`` is the dustbin row (for u)
or column (for v). Without a dustbin those slots have no support and stay 0.

Tail (r = 1..R, from the stopped base potential v^0):
    û^r = log a - LSE_row(S + v^{r-1}),  v̂^r = log b - LSE_col(S + û^r),
    c_r = mean over supported rows of û^r,  u^r = û^r - c_r,  v^r = v̂^r + c_r.
Plans: row plans A^r = exp(S + û^r ⊕ v^{r-1}), column plans B^r = exp(S + u^r ⊕ v^r),
output plan P = B^R, output O = P V.

Adjoint (docs/design.md §3.5): with G_ij = <dO_i, V_j>,
    dS = P∘G - Σ_r [A^r ∘ (α_r ⊗ 1) + B^r ∘ (1 ⊗ β_r)],
where, going r = R..1 with ū (adjoint of u^r; R(P∘G) at r = R, else 0) and v̄ (adjoint of
v^r; C(P∘G) at r = R, else the previous -A^{r+1 T} α_{r+1}):
    c̄ = Σ v̄ - Σ ū  (the centering ledger: 0 up to rounding, kept exact),
    β_r = v̄ / b,   α_r = (ū + c̄ / n_rows - B^r β_r) / a,   v̄ ← -A^{rT} α_r.
The targets a, b are 1 on every line except a capacity dustbin (a = active Lk on the dustbin
row, b = active Lq on the dustbin column: every residue can go to the dustbin). The code
divides by the tail plans' line sums as it computes them, which equal a and b in exact
arithmetic: at cold scores the difference is what keeps dS's cancellations exact
(``_half_step_weights``).
One-reference schedule (the orbit identity, docs/design.md §3.5): every tail plan is a
diagonal rescaling of P, ``A^r = diag(e^{a_u}) P diag(e^{a_v})``, so every product above is a
product with P and the whole dS is ``P ∘ <X_i, Z_j>`` for a rank-(dv + 2R) factorisation:
one exponential per entry instead of 2R + 1.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pfamalign.kernels.band import BandGeometry
from pfamalign.kernels.band_ops import BandOps
from pfamalign.kernels.config import SAFE_LOG, TransportConfig, einsum, log_or_neg_inf, marginal_error, potential


class Flat(NamedTuple):
    """A batch of padded square problems, N = batch x heads."""

    q: jax.Array  # [N, Lp, d]
    k: jax.Array  # [N, Lp, d]
    v: jax.Array  # [N, Lp, dv]
    tq: jax.Array  # [N, d]   dustbin row query (unused without dustbin)
    tk: jax.Array  # [N, d]   dustbin column key
    tv: jax.Array  # [N, dv]  dustbin column value
    row_active: jax.Array  # [N, Lp] bool
    col_active: jax.Array  # [N, Lp] bool
    target: jax.Array  # [N, Lp] int32: each row's target column (the dustbin: Lp with spokes, lmax widened), -1 none


class Spokes(NamedTuple):
    """Scores (or plan entries) on the dustbin row and column; -inf (0) where inactive."""

    col: jax.Array  # [N, Lp]  entry (i, dustbin column)
    row: jax.Array  # [N, Lp]  entry (dustbin row, j)
    corner: jax.Array  # [N]   entry (dustbin row, dustbin column)


_NO_SPOKES = Spokes(None, None, None)  # no dustbin: the spoke helpers' terms are left out


class Support(NamedTuple):
    rows: jax.Array  # [N, Lp + 1] bool: row has at least one entry
    cols: jax.Array  # [N, Lp + 1] bool
    band_rows: jax.Array  # [N, Lp] bool: row has at least one band entry
    band_cols: jax.Array  # [N, Lp] bool
    log_rows: jax.Array  # [N, Lp + 1] log row targets: 0 (unit), log Lk at a capacity dustbin row
    log_cols: jax.Array  # [N, Lp + 1] log column targets: 0, log Lq at a capacity dustbin column
    kappa_rows: float = 1.0  # static damping of the row half step (TransportConfig.damping)
    kappa_cols: float = 1.0
    centered: bool = True  # balanced: the rows' mean potential moves into the columns


class Solution(NamedTuple):
    """Everything the backward needs besides the inputs: O(L) vectors per problem."""

    v0: jax.Array  # [N, Lp + 1]      stopped base column potential
    u_hat: jax.Array  # [R, N, Lp + 1] tail row potentials before centering
    u: jax.Array  # [R, N, Lp + 1]     tail row potentials, centered
    v: jax.Array  # [R, N, Lp + 1]     tail column potentials, centered
    u_final: jax.Array  # [N, Lp + 1]  potentials of the output plan
    v_final: jax.Array  # [N, Lp + 1]
    steps: jax.Array  # [N] int: base steps taken (T without tol)


class Spec(NamedTuple):
    """Static description of one op instance."""

    cfg: TransportConfig
    geom: BandGeometry
    has_spokes: bool  # the dustbin spokes are present (modes spoke and capacity; widened has none)
    history: bool
    capacity: bool = False  # dustbin marginals = the other side's active length
    stats: bool = False  # also return (steps, row error, column error) of the output plan


def make_ops(spec: Spec) -> BandOps:
    """The backend of a resolved config: ``impl`` "xla" or "pallas" (``TransportConfig.resolved``)."""
    if spec.cfg.impl == "pallas":
        from pfamalign.kernels.pallas_ops import PallasBandOps, StoredBandOps

        backend = StoredBandOps if spec.cfg.resident_scores else PallasBandOps
        return backend(spec.geom, interpret=spec.cfg.interpret, wrapper=spec.cfg.kernel, dots=spec.cfg.triton_dots)
    if spec.cfg.impl == "xla":
        from pfamalign.kernels.banded_xla import XlaBandOps

        return XlaBandOps(spec.geom, shifted_lse=not spec.cfg.branch_free)
    raise ValueError(f"no banded backend for impl={spec.cfg.impl!r}: resolve the config first")


# ---- support, spokes and half steps -----------------------------------------------------------


def _band_has_entry(active, other, half_band):
    """[N, Lp]: line i is active and some active ``other`` line lies within |i - j| <= W."""
    n = other.shape[-1]
    csum = jnp.concatenate([jnp.zeros_like(other[:, :1], jnp.int32), jnp.cumsum(other, -1, dtype=jnp.int32)], -1)
    idx = jnp.arange(n)
    hi = jnp.minimum(idx + half_band + 1, n)
    lo = jnp.clip(idx - half_band, 0, n)
    return active & (csum[:, hi] - csum[:, lo] > 0)


def support(flat: Flat, spec: Spec) -> Support:
    w = spec.geom.half_band
    band_rows = _band_has_entry(flat.row_active, flat.col_active, w)
    band_cols = _band_has_entry(flat.col_active, flat.row_active, w)
    rows, cols = band_rows, band_cols
    db = jnp.full(rows.shape[:1] + (1,), spec.has_spokes)
    if spec.has_spokes:
        rows, cols = rows | flat.row_active, cols | flat.col_active
    log_rows = jnp.zeros(rows.shape[:1] + (rows.shape[1] + 1,), flat.q.dtype)
    log_cols = jnp.zeros_like(log_rows)
    if spec.capacity:  # a dustbin takes as much mass as the other side has residues
        count = lambda active: jnp.log(jnp.maximum(jnp.sum(active, -1), 1).astype(flat.q.dtype))
        log_rows = log_rows.at[:, -1].set(count(flat.col_active))
        log_cols = log_cols.at[:, -1].set(count(flat.row_active))
    return Support(jnp.concatenate([rows, db], -1), jnp.concatenate([cols, db], -1), band_rows, band_cols,
                   log_rows, log_cols, *spec.cfg.damping(), spec.cfg.centered())


def spoke_scores(flat: Flat, spec: Spec, scale) -> Spokes | None:
    """The dustbin spokes' scores; None without a dustbin (no spoke: every step, plan and
    product skips the spoke terms, which would be -inf scores and 0 plan entries, in O(L)
    passes and reductions that are kernel launches of their own on a GPU)."""
    if not spec.has_spokes:
        return None
    col = einsum("nid,nd->ni", flat.q, flat.tk) * scale
    row = einsum("nd,njd->nj", flat.tq, flat.k) * scale
    corner = einsum("nd,nd->n", flat.tq, flat.tk) * scale
    return Spokes(jnp.where(flat.row_active, col, -jnp.inf), jnp.where(flat.col_active, row, -jnp.inf), corner)


def _lse_last(x):
    """``logsumexp`` over the last axis; -inf for an all -inf line with a zero (not NaN)
    cotangent, so that autodiff through the steps is safe (``jax.nn.logsumexp`` gives NaN)."""
    mx = jax.lax.stop_gradient(jnp.max(x, -1))
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    s = jnp.sum(jnp.exp(x - mx[:, None]), -1)
    return log_or_neg_inf(s) + mx


def _logaddexp(a, b):
    """``jnp.logaddexp`` with a zero (not NaN) cotangent where both sides are -inf."""
    both = jnp.isneginf(a) & jnp.isneginf(b)
    return jnp.where(both, -jnp.inf, jnp.logaddexp(jnp.where(both, 0.0, a), jnp.where(both, 0.0, b)))


def _band_lse(ops: BandOps, lse_fn, band, bias, shift, has_entry):
    """Band log-sum-exp in one pass, stabilized by ``shift`` (the previous step's value);
    falls back to the exact two-pass form when any line drifted out of the safe range.
    Backends that take no shift (``BandOps.takes_shift``) compute the exact form directly."""
    if not ops.takes_shift or shift is None:
        return lse_fn(band, bias)
    fast = lse_fn(band, bias, shift)
    ok = jnp.all(~has_entry | (jnp.abs(fast - shift) < SAFE_LOG))
    return jax.lax.cond(ok, lambda: fast, lambda: lse_fn(band, bias))


def _with_dustbin_lse(band_lse, to_slot, from_slot, corner, x):
    """A band log-sum-exp ``[N, Lp]`` of ``S + x`` completed on the extended support ``[N, Lp
    + 1]``: real line l gains the entry ``to_slot[l] + x[slot]``, and the dustbin line is
    ``LSE_l (from_slot[l] + x[l])`` with the corner. Spokes None: no dustbin line (-inf)."""
    if to_slot is None:
        return jnp.concatenate([band_lse, jnp.full(band_lse.shape[:1] + (1,), -jnp.inf, band_lse.dtype)], -1)
    real = _logaddexp(band_lse, to_slot + x[:, -1:])
    db = _logaddexp(_lse_last(from_slot + x[:, :-1]), corner + x[:, -1])
    return jnp.concatenate([real, _unfused(db)[:, None]], -1)


def _unfused(x):
    """``x`` (an O(L) reduction's result: a dustbin line, a sum over lines) computed on its
    own: XLA's GPU compiler fused such reductions into the elementwise kernel that consumes
    them (a concatenation appending the dustbin line), where every output entry recomputed
    the whole reduction: two such kernels took 1.6 ms each of a 7.3 ms call at L 16384 (spoke
    dustbin, H200, 2026-11-30). ``scripts/count_gpu_launches.py`` reports any such kernel left
    in the module compiled for an H100 (``recomputed_reductions``)."""
    return jax.lax.optimization_barrier(x)


def _row_lse(ops, band, spk: Spokes | None, sup: Support, v, shift=None):
    """LSE_row(S + v) ``[N, Lp + 1]`` on the extended support (-inf on empty rows)."""
    band_lse = _band_lse(ops, ops.row_lse, band, v, shift, sup.band_rows)  # v extended: see BandOps
    s = spk or _NO_SPOKES
    return _with_dustbin_lse(band_lse, s.col, s.row, s.corner, v)


def _col_lse(ops, band, spk: Spokes | None, sup: Support, u, shift=None):
    """LSE_col(S + u) ``[N, Lp + 1]`` on the extended support (-inf on empty columns)."""
    band_lse = _band_lse(ops, ops.col_lse, band, u, shift, sup.band_cols)
    s = spk or _NO_SPOKES
    return _with_dustbin_lse(band_lse, s.row, s.col, s.corner, u)


def _row_half(ops, band, spk: Spokes, sup: Support, v, shift):
    """û = kappa_a (log a - LSE_row(S + v)) on the extended support (a: row targets)."""
    return potential(sup.log_rows, _row_lse(ops, band, spk, sup, v, shift), sup.kappa_rows)


def _col_half(ops, band, spk: Spokes, sup: Support, u, shift):
    """v̂ = kappa_b (log b - LSE_col(S + u)) on the extended support (b: column targets)."""
    return potential(sup.log_cols, _col_lse(ops, band, spk, sup, u, shift), sup.kappa_cols)


def marginal_errors(ops, band, spk: Spokes, sup: Support, u, v):
    """(row, column) marginal errors ``[N]`` of the plan ``exp(S + u ⊕ v)`` (two LSE passes)."""
    sums = lambda log_sums: jnp.where(jnp.isfinite(log_sums), jnp.exp(log_sums), 0.0)
    rows = sums(_row_lse(ops, band, spk, sup, v) + u)
    cols = sums(_col_lse(ops, band, spk, sup, u) + v)
    return (marginal_error(rows, u, sup.log_rows, sup.rows, sup.kappa_rows),
            marginal_error(cols, v, sup.log_cols, sup.cols, sup.kappa_cols))


def _full_step(ops, band, spk, sup: Support, v, u_prev):
    """One Sinkhorn step from (u_prev, v), centered when the problem is balanced: returns (û, u, v).

    The previous potentials only stabilize the log-sum-exps (the step depends on v alone).
    """
    u_hat = _row_half(ops, band, spk, sup, v, -u_prev[:, :-1])
    v_hat = _col_half(ops, band, spk, sup, u_hat, -v[:, :-1])
    return (u_hat,) + _center(sup, u_hat, v_hat)


def _center(sup: Support, u_hat, v_hat):
    """Centered (u, v): the mean of u over the active rows moved into v (same plan). Only a
    balanced problem is centered: with a damped side the shift would change the next step."""
    if not sup.centered:
        return u_hat, v_hat
    n_rows = jnp.maximum(jnp.sum(sup.rows, -1, keepdims=True), 1)
    c = jnp.sum(jnp.where(sup.rows, u_hat, 0.0), -1, keepdims=True) / n_rows
    return jnp.where(sup.rows, u_hat - c, 0.0), jnp.where(sup.cols, v_hat + c, 0.0)


# ---- forward ---------------------------------------------------------------------------------


def _scale(flat: Flat, eps):
    return 1.0 / (jnp.sqrt(jnp.asarray(flat.q.shape[-1], flat.q.dtype)) * eps)


def extended_scores(ops: BandOps, spec: Spec, flat: Flat):
    """The score band and the dustbin spokes at unit temperature, ``<q, k> / sqrt(d)``: every
    temperature is made from them by ``at_eps``."""
    scale = _scale(flat, 1.0)
    band = ops.scores(flat.q, flat.k, flat.row_active, flat.col_active, scale)
    return band, spoke_scores(flat, spec, scale)


def at_eps(ops: BandOps, dots, raw_spk: Spokes | None, inv_eps):
    """The band and spokes of ``extended_scores`` at temperature ``1 / inv_eps``. The
    one way every step, the output and the backward scale them: the backward's plan must be the
    forward's to the last bit, or at cold scores (|S| / eps in the hundreds) the adjoint's
    cancellations against the forward's output fail by u |S| / eps."""
    return ops.rescale(dots, inv_eps), None if raw_spk is None else Spokes(*(x * inv_eps for x in raw_spk))


def step_eps(cfg: TransportConfig, tail_steps: int | None = None, *, base: bool = True) -> np.ndarray:
    """The eps of every full step: the base stages (unless ``base=False``), then the tail at
    ``cfg.eps``."""
    tail = cfg.tail_steps if tail_steps is None else tail_steps
    stages = cfg.base_stages() if base else ()
    return np.array([e for e, t in stages for _ in range(t)] + [cfg.eps] * tail, np.float64)


def _base_to_tol(ops: BandOps, band, spk: Spokes, sup: Support, tol: float, max_steps: int, zeros):
    """The base solve to a tolerance: full log-domain steps at eps until each problem's
    ``marginal_errors`` are <= tol (a converged problem is frozen) or ``max_steps``.

    Returns (u, v, steps [N], (u_hist, v_hist)); the histories ``[max_steps, N, Lp + 1]``
    repeat a problem's final potentials after its last step (``reference._base_to_tol``)."""
    n = zeros.shape[0]

    def body(c):
        k, u, v, err, steps, hu, hv = c
        _, un, vn = _full_step(ops, band, spk, sup, v, u)
        run = err > tol
        u, v = jnp.where(run[:, None], un, u), jnp.where(run[:, None], vn, v)
        err = jnp.where(run, jnp.maximum(*marginal_errors(ops, band, spk, sup, u, v)), err)
        return k + 1, u, v, err, steps + run, hu.at[k].set(u), hv.at[k].set(v)

    hist0 = jnp.zeros((max_steps,) + zeros.shape, zeros.dtype)
    init = (0, zeros, zeros, jnp.full((n,), jnp.inf, zeros.dtype), jnp.zeros((n,), jnp.int32), hist0, hist0)
    k, u, v, _, steps, hu, hv = jax.lax.while_loop(
        lambda c: (c[0] < max_steps) & jnp.any(c[3] > tol), body, init)
    done = (jnp.arange(max_steps) >= k)[:, None, None]
    return u, v, steps, (jnp.where(done, u, hu), jnp.where(done, v, hv))


def _scan_keeping(step, carry, n: int, keep: int, xs=None, *, unroll: bool = False):
    """``step`` run ``n`` times from ``carry`` (``xs`` sliced per step, or None); only the last
    ``keep`` steps' outputs are stacked (the others run in a carry-only scan: on a GPU each
    stacked output is a kernel of its own per step). ``unroll``: straight-line steps instead
    of loops (``TransportConfig.unroll``). Returns (the carry before the kept steps, their
    stacked outputs: ``[keep, ...]``, empty for 0)."""
    head = n - keep
    part = lambda lo, hi: None if xs is None else jax.tree.map(lambda x: x[lo:hi], xs)
    if head:
        carry, _ = jax.lax.scan(lambda c, x: (step(c, x)[0], None), carry, part(0, head), length=head,
                                unroll=unroll)
    return carry, jax.lax.scan(step, carry, part(head, n), length=keep, unroll=unroll)[1]


def run_steps(ops: BandOps, dots, raw_spk: Spokes | None, sup: Support, eps: np.ndarray, u, v, *,
              keep: int | None = None, unroll: bool = False):
    """Full steps from (u, v) (centered when balanced), step t at temperature ``eps[t]``.

    ``dots`` and ``raw_spk`` are the scores at eps = 1. Potentials are carried across a change
    of eps at fixed eps * potential. Returns ((u, v) before the kept steps, their (û, u, v),
    each ``[keep, N, Lp + 1]``): the last ``keep`` steps (None: all; 0: the first element is
    the final state). At one eps (no schedule) the band is rescaled once, outside the loop.
    ``unroll``: straight-line steps (``TransportConfig.unroll``).
    """
    n = len(eps)
    keep = n if keep is None else keep
    ratio = np.concatenate([[1.0], eps[:-1] / eps[1:]]) if n else eps
    one_eps = n > 0 and bool(np.all(eps == eps[0]))

    at = functools.partial(at_eps, ops, dots, raw_spk)  # inv_eps -> (band, spokes)

    fixed = at(float(1.0 / eps[0])) if one_eps else None

    def step(carry, xs):
        u_c, v_c = carry
        if one_eps:
            (band, spk), rescale = fixed, 1.0
        else:
            inv_eps, rescale = xs
            band, spk = at(inv_eps)
        u_hat, u_c, v_c = _full_step(ops, band, spk, sup, v_c * rescale, u_c * rescale)
        return (u_c, v_c), (u_hat, u_c, v_c)

    dtype = u.dtype
    xs = None if one_eps else (jnp.asarray(1.0 / eps, dtype), jnp.asarray(ratio, dtype))
    return _scan_keeping(step, (u, v), n, keep, xs, unroll=unroll)


# Scaling-domain steps rebuild their reference plan once a potential has moved this far from
# it: e^30 keeps every product far from float32 overflow, and a supported line (whose largest
# reference entry is at least 1 / Lp after the first normalizing step) from underflowing.
_ABSORB = 30.0


def run_steps_scaling(ops: BandOps, band, spk: Spokes | None, sup: Support, n_steps: int, u, v, *,
                      keep: int | None = None, unroll: bool = False):
    """``run_steps`` at one eps in the scaling domain: after one exact log-domain step, each
    half step is one product with a resident reference plan ``p0 = exp(S + u0 ⊕ v0)``:
    ``LSE_j(S_ij + v_j) = log (p0 e^{v - v0})_i - u0_i`` — a multiply-add per band entry
    instead of an exponential. The reference is rebuilt (absorbed) when the potentials drift
    more than ``_ABSORB`` from it. Same steps, same results as the log domain up to rounding;
    returns as ``run_steps``.
    """
    keep = n_steps if keep is None else keep
    first = _full_step(ops, band, spk, sup, v, u)

    def step(carry, _):
        u_c, v_c, p, u0, v0 = carry
        p_rows, p_cols = _products(ops, p)
        u_hat = potential(sup.log_rows, log_or_neg_inf(p_rows(jnp.exp(v_c - v0))) - u0, sup.kappa_rows)
        v_hat = potential(sup.log_cols, log_or_neg_inf(p_cols(jnp.exp(u_hat - u0))) - v0, sup.kappa_cols)
        u_c, v_c = _center(sup, u_hat, v_hat)
        drift = jnp.maximum(jnp.max(jnp.where(sup.rows, jnp.abs(u_c - u0), 0.0)),
                            jnp.max(jnp.where(sup.cols, jnp.abs(v_c - v0), 0.0)))
        # A loop of zero or one trip, not a lax.cond: XLA's GPU compiler gives a cond's untaken
        # branch a copy of the plan (the whole band, every step: 142 MB at L 16384, W 1024;
        # scripts/count_gpu_launches.py's module shows it), where a loop updates its carry in
        # place. The CPU compiler aliased it either way.
        _, p, u0, v0 = jax.lax.while_loop(
            lambda c: c[0], lambda c: (False, _plan(ops, band, spk, u_c, v_c), u_c, v_c),
            (drift > _ABSORB, p, u0, v0))
        return (u_c, v_c, p, u0, v0), (u_hat, u_c, v_c)

    _, u1, v1 = first
    init = (u1, v1, _plan(ops, band, spk, u1, v1), u1, v1)
    before, rest = _scan_keeping(step, init, n_steps - 1, min(keep, n_steps - 1), unroll=unroll)
    if keep == n_steps:  # the first (log-domain) step is kept too
        return (u, v), tuple(jnp.concatenate([a[None], b], 0) for a, b in zip(first, rest))
    return before[:2], rest


def _scaling_base_log_tail(ops: BandOps, band, spk, dots, raw_spk, sup: Support, cfg, zeros, history: bool):
    """The T + R steps of one eps from zero, the base in the scaling domain (a multiply-add per
    band entry), the tail in the log domain: the adjoint differentiates log-domain steps, and
    at cold scores (|S| / eps in the hundreds) the scaling domain's rounding of the tail's
    potentials broke the cancellation of its O(1) terms (docs/design.md §3.5). Returns (the
    base's end (u, v), its every step's (u, v) with ``history`` else None, the tail's (û, u, v))."""
    t = cfg.base_steps
    if t:
        before, kept = run_steps_scaling(ops, band, spk, sup, t, zeros, zeros, keep=None if history else 0,
                                         unroll=cfg.unroll)
        base, base_hist = ((kept[1][-1], kept[2][-1]), kept[1:]) if history else (before, None)
    else:
        empty = jnp.zeros((0,) + zeros.shape, zeros.dtype)
        base, base_hist = (zeros, zeros), ((empty, empty) if history else None)
    _, tail = run_steps(ops, dots, raw_spk, sup, step_eps(cfg, base=False), *base, unroll=cfg.unroll)
    return base, base_hist, tail


def run_steps_fused(ops: BandOps, band, spk: Spokes | None, sup: Support, n_steps: int, u, v, *,
                    keep: int | None = None, unroll: bool = False, one_pass: bool = False):
    """``run_steps`` at one eps, each step two kernels that compute the potentials and the
    centering themselves (``TransportConfig.fused_steps``). ``ops`` must be the stored-band
    backend (``pallas_ops.StoredBandOps``): ``row_half_step``, ``col_half_step``,
    ``dustbin_partials``, ``one_pass_step`` and ``one_pass_pad`` are its own, outside the
    ``BandOps`` protocol. The carry is the real lines' potentials ``[N, Lp]``, the dustbin's
    ``[N]`` (0 without spokes) and, with spokes, the dustbin row's line as per-block partial
    LSEs (``pallas_gpu.SpokeLines``): the kernels fold each line's dustbin entry into its LSE
    and solve the dustbin lines themselves, so a step stays two launches. Same steps as
    ``run_steps`` up to rounding (sums and LSEs are taken per line block); returns as
    ``run_steps``. ``one_pass``: each step reads the band once (``one_pass_step``; no spokes),
    the carry padded as it reads it (``one_pass_pad`` zeros each side)."""
    from pfamalign.kernels.pallas_gpu import SpokeLines

    keep = n_steps if keep is None else keep
    lp = u.shape[-1] - 1
    n_rows = jnp.maximum(jnp.sum(sup.rows, -1, keepdims=True), 1)  # the dustbin row included
    weight_ext = jnp.where(sup.rows, 1.0 / n_rows, 0.0).astype(u.dtype)
    weight = weight_ext[:, :lp]
    if one_pass and spk is not None:
        raise ValueError("one-pass steps take no dustbin spokes")

    def two_walks(carry, _):
        # The previous potentials let each walk take one pass (they guess its LSE; the result
        # does not depend on them). The kernels read them as they are: no XLA op, no launch.
        # A free side's potential is 0 (kappa = 0): it guesses nothing, its walk is the exact one.
        u_prev, v_prev, u_db, v_db, partials = carry
        guess = lambda prev, kappa: prev if kappa > 0 else None
        row_spoke = col_spoke = None
        if spk is not None:
            row_spoke = SpokeLines(spk.col, partials, v_db, spk.corner, sup.log_rows[:, -1])
        row = ops.row_half_step(band, v_prev, weight, sup.kappa_rows, sup.centered, guess(u_prev, sup.kappa_rows),
                                row_spoke)
        row = row if isinstance(row, tuple) else (row,)
        u_hat, shares = row[0], row[1] if sup.centered else None
        u_hat_db = u_db
        if spk is not None:
            partials, u_hat_db = row[-2:]
            col_spoke = SpokeLines(spk.row, partials, u_hat_db, spk.corner, sup.log_cols[:, -1], weight_ext[:, -1])
        cols = ops.col_half_step(band, u_hat, shares, weight, sup.kappa_cols, sup.centered,
                                 guess(v_prev, sup.kappa_cols), col_spoke)
        cols = cols if isinstance(cols, tuple) else (cols,)
        u_c, v_c = cols[:2] if sup.centered else (u_hat, cols[0])
        if spk is not None:
            partials, u_db, v_db = cols[-3:]
        return (u_c, v_c, u_db, v_db, partials), (u_hat, u_hat_db, u_c, v_c, u_db, v_db)

    def one_pass_walk(carry, _):  # û as two_walks gives it; u and v padded
        u_hat, u_c, v_c = ops.one_pass_step(band, carry[1], weight, sup.kappa_rows, sup.kappa_cols,
                                            sup.centered)
        zero = carry[2]
        return (u_c, v_c, zero, zero, carry[4]), (u_hat, zero, u_c, v_c, zero, zero)

    ext = lambda x, db: jnp.concatenate([x, db[..., None]], -1)
    # the dustbin row's line before the first step, over the columns' potentials v
    partials = (ops.dustbin_partials(spk.row + v[..., :lp]) if spk is not None
                else jnp.zeros(u.shape[:1] + (0,), u.dtype))
    start, unpad, step = (u[..., :lp], v[..., :lp], u[..., -1], v[..., -1], partials), lambda x: x, two_walks
    if one_pass:
        pad = ops.one_pass_pad()
        unpad, step = (lambda x: x[..., pad:pad + lp]), one_pass_walk
        start = tuple(jnp.pad(x, ((0, 0), (pad, pad))) for x in start[:2]) + start[2:]
    (u_end, v_end, u_db, v_db, _), kept = _scan_keeping(step, start, n_steps, keep, unroll=unroll)
    u_hat, u_hat_db, u_kept, v_kept, u_kept_db, v_kept_db = kept
    return ((ext(unpad(u_end), u_db), ext(unpad(v_end), v_db)),
            (ext(u_hat, u_hat_db), ext(unpad(u_kept), u_kept_db), ext(unpad(v_kept), v_kept_db)))


def solve(spec: Spec, flat: Flat):
    """Base + tail. Returns (Solution, (u_hist, v_hist) or None, band at eps, spokes).

    No gradient is taken through this function on the banded paths (the custom VJP uses only
    the stored tail potentials), which is what makes the base "stopped". Only the R tail
    steps' potentials are kept unless the history is asked for.
    """
    ops, cfg = make_ops(spec), spec.cfg
    sup = support(flat, spec)
    dots, raw_spk = extended_scores(ops, spec, flat)
    n, lp1 = flat.q.shape[0], flat.q.shape[1] + 1
    zeros = jnp.zeros((n, lp1), flat.q.dtype)
    t, r = cfg.base_steps, cfg.tail_steps
    band, spk = at_eps(ops, dots, raw_spk, float(1.0 / cfg.eps))
    keep = None if spec.history else r  # the history needs every step's potentials
    if cfg.tol is not None:
        u_b, v_b, steps, (hu, hv) = _base_to_tol(ops, band, spk, sup, cfg.tol, cfg.max_steps, zeros)
        _, tail = run_steps(ops, dots, raw_spk, sup, step_eps(cfg, base=False), u_b, v_b, unroll=cfg.unroll)
        base_end, base_hist = (u_b, v_b), (hu, hv)
    else:
        fused = cfg.fused_steps and cfg.fusable()
        if not fused and ops.keeps_plans and cfg.eps_schedule is None and t + r > 1 and not cfg.branch_free:
            base_end, base_hist, tail = _scaling_base_log_tail(ops, band, spk, dots, raw_spk, sup, cfg, zeros,
                                                               history=keep is None)
        else:
            if fused:
                before, kept = run_steps_fused(ops, band, spk, sup, t + r, zeros, zeros, keep=keep, unroll=cfg.unroll,
                                               one_pass=cfg.one_pass_steps)
            else:
                before, kept = run_steps(ops, dots, raw_spk, sup, step_eps(cfg), zeros, zeros, keep=keep,
                                         unroll=cfg.unroll)
            if keep is None:  # every step kept: the base's, then the tail's
                base_end = (kept[1][t - 1], kept[2][t - 1]) if t else (zeros, zeros)
                base_hist, tail = (kept[1][:t], kept[2][:t]), tuple(x[t:] for x in kept)
            else:
                base_end, base_hist, tail = before, None, kept
        steps = jnp.full((n,), t, jnp.int32)
    u_hat, u_tail, v_tail = tail
    u_final, v_final = (u_tail[-1], v_tail[-1]) if r else base_end
    sol = Solution(base_end[1], u_hat, u_tail, v_tail, u_final, v_final, steps)
    history = None
    if spec.history:  # [T + R, N, Lp + 1] (T = max_steps with tol)
        history = (jnp.concatenate([base_hist[0], u_tail]), jnp.concatenate([base_hist[1], v_tail]))
    return sol, history, band, spk


# ---- plan products on the extended support --------------------------------------------------


class _ExtPlan(NamedTuple):
    band: object  # backend plan on the band
    spk: Spokes | None  # plan entries on the spokes (0 where inactive); None: no dustbin


def _plan(ops, band, spk: Spokes | None, u, v) -> _ExtPlan:
    band_plan = ops.plan(band, u[:, :-1], v[:, :-1])
    if spk is None:
        return _ExtPlan(band_plan, None)
    return _ExtPlan(band_plan, Spokes(jnp.exp(spk.col + u[:, :-1] + v[:, -1:]),
                                      jnp.exp(spk.row + u[:, -1:] + v[:, :-1]),
                                      jnp.exp(spk.corner + u[:, -1] + v[:, -1])))


def _real(*xs):
    """The real lines ``[N, Lp, ...]`` of extended operands ``[N, Lp + 1, ...]`` (None stays)."""
    return tuple(None if a is None else a[:, :-1] for a in xs)


def _modulated_spokes(p: _ExtPlan, x, z) -> Spokes | None:
    """The spoke plan entries times ``<x_i, z_j>`` (as they are without x and z, or spokes)."""
    if x is None or p.spk is None:
        return p.spk
    inner = lambda a, b: jnp.sum(a * b, -1)
    return Spokes(p.spk.col * inner(x[:, :-1], z[:, -1:]), p.spk.row * inner(x[:, -1:], z[:, :-1]),
                  p.spk.corner * inner(x[:, -1], z[:, -1]))


def _with_spokes(real, to_slot, from_slot, corner, y):
    """Completes a band product ``real [N, Lp, m]`` of ``y [N, Lp + 1, m]`` on the extended
    support: real line l gains ``to_slot[l] y[slot]``, and the dustbin line is
    ``Σ_l from_slot[l] y[l] + corner y[slot]``. Returns ``[N, Lp + 1, m]``. Spokes None (no
    dustbin): the dustbin line is 0."""
    if to_slot is None:
        return jnp.concatenate([real, jnp.zeros_like(real[:, :1])], 1)
    real = real + to_slot[..., None] * y[:, -1:]
    db = einsum("nl,nlm->nm", from_slot, y[:, :-1]) + corner[:, None] * y[:, -1]
    return jnp.concatenate([real, _unfused(db)[:, None]], 1)


def _ext_rows(ops, p: _ExtPlan, y, x=None, z=None):
    """``out_i = Σ_j P_ij <x_i, z_j> y_j`` over the extended support; y, z on columns."""
    w = _modulated_spokes(p, x, z) or _NO_SPOKES
    return _with_spokes(ops.plan_rows(p.band, *_real(y, x, z)), w.col, w.row, w.corner, y)


def _ext_cols(ops, p: _ExtPlan, y, x=None, z=None):
    """``out_j = Σ_i P_ij <x_i, z_j> y_i`` over the extended support; y, x on rows. The row
    product of the transposed plan: the dustbin row and column trade places."""
    w = _modulated_spokes(p, x, z) or _NO_SPOKES
    return _with_spokes(ops.plan_cols(p.band, *_real(y, x, z)), w.row, w.col, w.corner, y)


def _ext_modulated(ops, p: _ExtPlan, x, z, y_cols, y_rows):
    """``(_ext_rows(ops, p, y_cols, x, z), _ext_cols(ops, p, y_rows, x, z))``: the band's two
    products from ``ops.modulated_products``, which may form the modulated plan once."""
    w = _modulated_spokes(p, x, z) or _NO_SPOKES
    rows, cols = ops.modulated_products(p.band, *_real(x, z, y_cols, y_rows))
    return (_with_spokes(rows, w.col, w.row, w.corner, y_cols), _with_spokes(cols, w.row, w.col, w.corner, y_rows))


def _ext(x, token):  # [N, Lp, m], [N, m] -> [N, Lp + 1, m]
    return jnp.concatenate([x, token[:, None]], 1)


def output(ops: BandOps, band, spk, sol: Solution, flat: Flat):
    """O = P V for the real rows ``[N, Lp, dv]`` (the dustbin row's output is not returned)."""
    p = _plan(ops, band, spk, sol.u_final, sol.v_final)
    return _ext_rows(ops, p, _ext(flat.v, flat.tv))[:, :-1]


def _target_entries(spec: Spec, flat: Flat):
    """Which rows have a target inside the support, the clipped target, and k at the target."""
    lp = flat.q.shape[1]
    t = flat.target
    tc = jnp.clip(t, 0, lp)
    col_ok = jnp.where(t == lp, spec.has_spokes,
                       jnp.take_along_axis(flat.col_active, jnp.minimum(tc, lp - 1), -1)
                       & (jnp.abs(tc - jnp.arange(lp)) <= spec.geom.half_band))
    valid = (t >= 0) & flat.row_active & col_ok
    k_t = jnp.take_along_axis(_ext(flat.k, flat.tk), tc[..., None], 1)  # [N, Lp, d]
    return valid, tc, k_t


def target_logp(spec: Spec, flat: Flat, sol: Solution, eps):
    """log P_{i, t_i} = S_{i,t_i} + u_i + v_{t_i} ``[N, Lp]``; -inf where the target entry is
    outside the support (or absent). Computed in the log domain: finite however small P is."""
    valid, tc, k_t = _target_entries(spec, flat)
    s_t = jnp.sum(flat.q * k_t, -1) * _scale(flat, eps)
    logp = s_t + sol.u_final[:, :-1] + jnp.take_along_axis(sol.v_final, tc, -1)
    return jnp.where(valid, logp, -jnp.inf)


# ---- the exact tail adjoint -----------------------------------------------------------------


def _balanced_exp(a, b, rows_ok, cols_ok):
    """e^a, e^b with a constant moved between them so neither factor over/underflows alone."""
    ma = jnp.max(jnp.where(rows_ok, a, -jnp.inf), -1, keepdims=True)
    mb = jnp.max(jnp.where(cols_ok, b, -jnp.inf), -1, keepdims=True)
    c = jnp.where(jnp.isfinite(ma) & jnp.isfinite(mb), 0.5 * (ma - mb), 0.0)
    return jnp.where(rows_ok, jnp.exp(a - c), 0.0), jnp.where(cols_ok, jnp.exp(b + c), 0.0)


def _products(ops, p: _ExtPlan):
    """Row and column products ``P y`` and ``P^T y`` of a plan with vectors y ``[N, Lp + 1]``."""
    rows = lambda y: _ext_rows(ops, p, y[..., None])[..., 0]
    cols = lambda y: _ext_cols(ops, p, y[..., None])[..., 0]
    return rows, cols


def _v_before(sol: Solution):
    """v^{r-1} for r = 1..R ``[R, N, Lp + 1]``: the stopped base v^0, then the tail's own."""
    return jnp.concatenate([sol.v0[None], sol.v], 0)[:-1]


class _Seed(NamedTuple):
    """Where both adjoint schedules start: the output plan and the cotangents at step R."""

    p: _ExtPlan  # the output plan P = B^R
    g: jax.Array  # [N, Lp + 1, dv] output cotangent dO (0 on the dustbin row)
    v: jax.Array  # [N, Lp + 1, dv] values V (the dustbin column's last)
    u_bar: jax.Array  # [N, Lp + 1] adjoint of u^R: row sums of P∘G (+ the targets')
    v_bar: jax.Array  # [N, Lp + 1] adjoint of v^R: column sums of P∘G (+ the targets')


# False: the adjoint divides by the line sums' exact-arithmetic values (``_target_line_sums``),
# as when the kernels were measured on an H100 (2026-11-24: scripts/triton_static_cost.py's
# calibration traces the op so, without the two products). Read at trace time.
COMPUTED_LINE_SUMS = True


def _target_line_sums(sup: Support, sol: Solution):
    """The tail plans' line sums in exact arithmetic ``[R, N, Lp + 1]``: the targets on a
    constrained side, the fixed point ``a exp(-pot (1 - kappa) / kappa)`` on a damped one
    (rows of A^r from û, columns of B^r from v: no centering then); 1 on a free side (unused)."""
    def side(log_t, pot, kappa):
        if kappa in (0.0, 1.0):
            return jnp.broadcast_to(jnp.exp(log_t), pot.shape)
        return jnp.exp(log_t - pot * (1 - kappa) / kappa)
    return side(sup.log_rows, sol.u_hat, sup.kappa_rows), side(sup.log_cols, sol.v, sup.kappa_cols)


def _half_step_weights(sup: Support, row_sums, col_sums):
    """``kappa / (line sum)`` of each tail half step's plan ``[R, N, Lp + 1]``: d û_i / d S_ij
    = -kappa_a A_ij / r_i with r the row sums of A^r, and likewise the columns of B^r; a free
    side (kappa 0) contributes nothing. The sums are the plans' as the adjoint's products
    compute them (``row_sums``, ``col_sums``), not what they equal in exact arithmetic (the
    targets; a damped side's fixed point): at cold scores (|S| / eps in the thousands) a plan
    entry carries a rounding of u |S| / eps in its exponent, its line sums are that far off
    their targets, and dividing by the targets left the adjoint's cancellations that far off
    too (dq 0.25 from float64 at eps 1e-3, T 0, where dense f32 autodiff is 2.5e-4; with the
    computed sums 6.7e-4; at T 4 0.12 -> 0.0079 against dense's 0.018; 2026-11-30)."""
    def side(sums, has, kappa):
        if kappa == 0.0:
            return jnp.zeros_like(sums)
        ok = has & (sums > 0)
        return jnp.where(ok, kappa / jnp.where(ok, sums, 1.0), 0.0)
    return side(row_sums, sup.rows, sup.kappa_rows), side(col_sums, sup.cols, sup.kappa_cols)


def _reverse_sweep(sup: Support, sol: Solution, seed: _Seed, xs, products, weights, unroll: bool):
    """The recursion r = R..1 of the module docstring, for either schedule: ``products(xs[r])``
    gives ``y -> B^r y`` and ``y -> A^{rT} y`` (``unroll``: straight-line steps). Returns eta
    (the adjoint of v^0) and the stacked α_r, β_r ``[R, N, Lp + 1]``, already multiplied by
    ``weights`` (``_half_step_weights``: kappa over the plans' line sums, which enter the
    half-step derivatives as d û_i / d S_ij = -kappa A_ij / r_i)."""
    n_rows = jnp.maximum(jnp.sum(sup.rows, -1, keepdims=True), 1)

    def step(carry, xs_r):
        (u_bar, v_bar), (xs_r, inv_a, inv_b) = carry, xs_r
        b_rows, a_cols = products(xs_r)
        c_bar = _unfused(jnp.sum(jnp.where(sup.cols, v_bar, 0.0), -1, keepdims=True) - jnp.sum(
            jnp.where(sup.rows, u_bar, 0.0), -1, keepdims=True))  # the centering ledger
        beta = v_bar
        shift = c_bar / n_rows if sup.centered else 0.0
        alpha = jnp.where(sup.rows, u_bar + shift, 0.0) - b_rows(beta * inv_b)
        return (jnp.zeros_like(u_bar), -a_cols(alpha * inv_a)), (alpha * inv_a, beta * inv_b)

    (_, eta), (alphas, betas) = jax.lax.scan(step, (seed.u_bar, seed.v_bar), (xs, *weights), reverse=True,
                                             unroll=unroll)
    return eta, alphas, betas


def _one_reference_adjoint(ops, sup: Support, sol: Solution, seed: _Seed, q_ext, k_ext, unroll: bool):
    """The one-reference schedule: ``A^r = diag(eA_u) P diag(eA_v)``, ``B^r = diag(eB_u) P
    diag(eB_v)``, so every product is a product with P and ``dS = P ∘ <X_i, Z_j>``.

    Returns ``Σ_j dS_ij k_j``, ``Σ_i dS_ij q_i`` (at unit score scale) and eta."""
    scales = (_balanced_exp(sol.u_hat - sol.u_final, _v_before(sol) - sol.v_final, sup.rows, sup.cols)
              + _balanced_exp(sol.u - sol.u_final, sol.v - sol.v_final, sup.rows, sup.cols))
    p_rows, p_cols = _products(ops, seed.p)

    def products(xs_r):
        ea_u, ea_v, eb_u, eb_v = xs_r
        return (lambda y: eb_u * p_rows(eb_v * y)), (lambda y: ea_v * p_cols(ea_u * y))

    ea_u, ea_v, eb_u, eb_v = (jnp.moveaxis(x, 0, -1) for x in scales)  # [N, Lp + 1, R]
    # the tail plans' line sums, all R at once: rows of A^r = eA_u (P eA_v), columns of B^r
    if COMPUTED_LINE_SUMS:
        sums = (ea_u * _ext_rows(ops, seed.p, ea_v), eb_v * _ext_cols(ops, seed.p, eb_u))
        sums = tuple(jnp.moveaxis(x, -1, 0) for x in sums)
    else:
        sums = _target_line_sums(sup, sol)
    weights = _half_step_weights(sup, *sums)
    eta, alphas, betas = _reverse_sweep(sup, sol, seed, scales, products, weights, unroll)
    # dS = P ∘ <X_i, Z_j>: X = [dO, -α_r eA_u, -eB_u], Z = [V, eA_v, β_r eB_v].
    al, be = jnp.moveaxis(alphas, 0, -1), jnp.moveaxis(betas, 0, -1)
    x = jnp.concatenate([seed.g, -al * ea_u, -eb_u], -1)
    z = jnp.concatenate([seed.v, ea_v, be * eb_v], -1)
    return (*_ext_modulated(ops, seed.p, x, z, k_ext, q_ext), eta)


def _four_plan_adjoint(ops, band, spk: Spokes, sup: Support, sol: Solution, seed: _Seed, q_ext, k_ext,
                       unroll: bool):
    """The direct baseline: every tail plan exponentiated on its own (2R + 1 exponentials per
    entry), ``dS = P∘G - Σ_r [A^r ∘ (α_r ⊗ 1) + B^r ∘ (1 ⊗ β_r)]``. Returns as
    ``_one_reference_adjoint``."""
    pots = (sol.u_hat, _v_before(sol), sol.u, sol.v)  # per r: A^r's (û^r, v^{r-1}), B^r's (u^r, v^r)
    tail_plans = lambda u_hat, v_prev, u, v: (_plan(ops, band, spk, u_hat, v_prev),
                                             _plan(ops, band, spk, u, v))

    def products(xs_r):
        a_plan, b_plan = tail_plans(*xs_r)
        return _products(ops, b_plan)[0], _products(ops, a_plan)[1]

    plans = [tail_plans(*(x[r] for x in pots)) for r in range(sol.u.shape[0])]  # (A^r, B^r)
    if COMPUTED_LINE_SUMS:
        ones = jnp.ones_like(sol.u_final)
        sums = [(_products(ops, a)[0](ones), _products(ops, b)[1](ones)) for a, b in plans]
        sums = tuple(jnp.stack(x) for x in zip(*sums)) if sums else (jnp.zeros_like(sol.u),) * 2  # R = 0
    else:
        sums = _target_line_sums(sup, sol)
    weights = _half_step_weights(sup, *sums)
    eta, alphas, betas = _reverse_sweep(sup, sol, seed, pots, products, weights, unroll)
    dq, dk = _ext_modulated(ops, seed.p, seed.g, seed.v, k_ext, q_ext)
    for r, (a_plan, b_plan) in enumerate(plans):
        al, be = alphas[r][..., None], betas[r][..., None]
        dq -= al * _ext_rows(ops, a_plan, k_ext) + _ext_rows(ops, b_plan, be * k_ext)
        dk -= _ext_cols(ops, a_plan, al * q_ext) + be * _ext_cols(ops, b_plan, q_ext)
    return dq, dk, eta


def adjoint(spec: Spec, flat: Flat, sol: Solution, band, spk, out, g_out, g_logp=None):
    """Cotangents of (q, k, v, tq, tk, tv) for the output cotangent ``g_out [N, Lp, dv]`` and
    the cotangent ``g_logp [N, Lp]`` of the target log-plan entries (None: no targets), by the
    schedule ``spec.cfg.adjoint`` names.

    A target entry adds ``g`` to the score cotangent at (i, t_i) (``P ∘ (g / P) = g``: no
    division, the log domain carries it) and to the row and column sums at the last step.

    Also returns eta, the adjoint of the stopped base potential v^0 (the part the stopped
    gradient drops; the bias certificate pushes it through the base).
    """
    ops, sup = make_ops(spec), support(flat, spec)
    n = g_out.shape[0]
    g_out = jnp.where(flat.row_active[..., None], g_out, 0.0)
    g_ext = _ext(g_out, jnp.zeros((n, g_out.shape[-1]), g_out.dtype))  # dustbin row: no output
    v_ext = _ext(flat.v, flat.tv)
    p = _plan(ops, band, spk, sol.u_final, sol.v_final)
    dv_ext = _ext_cols(ops, p, g_ext)  # P^T dO
    o_ext = _ext(out, jnp.zeros((n, out.shape[-1]), out.dtype))
    u_bar = jnp.sum(g_ext * o_ext, -1)  # row sums of P∘G
    v_bar = jnp.sum(v_ext * dv_ext, -1)  # column sums of P∘G
    if g_logp is not None:
        valid, tc, k_t = _target_entries(spec, flat)
        g_t = jnp.where(valid, g_logp, 0.0)  # [N, Lp]
        u_bar = u_bar.at[:, :-1].add(g_t)
        v_bar = jax.vmap(lambda vb, t, g: vb.at[t].add(g))(v_bar, tc, g_t)
    seed = _Seed(p, g_ext, v_ext, u_bar, v_bar)
    q_ext, k_ext = _ext(flat.q, flat.tq), _ext(flat.k, flat.tk)
    if spec.cfg.adjoint == "one_reference":
        dq_ext, dk_ext, eta = _one_reference_adjoint(ops, sup, sol, seed, q_ext, k_ext, spec.cfg.unroll)
    else:
        dq_ext, dk_ext, eta = _four_plan_adjoint(ops, band, spk, sup, sol, seed, q_ext, k_ext, spec.cfg.unroll)
    scale = _scale(flat, spec.cfg.eps)
    dq_ext, dk_ext = scale * dq_ext, scale * dk_ext
    if g_logp is not None:  # the sparse target entries of the score cotangent
        dq_ext = dq_ext.at[:, :-1].add(scale * g_t[..., None] * k_t)
        dk_ext = jax.vmap(lambda dk, t, x: dk.at[t].add(x))(dk_ext, tc, scale * g_t[..., None] * flat.q)
    grads = (dq_ext[:, :-1], dk_ext[:, :-1], dv_ext[:, :-1], dq_ext[:, -1], dk_ext[:, -1], dv_ext[:, -1])
    if not spec.has_spokes:
        grads = grads[:3] + tuple(jnp.zeros_like(g) for g in grads[3:])
    return grads, eta


# ---- the differentiable op ------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def banded_transport(spec: Spec, flat: Flat):
    """Returns (O [N, Lp, dv], target log-plan [N, Lp], potential history or None, stats or
    None): stats = (base steps [N], row error [N], column error [N]) of the output plan
    (``marginal_errors``). No gradient flows into the history or the stats (diagnostics)."""
    return _fwd(spec, flat)[0]


def _fwd(spec, flat):
    sol, hist, band, spk = solve(spec, flat)
    out = output(make_ops(spec), band, spk, sol, flat)
    logp = target_logp(spec, flat, sol, spec.cfg.eps)
    stats = None
    if spec.stats:
        errs = marginal_errors(make_ops(spec), band, spk, support(flat, spec), sol.u_final, sol.v_final)
        stats = (sol.steps, *errs)
    # Resident scores keep their stored band for the backward (O(L W) memory until then, which
    # they hold anyway); the other backends recompute it there (one matmul over the band) and
    # keep O(L) residuals.
    kept = (band, spk) if spec.cfg.resident_scores else None
    return (out, logp, hist, stats), (flat, sol, out, kept)


def _bwd(spec, res, cotangents):
    flat, sol, out, kept = res
    g_out, g_logp, _, _ = cotangents  # the history's and the stats' cotangents are ignored
    if kept is not None:
        band, spk = kept
    else:  # recomputed as the forward computed it (at_eps), so that the plans are the same
        ops = make_ops(spec)
        band, spk = at_eps(ops, *extended_scores(ops, spec, flat), float(1.0 / spec.cfg.eps))
    grads, _ = adjoint(spec, flat, sol, band, spk, out, g_out, g_logp)
    return (Flat(*grads, None, None, None),)


banded_transport.defvjp(_fwd, _bwd)
