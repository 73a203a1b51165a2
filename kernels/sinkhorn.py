"""The banded Sinkhorn solve and its exact tail adjoint, written once for every backend.

A backend (``XlaBandOps`` or ``PallasBandOps``) supplies six banded primitives — ``scores``,
``rescale``, ``row_lse``, ``col_lse``, ``plan``, ``plan_rows``, ``plan_cols`` — and this module
adds the dustbin spokes (O(L) vectors), the potentials, centering, the stopped base, the
R-step tail and the custom VJP.

Extended index space: potentials are ``[N, Lp + 1]``; slot ``Lp`` is the dustbin row (for u)
or column (for v). Without a dustbin those slots have no support and stay 0.

Tail (r = 1..R, from the stopped base potential v^0):
    û^r = -LSE_row(S + v^{r-1}),  v̂^r = -LSE_col(S + û^r),
    c_r = mean over supported rows of û^r,  u^r = û^r - c_r,  v^r = v̂^r + c_r.
Plans: row plans A^r = exp(S + û^r ⊕ v^{r-1}), column plans B^r = exp(S + u^r ⊕ v^r),
output plan P = B^R, output O = P V.

Adjoint (seed paper Prop. 1): with G_ij = <dO_i, V_j>,
    dS = P∘G - Σ_r [A^r ∘ (α_r ⊗ 1) + B^r ∘ (1 ⊗ β_r)],
where, going r = R..1 with ū (adjoint of u^r; R(P∘G) at r = R, else 0) and v̄ (adjoint of
v^r; C(P∘G) at r = R, else the previous -A^{r+1 T} α_{r+1}):
    c̄ = Σ v̄ - Σ ū  (the centering ledger: 0 up to rounding, kept exact),
    β_r = v̄,   α_r = ū + c̄ / n_rows - B^r β_r,   v̄ ← -A^{rT} α_r.
One-reference schedule (Prop. 2 / the orbit identity, Prop. 6): every tail plan is a
diagonal rescaling of P, ``A^r = diag(e^{a_u}) P diag(e^{a_v})``, so every product above is a
product with P and the whole dS is ``P ∘ <X_i, Z_j>`` for a rank-(dv + 2R) factorisation:
one exponential per entry instead of 2R + 1.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pfamalign.kernels.band import BandGeometry
from pfamalign.kernels.config import TransportConfig


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


class Spokes(NamedTuple):
    """Scores (or plan entries) on the dustbin row and column; -inf (0) where inactive."""

    col: jax.Array  # [N, Lp]  entry (i, dustbin column)
    row: jax.Array  # [N, Lp]  entry (dustbin row, j)
    corner: jax.Array  # [N]   entry (dustbin row, dustbin column)


class Support(NamedTuple):
    rows: jax.Array  # [N, Lp + 1] bool: row has at least one entry
    cols: jax.Array  # [N, Lp + 1] bool


class Solution(NamedTuple):
    """Everything the backward needs besides the inputs: O(L) vectors per problem."""

    v0: jax.Array  # [N, Lp + 1]      stopped base column potential
    u_hat: jax.Array  # [R, N, Lp + 1] tail row potentials before centering
    u: jax.Array  # [R, N, Lp + 1]     tail row potentials, centered
    v: jax.Array  # [R, N, Lp + 1]     tail column potentials, centered
    u_final: jax.Array  # [N, Lp + 1]  potentials of the output plan
    v_final: jax.Array  # [N, Lp + 1]


class Spec(NamedTuple):
    """Static description of one op instance."""

    cfg: TransportConfig
    geom: BandGeometry
    has_dustbin: bool
    history: bool


def make_ops(spec: Spec):
    if spec.cfg.impl == "pallas":
        from pfamalign.kernels.pallas_ops import PallasBandOps

        return PallasBandOps(spec.geom, interpret=spec.cfg.interpret)
    from pfamalign.kernels.banded_xla import XlaBandOps

    return XlaBandOps(spec.geom)


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
    rows = _band_has_entry(flat.row_active, flat.col_active, w)
    cols = _band_has_entry(flat.col_active, flat.row_active, w)
    db = jnp.full(rows.shape[:1] + (1,), spec.has_dustbin)
    if spec.has_dustbin:
        rows, cols = rows | flat.row_active, cols | flat.col_active
    return Support(jnp.concatenate([rows, db], -1), jnp.concatenate([cols, db], -1))


def spoke_scores(flat: Flat, spec: Spec, scale) -> Spokes:
    n = flat.q.shape[0]
    if not spec.has_dustbin:
        off = jnp.full(flat.row_active.shape, -jnp.inf, flat.q.dtype)
        return Spokes(off, off, jnp.full((n,), -jnp.inf, flat.q.dtype))
    col = jnp.einsum("nid,nd->ni", flat.q, flat.tk) * scale
    row = jnp.einsum("nd,njd->nj", flat.tq, flat.k) * scale
    corner = jnp.einsum("nd,nd->n", flat.tq, flat.tk) * scale
    return Spokes(jnp.where(flat.row_active, col, -jnp.inf), jnp.where(flat.col_active, row, -jnp.inf), corner)


def _neg_lse_or_zero(lse):
    return jnp.where(jnp.isfinite(lse), -lse, 0.0)


def _row_half(ops, band, spk: Spokes, v):
    """û = -LSE_row(S + v) on the extended support."""
    real = jnp.logaddexp(ops.row_lse(band, v[:, :-1]), spk.col + v[:, -1:])
    db = jnp.logaddexp(jax.nn.logsumexp(spk.row + v[:, :-1], axis=-1), spk.corner + v[:, -1])
    return _neg_lse_or_zero(jnp.concatenate([real, db[:, None]], -1))


def _col_half(ops, band, spk: Spokes, u):
    """v̂ = -LSE_col(S + u) on the extended support."""
    real = jnp.logaddexp(ops.col_lse(band, u[:, :-1]), spk.row + u[:, -1:])
    db = jnp.logaddexp(jax.nn.logsumexp(spk.col + u[:, :-1], axis=-1), spk.corner + u[:, -1])
    return _neg_lse_or_zero(jnp.concatenate([real, db[:, None]], -1))


def _full_step(ops, band, spk, sup: Support, v):
    """One centered Sinkhorn step: returns (û, u, v)."""
    u_hat = _row_half(ops, band, spk, v)
    v_hat = _col_half(ops, band, spk, u_hat)
    n_rows = jnp.maximum(jnp.sum(sup.rows, -1, keepdims=True), 1)
    c = jnp.sum(jnp.where(sup.rows, u_hat, 0.0), -1, keepdims=True) / n_rows
    return u_hat, jnp.where(sup.rows, u_hat - c, 0.0), jnp.where(sup.cols, v_hat + c, 0.0)


# ---- forward ---------------------------------------------------------------------------------


def _scale(flat: Flat, eps):
    return 1.0 / (jnp.sqrt(jnp.asarray(flat.q.shape[-1], flat.q.dtype)) * eps)


def solve(spec: Spec, flat: Flat):
    """Stopped base + tail. Returns (Solution, (u_hist, v_hist) or None, band at eps, spokes)."""
    ops, cfg = make_ops(spec), spec.cfg
    sup = support(flat, spec)
    dots = ops.scores(flat.q, flat.k, flat.row_active, flat.col_active, _scale(flat, 1.0))
    raw_spk = spoke_scores(flat, spec, _scale(flat, 1.0))
    n, lp1 = flat.q.shape[0], flat.q.shape[1] + 1
    zeros = jnp.zeros((n, lp1), flat.q.dtype)

    def scaled(eps):
        return ops.rescale(dots, 1.0 / eps), Spokes(*(x / eps for x in raw_spk))

    # Base: T steps under stop-gradient (no gradient is ever taken through it).
    v, u = zeros, zeros
    hist_u, hist_v, prev_eps = [], [], None
    for eps_s, steps in cfg.base_stages():
        if prev_eps is not None:
            v = v * (prev_eps / eps_s)  # keep eps * potential across stages
        prev_eps = eps_s
        if steps == 0:
            continue
        band_s, spk_s = scaled(eps_s)

        def body(carry, _, band_s=band_s, spk_s=spk_s):
            _, u_c, v_c = _full_step(ops, band_s, spk_s, sup, carry[1])
            return (u_c, v_c), (u_c, v_c) if spec.history else None

        (u, v), hist = jax.lax.scan(body, (u, v), None, length=steps)
        if spec.history:
            hist_u.append(hist[0])
            hist_v.append(hist[1])
    v0 = jax.lax.stop_gradient(v)
    u_base = jax.lax.stop_gradient(u)

    band, spk = scaled(cfg.eps)
    tail = []
    v_prev = v0
    for _ in range(cfg.tail_steps):
        step = _full_step(ops, band, spk, sup, v_prev)
        tail.append(step)
        v_prev = step[2]
    if tail:
        u_hat, u_t, v_t = (jnp.stack(x) for x in zip(*tail))
        u_final, v_final = u_t[-1], v_t[-1]
        if spec.history:
            hist_u.append(u_t)
            hist_v.append(v_t)
    else:
        u_hat = u_t = v_t = jnp.zeros((0, n, lp1), flat.q.dtype)
        u_final, v_final = u_base, v0
    history = None
    if spec.history:
        cat = lambda xs: jnp.concatenate(xs, 0) if xs else jnp.zeros((0, n, lp1), flat.q.dtype)
        history = (cat(hist_u), cat(hist_v))  # [T + R, N, Lp + 1]
    return Solution(v0, u_hat, u_t, v_t, u_final, v_final), history, band, spk


# ---- plan products on the extended support --------------------------------------------------


class _ExtPlan(NamedTuple):
    band: object  # backend plan on the band
    spk: Spokes  # plan entries on the spokes (0 where inactive)


def _plan(ops, band, spk: Spokes, u, v) -> _ExtPlan:
    return _ExtPlan(
        ops.plan(band, u[:, :-1], v[:, :-1]),
        Spokes(jnp.exp(spk.col + u[:, :-1] + v[:, -1:]), jnp.exp(spk.row + u[:, -1:] + v[:, :-1]),
               jnp.exp(spk.corner + u[:, -1] + v[:, -1])),
    )


def _inner(x, z):
    return None if x is None else jnp.sum(x * z, -1)


def _ext_rows(ops, p: _ExtPlan, y, x=None, z=None):
    """``out_i = Σ_j P_ij <x_i, z_j> y_j`` over the extended support; y, z on columns."""
    cut = (lambda a: None if a is None else a[:, :-1])
    real = ops.plan_rows(p.band, y[:, :-1], cut(x), cut(z))
    w_col = p.spk.col if x is None else p.spk.col * _inner(x[:, :-1], z[:, -1:])  # [N, Lp]
    real = real + w_col[..., None] * y[:, -1:]
    w_row = p.spk.row if x is None else p.spk.row * _inner(x[:, -1:], z[:, :-1])
    w_cor = p.spk.corner if x is None else p.spk.corner * _inner(x[:, -1], z[:, -1])
    db = jnp.einsum("nj,njm->nm", w_row, y[:, :-1]) + w_cor[:, None] * y[:, -1]
    return jnp.concatenate([real, db[:, None]], 1)


def _ext_cols(ops, p: _ExtPlan, y, x=None, z=None):
    """``out_j = Σ_i P_ij <x_i, z_j> y_i`` over the extended support; y, x on rows."""
    cut = (lambda a: None if a is None else a[:, :-1])
    real = ops.plan_cols(p.band, y[:, :-1], cut(x), cut(z))
    w_row = p.spk.row if x is None else p.spk.row * _inner(x[:, -1:], z[:, :-1])
    real = real + w_row[..., None] * y[:, -1:]
    w_col = p.spk.col if x is None else p.spk.col * _inner(x[:, :-1], z[:, -1:])
    w_cor = p.spk.corner if x is None else p.spk.corner * _inner(x[:, -1], z[:, -1])
    db = jnp.einsum("ni,nim->nm", w_col, y[:, :-1]) + w_cor[:, None] * y[:, -1]
    return jnp.concatenate([real, db[:, None]], 1)


def _ext(x, token):  # [N, Lp, m], [N, m] -> [N, Lp + 1, m]
    return jnp.concatenate([x, token[:, None]], 1)


def output(ops, band, spk, sol: Solution, flat: Flat):
    """O = P V for the real rows ``[N, Lp, dv]`` (the dustbin row's output is not returned)."""
    p = _plan(ops, band, spk, sol.u_final, sol.v_final)
    return _ext_rows(ops, p, _ext(flat.v, flat.tv))[:, :-1]


# ---- the exact tail adjoint -----------------------------------------------------------------


def _balanced_exp(a, b, rows_ok, cols_ok):
    """e^a, e^b with a constant moved between them so neither factor over/underflows alone."""
    ma = jnp.max(jnp.where(rows_ok, a, -jnp.inf), -1, keepdims=True)
    mb = jnp.max(jnp.where(cols_ok, b, -jnp.inf), -1, keepdims=True)
    c = jnp.where(jnp.isfinite(ma) & jnp.isfinite(mb), 0.5 * (ma - mb), 0.0)
    return jnp.where(rows_ok, jnp.exp(a - c), 0.0), jnp.where(cols_ok, jnp.exp(b + c), 0.0)


class _TailPlans:
    """Products with the tail plans A^r, B^r: rescalings of P, or exponentiated one by one."""

    def __init__(self, ops, band, spk, sol: Solution, sup: Support, one_reference: bool):
        self.ops, self.sup, self.one_ref = ops, sup, one_reference
        self.p = _plan(ops, band, spk, sol.u_final, sol.v_final)
        v_before = jnp.concatenate([sol.v0[None], sol.v[:-1]], 0)  # v^{r-1}
        self.pots = {"A": (sol.u_hat, v_before), "B": (sol.u, sol.v)}
        if one_reference:
            self.scales = {
                key: [_balanced_exp(a[r] - sol.u_final, b[r] - sol.v_final, sup.rows, sup.cols)
                      for r in range(a.shape[0])]
                for key, (a, b) in self.pots.items()
            }
        else:
            self.plans = {key: [_plan(ops, band, spk, a[r], b[r]) for r in range(a.shape[0])]
                          for key, (a, b) in self.pots.items()}

    def rows(self, key, r, y):  # Σ_j plan_ij y_j, y [N, Lp + 1]
        if self.one_ref:
            ea, eb = self.scales[key][r]
            return ea * _ext_rows(self.ops, self.p, (eb * y)[..., None])[..., 0]
        return _ext_rows(self.ops, self.plans[key][r], y[..., None])[..., 0]

    def cols(self, key, r, y):  # Σ_i plan_ij y_i
        if self.one_ref:
            ea, eb = self.scales[key][r]
            return eb * _ext_cols(self.ops, self.p, (ea * y)[..., None])[..., 0]
        return _ext_cols(self.ops, self.plans[key][r], y[..., None])[..., 0]


def adjoint(spec: Spec, flat: Flat, sol: Solution, band, spk, out, g_out):
    """Cotangents of (q, k, v, tq, tk, tv) for the output cotangent ``g_out [N, Lp, dv]``.

    Also returns eta, the adjoint of the stopped base potential v^0 (the part the stopped
    gradient drops; the bias certificate pushes it through the base).
    """
    ops, cfg = make_ops(spec), spec.cfg
    sup = support(flat, spec)
    g_out = jnp.where(flat.row_active[..., None], g_out, 0.0)
    n = g_out.shape[0]
    g_ext = _ext(g_out, jnp.zeros((n, g_out.shape[-1]), g_out.dtype))  # dustbin row: no output
    v_ext = _ext(flat.v, flat.tv)
    tails = _TailPlans(ops, band, spk, sol, sup, cfg.adjoint == "one_reference")

    dv_ext = _ext_cols(ops, tails.p, g_ext)  # P^T dO
    o_ext = _ext(out, jnp.zeros((n, out.shape[-1]), out.dtype))
    u_bar = jnp.sum(g_ext * o_ext, -1)  # row sums of P∘G
    v_bar = jnp.sum(v_ext * dv_ext, -1)  # column sums of P∘G
    n_rows = jnp.maximum(jnp.sum(sup.rows, -1, keepdims=True), 1)
    alphas, betas = [None] * cfg.tail_steps, [None] * cfg.tail_steps
    for r in reversed(range(cfg.tail_steps)):
        c_bar = jnp.sum(jnp.where(sup.cols, v_bar, 0.0), -1, keepdims=True) - jnp.sum(
            jnp.where(sup.rows, u_bar, 0.0), -1, keepdims=True)
        beta = v_bar
        alpha = jnp.where(sup.rows, u_bar + c_bar / n_rows, 0.0) - tails.rows("B", r, beta)
        alphas[r], betas[r] = alpha, beta
        v_bar = -tails.cols("A", r, alpha)
        u_bar = jnp.zeros_like(u_bar)
    eta = v_bar

    scale = _scale(flat, cfg.eps)
    q_ext, k_ext = _ext(flat.q, flat.tq), _ext(flat.k, flat.tk)
    if tails.one_ref:
        # dS = P ∘ <X_i, Z_j>: X = [dO, -α_r e^{a_u}, -e^{b_u}], Z = [V, e^{a_v}, β_r e^{b_v}].
        xs, zs = [g_ext], [v_ext]
        for r in range(cfg.tail_steps):
            ea, eb = tails.scales["A"][r]
            xs.append(-(alphas[r] * ea)[..., None])
            zs.append(eb[..., None])
            ea, eb = tails.scales["B"][r]
            xs.append(-ea[..., None])
            zs.append((betas[r] * eb)[..., None])
        x, z = jnp.concatenate(xs, -1), jnp.concatenate(zs, -1)
        dq_ext = scale * _ext_rows(ops, tails.p, k_ext, x, z)
        dk_ext = scale * _ext_cols(ops, tails.p, q_ext, x, z)
    else:  # the direct schedule: one exponentiated plan per tail half-step
        dq_ext = _ext_rows(ops, tails.p, k_ext, g_ext, v_ext)
        dk_ext = _ext_cols(ops, tails.p, q_ext, g_ext, v_ext)
        for r in range(cfg.tail_steps):
            a_plan, b_plan = tails.plans["A"][r], tails.plans["B"][r]
            dq_ext -= alphas[r][..., None] * _ext_rows(ops, a_plan, k_ext)
            dq_ext -= _ext_rows(ops, b_plan, betas[r][..., None] * k_ext)
            dk_ext -= _ext_cols(ops, a_plan, alphas[r][..., None] * q_ext)
            dk_ext -= betas[r][..., None] * _ext_cols(ops, b_plan, q_ext)
        dq_ext, dk_ext = scale * dq_ext, scale * dk_ext
    grads = (dq_ext[:, :-1], dk_ext[:, :-1], dv_ext[:, :-1], dq_ext[:, -1], dk_ext[:, -1], dv_ext[:, -1])
    if not spec.has_dustbin:
        grads = grads[:3] + tuple(jnp.zeros_like(g) for g in grads[3:])
    return grads, eta


# ---- the differentiable op ------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def banded_transport(spec: Spec, flat: Flat):
    """Returns (O [N, Lp, dv], potential history or None). No gradient flows into the history."""
    sol, hist, band, spk = solve(spec, flat)
    return output(make_ops(spec), band, spk, sol, flat), hist


def _fwd(spec, flat):
    sol, hist, band, spk = solve(spec, flat)
    out = output(make_ops(spec), band, spk, sol, flat)
    return (out, hist), (flat, sol, out)


def _bwd(spec, res, cotangents):
    flat, sol, out = res
    g_out, _ = cotangents  # the history is a diagnostic: its cotangent is ignored
    # The score band is recomputed (one matmul over the band) rather than kept from forward.
    ops = make_ops(spec)
    band = ops.scores(flat.q, flat.k, flat.row_active, flat.col_active, _scale(flat, spec.cfg.eps))
    spk = spoke_scores(flat, spec, _scale(flat, spec.cfg.eps))
    grads, _ = adjoint(spec, flat, sol, band, spk, out, g_out)
    return (Flat(*grads, None, None),)


banded_transport.defvjp(_fwd, _bwd)
