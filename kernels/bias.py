"""A-posteriori tail bias certificate (docs/design.md §6.2).

The op's gradient is that of the *stopped-base surrogate*: the R-step tail is differentiated
exactly, but the base state z_T — the column potential v^0 = v^T after the T stopped steps —
is treated as a constant. Differentiating through all T + R steps instead gives

    grad_full = grad_stopped + D_x z_T^T eta_R,        c_R := D_x z_T^T eta_R,

with eta_R the adjoint of z_T after back-propagating the output cotangent through the R tail
steps (``sinkhorn.adjoint`` returns it). c_R is the bias of the surrogate gradient; the tail
contracts it (||eta_R|| shrinks like the contraction rate to the power R), and the certified
tail depth is the first R with ||c_R|| <= tol.

Every term is computed on its own path:
  * grad_stopped and eta_R: ``sinkhorn.solve`` + ``sinkhorn.adjoint`` (the op's own backward)
    on the banded problem, mapped back to the inputs;
  * grad_full: the public op with (T, R) -> (0, T + R): the base is then the constant zero
    potential, so the op's exact tail adjoint differentiates all T + R steps;
  * c_R: a VJP of the base solve (``sinkhorn.run_steps`` on the XLA band, plain jnp) at eta_R;
so the residual ||(grad_full - grad_stopped) - c_R|| checks the identity (it is rounding).

R = 0: the output plan then also reads the base's last row potential u^T (a function of
v^{T-1}, not of v^T), so the base state is (u^T, v^T) with adjoint (ū_0, eta_0), ū_0 the row
sums of P∘G. From R = 1 on only v^0 enters the tail and ū_R = 0.

Gradients are taken with respect to all inputs (q, k, v and the dustbin tokens); the v parts
of c_R are zero (the plan does not depend on v). Constant eps only: with an eps schedule the
tail would not continue the base at one temperature and grad_full is not the (0, T + R) op.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pfamalign.kernels import sinkhorn as sk
from pfamalign.kernels.api import check_inputs, flatten, pad_flat, transport
from pfamalign.kernels.config import DustbinTokens, TransportConfig


class TailBiasRow(NamedTuple):
    """The certificate at one tail depth R (2-norms over all input gradients)."""

    tail_steps: int  # R
    eta_norm: float  # ||eta_R||: adjoint of the base state
    bias_norm: float  # ||c_R|| = ||D_x z_T^T eta_R||
    gap_norm: float  # ||grad_full - grad_stopped||
    residual: float  # ||(grad_full - grad_stopped) - c_R||: rounding when the identity holds
    grad_norm: float  # ||grad_full||, the scale of the above


class TailBiasCertificate(NamedTuple):
    """Per-R rows and the certified tail depth (the smallest R with ``bias_norm <= tol``, or None)."""

    rows: tuple[TailBiasRow, ...]
    tol: float
    certified_depth: int | None


def _flatten(q, k, v, q_len, k_len, tokens, cfg: TransportConfig):
    """Inputs -> (Flat, Spec) of the banded op (no targets), always on the XLA band (plain
    jnp, differentiable by autodiff)."""
    flat, spec, _ = flatten(q, k, v, q_len, k_len, tokens, None, dataclasses.replace(cfg, impl="xla"))
    return flat, spec


def _base_state(cfg: TransportConfig, q_len, k_len, inputs):
    """(u^T, v^T) ``[N, Lp + 1]`` after the T base steps from zero, differentiably."""
    flat, spec = _flatten(*inputs[:3], q_len, k_len, inputs[3], cfg)
    ops, sup = sk.make_ops(spec), sk.support(flat, spec)
    scores, raw_spk = sk.extended_scores(ops, spec, flat)
    zeros = jnp.zeros((flat.q.shape[0], flat.q.shape[1] + 1), flat.q.dtype)
    (u, v), _ = sk.run_steps(ops, scores, raw_spk, sup, sk.step_eps(cfg, 0), zeros, zeros, keep=0)
    return u, v


@functools.partial(jax.jit, static_argnames=("cfg",))
def _stopped(cfg: TransportConfig, q_len, k_len, inputs, g_out):
    """The stopped-base gradient (the op's own adjoint) and the adjoint (ū_R, eta_R) of the
    base state, for the output cotangent ``g_out`` at the tail depth ``cfg.tail_steps``."""
    flat, spec = _flatten(*inputs[:3], q_len, k_len, inputs[3], cfg)
    fields = lambda *x: _flatten(*x[:3], q_len, k_len, x[3], cfg)[0][:6]  # (q, k, v, tq, tk, tv)
    _, to_inputs = jax.vjp(fields, *inputs)  # maps flat cotangents back to the inputs
    sol, _, band, spk = sk.solve(spec, flat)
    out = sk.output(sk.make_ops(spec), band, spk, sol, flat)  # [N, Lp, dv]
    g_flat = pad_flat(g_out, flat.q.shape[1])
    grads, eta = sk.adjoint(spec, flat, sol, band, spk, out, g_flat)
    u_bar = jnp.zeros_like(eta)
    if cfg.tail_steps == 0:  # the output plan reads u^T too: ū_0 = row sums of P∘G
        rows = jnp.sum(jnp.where(flat.row_active[..., None], g_flat, 0.0) * out, -1)
        u_bar = u_bar.at[:, :-1].set(rows)
    return to_inputs(tuple(grads)), (u_bar, eta)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _full(cfg: TransportConfig, q_len, k_len, inputs, g_out):
    """The gradient through all T + R steps: the public op with (T, R) -> (0, T + R)."""
    cfg = dataclasses.replace(cfg, base_steps=0, tail_steps=cfg.base_steps + cfg.tail_steps)
    _, vjp = jax.vjp(lambda *x: transport(*x[:3], q_len, k_len, x[3], config=cfg), *inputs)
    return vjp(g_out)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _bias(cfg: TransportConfig, q_len, k_len, inputs, base_adjoint):
    """c_R = D_x z_T^T (ū_R, eta_R): a VJP through the T base steps (depends on T only)."""
    _, vjp = jax.vjp(lambda *x: _base_state(cfg, q_len, k_len, x), *inputs)
    return vjp(base_adjoint)


def _norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree))))


def tail_bias_certificate(q, k, v, q_len, k_len, tokens: DustbinTokens | None = None, *,
                          config: TransportConfig, g_out, tail_depths=(0, 1, 2, 4),
                          tol: float = 1e-5) -> TailBiasCertificate:
    """The a-posteriori bias certificate of the stopped-base gradient at several tail depths.

    Args:
      q, k, v, q_len, k_len, tokens: the op's inputs (as for ``transport``).
      config: the op's settings; its ``base_steps`` is T, its ``tail_steps`` is ignored (the
        depths come from ``tail_depths``). Constant eps and a fixed T only (no ``tol``).
      g_out: ``[B, H, Lq, dv]`` cotangent of the output (e.g. a loss gradient).
      tail_depths: the R to certify (certified in increasing order, each once).
      tol: the bias tolerance tau.

    Returns:
      ``TailBiasCertificate``: per R, ||eta_R||, ||c_R||, ||grad_full - grad_stopped||, the
      identity residual ||(grad_full - grad_stopped) - c_R|| and ||grad_full||; and the
      smallest R with ``||c_R|| <= tol`` (None if there is none).
    """
    if config.eps_schedule is not None:
        raise ValueError(f"the tail bias certificate needs a constant eps (the full unrolled gradient "
                         f"is the (T=0, R=T+R) op only then); got eps_schedule={config.eps_schedule}")
    if config.tol is not None:  # a base run to a tolerance has no fixed T to unroll
        raise ValueError(f"the tail bias certificate needs a fixed number of base steps (the full "
                         f"gradient unrolls exactly T); got tol={config.tol:g}: certify the model with "
                         f"tol unset (transport.tol=null)")
    depths = tuple(tail_depths)
    if not depths or any(not isinstance(r, (int, np.integer)) or r < 0 for r in depths):
        raise ValueError(f"tail_depths must be a non-empty sequence of integers >= 0, got {tail_depths!r}")
    depths = tuple(sorted(set(depths)))  # the certified depth is the smallest that holds
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    check_inputs(q, k, v, q_len, k_len, tokens, config)
    want = q.shape[:3] + v.shape[-1:]
    if tuple(jnp.shape(g_out)) != want:
        raise ValueError(f"g_out must have the output's shape [B, H, Lq, dv]={want}, got {jnp.shape(g_out)}")
    inputs = (q, k, v, None if config.dustbin == "none" else tokens)
    q_len, k_len = jnp.asarray(q_len), jnp.asarray(k_len)
    if config.base_steps == 0 and depths[0] == 0:
        raise ValueError("with base_steps=0 a tail depth of 0 leaves no step to certify (T + R >= 1): "
                         "drop 0 from tail_depths")
    # one _bias compile for all R; none at T = 0 (T + R = 0 is no config, and there is no base)
    base_cfg = dataclasses.replace(config, tail_steps=0) if config.base_steps else None
    rows = []
    for r in depths:
        cfg = dataclasses.replace(config, tail_steps=int(r))
        stopped, adj = _stopped(cfg, q_len, k_len, inputs, g_out)
        full = _full(cfg, q_len, k_len, inputs, g_out)
        if config.base_steps == 0:  # the base is the constant zero potential: no bias
            bias = jax.tree.map(jnp.zeros_like, inputs)
        else:
            bias = _bias(base_cfg, q_len, k_len, inputs, adj)
        eta = jnp.concatenate(adj, -1)
        gap = jax.tree.map(lambda f, s: f - s, full, stopped)
        rows.append(TailBiasRow(int(r), _norm(eta), _norm(bias), _norm(gap),
                                _norm(jax.tree.map(lambda g, c: g - c, gap, bias)), _norm(full)))
    certified = next((row.tail_steps for row in rows if row.bias_norm <= tol), None)
    return TailBiasCertificate(tuple(rows), float(tol), certified)
