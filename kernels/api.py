"""The public transport op: ``O = P V`` under a banded, dustbin-augmented Sinkhorn plan."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pfamalign.kernels.band import make_geometry
from pfamalign.kernels.config import DustbinTokens, TransportConfig
from pfamalign.kernels.reference import (SolveStats, dense_constraints, dense_problem, reference_solve,
                                         reference_transport)
from pfamalign.kernels.scaling import scaling_applies, scaling_solve
from pfamalign.kernels.sinkhorn import Flat, Spec, banded_transport


class Potentials(NamedTuple):
    """Centered potentials after each of the T + R full steps (base then tail; ``max_steps + R``
    with ``tol``).

    ``u[..., t, :Lq]`` are the query rows and ``u[..., t, Lq]`` the dustbin row (0 without a
    dustbin); likewise ``v`` with the dustbin column at ``Lk``. Potentials are in units of the
    step's own eps (``S = <q, k> / (sqrt(d) eps_t)``). No gradient flows through them.
    """

    u: jax.Array  # [B, H, T + R, Lq + 1]
    v: jax.Array  # [B, H, T + R, Lk + 1]


def check_inputs(q, k, v, q_len, k_len, tokens, cfg: TransportConfig):
    """Raises ValueError, naming the shapes, unless the op's inputs agree with each other and
    with ``cfg`` (lengths in range, dustbin tokens present where the mode needs them)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [B, H, L, d]; got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2]:
        raise ValueError(f"batch and head dims differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k feature dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v lengths differ: {k.shape[2]} vs {v.shape[2]}")
    used = tokens if cfg.dustbin != "none" else None
    arrays = {"q": q, "k": k, "v": v, **({} if used is None else {f"tokens.{n}": t for n, t in zip("qkv", used)})}
    for name, x in arrays.items():  # an integer answer is truncated, a bool or complex one meaningless
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            raise TypeError(f"{name} must be a real floating array (float16, bfloat16, float32 or float64), got "
                            f"dtype {jnp.result_type(x)}; cast it, e.g. {name}.astype(jnp.float32)")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"empty sequence axis: Lq={q.shape[2]}, Lk={k.shape[2]}")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k need at least one feature (d >= 1), got d={q.shape[-1]}")
    b = q.shape[0]
    for name, lens, cap in (("q_len", q_len, q.shape[2]), ("k_len", k_len, k.shape[2])):
        if isinstance(lens, (list, tuple)):  # a Python list of lengths is an integer array too
            lens = np.asarray(lens)
        if jnp.ndim(lens) != 1 or jnp.shape(lens)[0] != b:
            raise ValueError(f"{name} must have shape [B]=[{b}], got {jnp.shape(lens)}")
        if not jnp.issubdtype(jnp.result_type(lens), jnp.integer):  # a float would be truncated
            raise ValueError(f"{name} must be integers, got dtype {jnp.result_type(lens)}")
        if not isinstance(lens, jax.core.Tracer):
            arr = np.asarray(lens)
            if arr.min(initial=0) < 0 or arr.max(initial=0) > cap:
                raise ValueError(f"{name} must lie in [0, {cap}], got {arr.tolist()}")
    if cfg.dustbin != "none":
        if tokens is None:
            raise ValueError(f"dustbin={cfg.dustbin!r} needs DustbinTokens(q, k, v)")
        h, d, dv = q.shape[1], q.shape[-1], v.shape[-1]
        want = ((h, d), (h, d), (h, dv))
        got = tuple(tuple(t.shape) for t in tokens)
        if got != want:
            raise ValueError(f"dustbin tokens must have shapes {want} ([H, d], [H, d], [H, dv]), got {got}")


def pad_flat(x, length):
    """[B, H, L, m] -> [B * H, length, m], zero padded."""
    b, h, l, m = x.shape
    return jnp.pad(x.reshape(b * h, l, m), ((0, 0), (0, length - l), (0, 0)))


def zero_padding(q, k, v, q_len, k_len):
    """``q``, ``k``, ``v`` ``[B, H, L, .]`` with their positions past the lengths set to 0
    (the dense path's; ``flatten`` does the same to the banded problem as it pads): padding
    never counts, and a NaN or an inf there would (a plan weight of 0 times a NaN is NaN in
    the output and the gradients; a NaN score in a kernel's LSE)."""
    active = lambda x, lens: jnp.arange(x.shape[2])[None, None, :] < jnp.asarray(lens)[:, None, None]  # noqa: E731
    return _zeroed(q, active(q, q_len)), _zeroed(k, active(k, k_len)), _zeroed(v, active(v, k_len))


