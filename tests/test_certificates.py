"""docs/design.md §6 certificates against direct computation: brute-force Delta, Birkhoff contraction
of the kernel, block layout, receiver mass, the score-perturbation bound, tail mass."""

import itertools

import numpy as np
import pytest

from pfamalign.alignment.certificates import (
    block_contraction, contraction_delta, contraction_table, distribution_summary,
    hilbert_rate, range_rate, receiver_mass_imbalance, row_softmax, score_perturbation,
    tail_mass)


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


def test_contraction_table():
    rng = np.random.default_rng(4)
    certs = block_contraction(rng.normal(size=(20, 8)), block_rows=5)
    certs += block_contraction(np.where(np.eye(5, 8) > 0, 0.0, -np.inf), block_rows=5)
    table = contraction_table(certs)
    assert list(table.index) == ["delta", "rho_h", "omega", "range_bound"]
    assert list(table.columns) == ["count", "min", "median", "p90", "max", "excluded"]
    deltas = [c.delta for c in certs if c.strictly_positive]
    assert table.loc["delta", "count"] == 4 and table.loc["delta", "excluded"] == 1
    assert table.loc["delta", "max"] == pytest.approx(max(deltas))
    assert table.loc["delta", "median"] == pytest.approx(np.median(deltas))
    summary = distribution_summary([3.0, 1.0, np.nan, 2.0])
    assert summary == {"count": 3, "min": 1.0, "median": 2.0, "p90": pytest.approx(2.8),
                       "max": 3.0}


def test_receiver_mass_imbalance():
    a = np.array([[0.5, 0.5], [0.2, 0.8]])  # column sums 0.7, 1.3
    assert receiver_mass_imbalance(a) == pytest.approx(0.3)
    assert receiver_mass_imbalance(a, col_mask=[True, False]) == pytest.approx(0.3)
    ds = np.array([[0.25, 0.75], [0.75, 0.25]])  # doubly stochastic
    assert receiver_mass_imbalance(ds) == pytest.approx(0.0)
    att = row_softmax(np.random.default_rng(0).normal(size=(2, 6, 6)), tau=0.5)
    direct = max(abs(att[h, :, j].sum() - 1) for h in range(2) for j in range(6))
    assert receiver_mass_imbalance(att) == pytest.approx(direct)


@pytest.mark.parametrize("seed", range(30))
def test_score_perturbation_bound_holds(seed):
    rng = np.random.default_rng(seed)
    n, m = rng.integers(1, 12, size=2)
    tau = float(rng.uniform(0.05, 3.0))
    s = rng.normal(scale=rng.uniform(0.1, 10), size=(n, m))
    t = s + rng.normal(scale=rng.uniform(1e-4, 3), size=(n, m))
    bound = score_perturbation(s, t, tau=tau)
    direct_lhs = sum(abs(np.exp(s[i] / tau) / np.exp(s[i] / tau).sum()
                         - np.exp(t[i] / tau) / np.exp(t[i] / tau).sum()).sum() for i in range(n))
    assert bound.lhs == pytest.approx(direct_lhs, rel=1e-9, abs=1e-12)
    assert bound.rhs == pytest.approx(n / tau * np.abs(s - t).max())
    assert bound.holds


def test_score_perturbation_constant_is_sharp():
    # two equal logits pushed apart by +-d: each row moves 2 |sigmoid(2 d / tau) - 1/2| ~ d / tau
    n, tau, d = 5, 0.7, 1e-5
    s = np.zeros((n, 2))
    t = s + np.array([d, -d])
    bound = score_perturbation(s, t, tau=tau)
    assert bound.holds and bound.lhs / bound.rhs > 0.999
    with pytest.raises(ValueError, match="tau"):
        score_perturbation(s, t, tau=0.0)
    with pytest.raises(ValueError, match="shape"):
        score_perturbation(s, t[:, :1], tau=1.0)


def test_tail_mass():
    p = np.array([[0.7, 0.2, 0.1], [0.4, 0.4, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(tail_mass(p), [0.3, 0.6, 1.0])
    out = tail_mass(p, normalize=True)
    np.testing.assert_allclose(out[:2], [0.3, 0.5])
    assert np.isnan(out[2])
