"""Marginals of the transport op (issue 15): the row / column softmax as semi-relaxed OT, the
KL-relaxed (unbalanced) side, the solve to a tolerance and its stats, on every implementation.

The truths are independent of the op's half-step code: a float64 numpy masked softmax, the KKT
conditions of the semi-relaxed and of the KL-relaxed problem, and a float64 numpy Sinkhorn run to
convergence.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.test_util
import jax.numpy as jnp
import numpy as np
import pytest

from pfamalign.kernels import BlockSizes, DustbinTokens, TransportConfig, transport, transport_plan
from pfamalign.kernels import pallas_ops

IMPLS = ("reference", "xla", "pallas")
ATOL = 1e-5  # float32 outputs and gradients, absolute


def _inputs(b=2, h=2, lq=23, lk=19, d=8, dv=4, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    n = lambda key, shape: jax.random.normal(key, shape, jnp.float32)
    tokens = DustbinTokens(n(ks[3], (h, d)), n(ks[4], (h, d)), n(ks[5], (h, dv)))
    return n(ks[0], (b, h, lq, d)), n(ks[1], (b, h, lk, d)), n(ks[2], (b, h, lk, dv)), tokens, n(ks[6], (b, h, lq, dv))


Q_LEN, K_LEN = np.array([23, 15]), np.array([17, 19])


def _cfg(impl, **kw):
    kw = {"half_band": 4, "eps": 0.7, "blocks": BlockSizes(8), **kw}
    return TransportConfig(impl=impl, **kw)


def _np_scores(q, k, tokens, q_len, k_len, half_band, eps, dustbin):
    """float64 ``[B, H, Lq + 1, Lk + 1]`` scores ``q.k / sqrt(d) / eps`` with -inf off the
    support (band among active lines; the spokes and corner with a dustbin)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    tq, tk = (np.asarray(t, np.float64) for t in tokens[:2])
    b, h, lq, d = q.shape
    lk = k.shape[2]
    qe = np.concatenate([q, np.broadcast_to(tq[None, :, None], (b, h, 1, d))], 2)
    ke = np.concatenate([k, np.broadcast_to(tk[None, :, None], (b, h, 1, d))], 2)
    s = np.einsum("bhid,bhjd->bhij", qe, ke) / np.sqrt(d) / eps
    i, j = np.arange(lq + 1)[:, None], np.arange(lk + 1)[None]
    mask = np.zeros((b, 1, lq + 1, lk + 1), bool)
    for n in range(b):
        qa, ka = i < q_len[n], j < k_len[n]
        m = qa & ka & (np.abs(i - j) <= half_band)
        if dustbin != "none":
            m |= (qa & (j == lk)) | ((i == lq) & ka) | ((i == lq) & (j == lk))
        mask[n, 0] = m
    return np.where(mask, s, -np.inf), np.broadcast_to(mask, s.shape)


def _np_softmax(s, mask, axis):
    """Masked softmax along ``axis`` in float64; lines without support are 0."""
    mx = np.max(s, axis, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    tot = e.sum(axis, keepdims=True)
    return np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)


def _np_output(plan, v, tokens):
    v = np.asarray(v, np.float64)
    tv = np.asarray(tokens.v, np.float64)
    ve = np.concatenate([v, np.broadcast_to(tv[None, :, None], v.shape[:2] + (1, v.shape[-1]))], 2)
    return np.einsum("bhij,bhjv->bhiv", plan[:, :, :-1], ve)


@functools.lru_cache(maxsize=None)
def _fn(cfg):
    def loss(q, k, v, tokens, w):
        return jnp.sum(w * transport(q, k, v, Q_LEN, K_LEN, tokens, config=cfg))
    out = jax.jit(lambda q, k, v, t: transport(q, k, v, Q_LEN, K_LEN, t, config=cfg, return_stats=True))
    return out, jax.jit(jax.grad(loss, (0, 1, 2, 3)))


# ---- the softmax as semi-relaxed OT ---------------------------------------------------------