def _zeroed(x, active):
    """``x`` with 0 where ``active`` (``x``'s shape but its last axis) is False."""
    return jnp.where(active[..., None], x, jnp.zeros((), x.dtype))


def flatten(q, k, v, q_len, k_len, tokens, targets, cfg: TransportConfig, *, history: bool = False,
            stats: bool = False):
    """Inputs ``[B, H, L, .]`` -> the banded op's padded flat problem and its static spec.

    Returns ``(Flat, Spec, slot)``: ``slot`` is the padded index of the dustbin in ``widened``
    mode (where the tokens become ordinary positions), else ``Lp`` (the extended slot).
    Differentiable in (q, k, v, tokens).
    """
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    n = b * h
    lmax = max(lq, lk)
    cfg = cfg.resolved()
    per_head = lambda lens: jnp.repeat(jnp.asarray(lens).astype(jnp.int32), h)  # [N]
    pallas = cfg.impl == "pallas"  # kernel-legal tiles (see make_geometry)
    if cfg.dustbin == "widened":
        # The widened bridge: the dustbin tokens become ordinary positions at index lmax and
        # the band covers everything.
        geom = make_geometry(lmax + 1, lmax + 1, cfg.blocks.block, pallas=pallas)
    else:
        geom = make_geometry(lmax, cfg.half_band, cfg.blocks.block, pallas=pallas)
    lp = geom.length
    slot = lmax if cfg.dustbin == "widened" else lp
    pos = jnp.arange(lp)[None, :]
    row_active = pos < per_head(q_len)[:, None]
    col_active = pos < per_head(k_len)[:, None]
    qf, kf, vf = pad_flat(q, lp), pad_flat(k, lp), pad_flat(v, lp)
    # padded values never count (a plan weight of 0 times a NaN there is NaN, and so is an LSE
    # over a NaN score); fused with the pad: zeroing before it cost the GPU 3-5 more launches
    qf, kf, vf = _zeroed(qf, row_active), _zeroed(kf, col_active), _zeroed(vf, col_active)
    tok = lambda t, m: (jnp.zeros((n, m), q.dtype) if t is None or cfg.dustbin == "none"
                        else jnp.tile(t.astype(q.dtype), (b, 1)))
    tq, tk, tv = (tok(t, m) for t, m in zip(tokens or (None,) * 3, (d, d, dv)))
    if cfg.dustbin == "widened":
        qf, kf, vf = qf.at[:, slot].set(tq), kf.at[:, slot].set(tk), vf.at[:, slot].set(tv)
        row_active, col_active = row_active.at[:, slot].set(True), col_active.at[:, slot].set(True)
    # Targets: key index, or lk for the dustbin column (at its slot in the padded problem).
    tgt = jnp.full((b, lq), -1, jnp.int32) if targets is None else jnp.asarray(targets, jnp.int32)
    tgt = jnp.where(tgt == lk, slot, jnp.where(tgt > lk, -1, tgt))
    tgt = jnp.pad(jnp.repeat(tgt, h, axis=0), ((0, 0), (0, lp - lq)), constant_values=-1)
    flat = Flat(qf, kf, vf, tq, tk, tv, row_active, col_active, tgt)
    spokes = cfg.dustbin in ("spoke", "capacity")
    spec = Spec(cfg, geom, spokes, history, cfg.dustbin == "capacity", stats)
    return flat, spec, slot


def _banded(q, k, v, q_len, k_len, tokens, targets, cfg: TransportConfig, history: bool, stats: bool):
    b, h, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    flat, spec, slot = flatten(q, k, v, q_len, k_len, tokens, targets, cfg, history=history, stats=stats)
    out, logp, hist, st = banded_transport(spec, flat)
    out = out[:, :lq].reshape(b, h, lq, dv)
    logp = logp[:, :lq].reshape(b, h, lq)
    st = None if st is None else SolveStats(*(jax.lax.stop_gradient(x).reshape(b, h) for x in st))
    if not history:
        return out, logp, None, st
    hu, hv = (jnp.moveaxis(x, 0, 1) for x in hist)  # [N, T + R, Lp + 1]
    u = jnp.concatenate([hu[..., :lq], hu[..., slot : slot + 1]], -1)
    vv = jnp.concatenate([hv[..., :lk], hv[..., slot : slot + 1]], -1)
    if cfg.dustbin == "none":
        u, vv = u.at[..., -1].set(0.0), vv.at[..., -1].set(0.0)
    return out, logp, Potentials(u.reshape(b, h, -1, lq + 1), vv.reshape(b, h, -1, lk + 1)), st


