"""The transport op: banded XLA path vs the dense autodiff reference, finite differences,
plan marginals, the spoke/widened bridge, empty rows and the O(L W) memory contract."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.test_util
import jax.numpy as jnp
import numpy as np
import pytest

from pfamalign.kernels import BlockSizes, DustbinTokens, TransportConfig, transport, transport_plan
from pfamalign.kernels.band import active_entries, make_geometry
from pfamalign.kernels.config import IMPL_VARIANTS, impl_variant

GRAD_ATOL = 1e-5  # float32, absolute, as the issue requires
OUT_ATOL = 1e-5


def make_inputs(b, h, lq, lk, d, dv, seed=0, dtype=jnp.float32, scale=1.0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    q = scale * jax.random.normal(ks[0], (b, h, lq, d), dtype)
    k = scale * jax.random.normal(ks[1], (b, h, lk, d), dtype)
    v = jax.random.normal(ks[2], (b, h, lk, dv), dtype)
    tokens = DustbinTokens(
        jax.random.normal(ks[3], (h, d), dtype),
        jax.random.normal(ks[4], (h, d), dtype),
        jax.random.normal(ks[5], (h, dv), dtype),
    )
    w = jax.random.normal(ks[6], (b, h, lq, dv), dtype)  # a fixed linear functional of O
    return q, k, v, tokens, w


@functools.lru_cache(maxsize=None)
def _value_and_grad(cfg: TransportConfig):
    """jit(inputs -> ((loss, O), grads)): one compilation per config gives output and gradient."""

    def loss(q, k, v, tokens, q_len, k_len, w):
        out = transport(q, k, v, q_len, k_len, tokens, config=cfg)
        return jnp.sum(w * out), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))


@functools.lru_cache(maxsize=None)
def _jit_transport(cfg: TransportConfig):
    return jax.jit(lambda q, k, v, q_len, k_len, tokens=None: transport(q, k, v, q_len, k_len, tokens, config=cfg))


def _compare(cfg, lq, lk, q_len, k_len, *, b=2, h=2, d=8, dv=4, seed=0):
    q, k, v, tokens, w = make_inputs(b, h, lq, lk, d, dv, seed)
    q_len, k_len = jnp.asarray(q_len), jnp.asarray(k_len)
    ref_cfg = cfg.dense_reference()
    (_, out), grads = _value_and_grad(cfg)(q, k, v, tokens, q_len, k_len, w)
    (_, ref_out), ref_grads = _value_and_grad(ref_cfg)(q, k, v, tokens, q_len, k_len, w)
    np.testing.assert_allclose(out, ref_out, atol=OUT_ATOL, rtol=0)
    names = ("dq", "dk", "dv", "dustbin")
    for name, g, rg in zip(names, grads, ref_grads):
        for gl, rl in zip(jax.tree.leaves(g), jax.tree.leaves(rg)):
            assert np.all(np.isfinite(gl)), name
            np.testing.assert_allclose(gl, rl, atol=GRAD_ATOL, rtol=0, err_msg=name)
    return grads


# (name, lq, lk, q_len, k_len, half_band, block): balanced, ragged, rectangular both ways,
# band wider than the problem, several tiles with ragged band edges.
SHAPES = [
    ("balanced", 24, 24, [24, 24], [24, 24], 3, 8),
    ("ragged", 29, 29, [29, 17], [21, 29], 4, 8),
    ("rect_wide", 19, 33, [19, 14], [33, 30], 6, 8),
    ("rect_tall", 35, 18, [35, 30], [18, 11], 5, 16),
    ("band_covers_all", 20, 26, [20, 9], [26, 26], 100, None),
]


def _grid():
    """Every shape x dustbin x adjoint; a covering subset runs by default, the rest with --full."""
    cases = []
    for i, shape in enumerate(SHAPES):
        for j, dustbin in enumerate(["none", "spoke", "widened", "capacity"]):
            for k, adjoint in enumerate(["one_reference", "four_plan"]):
                fast = j == i % 4 and k == i % 2 or (shape[0], dustbin) in (("ragged", "spoke"), ("rect_tall", "capacity"))
                marks = () if fast else (pytest.mark.slow,)
                cases.append(pytest.param(shape, dustbin, adjoint, marks=marks,
                                          id=f"{shape[0]}-{dustbin}-{adjoint}"))
    return cases


@pytest.mark.parametrize("shape, dustbin, adjoint", _grid())
def test_xla_matches_reference(shape, dustbin, adjoint):
    _, lq, lk, ql, kl, w, block = shape
    cfg = TransportConfig(half_band=w, eps=0.7, base_steps=5, tail_steps=2, dustbin=dustbin,
                          impl="xla", adjoint=adjoint, blocks=BlockSizes(block))
    _compare(cfg, lq, lk, ql, kl)


@pytest.mark.parametrize("shape, dustbin", [(SHAPES[1], "spoke"), (SHAPES[3], "capacity"),
                                            pytest.param(SHAPES[2], "none", marks=pytest.mark.slow)])
def test_branch_free_steps_match_reference(shape, dustbin):
    """``branch_free=True`` (log-domain steps, two-pass log-sum-exps, no lax.cond): the same
    outputs and gradients as dense autodiff, as the default steps give."""
    _, lq, lk, ql, kl, w, block = shape
    cfg = TransportConfig(half_band=w, eps=0.7, base_steps=5, tail_steps=2, dustbin=dustbin,
                          impl="xla", blocks=BlockSizes(block), branch_free=True)
    _compare(cfg, lq, lk, ql, kl)


# never rebuilt is also what the default threshold gives these small problems (slow: the control)
@pytest.mark.parametrize("absorb", [0.0, pytest.param(float("inf"), marks=pytest.mark.slow)],
                         ids=["rebuilt every step", "never rebuilt"])
def test_scaling_steps_match_reference_whether_or_not_the_plan_is_rebuilt(absorb, monkeypatch):
    """The default XLA solve (scaling domain) rebuilds its reference plan, in a loop of zero or
    one trip, once the potentials drift past ``_ABSORB``: rebuilt at every step or never, the
    same outputs and gradients as dense autodiff (a rebuild that lost the new plan, or kept a
    stale one, would show at absorb 0)."""
    from pfamalign.kernels import sinkhorn

    monkeypatch.setattr(sinkhorn, "_ABSORB", absorb)
    jax.clear_caches()  # the threshold is read when the solve is traced
    _, lq, lk, ql, kl, w, block = SHAPES[1]
    cfg = TransportConfig(half_band=w, eps=0.7, base_steps=5, tail_steps=2, dustbin="spoke", impl="xla",
                          blocks=BlockSizes(block))
    _compare(cfg, lq, lk, ql, kl)
    jax.clear_caches()


@pytest.mark.parametrize("variant", [
    dict(impl="xla", dustbin="spoke"),  # the scaling-domain solve, the one-reference adjoint
    dict(impl="xla", dustbin="capacity", eps_schedule=((1.4, 3), (0.7, 2)), adjoint="four_plan"),  # log domain
    dict(impl="pallas", dustbin="none", resident_scores=True),  # the stored-band kernels (interpret mode)
], ids=["scaling", "schedule-four_plan", "pallas-resident"])
def test_unrolled_steps_match_reference(variant):
    """``unroll=True`` (base, tail and backward sweep as straight-line steps): the same outputs
    and gradients as dense autodiff; a flag that is not a bool is refused."""
    _, lq, lk, ql, kl, w, block = SHAPES[1]
    cfg = TransportConfig(half_band=w, eps=0.7, base_steps=5, tail_steps=2, unroll=True,
                          blocks=BlockSizes(block), **variant)
    _compare(cfg, lq, lk, ql, kl)
    with pytest.raises(ValueError, match="unroll must be True or False"):
        dataclasses.replace(cfg, unroll=1)


@pytest.mark.parametrize("one_pass", [False, True], ids=["two_pass", "one_pass"])
@pytest.mark.parametrize("variant", [
    dict(marginals="balanced"),  # the centering inside the column kernel
    dict(marginals="rows", relax=0.5),  # a damped side, no centering
    dict(marginals="cols"),  # a free side: its potential 0 guesses no LSE (was a ZeroDivisionError)
    dict(dustbin="spoke"),  # spokes: each line's dustbin entry in the kernels (one pass: unfused steps)
    pytest.param(dict(dustbin="capacity", marginals="rows", relax=0.5), marks=pytest.mark.slow),  # dustbin targets
], ids=["balanced", "damped", "free", "spoke", "capacity-damped"])
def test_fused_steps_match_reference(variant, one_pass):
    """``fused_steps=True`` (two kernels a step on the stored band; interpret mode), reading the
    band twice a step or once (``one_pass_steps``): the same outputs and gradients as dense
    autodiff, looped and unrolled; fused steps need resident scores, one pass fused steps.
    With dustbin spokes the two-walk steps fold each line's dustbin entry into its kernel's LSE
    and solve the dustbin lines between the kernels; one-pass steps take the unfused ones."""
    _, lq, lk, ql, kl, w, block = SHAPES[1]
    cfg = TransportConfig(half_band=w, eps=0.7, base_steps=5, tail_steps=2, impl="pallas", resident_scores=True,
                          fused_steps=True, one_pass_steps=one_pass, blocks=BlockSizes(block), **variant)
    _compare(cfg, lq, lk, ql, kl)
    if variant.get("marginals") == "balanced":
        _compare(dataclasses.replace(cfg, unroll=True), lq, lk, ql, kl)
    with pytest.raises(ValueError, match="fused_steps needs resident_scores"):
        dataclasses.replace(cfg, resident_scores=False)
    with pytest.raises(ValueError, match="fused_steps must be True or False"):
        dataclasses.replace(cfg, fused_steps=1)
    with pytest.raises(ValueError, match="one_pass_steps needs fused_steps"):
        dataclasses.replace(cfg, fused_steps=False, one_pass_steps=True)
    with pytest.raises(ValueError, match="one_pass_steps must be True or False"):
        dataclasses.replace(cfg, one_pass_steps=1)


@pytest.mark.parametrize("dustbin", ["spoke", pytest.param("capacity", marks=pytest.mark.slow)])
def test_fused_steps_with_spokes_give_every_steps_potentials(dustbin):
    """The fused steps solve the dustbin lines inside their kernels: every step's potentials,
    the dustbin slots included (what the certificates read), and the output plan's marginal
    errors match the XLA path's (ragged, interpret mode)."""
    _, lq, lk, ql, kl, w, block = SHAPES[1]
    q, k, v, tokens, _ = make_inputs(2, 2, lq, lk, 8, 4, 0)
    run = lambda impl: transport(q, k, v, jnp.asarray(ql), jnp.asarray(kl), tokens, return_potentials=True,
                                 return_stats=True, config=TransportConfig(
                                     half_band=w, eps=0.7, base_steps=5, tail_steps=2, dustbin=dustbin,
                                     blocks=BlockSizes(block), **impl_variant(impl)))
    got, want = run("pallas-fused"), run("xla")
    (out, pots, stats), (want_out, want_pots, want_stats) = (
        (r.out, r.potentials, r.stats) for r in (got, want))
    np.testing.assert_allclose(out, want_out, atol=OUT_ATOL, rtol=0)
    for got, want in zip((*pots, *stats), (*want_pots, *want_stats)):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), atol=1e-5, rtol=1e-5)
    assert np.any(np.asarray(pots[0])[..., -1] != 0)  # the dustbin slots were compared, not zeros


