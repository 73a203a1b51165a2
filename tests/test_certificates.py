"""docs/design.md §6 certificates against direct computation: brute-force Delta, Birkhoff contraction
of the kernel, block layout, receiver mass, tail mass and locking."""

import itertools

import numpy as np
import pytest

from pfamalign.alignment.certificates import (
    LOCKED, block_contraction, contraction_delta, distribution_summary, hilbert_rate,
    locked_fraction, range_rate, receiver_mass_imbalance, tail_mass)


def _delta_brute(s):
    """O(n^2 m^2): every (i, i', j, j')."""
    n, m = s.shape
    return max(s[i, j] + s[k, l] - s[i, l] - s[k, j]
               for i, k in itertools.product(range(n), repeat=2)
               for j, l in itertools.product(range(m), repeat=2))


@pytest.mark.parametrize("seed", range(25))
def test_delta_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, m = rng.integers(1, 7, size=2)
    s = rng.normal(scale=rng.uniform(0.1, 5.0), size=(n, m))
    assert contraction_delta(s) == pytest.approx(_delta_brute(s), abs=1e-12)


def test_additive_scores_have_zero_delta():
    rng = np.random.default_rng(1)
    s = rng.normal(size=(9, 1)) + rng.normal(size=(1, 13))  # S_ij = a_i + b_j: rank-1 kernel
    assert contraction_delta(s) == pytest.approx(0.0, abs=1e-12)
    assert contraction_delta(rng.normal(size=(1, 8))) == 0.0  # one row: i = i' only


def _hilbert(x, y):
    r = np.log(x) - np.log(y)
    return r.max() - r.min()