class TransportResult(NamedTuple):
    """What ``transport`` returns when more than the output is asked for."""

    out: jax.Array  # [B, H, Lq, dv]
    target_logp: jax.Array | None  # [B, H, Lq] log P_{i, t_i}; -inf where t_i is absent/off-support
    potentials: Potentials | None
    stats: SolveStats | None = None  # base steps taken and the output plan's marginal errors


def transport(q, k, v, q_len, k_len, tokens: DustbinTokens | None = None, *,
              config: TransportConfig | None = None, targets=None, return_potentials: bool = False,
              return_stats: bool = False, **settings):
    """Transport output ``O = P V`` for a batch of (query, key) pairs and heads.

    P is the Sinkhorn plan on the banded support ``|i - j| <= W`` (plus the dustbin spokes)
    after a stopped base solve (T steps, or to ``tol``) and an R-step differentiable tail,
    with the marginals ``config.marginals`` names (balanced, or the row / column softmax,
    optionally KL-relaxed); the gradient is the exact adjoint of that tail (custom VJP on the
    ``xla`` and ``pallas`` paths).

    Args:
      q: ``[B, H, Lq, d]`` queries; k: ``[B, H, Lk, d]`` keys; v: ``[B, H, Lk, dv]`` values.
      (In float32 the plan holds while the scores' spread ``|<q_i, k_j>| / eps`` stays below
      about 1e6; past it float32 cannot resolve the scores and every path, the dense one too,
      loses the plan.)
      q_len, k_len: ``[B]`` integer true lengths; positions beyond them are inactive padding
        (traced lengths past the arrays are clamped to them; concrete ones are refused). Any
        float dtype: the Pallas paths compute in float32 and answer in the inputs' dtype.
      tokens: learned dustbin tokens, for every dustbin mode but ``none``.
      config: a TransportConfig; or pass its fields as keywords (``half_band=64, eps=0.5``).
      targets: optional ``[B, Lq]`` int in [-1, Lk]: each query row's target key (``Lk`` =
        the dustbin column, -1 = none). Their log plan entries are returned, differentiably, computed in
        the log domain (a sparse cross-entropy needs no dense plan).
      return_potentials: also return the ``Potentials`` history (for the certificates).
      return_stats: also return the ``SolveStats``: base steps taken and the output plan's
        marginal errors per problem and head.

    Returns:
      ``O [B, H, Lq, dv]`` (rows without support are 0); a ``TransportResult`` instead when
      targets, potentials or stats are requested.
    """
    config = _config(config, settings)
    check_inputs(q, k, v, q_len, k_len, tokens, config)
    config = config.resolved(length=max(q.shape[2], k.shape[2]), features=(q.shape[-1], v.shape[-1]))
    if q.shape[0] * q.shape[1] == 0:  # no problem to solve: the dense path answers with the
        config = config.dense_reference()  # shapes (the banded tilings divide by the count)
    # lengths past the arrays (checked above unless traced) mean the whole axis, on every path
    q_len, k_len = jnp.clip(jnp.asarray(q_len), 0, q.shape[2]), jnp.clip(jnp.asarray(k_len), 0, k.shape[2])
    if targets is not None:
        if jnp.shape(targets) != (q.shape[0], q.shape[2]):
            raise ValueError(f"targets must have shape [B, Lq]={(q.shape[0], q.shape[2])}, "
                             f"got {jnp.shape(targets)}")
        if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
            raise ValueError(f"targets must be integers (a key index, Lk for the dustbin, -1 for "
                             f"none), got dtype {jnp.result_type(targets)}")
        if not isinstance(targets, jax.core.Tracer):
            arr = np.asarray(targets)
            if arr.size and (arr.min() < -1 or arr.max() > k.shape[2]):
                raise ValueError(f"targets must lie in [-1, Lk={k.shape[2]}] (-1: none, Lk: the dustbin "
                                 f"column), got values from {arr.min()} to {arr.max()}")
    dtype = q.dtype
    if config.impl == "pallas" and dtype != jnp.float32:
        # the kernels compute in float32 (their offsets and scale are): the op does too, and
        # answers in the caller's dtype (the gradients follow the casts)
        q, k, v, tokens = jax.tree.map(lambda a: a.astype(jnp.float32), (q, k, v, tokens))
    if config.impl == "reference":  # (the banded paths zero the padding as they pad: flatten)
        q, k, v = zero_padding(q, k, v, q_len, k_len)
        out, logp, hist, stats = reference_transport(q, k, v, q_len, k_len, tokens, config, targets=targets)
        pots = Potentials(*(jax.lax.stop_gradient(x) for x in hist))
    else:
        out, logp, pots, stats = _banded(q, k, v, q_len, k_len, tokens, targets, config,
                                         return_potentials, return_stats)
    out = out.astype(dtype)
    if targets is None and not return_potentials and not return_stats:
        return out
    return TransportResult(out, logp if targets is not None else None, pots if return_potentials else None,
                           stats if return_stats else None)