@pytest.mark.parametrize("variant", [
    dict(resident_scores=True, fused_steps=True, one_pass_steps=True),  # scores kernel, stored products
    dict(dustbin="spoke"),  # score tiles recomputed in every log-sum-exp and product
], ids=["one_pass", "recomputed-spoke"])
def test_tf32x3_dots_match_reference(variant):
    """``triton_dots="tf32x3"`` (the Triton dots as three TF32 products; interpret mode emulates
    their arithmetic): the same outputs and gradients as dense autodiff within the op's 1e-5,
    at d = 64 (the benchmark's); the gradients are not the "ieee" kernels' bit for bit (the
    emulation ran); another name is refused."""
    _, lq, lk, ql, kl, w, block = SHAPES[1]
    cfg = TransportConfig(half_band=w, eps=0.7, base_steps=5, tail_steps=2, impl="pallas", triton_dots="tf32x3",
                          blocks=BlockSizes(block), **variant)
    grads = _compare(cfg, lq, lk, ql, kl, d=64)
    q, k, v, tokens, w_out = make_inputs(2, 2, lq, lk, 64, 4, 0)
    ieee = _value_and_grad(dataclasses.replace(cfg, triton_dots="ieee"))(
        q, k, v, tokens, jnp.asarray(ql), jnp.asarray(kl), w_out)[1]
    assert not np.array_equal(grads[0], ieee[0])
    with pytest.raises(ValueError, match="triton_dots must be one of"):
        dataclasses.replace(cfg, triton_dots="tf32")