def _fast_first(cases, n_fast):
    """The first ``n_fast`` cases run by default, the rest with --full (the default suite stays
    fast; every feature keeps a fast case)."""
    return [c if i < n_fast else pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=pytest.mark.slow)
            for i, c in enumerate(cases)]


@pytest.mark.parametrize("impl,dustbin,marginals", _fast_first(
    [("reference", "spoke", "rows"), ("xla", "none", "cols"), ("pallas", "spoke", "rows")]
    + [(i, d, m) for i in IMPLS for d in ("none", "spoke") for m in ("rows", "cols")], 3))
def test_semi_relaxed_plan_is_the_independent_masked_softmax(impl, dustbin, marginals):
    """``rows``: O = softmax_rows(S) V with S from float64 numpy (band + dustbin column);
    ``cols``: the column softmax. Not through the op's half steps."""
    q, k, v, tokens, _ = _inputs()
    cfg = _cfg(impl, dustbin=dustbin, marginals=marginals)
    res = _fn(cfg)[0](q, k, v, tokens)
    s, mask = _np_scores(q, k, tokens, Q_LEN, K_LEN, 4, 0.7, dustbin)
    plan = _np_softmax(s, mask, -1 if marginals == "rows" else -2)
    np.testing.assert_allclose(res.out, _np_output(plan, v, tokens), atol=ATOL, rtol=0)
    assert np.all(res.stats.row_error <= 1e-5) and np.all(res.stats.col_error <= 1e-5)


@pytest.mark.parametrize("dustbin", ["none", "spoke"])
def test_rows_plan_satisfies_kkt(dustbin):
    """The KKT condition of min <c, P> + eps sum P log P over the row simplex: log P_ij - S_ij is
    one constant per row on its support, and every row sums to 1 (columns unconstrained)."""
    q, k, _, tokens, _ = _inputs(seed=3)
    cfg = _cfg("reference", dustbin=dustbin, marginals="rows")
    plan = np.asarray(transport_plan(q, k, Q_LEN, K_LEN, tokens, config=cfg), np.float64)
    s, mask = _np_scores(q, k, tokens, Q_LEN, K_LEN, 4, 0.7, dustbin)
    rows = mask.any(-1)
    resid = np.where(mask, np.log(np.where(mask, plan, 1.0)) - np.where(mask, s, 0.0), np.nan)
    spread = np.nanmax(resid[rows], -1) - np.nanmin(resid[rows], -1)
    assert spread.max() < 1e-4
    np.testing.assert_allclose(plan.sum(-1)[rows], 1.0, atol=1e-5)
    assert np.abs(plan.sum(-2) - 1).max() > 0.1  # the columns really are free


@pytest.mark.parametrize("impl,dustbin", _fast_first(
    [("xla", "spoke"), ("pallas", "none"), ("reference", "spoke"), ("pallas", "spoke"), ("xla", "none")], 2))