@pytest.mark.parametrize("seed", range(5))
def test_birkhoff_contraction_of_the_kernel(seed):
    """d_H(Kx, Ky) <= tanh(Delta/4) d_H(x, y) and, for a full step (K then K^T, each followed
    by the reciprocal, which is a d_H isometry), the rate is rho_H = tanh^2(Delta/4)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(scale=1.5, size=(7, 9))
    k = np.exp(s)
    rate = np.tanh(contraction_delta(s) / 4)
    assert hilbert_rate(contraction_delta(s)) == pytest.approx(rate ** 2)
    for _ in range(50):
        x, y = rng.lognormal(sigma=rng.uniform(0.1, 4), size=(2, 9))
        assert _hilbert(k @ x, k @ y) <= rate * _hilbert(x, y) + 1e-12
        full_x, full_y = k.T @ (1 / (k @ x)), k.T @ (1 / (k @ y))
        assert _hilbert(full_x, full_y) <= rate ** 2 * _hilbert(x, y) + 1e-12


@pytest.mark.parametrize("seed", range(10))
def test_range_bound_dominates(seed):
    rng = np.random.default_rng(seed)
    s = rng.normal(scale=3.0, size=(6, 8))
    omega = s.max() - s.min()
    assert contraction_delta(s) <= 2 * omega + 1e-12
    assert hilbert_rate(contraction_delta(s)) <= range_rate(omega) + 1e-15


def test_block_layout_dense_and_banded():
    rng = np.random.default_rng(2)
    s = rng.normal(size=(10, 12))
    certs = block_contraction(s, block_rows=4)
    assert [(c.row_start, c.row_stop, c.n_rows, c.n_cols) for c in certs] == [
        (0, 4, 4, 12), (4, 8, 4, 12), (8, 10, 2, 12)]
    for c in certs:
        block = s[c.row_start:c.row_stop]
        assert c.strictly_positive
        assert c.delta == pytest.approx(_delta_brute(block))
        assert c.omega == pytest.approx(block.max() - block.min())
        assert c.rho_h == pytest.approx(np.tanh(c.delta / 4) ** 2)
        assert c.range_bound == pytest.approx(np.tanh(c.omega / 2) ** 2)

    # a band |i - j| <= 2 with rows 9, 10 inactive: 4-row blocks miss the band corners
    i, j = np.indices((11, 12))
    band = (np.abs(i - j) <= 2) & (i < 9)
    certs = block_contraction(s.repeat(2, 0)[:11], mask=band, block_rows=4)
    assert [c.strictly_positive for c in certs] == [False, False, True]  # last: row 8 only
    assert all(c.rho_h == 1.0 and c.delta == np.inf for c in certs[:2])
    assert certs[0].n_cols == 6 and certs[2].n_rows == 1 and certs[2].n_cols == 5
    # one-row blocks are always strictly positive (Delta = 0 with a single row)
    certs = block_contraction(s.repeat(2, 0)[:11], mask=band, block_rows=1)
    assert len(certs) == 9 and all(c.strictly_positive and c.delta == 0 for c in certs)
    # -inf scores count as outside the support
    s2 = s.copy()
    s2[0, 0] = -np.inf
    assert not block_contraction(s2, block_rows=10)[0].strictly_positive


def test_distribution_summary():
    summary = distribution_summary([3.0, 1.0, np.nan, 2.0])
    assert summary == {"count": 3, "min": 1.0, "median": 2.0, "p90": pytest.approx(2.8),
                       "max": 3.0}


def test_receiver_mass_imbalance():
    a = np.array([[0.5, 0.5], [0.2, 0.8]])  # column sums 0.7, 1.3
    assert receiver_mass_imbalance(a) == pytest.approx(0.3)
    assert receiver_mass_imbalance(a, col_mask=[True, False]) == pytest.approx(0.3)
    ds = np.array([[0.25, 0.75], [0.75, 0.25]])  # doubly stochastic
    assert receiver_mass_imbalance(ds) == pytest.approx(0.0)
    att = np.exp(np.random.default_rng(0).normal(size=(2, 6, 6)) / 0.5)
    att /= att.sum(-1, keepdims=True)  # a row softmax
    direct = max(abs(att[h, :, j].sum() - 1) for h in range(2) for j in range(6))
    assert receiver_mass_imbalance(att) == pytest.approx(direct)


def test_tail_mass():
    p = np.array([[0.7, 0.2, 0.1], [0.4, 0.4, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(tail_mass(p), [0.3, 0.6, 1.0])
    out = tail_mass(p, normalize=True)
    np.testing.assert_allclose(out[:2], [0.3, 0.5])
    assert np.isnan(out[2])


def test_locked_fraction():
    assert LOCKED == 0.9999
    assert locked_fraction([1.0, LOCKED, np.nextafter(LOCKED, 0), 0.5]) == 0.5  # ">=": LOCKED counts
    assert locked_fraction(np.array([[0.99995], [0.3]]), locked=0.99) == 0.5
    assert np.isnan(locked_fraction([]))


# ---- certificates of the plan itself (issue 15) ------------------------------------------------

from pfamalign.alignment.certificates import (  # noqa: E402
    gauge_oscillation, local_constant, masked_softmax, plan_marginals, plan_perturbation, softmax_rows,
    solve_dense, stable_matches)


def _converged(s, mask=None, log_a=None, log_b=None, tau=1.0):
    mask = np.ones(s.shape, bool) if mask is None else mask
    la = np.zeros(s.shape[0]) if log_a is None else log_a
    lb = np.zeros(s.shape[1]) if log_b is None else log_b
    return solve_dense(s, mask, la, lb, stages=((tau, 1),), tol=1e-11, max_steps=20000)


def test_solve_dense_converges_and_reports():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(7, 7))
    res = _converged(s)
    np.testing.assert_allclose(res.plan.sum(1), 1, atol=1e-10)
    np.testing.assert_allclose(res.plan.sum(0), 1, atol=1e-12)
    assert res.row_error <= 1e-11 and 1 < res.steps < 20000 and len(res.drift) == res.steps - 1
    fixed = solve_dense(s, np.ones_like(s, bool), np.zeros(7), np.zeros(7), stages=((1.0, 3),))
    assert fixed.steps == 3 and fixed.row_error > 1e-6  # three steps are not converged
    # a free column side (kappa_b = 0) is the row softmax after one step
    rows = solve_dense(s, np.ones_like(s, bool), np.zeros(7), np.zeros(7), kappa=(1.0, 0.0), stages=((0.5, 4),))
    np.testing.assert_allclose(rows.plan, np.exp(s / 0.5) / np.exp(s / 0.5).sum(1, keepdims=True), atol=1e-12)
    assert rows.col_error == 0.0 and np.all(rows.drift < 1e-12)


def test_plan_marginals_flags_the_infeasible_problem():
    # spoke-like: 5 + 1 rows, 3 + 1 columns, unit targets; column step exact, rows infeasible
    rng = np.random.default_rng(1)
    s = rng.normal(size=(6, 4))
    res = solve_dense(s, np.ones_like(s, bool), np.zeros(6), np.zeros(4), stages=((1.0, 3000),))
    marg = plan_marginals(res.plan, np.arange(6) < 5, np.arange(4) < 3, balanced=True, total_rows=6,
                          total_cols=4, steps=res.steps)
    assert not marg["feasible"] and marg["expected_row_sum"] == pytest.approx(4 / 6)
    np.testing.assert_allclose(res.plan.sum(1), 4 / 6, atol=1e-6)  # rows tend to the average
    assert marg["sender_error"] == pytest.approx(1 / 3, abs=1e-6) and marg["receiver_error"] < 1e-12
    assert marg["total_mass"] == pytest.approx(4.0)
    # a capacity problem is balanced (float32 targets: equal totals up to rounding)
    cap = plan_marginals(res.plan, np.arange(6) < 5, np.arange(4) < 3, balanced=True,
                         total_rows=135.0, total_cols=np.float32(np.exp(np.float32(np.log(66)))) + 69, steps=1)
    assert cap["feasible"]


@pytest.mark.parametrize("seed", range(12))
def test_plan_perturbation_bound_holds_on_converged_plans(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 8))
    tau = float(rng.uniform(0.2, 2.0))
    mask = np.abs(np.subtract.outer(np.arange(n), np.arange(n))) <= rng.integers(1, n)  # a band
    s = rng.normal(scale=2.0, size=(n, n))
    d = np.where(mask, rng.normal(scale=rng.uniform(1e-3, 1.0), size=(n, n)), 0.0)
    p, q = _converged(s, mask, tau=tau).plan, _converged(s + d, mask, tau=tau).plan
    b = plan_perturbation(p, q, d, mask, tau=tau)
    assert b["lhs"] == pytest.approx(np.abs(p - q).sum())
    assert b["holds"] and b["lhs"] <= b["rhs_gauge"] <= b["rhs_sup"] + 1e-12
    assert b["mass"] == pytest.approx(n) and b["vacuity_radius"] == 2 * tau


def test_plan_bound_gauge_and_its_tightness():
    rng = np.random.default_rng(3)
    s = rng.normal(size=(5, 5))
    gauge = rng.normal(size=(5, 1)) + rng.normal(size=(1, 5))  # row + column constants
    full = np.ones((5, 5), bool)
    assert gauge_oscillation(gauge, full) < 1e-9  # removed entirely
    p, q = _converged(s).plan, _converged(s + gauge).plan
    assert np.abs(p - q).sum() < 1e-9  # a gauge changes no plan
    # two blocks of 2 x 2 with equal scores, pushed by +-d on the diagonals: ratio -> 1 as d -> 0
    d = 1e-5
    s2 = np.zeros((2, 2))
    diff = np.array([[d, -d], [-d, d]])
    b = plan_perturbation(_converged(s2).plan, _converged(s2 + diff).plan, diff, full[:2, :2], tau=1.0,
                          gauge=(False, False))
    assert 0.999 < b["ratio"] <= 1 + 1e-9


@pytest.mark.parametrize("seed", range(10))
def test_softmax_half_oscillation_bound(seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=3, size=(9, 6))
    mask = rng.random((9, 6)) > 0.3
    mask[:, 0] = True
    zp = z + rng.normal(scale=rng.uniform(1e-3, 2), size=z.shape)
    out = softmax_rows(z, zp, mask)
    assert out["violations"] == 0
    direct = np.abs(masked_softmax(z, mask) - masked_softmax(zp, mask)).sum(1)
    osc = np.array([np.ptp((zp - z)[i][mask[i]]) for i in range(9)])
    np.testing.assert_allclose(out["per_row"]["row_bound_ratio"], direct / (osc / 2), rtol=1e-9)
    ref = np.exp(np.where(mask, z, -np.inf))
    np.testing.assert_allclose(masked_softmax(z, mask), ref / ref.sum(1, keepdims=True), atol=1e-12)


def test_softmax_margin_is_the_top_two_gap_and_leaves_out_a_row_of_one_entry():
    """The argmax margin of a row is its top-two logit gap; a row of one support entry has no
    rival (an infinite margin, left out of the summary), not a margin of 0."""
    z = np.array([[0.0, 5.0, 1.0], [2.0, 0.0, 0.0]])
    mask = np.array([[True, True, True], [True, False, False]])
    margin = softmax_rows(z, z, mask)["margin"]
    assert margin["count"] == 1 and margin["min"] == margin["max"] == 4.0


def test_softmax_rows_of_logits_minus_infinity_off_the_support_warn_of_nothing():
    """The op's logits are -inf off the band: z' - z was -inf - -inf there, numpy's "invalid
    value" warning on every certify of a pair longer than its band (1 x 1,500)."""
    import warnings

    z = np.array([[0.5, 1.0, -np.inf], [-np.inf, 0.2, 0.1]])
    mask = np.isfinite(z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = softmax_rows(z, z + 0.25 * mask.cumsum(1), mask)
    assert out["violations"] == 0 and out["row_bound_ratio_median"] > 0


def test_softmax_bound_is_tight_and_locking():
    d = 1e-6  # two equal logits pushed apart: ||dsm||_1 = osc / 2 to first order
    out = softmax_rows(np.zeros((1, 2)), np.array([[d, -d]]), np.ones((1, 2), bool))
    assert out["row_bound_ratio_median"] == pytest.approx(1.0, abs=1e-3)
    z = np.array([[12.0, 0.0, 0.0], [0.5, 0.0, 0.1]])
    out = softmax_rows(z, z, np.ones_like(z, bool))
    assert out["locked_fraction"] == 0.5  # row 0: p_max = 1 - 2 e^-12 / (1 + ...) >= 0.9999
    assert out["margin"]["max"] == pytest.approx(12.0) and out["margin"]["min"] == pytest.approx(0.4)


@pytest.mark.parametrize("seed", range(20))
def test_local_constant_is_the_exact_jacobian_norm(seed):
    """max over sign vectors of ||(diag p - p p^T) x||_1 = 4 delta (1 - delta) when delta <= 1/2."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    p = rng.dirichlet(np.full(n, 0.3))
    p[np.argmax(p)] += rng.uniform(0, 3)  # mostly locked rows
    p /= p.sum()
    jac = np.diag(p) - np.outer(p, p)
    exact = max(np.abs(jac @ np.array(x)).sum() for x in itertools.product((-1.0, 1.0), repeat=n))
    delta = 1 - p.max()
    if delta <= 0.5:
        assert local_constant(delta) == pytest.approx(exact, rel=1e-12)
        assert local_constant(delta) > 2 * delta or delta == 0 or delta >= 0.5  # 2 delta is too small
    else:
        assert exact <= local_constant(delta) + 1e-12


def test_stable_matches_threshold():
    plan = np.array([[0.9, 0.1], [0.1, 0.9]])
    res = stable_matches(plan, [[0, 0], [1, 1]], mass=2.0, tau=1.0, radius=0.3)
    assert res["threshold"] == pytest.approx(0.8) and res["certified"] == 2
    res = stable_matches(plan, [[0, 0], [1, 1]], mass=2.0, tau=1.0, radius=0.5)
    assert res["certified"] == 0 and res["aligned"] == 2
    # the certificate is true: every perturbation with osc <= r keeps the winners
    rng = np.random.default_rng(0)
    s = np.log(plan)
    for _ in range(200):
        d = rng.uniform(-0.15, 0.15, size=(2, 2))  # osc <= 0.3
        q = _converged(s + d).plan
        assert q[0, 0] > 0.5 and q[1, 1] > 0.5


def test_a_contraction_rate_just_below_one_is_not_printed_as_one():
    """certify's table: rho_H = tanh^2(delta / 4) of a long band is 1 - 3.5e-7 for delta 32.5,
    a certified block; rounding it to '1' (uncertified) would contradict the title's count."""
    from pfamalign.commands.certify import _contraction_number

    rho = float(np.tanh(32.51 / 4) ** 2)
    assert rho < 1 and _contraction_number(rho) == f"1 - {1 - rho:.2g}" != "1"
    assert [_contraction_number(x) for x in (1.0, 0.5, 0.99990, 32.51)] == ["1", "0.5", "0.9999", "32.51"]


def test_rows_without_support_get_a_null_per_row_entry_and_the_figure_draws(tmp_path):
    """No dustbin, a query longer than the key by more than the band: real rows beyond the band
    have no support. Every per-row list has one entry per real row (null there), the sender
    error is taken over the rows that can carry mass, the row softmax's receiver imbalance is
    taken against the balanced target Lq / Lk a key, and the figure draws (its row panels need
    lists of one length)."""
    import types

    import jax.numpy as jnp

    from pfamalign.certify import plan_certificates, plot_certificates
    from pfamalign.kernels import TransportConfig
    from pfamalign.kernels.reference import reference_solve

    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 1, n, 8)), jnp.float32) for n in (12, 5, 5))
    cfg = TransportConfig(half_band=2, eps=1.0, base_steps=5, tail_steps=2, dustbin="none", impl="xla")
    model = types.SimpleNamespace(cfg=types.SimpleNamespace(transport=cfg))
    plan, *_ = reference_solve(q, k, v, jnp.array([12]), jnp.array([5]), None, cfg)
    with np.errstate(all="ignore"):
        secs, _ = plan_certificates(model, q, k, None, 12, 5, plan)
    per_row = secs["softmax_ot"][0]["per_row"]
    assert {name: len(values) for name, values in per_row.items()} == dict.fromkeys(per_row, 12)
    empty = np.isnan(per_row["sender_error"])
    assert empty[7:].all() and not empty[:7].any()  # rows 8-12 lie beyond the band of a 5-residue key
    assert np.array_equal(np.isnan(per_row["tail_mass"]), empty)
    assert secs["marginals"][0]["sender_error"] == pytest.approx(np.nanmax(per_row["sender_error"]))
    # the row softmax's receiver imbalance, against the balanced target of Lq / Lk = 12 / 5 a key
    # (against 1 a key it reads 2.4x larger here)
    from pfamalign.certify import _extended_scores

    scores, mask, _, _ = _extended_scores(q, k, None, 12, 5, cfg)
    z = np.where(mask, scores[0] / cfg.eps, -np.inf)[:7]  # the rows with support (the 7 in reach)
    softmax = np.exp(z - z.max(1, keepdims=True))
    received = (softmax / softmax.sum(1, keepdims=True))[:, :5].sum(0)
    assert secs["ceta"][0]["softmax_receiver_imbalance"] == pytest.approx(np.abs(received / (12 / 5) - 1).max())
    result = {"lengths": [12, 5], "heads": 1, "contraction": {"blocks": []},
              "bias": {"rows": [{"tail_steps": 0, "bias_norm": 1.0, "eta_norm": 1.0}], "tol": 1e-5,
                       "certified_tail_depth": None}, **secs}
    plot_certificates(result, tmp_path / "cert.png")
    assert (tmp_path / "cert.png").stat().st_size > 0
    plot_certificates(result, tmp_path / "cert.svg")  # its head numbered as the tables number it
    assert "head 0 of 1, numbered from 0 as in the tables" in (tmp_path / "cert.svg").read_text()