# (0, 0) is no plan at all: TransportConfig refuses it (test_hardening's invalid configurations)
@pytest.mark.parametrize("base_steps, tail_steps", [(0, 1), (3, 0), (3, 3), pytest.param(3, 1, marks=pytest.mark.slow),
                                                    pytest.param(0, 3, marks=pytest.mark.slow)])
def test_any_tail_depth(base_steps, tail_steps):
    cfg = TransportConfig(half_band=4, eps=0.5, base_steps=base_steps, tail_steps=tail_steps,
                          dustbin="spoke", impl="xla", blocks=BlockSizes(8))
    _compare(cfg, 21, 19, [21, 15], [19, 19])


@pytest.mark.slow
def test_four_plan_adjoint_without_tail():
    # R = 0: the sweep over tail plans is empty and the gradient is P∘G alone (this failed
    # once: the baseline schedule read R + 1 previous potentials).
    cfg = TransportConfig(half_band=4, eps=0.5, base_steps=3, tail_steps=0, dustbin="spoke",
                          impl="xla", adjoint="four_plan", blocks=BlockSizes(8))
    _compare(cfg, 21, 19, [21, 15], [19, 19])


def test_eps_schedule_matches_reference():
    cfg = TransportConfig(half_band=5, eps=0.5, base_steps=6, tail_steps=2, dustbin="spoke",
                          eps_schedule=((2.0, 2), (1.0, 2), (0.5, 2)), impl="xla", blocks=BlockSizes(8))
    _compare(cfg, 26, 22, [26, 20], [22, 17])


def _cold_problem(eps=0.05, scale=3.0, base_steps=4, seed=3):
    """eps 0.05 and scores x3: |S| / eps reaches 933, so the one-pass shifted log-sum-exp
    leaves its window on the first step. Returns the config, inputs and the float64 dense
    reference's output and gradients (q, k, v)."""
    cfg = TransportConfig(half_band=6, eps=eps, base_steps=base_steps, tail_steps=2, impl="xla",
                          blocks=BlockSizes(8))
    q, k, v, tokens, w = make_inputs(1, 1, 24, 24, 8, 4, seed=seed, scale=scale)
    lens = jnp.array([24])
    with jax.enable_x64(True):
        args64 = [np.asarray(x, np.float64) for x in (q, k, v, w)]
        (_, out64), grads64 = _cold_value_and_grad(dataclasses.replace(cfg, impl="reference"), lens, *args64)
        out64, grads64 = np.asarray(out64), [np.asarray(g) for g in grads64]
    scores = np.einsum("id,jd->ij", *(np.asarray(x[0, 0], np.float64) for x in (q, k))) / np.sqrt(8) / cfg.eps
    return cfg, (q, k, v, w), lens, out64, grads64, np.abs(scores).max()


def _cold_value_and_grad(cfg, lens, q, k, v, w):
    def loss(q, k, v):
        out = transport(q, k, v, lens, lens, config=cfg)
        return jnp.sum(w * out), out
    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)


def test_cold_scores_use_exact_fallback():
    """The exact two-pass form takes over (without it the output is off by far more) and the
    output stays within float32's forward error at this score scale of float64: an exponent
    of size |S| / eps carries u |S| / eps, the plan's entries that relative error, the output
    at most that times max |V| (1.8e-4 here; 9.6e-5 measured, float32 dense autodiff 2.1e-5)."""
    cfg, (q, k, v, w), lens, out64, _, scale = _cold_problem()
    (_, out), _ = _cold_value_and_grad(cfg, lens, q, k, v, w)
    assert np.all(np.isfinite(out))
    bound = np.finfo(np.float32).eps / 2 * scale * np.abs(np.asarray(v)).max()
    np.testing.assert_allclose(out, out64, atol=bound, rtol=0)


@pytest.mark.parametrize("eps, scale, base_steps", [(0.05, 3.0, 4), (1e-3, 1.0, 0), (1e-3, 1.0, 4)])
def test_cold_score_gradients_are_as_exact_as_dense_autodiff(eps, scale, base_steps):
    """At cold scores (|S| / eps ~ 900, and ~3000 at eps 1e-3) the banded gradients stay within
    4x of dense float32 autodiff's own distance from float64. The XLA path's tail runs in the
    log domain for this: with scaling-domain tail steps its dq was 7x autodiff's (2026-11-29).
    And the adjoint divides by its plans' line sums as computed, not by the targets they equal
    in exact arithmetic: with the targets, dq was 970x autodiff's at eps 1e-3, T 0 (a nearly
    saturated plan, true gradient ~1e-11) and 6.6x at T 4 (2026-11-30)."""
    cfg, (q, k, v, w), lens, _, grads64, _ = _cold_problem(eps, scale, base_steps)
    _, grads = _cold_value_and_grad(cfg, lens, q, k, v, w)
    _, dense = _cold_value_and_grad(dataclasses.replace(cfg, impl="reference"), lens, q, k, v, w)
    for got, ref, want in zip(grads, dense, grads64):
        assert np.abs(np.asarray(got) - want).max() <= 4 * np.abs(np.asarray(ref) - want).max()


@pytest.mark.parametrize("seed", [3, pytest.param(1, marks=pytest.mark.slow)])
@pytest.mark.parametrize("variant", ["pallas", "pallas-resident", "pallas-fused"])
def test_kernel_walks_round_one_plan_at_cold_scores(variant, seed):
    """The kernels' row and column walks compute a plan entry with the same roundings
    (``<scale q_i, k_j>`` on both, offsets added as ``s + (a_i + c_j)``), so the adjoint's
    products all see one plan and its cold-score cancellations cancel as the XLA path's do. At
    eps 1e-3, T 0 (true dq, dk ~1e-11), with ``<scale k_j, q_i>`` and ``(s + c_j) + a_i`` on
    column walks the Pallas paths' dq and dk were 6-137x dense f32 autodiff's distance from
    float64 (seeds 0-3); now 1-5x (2026-11-30). Interpret mode: XLA's CPU arithmetic in the
    kernels' order."""
    cfg, (q, k, v, w), lens, _, grads64, _ = _cold_problem(1e-3, 1.0, 0, seed)
    _, dense = _cold_value_and_grad(dataclasses.replace(cfg, impl="reference"), lens, q, k, v, w)
    _, grads = _cold_value_and_grad(dataclasses.replace(cfg, **IMPL_VARIANTS[variant]), lens, q, k, v, w)
    for got, ref, want in list(zip(grads, dense, grads64))[:2]:  # dq, dk: the cancelling sums
        assert np.abs(np.asarray(got) - want).max() <= 8 * np.abs(np.asarray(ref) - want).max()


