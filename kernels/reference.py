"""Dense reference of the transport op: the truth the banded paths are tested against.

Everything is an explicit ``[Lq + 1, Lk + 1]`` matrix (the last row / column are the dustbin
slots, inactive when there is no dustbin) and gradients come from plain JAX autodiff through
the R tail steps, the base solve being wrapped in ``stop_gradient``. Small sizes only.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pfamalign.kernels.config import DustbinTokens, TransportConfig, damp, einsum, marginal_error


def dense_support(q_len, k_len, lq: int, lk: int, *, half_band: int, dustbin: str):
    """Boolean support ``[B, Lq + 1, Lk + 1]`` of the extended problem."""
    i = jnp.arange(lq + 1)[:, None]
    j = jnp.arange(lk + 1)[None, :]
    qa = i < q_len[:, None, None]  # real active rows (never the dustbin slot: i == lq >= q_len)
    ka = j < k_len[:, None, None]
    band = jnp.abs(i - j) <= half_band
    if dustbin == "widened":  # the bridge widens the band to the whole sequence
        band = jnp.ones_like(band)
    support = qa & ka & band
    if dustbin != "none":  # widened, spoke and capacity share this support
        db_row, db_col = i == lq, j == lk
        support = support | (qa & db_col) | (db_row & ka) | (db_row & db_col)
    return support


def dense_log_targets(q_len, k_len, lq: int, lk: int, *, dustbin: str, dtype=jnp.float32):
    """Log row / column targets ``[B, 1, Lq + 1]``, ``[B, 1, Lk + 1]``: unit, except a capacity
    dustbin takes as much as the other side's length."""
    log_a = jnp.zeros((jnp.shape(q_len)[0], 1, lq + 1), dtype)
    log_b = jnp.zeros((jnp.shape(q_len)[0], 1, lk + 1), dtype)
    if dustbin == "capacity":
        log_a = log_a.at[..., lq].set(jnp.log(jnp.maximum(k_len, 1).astype(dtype))[:, None])
        log_b = log_b.at[..., lk].set(jnp.log(jnp.maximum(q_len, 1).astype(dtype))[:, None])
    return log_a, log_b


def masked_neg_lse(x, mask, axis):
    """-LSE over the masked entries (the c-transform of a potential); 0 where a line has no
    entry (it then carries no mass). Returns (that, has-an-entry)."""
    has = jnp.any(mask, axis=axis)
    xm = jnp.where(mask, x, -jnp.inf)
    mx = jax.lax.stop_gradient(jnp.max(xm, axis=axis, keepdims=True))
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    s = jnp.sum(jnp.where(mask, jnp.exp(xm - mx), 0.0), axis=axis)
    lse = jnp.log(jnp.where(has, s, 1.0)) + jnp.squeeze(mx, axis)
    return jnp.where(has, -lse, 0.0), has


def _full_step(s, mask, v, log_a, log_b, kappa=(1.0, 1.0), centered=True):
    """One Sinkhorn step on ``s [.., m, n]`` with row / column targets ``exp(log_a)``,
    ``exp(log_b)``, each half step damped by its side's kappa (``TransportConfig.damping``),
    followed by centering when the problem is balanced."""
    ka, kb = kappa
    u, row_has = masked_neg_lse(s + v[..., None, :], mask, -1)
    u = jnp.where(row_has, damp(u + log_a, ka), 0.0)
    v_new, col_has = masked_neg_lse(s + u[..., :, None], mask, -2)
    v_new = jnp.where(col_has, damp(v_new + log_b, kb), 0.0)
    if not centered:
        return u, v_new
    n_rows = jnp.maximum(jnp.sum(row_has, -1, keepdims=True), 1)
    c = jnp.sum(jnp.where(row_has, u, 0.0), -1, keepdims=True) / n_rows
    return jnp.where(row_has, u - c, 0.0), jnp.where(col_has, v_new + c, 0.0)


def dense_marginal_errors(plan, mask, u, v, log_a, log_b, kappa):
    """(row, column) marginal errors ``[..]`` of a dense plan with potentials (u, v): the max
    over supported lines of ``|sum - target|``, the target of a damped side being its
    fixed point ``exp(log_a - u (1 - kappa) / kappa)`` (the prescribed one at kappa = 1); a
    free side (kappa = 0) has no constraint and error 0."""
    return (marginal_error(jnp.sum(plan, -1), u, log_a, jnp.any(mask, -1), kappa[0]),
            marginal_error(jnp.sum(plan, -2), v, log_b, jnp.any(mask, -2), kappa[1]))