def test_relaxed_plan_satisfies_kkt(impl, dustbin):
    """The KKT condition of min <c, P> + eps sum P log P + lam KL(P^T 1 || b) over the row
    simplex, written from that definition (not from the op's damping): on its support,
    ``log P_ij - S_ij + (lam / eps) log(col_j / b_j)`` is one constant per row, rows sum to 1,
    and the columns are neither free nor at their targets. Checked on the float64 plan
    (``transport_plan``, solved to a tolerance: the fixed point); each implementation's output
    (float32, to a tolerance) is that plan's ``P V``."""
    q, k, v, tokens, _ = _inputs(seed=6)
    lam, eps = 0.5, 0.7
    cfg = _cfg(impl, dustbin=dustbin, marginals="rows", relax=lam, tol=1e-7, max_steps=3000)
    with jax.enable_x64(True):
        f64 = lambda tree: jax.tree.map(lambda x: jnp.asarray(np.asarray(x, np.float64)), tree)
        ref = dataclasses.replace(cfg, impl="reference", tol=1e-12, max_steps=20000)
        plan = np.asarray(transport_plan(*f64((q, k)), Q_LEN, K_LEN, f64(tokens), config=ref))
    s, mask = _np_scores(q, k, tokens, Q_LEN, K_LEN, 4, eps, dustbin)
    rows, cols = mask.any(-1), mask.any(-2)
    col = plan.sum(-2)  # targets b_j = 1 on every supported column (spoke: unit targets)
    pull = (lam / eps) * np.log(np.where(cols, col, 1.0))[..., None, :]
    resid = np.where(mask, np.log(np.where(mask, plan, 1.0)) - np.where(mask, s, 0.0) + pull, np.nan)
    spread = np.nanmax(resid[rows], -1) - np.nanmin(resid[rows], -1)
    assert spread.max() < 1e-9  # kappa at lam / 2 gives about 1
    np.testing.assert_allclose(plan.sum(-1)[rows], 1.0, atol=1e-9)
    assert np.abs(col[cols] - 1).max() > 0.05  # the column term is really exercised
    out = _fn(cfg)[0](q, k, v, tokens).out
    np.testing.assert_allclose(out, _np_output(plan, v, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl,marginals,relax,dustbin", _fast_first(
    [("xla", "rows", 0.5, "spoke"), ("pallas", "cols", 2.0, "capacity")]
    + [(i, *c) for i in ("xla", "pallas") for c in (("rows", None, "none"), ("cols", None, "spoke"))], 2))
def test_gradients_match_dense_autodiff(impl, marginals, relax, dustbin):
    """The custom VJP (damped half-step weights, no centering) against autodiff of the dense
    reference through the same tail steps."""
    q, k, v, tokens, w = _inputs(seed=1)
    cfg = _cfg(impl, dustbin=dustbin, marginals=marginals, relax=relax, base_steps=6, tail_steps=3)
    got = _fn(cfg)[1](q, k, v, tokens, w)
    want = _fn(dataclasses.replace(cfg, impl="reference"))[1](q, k, v, tokens, w)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, r, atol=ATOL, rtol=0)


@pytest.mark.parametrize("marginals,relax", [pytest.param("rows", None, marks=pytest.mark.slow), ("cols", 0.7)])
def test_finite_differences(marginals, relax):
    """With T = 0 the stopped base is the zero potential and the tail is the whole function:
    the adjoint must match central differences (float64)."""
    with jax.enable_x64(True):
        q, k, v, tokens, _ = (jax.tree.map(lambda x: x.astype(jnp.float64), a)
                              for a in _inputs(1, 2, 13, 11, 4, 3, seed=5))
        ql, kl = jnp.array([13]), jnp.array([10])
        cfg = TransportConfig(half_band=3, eps=0.8, base_steps=0, tail_steps=3, dustbin="spoke", impl="xla",
                              blocks=BlockSizes(8), marginals=marginals, relax=relax)
        f = lambda q, k, v, tq, tk, tv: transport(q, k, v, ql, kl, DustbinTokens(tq, tk, tv), config=cfg)
        # jitted: the differences' evaluations run compiled (2.5x faster than op by op)
        jax.test_util.check_grads(jax.jit(f), (q, k, v) + tuple(tokens), order=1, modes=["rev"], atol=1e-6,
                                  rtol=1e-6)


# ---- the KL relaxation: its two limits ----------------------------------------------------------


@pytest.mark.parametrize("impl", _fast_first(["reference", "pallas", "xla"], 1))
def test_relax_limits(impl):
    """lam = 1e-8 gives the softmax; lam = 1e8 the balanced plan (both solved to a tolerance)."""
    q, k, v, tokens, _ = _inputs(seed=2)
    base = dict(dustbin="capacity", tol=1e-6, max_steps=400, tail_steps=1)
    soft = _fn(_cfg(impl, marginals="rows", relax=1e-8, **base))[0](q, k, v, tokens).out
    s, mask = _np_scores(q, k, tokens, Q_LEN, K_LEN, 4, 0.7, "capacity")
    np.testing.assert_allclose(soft, _np_output(_np_softmax(s, mask, -1), v, tokens), atol=ATOL)
    hard = _fn(_cfg(impl, marginals="cols", relax=1e8, **base))[0](q, k, v, tokens).out
    balanced = _fn(_cfg(impl, **base))[0](q, k, v, tokens).out
    np.testing.assert_allclose(hard, balanced, atol=1e-4)
    assert np.abs(np.asarray(balanced) - np.asarray(soft)).max() > 0.05  # the limits differ