def test_finite_differences_of_public_op():
    # The op's gradient is that of the stopped-base surrogate; finite differences see the base
    # move too. With T = 0 the base is the constant zero potential, the surrogate is the
    # function itself, and the R-step adjoint must match central differences.
    with jax.enable_x64(True):
        q, k, v, tokens, _ = make_inputs(1, 2, 13, 11, 4, 3, seed=5, dtype=jnp.float64)
        ql, kl = jnp.array([13]), jnp.array([10])
        cfg = TransportConfig(half_band=3, eps=0.8, base_steps=0, tail_steps=3, dustbin="spoke",
                              impl="xla", blocks=BlockSizes(8))
        f = lambda q, k, v, tq, tk, tv: transport(q, k, v, ql, kl, DustbinTokens(tq, tk, tv), config=cfg)
        # jitted: the differences' evaluations run compiled (2.5x faster than op by op)
        jax.test_util.check_grads(jax.jit(f), (q, k, v) + tuple(tokens), order=1, modes=["rev"], atol=1e-6,
                                  rtol=1e-6)


def _dense_plan(cfg, q, k, q_len, k_len):
    """The plan over real keys read off the public op with V = identity (and its dustbin column)."""
    b, h, lk = k.shape[0], k.shape[1], k.shape[2]
    eye = jnp.broadcast_to(jnp.eye(lk + 1)[:lk], (b, h, lk, lk + 1))
    tokens = DustbinTokens(jnp.ones((h, q.shape[-1])) * 0.1, jnp.ones((h, q.shape[-1])) * -0.2,
                           jnp.broadcast_to(jnp.eye(lk + 1)[lk], (h, lk + 1)))
    return _jit_transport(cfg)(q, k, eye, q_len, k_len, tokens)


def test_plan_marginals_balanced():
    # Columns are exact after the final half-step; rows converge for a balanced square problem.
    cfg = TransportConfig(half_band=5, eps=1.0, base_steps=200, tail_steps=2, impl="xla", blocks=BlockSizes(8))
    q, k, _, _, _ = make_inputs(2, 1, 30, 30, 8, 4, seed=1, scale=0.5)
    ql = kl = jnp.array([30, 30])
    plan = _dense_plan(cfg, q, k, ql, kl)[..., :30]
    np.testing.assert_allclose(plan.sum(-2), 1.0, atol=1e-5)
    np.testing.assert_allclose(plan.sum(-1), 1.0, atol=1e-4)
    i, j = np.indices((30, 30))
    assert np.all(np.asarray(plan)[..., np.abs(i - j) > 5] == 0.0)


def test_plan_marginals_ragged_and_empty_rows():
    # Rows past k_len + W have no support: no mass, zero output, no NaN; padded rows likewise.
    cfg = TransportConfig(half_band=2, eps=1.0, base_steps=10, tail_steps=2, impl="xla", blocks=BlockSizes(8))
    q, k, _, _, _ = make_inputs(2, 1, 20, 20, 8, 4, seed=2)
    ql, kl = jnp.array([20, 0]), jnp.array([8, 20])
    plan = np.asarray(_dense_plan(cfg, q, k, ql, kl))
    assert np.all(np.isfinite(plan))
    assert np.all(plan[0, :, 11:] == 0.0)  # rows 11.. are further than W=2 from every key < 8
    assert np.all(plan[1] == 0.0)  # q_len = 0: nothing is active
    np.testing.assert_allclose(plan[0, 0, :, :8].sum(0), 1.0, atol=1e-5)  # columns exact


def test_empty_problem_has_finite_zero_gradients():
    cfg = TransportConfig(half_band=2, eps=1.0, base_steps=3, tail_steps=2, dustbin="spoke", impl="xla",
                          blocks=BlockSizes(8))
    q, k, v, tokens, w = make_inputs(2, 1, 12, 12, 4, 3, seed=4)
    ql, kl = jnp.array([0, 12]), jnp.array([5, 0])
    _, grads = _value_and_grad(cfg)(q, k, v, tokens, ql, kl, w)
    for leaf in jax.tree.leaves(grads):
        assert np.all(np.isfinite(leaf))
    assert np.all(np.asarray(grads[0])[0] == 0.0)  # no active query row in item 0


def test_spoke_equals_widened_when_band_covers_everything():
    """The identity in float64 (to 1e-12: the two supports are one problem); in float32 each
    mode's output and gradients within 4x the dense float32 autodiff's own distance from it
    (the modes round in different orders: they differ from each other by that much)."""
    q, k, v, tokens, w = make_inputs(2, 2, 17, 23, 8, 4, seed=6)
    ql, kl = jnp.array([17, 12]), jnp.array([23, 19])
    leaves = lambda r: [np.asarray(x, np.float64) for x in (r[0][1], *jax.tree.leaves(r[1]))]
    cfg = lambda mode, impl="xla": TransportConfig(half_band=40, eps=0.6, base_steps=5, tail_steps=2, dustbin=mode,
                                                   impl=impl)
    with jax.enable_x64(True):
        wide = jax.tree.map(lambda a: jnp.asarray(np.asarray(a, np.float64)), (q, k, v, tokens, w))
        exact = {mode: leaves(_value_and_grad(cfg(mode))(*wide[:4], ql, kl, wide[4])) for mode in ("spoke", "widened")}
    for a, b in zip(exact["spoke"], exact["widened"]):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)
    dense = leaves(_value_and_grad(cfg("spoke", "reference"))(q, k, v, tokens, ql, kl, w))
    for mode in ("spoke", "widened"):
        got = leaves(_value_and_grad(cfg(mode))(q, k, v, tokens, ql, kl, w))
        for g, d, e in zip(got, dense, exact["spoke"]):
            assert np.abs(g - e).max() <= 4 * np.abs(d - e).max(), mode


def test_spoke_differs_from_widened_when_band_is_narrow():
    # The bridge identity is specific to W >= L: a narrow band is a different support.
    q, k, v, tokens, _ = make_inputs(1, 1, 20, 20, 8, 4, seed=7)
    ql = kl = jnp.array([20])
    outs = [_jit_transport(TransportConfig(half_band=2, dustbin=m, base_steps=5))(q, k, v, ql, kl, tokens)
            for m in ("spoke", "widened")]
    assert float(jnp.max(jnp.abs(outs[0] - outs[1]))) > 1e-3