def extend_with_token(x, token):
    """Append a per-head token [H, d] as the last position of x [B, H, L, d]."""
    if token is None:
        token = jnp.zeros(x.shape[1:2] + x.shape[-1:], x.dtype)
    tok = jnp.broadcast_to(token[None, :, None, :], x.shape[:2] + (1, x.shape[-1]))
    return jnp.concatenate([x, tok.astype(x.dtype)], axis=2)


def dense_problem(q, k, q_len, k_len, tokens: DustbinTokens, cfg: TransportConfig):
    """The extended problem densely: scores ``<q, k> / sqrt(d)`` at eps = 1
    ``[B, H, Lq + 1, Lk + 1]`` (the dustbin tokens in the last row / column), then
    ``dense_constraints``."""
    d = q.shape[-1]
    q_ext, k_ext = extend_with_token(q, tokens.q), extend_with_token(k, tokens.k)
    dots = einsum("bhid,bhjd->bhij", q_ext, k_ext) / jnp.sqrt(jnp.asarray(d, q.dtype))
    return (dots, *dense_constraints(q_len, k_len, q.shape[2], k.shape[2], cfg, q.dtype))


def dense_constraints(q_len, k_len, lq: int, lk: int, cfg: TransportConfig, dtype=jnp.float32):
    """The support ``[B, 1, Lq + 1, Lk + 1]`` (broadcast over heads) and the log row / column
    targets ``[B, 1, Lq + 1]``, ``[B, 1, Lk + 1]`` of the extended problem (unit, except a
    capacity dustbin takes as much as the other side's length)."""
    mask = dense_support(q_len, k_len, lq, lk, half_band=cfg.half_band, dustbin=cfg.dustbin)
    log_a, log_b = dense_log_targets(q_len, k_len, lq, lk, dustbin=cfg.dustbin, dtype=dtype)
    return mask[:, None], log_a, log_b


class SolveStats(NamedTuple):
    """How the solve went, per problem ``[B, H]``: base steps taken (T without ``tol``) and the
    output plan's marginal errors (``dense_marginal_errors``)."""

    steps: jax.Array
    row_error: jax.Array
    col_error: jax.Array


def _base_to_tol(step, errors, u, v, tol: float, max_steps: int):
    """Full steps from (u, v) until each problem's errors are <= tol or ``max_steps``; a
    converged problem is frozen. Returns (u, v, steps, (u_hist, v_hist)): the histories
    ``[max_steps, .., L + 1]`` repeat the final potentials after a problem's last step."""
    batch = u.shape[:-1]
    hist0 = lambda x: jnp.zeros((max_steps,) + x.shape, x.dtype)

    def body(c):
        k, u, v, err, steps, hu, hv = c
        un, vn = step(u, v)
        run = err > tol
        u, v = jnp.where(run[..., None], un, u), jnp.where(run[..., None], vn, v)
        err = jnp.where(run, jnp.maximum(*errors(u, v)), err)
        return k + 1, u, v, err, steps + run, hu.at[k].set(u), hv.at[k].set(v)

    init = (0, u, v, jnp.full(batch, jnp.inf, u.dtype), jnp.zeros(batch, jnp.int32), hist0(u), hist0(v))
    k, u, v, _, steps, hu, hv = jax.lax.while_loop(
        lambda c: (c[0] < max_steps) & jnp.any(c[3] > tol), body, init)
    done = (jnp.arange(max_steps) >= k)[:, *([None] * u.ndim)]
    return u, v, steps, (jnp.where(done, u, hu), jnp.where(done, v, hv))