def transport_plan(q, k, q_len, k_len, tokens: DustbinTokens | None = None, *,
                   config: TransportConfig | None = None, **settings):
    """The dense plan ``[B, H, Lq + 1, Lk + 1]`` (last row / column: the dustbin; zero without
    one) for inference and diagnostics: decoding, barycenters, certificates.

    It is the plan whose products ``transport`` computes (same support, same steps), formed
    densely by the reference solver; no gradient. Memory Lq x Lk per pair and head.
    ``scaling_transport_plan`` computes it several times faster where float32 allows.
    """
    config = _config(config, settings)
    q_len, k_len, v, tokens = _plan_inputs(q, k, q_len, k_len, tokens, config)
    return jax.lax.stop_gradient(reference_solve(q, k, v, q_len, k_len, tokens, config)[0])


def scaling_transport_plan(q, k, q_len, k_len, tokens: DustbinTokens | None = None, *,
                           config: TransportConfig):
    """``(plan, safe)``: ``transport_plan``'s plan by the same steps in the scaling domain
    (``scaling.py``: one exp per entry, then matrix-vector products), and whether every
    problem stayed in float32's safe range -- where ``safe`` is False the caller recomputes
    with ``transport_plan`` (rare: the shipped models never leave the range). A program
    holding both solvers behind a ``lax.cond`` would trace and load twice the code on every
    call, half a second of each ``pfamalign align``. Configurations the scaling domain does
    not cover (``scaling_applies``) get the reference plan, safe."""
    if not scaling_applies(config):
        return transport_plan(q, k, q_len, k_len, tokens, config=config), jnp.array(True)
    q_len, k_len, v, tokens = _plan_inputs(q, k, q_len, k_len, tokens, config)
    problem_tokens = tokens if config.dustbin != "none" else DustbinTokens(None, None, None)
    scores = dense_problem(q, k, q_len, k_len, problem_tokens, config)[0]
    return scaling_plan_of_scores(scores, q_len, k_len, config=config)


def scaling_plan_of_scores(scores, q_len, k_len, *, config: TransportConfig):
    """``scaling_transport_plan`` from the extended scores ``[B, H, Lq + 1, Lk + 1]`` at eps
    = 1 (``dense_problem``'s: ``<q, k> / sqrt(d)``, the dustbin tokens in the last row and
    column), for a caller that has a cheaper way to them than the dot products of ``q`` and
    ``k`` (``model.Aligner.dense_scores``). Only where ``scaling_applies``."""
    if not scaling_applies(config):
        raise ValueError("the scaling solve does not cover this transport configuration "
                         "(scaling_applies); use transport_plan")
    lq, lk = scores.shape[-2] - 1, scores.shape[-1] - 1
    q_len, k_len = jnp.asarray(q_len), jnp.asarray(k_len)
    plan, safe = scaling_solve(scores, *dense_constraints(q_len, k_len, lq, lk, config, scores.dtype), config)
    return jax.lax.stop_gradient(plan), safe


def _config(config: TransportConfig | None, settings: dict) -> TransportConfig:
    """The config given, or one built from keyword settings; both at once is an error (the
    settings would be silently ignored)."""
    if config is None:
        return TransportConfig(**settings)
    if settings:
        raise ValueError(f"pass either config or settings, not both (got {sorted(settings)})")
    return config


def _plan_inputs(q, k, q_len, k_len, tokens, config):
    """Checked inputs of a plan solve: lengths as arrays, zero values (a plan needs none)."""
    v = jnp.zeros(k.shape[:-1] + (1,), k.dtype)
    if tokens is not None:
        tokens = DustbinTokens(tokens.q, tokens.k, jnp.zeros((k.shape[1], 1), k.dtype))
    check_inputs(q, k, v, q_len, k_len, tokens, config)
    return jnp.asarray(q_len), jnp.asarray(k_len), v, tokens