def test_potentials_history_matches_reference():
    cfg = TransportConfig(half_band=4, eps=0.9, base_steps=4, tail_steps=2, dustbin="spoke", impl="xla",
                          blocks=BlockSizes(8))
    q, k, v, tokens, _ = make_inputs(2, 2, 18, 15, 8, 4, seed=8)
    ql, kl = jnp.array([18, 10]), jnp.array([15, 15])
    pots = jax.jit(lambda *a: transport(*a, config=cfg, return_potentials=True).potentials)(q, k, v, ql, kl, tokens)
    ref_cfg = dataclasses.replace(cfg, impl="reference")
    ref = jax.jit(lambda *a: transport(*a, config=ref_cfg, return_potentials=True).potentials)(q, k, v, ql, kl, tokens)
    assert pots.u.shape == (2, 2, 6, 19) and pots.v.shape == (2, 2, 6, 16)
    np.testing.assert_allclose(pots.u, ref.u, atol=1e-5)
    np.testing.assert_allclose(pots.v, ref.v, atol=1e-5)


def test_band_never_materializes_full_matrix():
    """No intermediate of the banded forward+backward has Lp x Lp entries (here 512 x 512)."""
    L, W = 512, 16
    cfg = TransportConfig(half_band=W, eps=1.0, base_steps=3, tail_steps=2, dustbin="spoke", impl="xla",
                          blocks=BlockSizes(32))
    q, k, v, tokens, w = make_inputs(1, 1, L, L, 8, 4)
    ql = kl = jnp.array([L])
    jaxpr = jax.make_jaxpr(lambda *a: _value_and_grad.__wrapped__(cfg)(*a))(q, k, v, tokens, ql, kl, w)
    band_entries = make_geometry(L, W, 32).n_diag * 32 * L
    largest = 0

    def visit(jpr):
        nonlocal largest
        for eqn in jpr.eqns:
            for var in eqn.outvars:
                largest = max(largest, int(np.prod(getattr(var.aval, "shape", ()))))
            for param in eqn.params.values():
                for sub in (param if isinstance(param, (list, tuple)) else [param]):
                    if hasattr(sub, "jaxpr"):
                        visit(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub)
                    elif hasattr(sub, "eqns"):
                        visit(sub)

    visit(jaxpr.jaxpr)
    assert largest <= band_entries < L * L // 4, (largest, band_entries)


def test_active_entry_count_formula():
    for L, W in [(10, 0), (10, 3), (16384, 1024), (7, 20)]:
        brute = sum(1 for i in range(min(L, 60)) for j in range(min(L, 60)) if abs(i - j) <= W) if L <= 60 else None
        closed = L * (2 * W + 1) - W * (W + 1) if W < L else L * L
        assert active_entries(L, L, W) == closed
        if brute is not None:
            assert brute == closed
    assert active_entries(16384, 16384, 1024) == 32_521_216


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(half_band=-1), "half_band"),
        (dict(half_band=3, eps=0.0), "eps"),
        (dict(half_band=3, base_steps=-1), "base_steps"),
        (dict(half_band=3, tail_steps=-2), "tail_steps"),
        (dict(half_band=3, dustbin="bucket"), "dustbin"),
        (dict(half_band=3, branch_free="yes"), "branch_free must be True or False"),
        (dict(half_band=3, base_steps=4, eps=0.5, eps_schedule=((1.0, 2), (0.5, 1))), "sum"),
        (dict(half_band=3, base_steps=2, eps=0.5, eps_schedule=((0.5, 1), (1.0, 1))), "non-increasing"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransportConfig(**kwargs)


def test_input_errors():
    q, k, v, tokens, _ = make_inputs(2, 1, 10, 12, 8, 4)
    ql, kl = jnp.array([10, 10]), jnp.array([12, 12])
    with pytest.raises(ValueError, match=r"\[B, H, L, d\]"):
        transport(q[0], k, v, ql, kl, half_band=3)
    with pytest.raises(ValueError, match="k and v lengths"):
        transport(q, k, v[:, :, :5], ql, kl, half_band=3)
    with pytest.raises(ValueError, match="feature dims"):
        transport(q, k[..., :4], v, ql, kl, half_band=3)
    with pytest.raises(ValueError, match="q_len must have shape"):
        transport(q, k, v, jnp.array([10]), kl, half_band=3)
    with pytest.raises(ValueError, match="k_len must lie"):
        transport(q, k, v, ql, jnp.array([12, 13]), half_band=3)
    with pytest.raises(ValueError, match="needs DustbinTokens"):
        transport(q, k, v, ql, kl, half_band=3, dustbin="spoke")
    with pytest.raises(ValueError, match="dustbin tokens must have shapes"):
        transport(q, k, v, ql, kl, tokens._replace(v=tokens.v[:, :2]), half_band=3, dustbin="spoke")
    with pytest.raises(ValueError, match="empty sequence axis"):
        transport(q[:, :, :0], k, v, ql * 0, kl, half_band=3)
    cfg = TransportConfig(half_band=3)
    for op, args in ((transport, (q, k, v, ql, kl)), (transport_plan, (q, k, ql, kl))):
        with pytest.raises(ValueError, match="either config or settings"):  # eps would be ignored
            op(*args, config=cfg, eps=0.5)
    # each of these ran before, on some paths silently wrong (a float length truncated by the
    # banded paths, not by the reference; a target past Lk "none" there, the dustbin here)
    with pytest.raises(ValueError, match="q_len must be integers"):
        transport(q, k, v, jnp.array([3.5, 10.0]), kl, half_band=3)
    with pytest.raises(ValueError, match=r"targets must lie in \[-1, Lk=12\]"):
        transport(q, k, v, ql, kl, half_band=3, targets=jnp.full((2, 10), 13))
    with pytest.raises(ValueError, match="targets must be integers"):
        transport(q, k, v, ql, kl, half_band=3, targets=jnp.zeros((2, 10)))
    with pytest.raises(ValueError, match="d >= 1"):
        transport(q[..., :0], k[..., :0], v, ql, kl, half_band=3)
    with pytest.raises(ValueError, match="relax .* must be finite"):  # inf / inf was a NaN plan
        TransportConfig(half_band=3, marginals="rows", relax=float("inf"))


def test_traced_lengths_past_the_arrays_mean_the_whole_axis():
    """Under jit the lengths cannot be range-checked: one past the array is clamped to it, on
    every path alike (the banded path let its zero padding into the problem)."""
    q, k, v, tokens, _ = make_inputs(1, 1, 6, 6, 8, 4, seed=3)
    full = jnp.array([6])
    for impl in ("xla", "reference"):
        cfg = TransportConfig(half_band=2, dustbin="spoke", impl=impl, base_steps=4)
        want = transport(q, k, v, full, full, tokens, config=cfg)
        got = jax.jit(lambda ql: transport(q, k, v, ql, full, tokens, config=cfg))(jnp.array([9]))
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=impl)