def test_certify_counts_the_steps_of_a_solve_to_a_tolerance_as_the_op_takes_them():
    """With tol the op's base runs until the marginals meet it, then its R tail steps: the
    certificate's base step count is the op's, per head (the tol loop used to run in the tail)."""
    import types

    import jax.numpy as jnp

    from pfamalign.certify import plan_certificates
    from pfamalign.kernels import DustbinTokens, TransportConfig
    from pfamalign.kernels.reference import reference_solve

    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 2, 12, 8)), jnp.float32) for _ in range(3))
    tokens = DustbinTokens(*(jnp.asarray(rng.normal(size=(2, n)), jnp.float32) for n in (8, 8, 8)))
    cfg = TransportConfig(half_band=3, eps=1.0, base_steps=5, tail_steps=2, dustbin="spoke", tol=1e-4,
                          max_steps=300, impl="xla")
    plan, *_, stats = reference_solve(q, k, v, jnp.array([12]), jnp.array([12]), tokens, cfg)
    model = types.SimpleNamespace(cfg=types.SimpleNamespace(transport=cfg))
    with np.errstate(all="ignore"):
        secs, _ = plan_certificates(model, q, k, tokens, 12, 12, plan)
    op_steps = np.asarray(stats.steps).reshape(-1).tolist()
    assert min(op_steps) > cfg.base_steps  # the tolerance, not base_steps, ended the base
    assert [m["steps"] for m in secs["marginals"]] == op_steps
    assert [len(s["drift"]) for s in secs["softmax_ot"]] == [n + cfg.tail_steps - 1 for n in op_steps]


def test_the_contraction_verdict_says_when_a_strictly_positive_block_certifies_nothing():
    """The table and the plot share one verdict: a strictly positive block whose rho_H is 1 to
    within 1e-6 certifies no contraction (the table said "1/1 blocks certified" where the plot
    said the bound certifies none)."""
    from pfamalign.certify import contraction_verdict

    block = lambda positive, rho: {"strictly_positive": positive, "rho_h": rho}  # noqa: E731
    assert contraction_verdict({"blocks": [block(True, 1 - 6.5e-12)]}) == (
        "1/1 blocks strictly positive, rho_H up to 1 - 6.5e-12: the bound certifies no contraction")
    assert contraction_verdict({"blocks": [block(True, 0.25), block(True, 0.5), block(False, float("nan"))]}) == (
        "2/3 blocks strictly positive, rho_H at most 0.5: each contracts")
    assert contraction_verdict({"blocks": [block(False, float("nan"))]}) == (
        "0/1 blocks strictly positive: no contraction certified")