# ---- the solve to a tolerance ---------------------------------------------------------------


def _np_sinkhorn(s, mask, log_a, log_b, iters=20000, tol=1e-13):
    """float64 log-domain Sinkhorn to convergence on one dense problem ``[m, n]``."""
    u, v = np.zeros(s.shape[0]), np.zeros(s.shape[1])
    lse = lambda x, ax: np.log(np.maximum(np.sum(np.where(mask, np.exp(x), 0.0), ax), 1e-300))
    rows, cols = mask.any(1), mask.any(0)
    for _ in range(iters):
        u = np.where(rows, log_a - lse(np.where(mask, s + v[None], -np.inf), 1), 0.0)
        v = np.where(cols, log_b - lse(np.where(mask, s + u[:, None], -np.inf), 0), 0.0)
        p = np.where(mask, np.exp(np.where(mask, s + u[:, None] + v[None], -np.inf)), 0.0)
        if np.abs(p.sum(1) - np.exp(log_a))[rows].max() < tol:
            break
    return p


@pytest.mark.parametrize("impl", _fast_first(["pallas", "reference", "xla"], 1))
def test_tolerance_solve_reaches_the_converged_plan(impl):
    """Capacity dustbin (feasible): the op at tol = 1e-5 against float64 Sinkhorn to 1e-13;
    the reported steps are below max_steps, the errors at most tol; the fixed 17-step plan is
    measurably further away."""
    q, k, v, tokens, _ = _inputs(seed=4)
    eps = 0.3  # cold enough that 17 steps are not converged
    cfg = _cfg(impl, eps=eps, dustbin="capacity", tol=1e-5, max_steps=2000)
    res = _fn(cfg)[0](q, k, v, tokens)
    s, mask = _np_scores(q, k, tokens, Q_LEN, K_LEN, 4, eps, "capacity")
    want = np.zeros(s.shape)
    lq, lk = q.shape[2], k.shape[2]
    for b in range(s.shape[0]):
        log_a = np.zeros(lq + 1); log_a[lq] = np.log(K_LEN[b])
        log_b = np.zeros(lk + 1); log_b[lk] = np.log(Q_LEN[b])
        for h in range(s.shape[1]):
            want[b, h] = _np_sinkhorn(s[b, h], mask[b, h], log_a, log_b)
    out = _np_output(want, v, tokens)
    err = np.abs(np.asarray(res.out) - out).max()
    assert err < 5e-4
    fixed = _fn(_cfg(impl, eps=eps, dustbin="capacity"))[0](q, k, v, tokens)
    assert np.abs(np.asarray(fixed.out) - out).max() > 10 * err
    steps = np.asarray(res.stats.steps)
    assert np.all(steps > 17) and np.all(steps < 2000)
    assert np.all(res.stats.row_error <= 2e-5) and np.all(res.stats.col_error <= 2e-5)
    assert np.all(fixed.stats.steps == 15) and np.max(fixed.stats.row_error) > 1e-3