def test_pallas_takes_any_float_dtype_and_answers_in_it():
    """The kernels compute in float32: bfloat16 inputs (and float64 ones) crashed the Pallas
    paths' step loops; now the op casts in and out, gradients included, and matches the
    float32 result to the input dtype's precision."""
    q, k, v, tokens, w = make_inputs(1, 1, 12, 12, 8, 4, seed=5)
    lens = jnp.array([12])
    cfg = TransportConfig(half_band=3, base_steps=4, impl="pallas", blocks=BlockSizes(8))
    loss = lambda q, k, v: jnp.sum(w.astype(q.dtype) * transport(q, k, v, lens, lens, config=cfg))
    want, want_g = jax.value_and_grad(loss, (0, 1, 2))(q, k, v)
    half = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    got, got_g = jax.value_and_grad(loss, (0, 1, 2))(*half)
    assert got.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in got_g)
    np.testing.assert_allclose(np.float32(got), want, rtol=0.05, atol=0.05)
    for a, b in zip(got_g, want_g):
        np.testing.assert_allclose(np.float32(a), b, atol=0.1 * float(jnp.abs(b).max()))


@pytest.mark.parametrize("dustbin", ["spoke", "widened", "none", "capacity"])
def test_target_log_plan_and_its_gradient_match_reference(dustbin):
    """log P_{i,t_i} (keys, the dustbin column, absent and off-band targets) and the gradient
    of a cross-entropy on it plus a loss on O, against dense autodiff."""
    b, h, lq, lk = 2, 2, 21, 18
    q, k, v, tokens, w = make_inputs(b, h, lq, lk, 8, 4, seed=11)
    ql, kl = jnp.array([21, 16]), jnp.array([18, 15])
    rng = np.random.default_rng(0)
    targets = rng.integers(-1, lk + 1, size=(b, lq))  # includes -1 (none) and lk (dustbin)
    targets[0, 20] = 2  # far outside the band: not in the support
    targets = jnp.asarray(targets)
    res = {}
    for impl in ("xla", "reference"):
        cfg = TransportConfig(half_band=5, eps=0.8, base_steps=4, tail_steps=2, dustbin=dustbin, impl=impl,
                              blocks=BlockSizes(8))

        def loss(q, k, v, tokens):
            r = transport(q, k, v, ql, kl, tokens, config=cfg, targets=targets)
            ce = -jnp.sum(jnp.where(jnp.isfinite(r.target_logp), r.target_logp, 0.0))
            return ce + jnp.sum(w * r.out), r.target_logp

        res[impl] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, tokens)
    (_, logp), grads = res["xla"]
    (_, ref_logp), ref_grads = res["reference"]
    finite = np.isfinite(np.asarray(ref_logp))
    np.testing.assert_array_equal(np.isfinite(np.asarray(logp)), finite)
    assert finite[0, :, 20].all() == (dustbin == "widened")  # off-band unless the band is widened
    np.testing.assert_allclose(np.asarray(logp)[finite], np.asarray(ref_logp)[finite], atol=2e-5)
    for g, rg in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(g, rg, atol=GRAD_ATOL, rtol=0)


def test_dense_plan_is_the_plan_the_op_applies():

    cfg = TransportConfig(half_band=4, eps=0.8, base_steps=6, tail_steps=2, dustbin="spoke", impl="xla",
                          blocks=BlockSizes(8))
    q, k, v, tokens, _ = make_inputs(2, 2, 15, 13, 8, 4, seed=12)
    ql, kl = jnp.array([15, 11]), jnp.array([13, 13])
    plan = transport_plan(q, k, ql, kl, tokens, config=cfg)
    assert plan.shape == (2, 2, 16, 14)
    v_ext = jnp.concatenate([v, jnp.broadcast_to(tokens.v[None, :, None], (2, 2, 1, 4))], 2)
    expected = jnp.einsum("bhij,bhjv->bhiv", plan[:, :, :15], v_ext)
    np.testing.assert_allclose(_jit_transport(cfg)(q, k, v, ql, kl, tokens), expected, atol=1e-5)


def test_capacity_dustbin_marginals():
    """Capacity mode is balanced: real rows and columns carry 1, the dustbin row carries the
    active key count and the dustbin column the active query count; rows converge too."""

    cfg = TransportConfig(half_band=6, eps=1.0, base_steps=300, tail_steps=2, dustbin="capacity", impl="xla",
                          blocks=BlockSizes(8))
    q, k, v, tokens, _ = make_inputs(2, 1, 19, 23, 8, 4, seed=13, scale=0.5)
    ql, kl = jnp.array([19, 12]), jnp.array([23, 20])
    plan = np.asarray(transport_plan(q, k, ql, kl, tokens, config=dataclasses.replace(cfg, impl="reference")))
    for b, (lq, lk) in enumerate([(19, 23), (12, 20)]):
        p = plan[b, 0]
        rows = np.r_[p[:lq].sum(1), p[-1].sum()]
        cols = np.r_[p[:, :lk].sum(0), p[:, -1].sum()]
        np.testing.assert_allclose(cols, np.r_[np.ones(lk), lq], atol=1e-4)
        np.testing.assert_allclose(rows, np.r_[np.ones(lq), lk], atol=1e-3)
    # the banded op applies that same plan
    eye = jnp.broadcast_to(jnp.eye(24)[:23], (2, 1, 23, 24))
    tok = DustbinTokens(tokens.q, tokens.k, jnp.eye(24)[23][None])
    out = np.asarray(_jit_transport(cfg)(q, k, eye, ql, kl, tok))
    np.testing.assert_allclose(out[0, 0], plan[0, 0, :19], atol=1e-5)


def test_auto_impl_is_resolved_by_the_kernels_per_platform():
    from pfamalign.kernels import resolve_impl

    assert resolve_impl("auto", "cpu") == "xla"
    assert resolve_impl("auto", "tpu") == "pallas"
    assert resolve_impl("auto", "cuda") == "pallas-fused"  # the measured-faster banded path on GPU, "ieee" dots
    assert resolve_impl("reference", "tpu") == "reference"  # explicit choices pass through
    assert TransportConfig(half_band=4).impl == "auto"
    assert TransportConfig(half_band=4).resolved("cpu").impl == "xla"