def reference_solve(q, k, v, q_len, k_len, tokens: DustbinTokens | None, cfg: TransportConfig):
    """Runs the stopped base and the differentiable tail densely.

    Returns ``(plan, log_plan, values, (u_hist, v_hist), stats)``: the plan and its log
    ``[B, H, Lq+1, Lk+1]`` (log -inf off the support), the values ``[B, H, Lk+1, dv]``, the
    potential histories ``[B, H, T + R, L + 1]`` (after every full step; with ``tol``,
    ``max_steps + R`` steps, see ``_base_to_tol``) and the ``SolveStats``.
    """
    lq, lk = q.shape[2], k.shape[2]
    tokens = tokens if cfg.dustbin != "none" else DustbinTokens(None, None, None)
    # padded values never count (a plan weight of 0 times a NaN there is NaN)
    v = jnp.where((jnp.arange(lk) < jnp.asarray(k_len)[:, None])[:, None, :, None], v, jnp.zeros((), v.dtype))
    v_ext = extend_with_token(v, tokens.v)
    dots, mask, log_a, log_b = dense_problem(q, k, q_len, k_len, tokens, cfg)
    kappa, centered = cfg.damping(), cfg.centered()
    step = lambda s, v: _full_step(s, mask, v, log_a, log_b, kappa, centered)

    def plan_of(s, u, v):
        log_plan = jnp.where(mask, s + u[..., :, None] + v[..., None, :], -jnp.inf)
        return jnp.where(mask, jnp.exp(jnp.where(mask, log_plan, 0.0)), 0.0), log_plan

    def errors(s, u, v):
        return dense_marginal_errors(plan_of(s, u, v)[0], mask, u, v, log_a, log_b, kappa)

    history_u, history_v = [], []
    dots_base = jax.lax.stop_gradient(dots)
    zeros = lambda n: jnp.zeros(dots.shape[:-2] + (n,), dots.dtype)
    upot, vpot = zeros(lq + 1), zeros(lk + 1)
    steps = jnp.full(dots.shape[:-2], cfg.base_steps, jnp.int32)
    if cfg.tol is not None:
        sb = dots_base / cfg.eps
        upot, vpot, steps, (hu, hv) = _base_to_tol(
            lambda u, v: step(sb, v), lambda u, v: errors(sb, u, v), upot, vpot, cfg.tol, cfg.max_steps)
        history_u, history_v = [hu], [hv]
    else:
        prev_eps = None
        for eps_s, n_steps in cfg.base_stages():
            if prev_eps is not None:  # carry eps * potential across stages
                vpot = vpot * (prev_eps / eps_s)
            prev_eps = eps_s
            for _ in range(n_steps):
                upot, vpot = step(dots_base / eps_s, vpot)
                history_u.append(upot[None])
                history_v.append(vpot[None])
    vpot = jax.lax.stop_gradient(vpot)  # the schedule ends at cfg.eps: no rescale needed

    s = dots / cfg.eps
    # R = 0: the plan of the base itself (its last row potentials, or zeros when T = 0 too)
    upot = jax.lax.stop_gradient(upot)
    for _ in range(cfg.tail_steps):
        upot, vpot = step(s, vpot)
        history_u.append(upot[None])
        history_v.append(vpot[None])
    plan, log_plan = plan_of(s, upot, vpot)
    stack = lambda h, n: (jnp.moveaxis(jnp.concatenate(h, 0), 0, 2) if h
                          else jnp.zeros(upot.shape[:2] + (0, n)))
    hist = (jax.lax.stop_gradient(stack(history_u, lq + 1)), jax.lax.stop_gradient(stack(history_v, lk + 1)))
    row_err, col_err = jax.lax.stop_gradient(
        dense_marginal_errors(plan, mask, upot, vpot, log_a, log_b, kappa))
    return plan, log_plan, v_ext, hist, SolveStats(steps, row_err, col_err)


def reference_transport(q, k, v, q_len, k_len, tokens: DustbinTokens | None, cfg: TransportConfig, targets=None):
    """``O = P V`` for the real query rows and ``log P_{i, t_i}`` (targets ``[B, Lq]``, Lk = the
    dustbin column, -1 = none) densely; differentiable by autodiff."""
    plan, log_plan, v_ext, hist, stats = reference_solve(q, k, v, q_len, k_len, tokens, cfg)
    out = einsum("bhij,bhjv->bhiv", plan[:, :, :-1], v_ext)
    logp = None
    if targets is not None:
        t = jnp.asarray(targets)[:, None, :, None]  # [B, 1, Lq, 1]
        t_safe = jnp.clip(t, 0, k.shape[2])
        t_safe = jnp.broadcast_to(t_safe, plan.shape[:2] + t_safe.shape[2:])
        logp = jnp.take_along_axis(log_plan[:, :, :-1], t_safe, -1)[..., 0]
        logp = jnp.where(t[..., 0] >= 0, logp, -jnp.inf)
    return out, logp, hist, stats