@pytest.mark.parametrize("impl", ["reference", pytest.param("xla", marks=pytest.mark.slow)])
def test_tolerance_solve_is_per_problem(impl):
    """A converged problem is frozen while its batch mates go on: its potentials stay those of
    its last step (the history repeats them) and it matches the pair solved alone."""
    q, k, v, tokens, _ = _inputs(seed=6)
    cfg = _cfg(impl, eps=0.3, dustbin="capacity", tol=1e-4, max_steps=500)
    both = transport(q, k, v, Q_LEN, K_LEN, tokens, config=cfg, return_stats=True, return_potentials=True)
    steps = np.asarray(both.stats.steps)
    assert steps.min() < steps.max()
    u = np.asarray(both.potentials.u)[:, :, :cfg.max_steps]
    for b, h in np.ndindex(steps.shape):
        frozen = u[b, h, steps[b, h] - 1:steps.max()]
        np.testing.assert_array_equal(frozen, np.broadcast_to(frozen[:1], frozen.shape))
    n = int(np.argmin(steps.max(-1)))
    one = transport(q[n:n + 1], k[n:n + 1], v[n:n + 1], Q_LEN[n:n + 1], K_LEN[n:n + 1], tokens,
                    config=cfg, return_stats=True)
    # the stopping test sees batch-dependent float32 rounding: one step either way at the edge
    np.testing.assert_allclose(one.stats.steps, steps[n:n + 1], atol=1)
    np.testing.assert_allclose(one.out, both.out[n:n + 1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("impl", _fast_first(["xla", "reference", "pallas"], 1))
def test_stats_report_the_infeasible_spoke_problem(impl):
    """Spoke, Lq != Lk: unit targets on Lq + 1 rows and Lk + 1 columns cannot all hold; the
    balanced solve's rows tend to (Lk + 1) / (Lq + 1), and the stats say so."""
    q, k, v, tokens, _ = _inputs(b=1, lq=20, lk=12, seed=7)
    ql, kl = np.array([20]), np.array([12])
    cfg = _cfg(impl, dustbin="spoke", tol=1e-6, max_steps=300, half_band=30)
    res = transport(q, k, v, ql, kl, tokens, config=cfg, return_stats=True)
    assert np.all(res.stats.steps == 300)  # never converges
    np.testing.assert_allclose(res.stats.row_error, 1 - 13 / 21, atol=1e-3)
    assert np.all(res.stats.col_error < 1e-5)


# ---- configuration ----------------------------------------------------------------------------


def test_old_config_dicts_load_with_defaults():
    old = {k: v for k, v in TransportConfig(half_band=8, dustbin="spoke").to_dict().items()
           if k not in ("marginals", "relax", "tol", "max_steps")}
    cfg = TransportConfig.from_dict(old)
    assert (cfg.marginals, cfg.relax, cfg.tol) == ("balanced", None, None)
    new = TransportConfig(half_band=8, marginals="rows", relax=0.25, tol=1e-3, max_steps=50)
    assert TransportConfig.from_dict(new.to_dict()) == new


@pytest.mark.parametrize("kwargs,message", [
    (dict(marginals="both"), "marginals must be one of"),
    (dict(relax=1.0), "relax needs a free side"),
    (dict(marginals="rows", relax=0.0), "relax"),
    (dict(tol=0.0), "tol must be > 0"),
    (dict(tol=1e-3, eps=0.5, base_steps=2, eps_schedule=((1.0, 1), (0.5, 1))), "tol solves at one eps"),
    (dict(max_steps=0), "max_steps"),
])
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransportConfig(half_band=4, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["tpu", "gpu"])
def test_new_modes_lower_for_platform(wrapper, monkeypatch):
    """Forward (while loop to tol, damped steps) and custom VJP lower to Mosaic / Triton."""
    monkeypatch.setattr(pallas_ops, "CPU_WRAPPER", wrapper)
    cfg = TransportConfig(half_band=70, tail_steps=2, dustbin="spoke", impl="pallas", interpret=False,
                          marginals="rows", relax=0.5, tol=1e-4, max_steps=20)
    q, k, v, tokens, g = _inputs(b=1, h=2, lq=300, lk=260, d=32, dv=16)
    ql, kl = jnp.array([290]), jnp.array([260])
    loss = lambda q, k, v, t: jnp.sum(g * transport(q, k, v, ql, kl, t, config=cfg))
    specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (q, k, v, tokens))
    text = pallas_ops.lower(jax.jit(jax.grad(loss, (0, 1, 2, 3))), {"tpu": "tpu", "gpu": "cuda"}[wrapper], *specs).as_text()
    assert {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}[wrapper] in text