def test_gpu_auto_is_dense_below_the_measured_crossover(monkeypatch):
    """On GPU, dense autodiff below ``GPU_DENSE_CROSSOVER`` and ``GPU_BANDED_IMPL`` from it on
    (and when the length is unknown or the crossover unset); other platforms ignore it."""
    from pfamalign.kernels import config, resolve_impl

    monkeypatch.setattr(config, "GPU_DENSE_CROSSOVER", 4096)
    monkeypatch.setattr(config, "GPU_BANDED_IMPL", "pallas")
    assert resolve_impl("auto", "cuda", length=1024) == "reference"
    assert resolve_impl("auto", "cuda", length=4096) == "pallas"
    assert resolve_impl("auto", "cuda") == "pallas"
    assert resolve_impl("auto", "tpu", length=1024) == "pallas"
    assert resolve_impl("auto", "cpu", length=1024) == "xla"
    assert TransportConfig(half_band=4).resolved("cuda", length=100).impl == "reference"
    monkeypatch.setattr(config, "GPU_DENSE_CROSSOVER", None)
    assert resolve_impl("auto", "cuda", length=64) == "pallas"
    # A variant: the config takes its settings.
    monkeypatch.setattr(config, "GPU_BANDED_IMPL", "pallas-resident")
    resolved = TransportConfig(half_band=4, dustbin="spoke").resolved("cuda", length=10_000)
    assert (resolved.impl, resolved.resident_scores, resolved.dustbin) == ("pallas", True, "spoke")
    assert TransportConfig(half_band=4).resolved("cpu").resident_scores is False


def test_gpu_auto_loops_where_the_fused_steps_do_not_apply(monkeypatch):
    """The fused banded variant is taken only where its measured fused steps run (one eps, no
    tolerance, Triton kernels; any dustbin) and at most ``GPU_UNROLLED_MAX_STEPS`` straight-line
    steps (its compile grows with them; a base run to a tolerance is a loop, so only its tail
    counts); elsewhere the looped ``GPU_LOOPED_IMPL``, with its own dense crossover. A looped
    banded variant is kept at any step count."""
    from pfamalign.kernels import config, resolve_impl

    monkeypatch.setattr(config, "GPU_DENSE_CROSSOVER", 4096)
    monkeypatch.setattr(config, "GPU_LOOPED_CROSSOVER", 8192)
    monkeypatch.setattr(config, "GPU_BANDED_IMPL", "pallas-fused-tf32x3")
    cap = config.GPU_UNROLLED_MAX_STEPS
    assert resolve_impl("auto", "cuda", length=4096, steps=cap) == "pallas-fused-tf32x3"
    assert resolve_impl("auto", "cuda", length=8192, steps=cap + 1) == config.GPU_LOOPED_IMPL == "xla"
    assert resolve_impl("auto", "cuda", length=4096, steps=cap + 1) == "reference"  # the looped crossover
    assert resolve_impl("auto", "cuda", length=8192, fused=False) == "xla"
    resolved = lambda **kw: TransportConfig(half_band=4, **kw).resolved("cuda", length=8192)
    for kw in (dict(base_steps=cap, tail_steps=2), dict(eps_schedule=((2.0, 10), (1.0, 5))), dict(kernel="tpu")):
        assert resolved(**kw).impl == "xla", kw  # kernel="tpu" resolved to the stored band was refused
    assert resolved(base_steps=cap, tail_steps=2, tol=1e-4).impl == "xla"  # a tolerance: unfused steps
    for kw in (dict(), dict(dustbin="widened"), dict(dustbin="spoke"), dict(dustbin="capacity")):  # fused steps
        assert (resolved(**kw).impl, resolved(**kw).fused_steps, resolved(**kw).triton_dots) == \
            ("pallas", True, "tf32x3"), kw
    monkeypatch.setattr(config, "GPU_BANDED_IMPL", "pallas-resident")
    assert resolve_impl("auto", "cuda", length=8192, steps=10 * cap, fused=False) == "pallas-resident"


@pytest.mark.parametrize("d, dv, fits", [(256, 64, True), (320, 16, False), (64, 256, False)])
def test_gpu_auto_takes_the_xla_path_where_the_stored_band_does_not_fit(d, dv, fits):
    """``impl="auto"`` on a GPU takes the stored-band kernels only at feature widths whose
    calls fit the device's shared memory (``pallas_gpu.stored_band_fits``; here, with no GPU,
    the smallest budget listed, a consumer card's); elsewhere the looped XLA path (dense below
    its crossover), where before it raised the kernels' tiling error. The predicate is checked
    against the op itself lowered for "cuda" with the stored-band kernels."""
    from pfamalign.kernels import config
    from pfamalign.kernels.pallas_ops import lower

    cfg = TransportConfig(half_band=64, base_steps=2, tail_steps=2)
    want = config.GPU_BANDED_IMPL if fits else config.GPU_LOOPED_IMPL
    assert cfg.resolved_impl("cuda", length=16384, features=(d, dv)) == want
    assert cfg.resolved_impl("cuda", length=16384) == config.GPU_BANDED_IMPL  # widths unknown: as before
    q, k, v, _, _ = make_inputs(1, 1, 512, 512, d, dv, seed=0)
    lens = jnp.array([512])
    fused = dataclasses.replace(cfg, **impl_variant(config.GPU_BANDED_IMPL))
    op = jax.jit(jax.grad(lambda q, k, v: jnp.sum(transport(q, k, v, lens, lens, config=fused)), (0, 1, 2)))
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    if fits:
        lower(op, "cuda", *specs)
    else:
        with pytest.raises(ValueError, match="use impl='xla'"):
            lower(op, "cuda", *specs)


def test_dense_crossover_is_where_the_kernels_win_from_then_on():
    """The benchmark's rule for ``GPU_DENSE_CROSSOVER``: the shortest L from which the kernels
    win at every longer measured L; a dense path over its memory counts as a kernel win, a
    kernel that did not run as none; no number when the kernels lose at the longest L."""
    from pfamalign.kernels.config import dense_crossover

    # the H100 figures for the banded XLA path (dense, banded ms)
    assert dense_crossover({1024: (0.74, 2.55), 4096: (3.77, 5.97), 16384: (43.0, 8.44)}) == 16384
    assert dense_crossover({1024: (1.0, 2.0), 2048: (3.0, 2.0), 4096: (9.0, 3.0)}) == 2048
    assert dense_crossover({1024: (3.0, 2.0), 2048: (2.0, 2.5), 4096: (9.0, 3.0)}) == 4096  # not a win at 2048
    assert dense_crossover({1024: (1.0, 2.0), 4096: (None, 3.0)}) == 4096  # dense over memory
    assert dense_crossover({1024: (3.0, 2.0), 4096: (5.0, None)}) is None  # kernels failed
    assert dense_crossover({1024: (1.0, 2.0)}) is None
    assert dense_crossover({}) is None


