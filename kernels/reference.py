"""Dense reference of the transport op: the truth the banded paths are tested against.

Everything is an explicit ``[Lq + 1, Lk + 1]`` matrix (the last row / column are the dustbin
slots, inactive when there is no dustbin) and gradients come from plain JAX autodiff through
the R tail steps, the base solve being wrapped in ``stop_gradient``. Small sizes only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pfamalign.kernels.config import DustbinTokens, TransportConfig, einsum


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


def _full_step(s, mask, v, log_a, log_b):
    """One Sinkhorn step on ``s [.., m, n]`` with row / column targets ``exp(log_a)``,
    ``exp(log_b)``, followed by centering."""
    u, row_has = masked_neg_lse(s + v[..., None, :], mask, -1)
    u = jnp.where(row_has, u + log_a, 0.0)
    v_new, col_has = masked_neg_lse(s + u[..., :, None], mask, -2)
    v_new = jnp.where(col_has, v_new + log_b, 0.0)
    n_rows = jnp.maximum(jnp.sum(row_has, -1, keepdims=True), 1)
    c = jnp.sum(jnp.where(row_has, u, 0.0), -1, keepdims=True) / n_rows
    return jnp.where(row_has, u - c, 0.0), jnp.where(col_has, v_new + c, 0.0)


def _extend(x, token):
    """Append a per-head token [H, d] as the last position of x [B, H, L, d]."""
    if token is None:
        token = jnp.zeros(x.shape[1:2] + x.shape[-1:], x.dtype)
    tok = jnp.broadcast_to(token[None, :, None, :], x.shape[:2] + (1, x.shape[-1]))
    return jnp.concatenate([x, tok.astype(x.dtype)], axis=2)


def dense_problem(q, k, q_len, k_len, tokens: DustbinTokens, cfg: TransportConfig):
    """The extended problem densely: scores ``<q, k> / sqrt(d)`` at eps = 1
    ``[B, H, Lq + 1, Lk + 1]`` (the dustbin tokens in the last row / column), the support
    ``[B, 1, Lq + 1, Lk + 1]`` and the log row / column targets ``[B, 1, Lq + 1]``, ``[B, 1, Lk + 1]``
    (unit, except a capacity dustbin takes as much as the other side's length)."""
    d = q.shape[-1]
    lq, lk = q.shape[2], k.shape[2]
    q_ext, k_ext = _extend(q, tokens.q), _extend(k, tokens.k)
    mask = dense_support(q_len, k_len, lq, lk, half_band=cfg.half_band, dustbin=cfg.dustbin)
    mask = mask[:, None]  # broadcast over heads
    log_a = jnp.zeros((q.shape[0], 1, lq + 1), q.dtype)
    log_b = jnp.zeros((q.shape[0], 1, lk + 1), q.dtype)
    if cfg.dustbin == "capacity":
        log_a = log_a.at[..., lq].set(jnp.log(jnp.maximum(k_len, 1).astype(q.dtype))[:, None])
        log_b = log_b.at[..., lk].set(jnp.log(jnp.maximum(q_len, 1).astype(q.dtype))[:, None])
    dots = einsum("bhid,bhjd->bhij", q_ext, k_ext) / jnp.sqrt(jnp.asarray(d, q.dtype))
    return dots, mask, log_a, log_b


def reference_solve(q, k, v, q_len, k_len, dustbin: DustbinTokens | None, cfg: TransportConfig):
    """Runs the stopped base and the differentiable tail densely.

    Returns ``(plan, log_plan, values, (u_hist, v_hist))``: the plan and its log
    ``[B, H, Lq+1, Lk+1]`` (log -inf off the support), the values ``[B, H, Lk+1, dv]`` and the
    potential histories ``[B, H, T + R, L + 1]`` (centered, after every full step).
    """
    lq, lk = q.shape[2], k.shape[2]
    tokens = dustbin if cfg.dustbin != "none" else DustbinTokens(None, None, None)
    v_ext = _extend(v, tokens.v)
    dots, mask, log_a, log_b = dense_problem(q, k, q_len, k_len, tokens, cfg)

    history_u, history_v = [], []
    dots_base = jax.lax.stop_gradient(dots)
    vpot = jnp.zeros(dots.shape[:-2] + (lk + 1,), dots.dtype)
    prev_eps = None
    for eps_s, steps in cfg.base_stages():
        if prev_eps is not None:  # carry eps * potential across stages
            vpot = vpot * (prev_eps / eps_s)
        prev_eps = eps_s
        for _ in range(steps):
            upot, vpot = _full_step(dots_base / eps_s, mask, vpot, log_a, log_b)
            history_u.append(upot)
            history_v.append(vpot)
    vpot = jax.lax.stop_gradient(vpot)  # the schedule ends at cfg.eps: no rescale needed

    s = dots / cfg.eps
    # R = 0: the plan of the base itself (its last row potentials, or zeros when T = 0 too)
    upot = jax.lax.stop_gradient(history_u[-1]) if history_u else jnp.zeros(dots.shape[:-1])
    for _ in range(cfg.tail_steps):
        upot, vpot = _full_step(s, mask, vpot, log_a, log_b)
        history_u.append(upot)
        history_v.append(vpot)
    log_plan = jnp.where(mask, s + upot[..., :, None] + vpot[..., None, :], -jnp.inf)
    plan = jnp.where(mask, jnp.exp(jnp.where(mask, log_plan, 0.0)), 0.0)
    hist = (
        jnp.stack(history_u, axis=2) if history_u else jnp.zeros(upot.shape[:2] + (0, lq + 1)),
        jnp.stack(history_v, axis=2) if history_v else jnp.zeros(upot.shape[:2] + (0, lk + 1)),
    )
    return plan, log_plan, v_ext, hist


def reference_transport(q, k, v, q_len, k_len, dustbin, cfg: TransportConfig, targets=None):
    """``O = P V`` for the real query rows and ``log P_{i, t_i}`` (targets ``[B, Lq]``, Lk = the
    dustbin column, -1 = none) densely; differentiable by autodiff."""
    plan, log_plan, v_ext, hist = reference_solve(q, k, v, q_len, k_len, dustbin, cfg)
    out = einsum("bhij,bhjv->bhiv", plan[:, :, :-1], v_ext)
    logp = None
    if targets is not None:
        t = jnp.asarray(targets)[:, None, :, None]  # [B, 1, Lq, 1]
        t_safe = jnp.clip(t, 0, k.shape[2])
        t_safe = jnp.broadcast_to(t_safe, plan.shape[:2] + t_safe.shape[2:])
        logp = jnp.take_along_axis(log_plan[:, :, :-1], t_safe, -1)[..., 0]
        logp = jnp.where(t[..., 0] >= 0, logp, -jnp.inf)
    return out, logp, hist