def test_kernel_wrapper_setting_is_validated_and_round_trips():
    cfg = TransportConfig(half_band=4, kernel="tpu")
    assert TransportConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="kernel must be one of"):
        TransportConfig(half_band=4, kernel="mosaic")


@pytest.mark.parametrize("impl", ["reference", "xla", "pallas"])
def test_padded_values_never_reach_the_output_or_the_gradient(impl):
    """Positions past k_len are inactive padding: a NaN or an inf in v there leaves the output
    and every gradient as with zeros there (a plan weight of 0 times NaN made the whole pair
    NaN, and its dq)."""
    q, k, v, tokens, w = make_inputs(2, 1, 12, 12, 4, 3)
    q_len, k_len = jnp.array([12, 9]), jnp.array([10, 12])
    cfg = TransportConfig(half_band=3, dustbin="spoke", impl=impl, blocks=BlockSizes(8))
    clean = v.at[0, 0, 10:].set(0.0)
    dirty = v.at[0, 0, 10].set(jnp.nan).at[0, 0, 11].set(jnp.inf)
    (_, out), grads = _value_and_grad(cfg)(q, k, dirty, tokens, q_len, k_len, w)
    (_, want), want_grads = _value_and_grad(cfg)(q, k, clean, tokens, q_len, k_len, w)
    np.testing.assert_array_equal(out, want)
    for got, expected in zip(grads, want_grads):
        jax.tree.map(np.testing.assert_array_equal, got, expected)
    # and in q past q_len, k past k_len (NaN reached the kernels' LSE and every path's dq / dk)
    dirty_q, dirty_k = q.at[1, 0, 9:].set(jnp.nan), k.at[0, 0, 10].set(jnp.inf).at[0, 0, 11].set(jnp.nan)
    clean_q, clean_k = q.at[1, 0, 9:].set(0.0), k.at[0, 0, 10:].set(0.0)
    (_, out), grads = _value_and_grad(cfg)(dirty_q, dirty_k, v, tokens, q_len, k_len, w)
    (_, want), want_grads = _value_and_grad(cfg)(clean_q, clean_k, v, tokens, q_len, k_len, w)
    np.testing.assert_array_equal(out, want)
    for got, expected in zip(grads, want_grads):
        jax.tree.map(np.testing.assert_array_equal, got, expected)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.complex64])
def test_inputs_that_are_not_real_floats_are_refused_by_name(dtype):
    """An integer q, k, v gave an output truncated to integers, a complex one NaN, a bool one
    jax's "neg does not accept dtype bool": each is now a TypeError naming the input."""
    q, k, v, tokens, _ = make_inputs(1, 1, 8, 8, 4, 3)
    lens = jnp.array([8])
    for name in ("q", "v"):
        args = {"q": q, "k": k, "v": v, name: (q if name == "q" else v).astype(dtype)}
        with pytest.raises(TypeError, match=f"{name} must be a real floating array .*got dtype {jnp.dtype(dtype)}"):
            transport(args["q"], args["k"], args["v"], lens, lens, impl="xla", half_band=3)
    with pytest.raises(TypeError, match="tokens.v must be a real floating array"):
        transport(q, k, v, lens, lens, DustbinTokens(tokens.q, tokens.k, tokens.v.astype(dtype)), impl="xla",
                  half_band=3, dustbin="spoke")


@pytest.mark.parametrize("schedule, message", [
    (((2.0, 2.5), (1.0, 12.5)), "every step count of eps_schedule must be an integer, got 2.5"),
    (((2.0, 2, 3), (1.0, 13)), r"every stage of eps_schedule must be a pair \(eps, steps\)"),
    ((("a", 2), (1.0, 13)), "every eps of eps_schedule must be a number, got 'a'"),
    (5, r"eps_schedule must be \(\(eps, steps\), ...\)")])
def test_an_eps_schedule_of_another_form_is_refused_by_name(schedule, message):
    """2.5 steps was truncated to 2 (base_steps=2.5 is refused); a malformed stage gave a bare
    "too many values to unpack"."""
    with pytest.raises(ValueError, match=message):
        TransportConfig(half_band=4, base_steps=15, eps_schedule=schedule)
    assert TransportConfig(half_band=4, base_steps=15, eps_schedule=((2.0, np.int64(2)), (1.0, 13))
                           ).eps_schedule == ((2.0, 2), (1.0, 13))


def test_interpret_is_none_a_bool_or_interpreter_settings():
    """A string "false" from a config file was truthy: interpret mode forced on a GPU."""
    from jax.experimental.pallas import tpu as pltpu

    for bad in ("false", "yes", 1):
        with pytest.raises(ValueError, match="interpret must be None .*True, False or a pltpu.InterpretParams"):
            TransportConfig(half_band=4, interpret=bad)
    for good in (None, True, False, pltpu.InterpretParams()):
        assert TransportConfig(half_band=4, interpret=good).interpret is good


def test_max_steps_takes_a_numpy_integer_as_the_other_step_counts_do():
    assert TransportConfig(half_band=3, tol=1e-3, max_steps=np.int64(20)).max_steps == 20


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_the_plan_holds_up_to_the_documented_float32_score_spread(impl):
    """The docstring's domain: while |S| / eps stays below about 1e6 the output is a convex
    combination of the values on every path (|O| <= max |v|), as the dense reference's is."""
    r = np.random.default_rng(0)
    q, k = (jnp.asarray(r.normal(size=(2, 1, 12, 4)), jnp.float32) for _ in range(2))
    v = jnp.asarray(r.normal(size=(2, 1, 12, 3)), jnp.float32)
    q_len, k_len = jnp.array([12, 9]), jnp.array([10, 12])
    bound = float(jnp.abs(v).max()) * (1 + 1e-4)
    for scale in (1e2, 1e4, 1e5):  # |S| / eps up to about 5e5 here
        for path in (impl, "reference"):
            out = transport(q * scale, k, v, q_len, k_len, impl=path, half_band=3)
            assert bool(jnp.all(jnp.isfinite(out))) and float(jnp.abs(out).max()) <= bound, (path, scale)
