"""Pair P/R/F1 (micro, macro, bootstrap, identity bins) and the docs/design.md §5 plan metrics,
against hand-derived values and direct per-row loops."""

import math

import numpy as np
import pytest

from pfamalign.alignment.metrics import (
    PlanMetrics, alignment_counts, barycenters, diagonal_plan, diagonal_plan_metrics,
    identity_bin, pair_counts, paired_f1_difference, pairs_in_reference, plan_metrics, prf,
    prf_by_identity, prf_summary, reliability, reliability_sums)
from pfamalign.alignment.pairs import (
    PairAlignment, check_pairs, pairs_from_target)


# --- pairs --------------------------------------------------------------------------------------

def test_pairs_from_target_and_validation():
    target = np.array([2, -1, 3, -1, 5])
    pairs = pairs_from_target(target)
    assert pairs.tolist() == [[0, 2], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="proper"):
        check_pairs([[0, 1], [1, 1]], 3, 3)
    with pytest.raises(ValueError, match="out of range"):
        check_pairs([[0, 3]], 3, 3)
    with pytest.raises(ValueError, match=">= -1"):
        pairs_from_target([0, -2])
    with pytest.raises(ValueError, match="confidence"):
        PairAlignment(np.array([[0, 0]]), np.array([0.5, 0.5]), 1.0, 2, 2)
    assert PairAlignment(pairs_from_target([-1, 0, -1]), None, 0.0, 3, 2).pairs.tolist() == [[1, 0]]
    assert pairs_from_target([-1, -1]).shape == (0, 2)


# --- pair P/R/F1 --------------------------------------------------------------------------------

def test_pair_counts_sets_and_target():
    pred = [[0, 0], [1, 2], [2, 3], [2, 3]]  # duplicate counted once
    ref = [[0, 0], [1, 1], [2, 3], [3, 4]]
    assert pair_counts(pred, ref) == (2, 3, 4)
    assert alignment_counts([[0, 0], [1, 1]], [0, -1, 2]) == (1, 2, 2)
    assert pair_counts(np.zeros((0, 2)), ref) == (0, 0, 4)
    with pytest.raises(ValueError, match="out of range"):
        alignment_counts([[5, 0]], [0, 1])


def test_micro_and_macro_by_hand():
    counts = np.array([[1, 2, 4], [3, 3, 3]])
    out = prf_summary(counts, n_boot=0)
    micro, macro = out["micro"], out["macro"]
    assert micro["precision"]["value"] == pytest.approx(4 / 5)
    assert micro["recall"]["value"] == pytest.approx(4 / 7)
    assert micro["f1"]["value"] == pytest.approx(8 / 12)
    assert macro["precision"]["value"] == pytest.approx((1 / 2 + 1) / 2)
    assert macro["recall"]["value"] == pytest.approx((1 / 4 + 1) / 2)
    assert macro["f1"]["value"] == pytest.approx((2 / 6 + 1) / 2)
    assert math.isnan(micro["f1"]["low"])


def test_undefined_per_pair_values_are_skipped_in_macro():
    p, r, f = prf([0, 0, 2], [0, 3, 2], [4, 0, 2])
    assert np.isnan(p[0]) and r[0] == 0 and f[0] == 0  # nothing predicted
    assert p[1] == 0 and np.isnan(r[1]) and f[1] == 0  # empty reference
    out = prf_summary(np.array([[0, 0, 4], [2, 2, 2]]), n_boot=0)
    assert out["macro"]["precision"]["value"] == pytest.approx(1.0)  # mean over defined only
    assert out["macro"]["recall"]["value"] == pytest.approx(0.5)


def test_bootstrap_matches_direct_resampling():
    rng = np.random.default_rng(3)
    n = 40
    nref = rng.integers(5, 30, n)
    npred = rng.integers(5, 30, n)
    tp = np.minimum(rng.integers(0, 30, n), np.minimum(nref, npred))
    counts = np.stack([tp, npred, nref], 1)
    out = prf_summary(counts, n_boot=300, seed=11)
    # direct: the same generator draws, one resample at a time
    draws = np.random.default_rng(11).integers(0, n, size=(300, n))
    micro_f1 = [2 * counts[d, 0].sum() / (counts[d, 1].sum() + counts[d, 2].sum())
                for d in draws]
    macro_r = [np.mean(counts[d, 0] / counts[d, 2]) for d in draws]
    assert out["micro"]["f1"]["low"] == pytest.approx(np.percentile(micro_f1, 2.5))
    assert out["micro"]["f1"]["high"] == pytest.approx(np.percentile(micro_f1, 97.5))
    assert out["macro"]["recall"]["low"] == pytest.approx(np.percentile(macro_r, 2.5))
    assert out["micro"]["f1"]["low"] <= out["micro"]["f1"]["value"] <= out["micro"]["f1"]["high"]
    assert prf_summary(counts, n_boot=300, seed=11) == out  # deterministic
    assert prf_summary(counts, n_boot=300, seed=12) != out


def _random_counts(rng, n):
    nref, npred = rng.integers(5, 30, n), rng.integers(5, 30, n)
    tp = np.minimum(rng.integers(0, 30, n), np.minimum(nref, npred))
    return np.stack([tp, npred, nref], 1)


def test_paired_difference_resamples_both_methods_together():
    rng = np.random.default_rng(5)
    n = 50
    a, b = _random_counts(rng, n), _random_counts(rng, n)
    pid = rng.uniform(0, 100, n)
    out = paired_f1_difference(a, b, pid, n_boot=200, seed=4)
    f1 = lambda c: 2 * c[:, 0].sum() / (c[:, 1].sum() + c[:, 2].sum())
    assert out["all"]["value"] == pytest.approx(f1(a) - f1(b))
    draws = np.random.default_rng(4).integers(0, n, size=(200, n))  # the first ("all") draws
    diffs = [f1(a[d]) - f1(b[d]) for d in draws]
    assert out["all"]["low"] == pytest.approx(np.percentile(diffs, 2.5))
    assert out["all"]["high"] == pytest.approx(np.percentile(diffs, 97.5))
    low = pid < 30
    assert out["<30"]["n_pairs"] == low.sum()
    assert out["<30"]["value"] == pytest.approx(f1(a[low]) - f1(b[low]))
    same = paired_f1_difference(a, a, pid, n_boot=50)  # a method against itself: exactly zero
    assert (same["all"]["value"], same["all"]["low"], same["all"]["high"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same pairs"):
        paired_f1_difference(a, b[:-1], pid)


def test_paired_bootstrap_in_chunks_is_the_bootstrap_at_once(monkeypatch):
    """The paired bootstrap counts its draws a bounded block of resamples at a time
    (``_BOOT_CELLS``): blocks that split the resamples unevenly give the same intervals."""
    from pfamalign.alignment import metrics

    rng = np.random.default_rng(8)
    a, b = _random_counts(rng, 40), _random_counts(rng, 40)
    pid, families = rng.uniform(0, 100, 40), rng.integers(0, 7, 40)
    whole = [paired_f1_difference(a, b, pid, groups=g, n_boot=101, seed=1) for g in (None, families)]
    monkeypatch.setattr(metrics, "_BOOT_CELLS", 45)  # one resample of 40 pairs a block, or six of 7 families
    assert [paired_f1_difference(a, b, pid, groups=g, n_boot=101, seed=1) for g in (None, families)] == whole


def test_family_bootstrap_resamples_whole_families():
    rng = np.random.default_rng(6)
    n = 30
    a, b = _random_counts(rng, n), _random_counts(rng, n)
    pid = rng.uniform(0, 100, n)
    # one pair per group: the same draws as the pair bootstrap
    singletons = paired_f1_difference(a, b, pid, groups=[f"f{i:02d}" for i in range(n)], n_boot=100, seed=2)
    assert singletons == paired_f1_difference(a, b, pid, n_boot=100, seed=2)
    families = np.array(["x", "y", "z"])[rng.integers(0, 3, n)]
    out = paired_f1_difference(a, b, pid, groups=families, n_boot=200, seed=3)
    f1 = lambda c: 2 * c[:, 0].sum() / (c[:, 1].sum() + c[:, 2].sum())
    members = [np.flatnonzero(families == f) for f in ("x", "y", "z")]
    draws = np.random.default_rng(3).integers(0, 3, size=(200, 3))
    diffs = [f1(a[np.concatenate([members[g] for g in d])]) - f1(b[np.concatenate([members[g] for g in d])])
             for d in draws]
    assert out["all"]["n_groups"] == 3 and out["all"]["value"] == pytest.approx(f1(a) - f1(b))
    assert out["all"]["low"] == pytest.approx(np.percentile(diffs, 2.5))
    assert out["all"]["high"] == pytest.approx(np.percentile(diffs, 97.5))
    # one family: every resample is that family, so there is no interval to give (not a zero-width one)
    alone = paired_f1_difference(a, b, pid, groups=["x"] * n, n_boot=200, seed=3)["all"]
    assert alone["value"] == pytest.approx(f1(a) - f1(b)) and alone["n_groups"] == 1
    assert np.isnan(alone["low"]) and np.isnan(alone["high"])


def test_identity_bins():
    labels = identity_bin([0, 29.99, 30, 49.9, 50, 100])
    assert labels.tolist() == ["<30", "<30", "30-50", "30-50", ">=50", ">=50"]
    with pytest.raises(ValueError, match="percent"):
        identity_bin([101])
    counts = np.array([[1, 2, 2], [2, 2, 2], [0, 1, 1]])
    out = prf_by_identity(counts, [10, 60, 70], n_boot=50)
    assert set(out) == {"all", "<30", "30-50", ">=50"}
    assert out["<30"]["micro"]["precision"]["value"] == pytest.approx(0.5)
    assert out[">=50"]["micro"]["recall"]["value"] == pytest.approx(2 / 3)
    assert out["30-50"]["n_pairs"] == 0 and math.isnan(out["30-50"]["micro"]["f1"]["value"])
    with pytest.raises(ValueError, match="shape"):
        prf_by_identity(counts, [10, 60])


# --- plan metrics ---------------------------------------------------------------------------------

def _direct_plan_metrics(plan, target, values, dustbin, min_prob=1e-12):
    """Per-row loops over one head, straight from the docs/design.md §5 definitions."""
    lq, lk = plan.shape
    out = values.T @ plan.T if values is not None else None  # [dv, Lq]
    rec, ce, err, viol = [], [], [], []
    b = []
    for i in range(lq):
        mass = sum(plan[i])
        b.append(sum(plan[i, j] * j for j in range(lk)) / mass if mass > 0 else None)
    for i in range(lq):
        c = target[i]
        if c >= 0:
            if values is not None:
                rec.append(sum((out[d, i] - values[c, d]) ** 2 for d in range(values.shape[1])))
            ce.append(-math.log(max(plan[i, c], min_prob)))
            if b[i] is not None:
                err.append(abs(b[i] - c))
        elif dustbin is not None:
            ce.append(-math.log(max(dustbin[i], min_prob)))
    for i in range(lq - 1):
        if target[i] >= 0 and target[i + 1] >= 0 and b[i] is not None and b[i + 1] is not None:
            viol.append(b[i + 1] < b[i])
    return dict(reconstruction=np.mean(rec) if rec else np.nan, sparse_ce=np.mean(ce),
                barycenter_mae=np.mean(err), within5=np.mean([e <= 5 for e in err]),
                monotonicity_violation=np.mean(viol) if viol else np.nan)


@pytest.mark.parametrize("seed", range(5))
def test_plan_metrics_match_direct_loops(seed):
    rng = np.random.default_rng(seed)
    lq, lk, dv = 23, 31, 4
    plan = rng.random((lq, lk)) ** 4
    plan[3] = 0.0  # a row with no real mass: barycenter undefined
    plan /= np.maximum(plan.sum(1, keepdims=True), 1e-300) * 1.25
    target = np.where(rng.random(lq) < 0.7, np.sort(rng.integers(0, lk, lq)), -1)
    values = rng.normal(size=(lk, dv))
    dustbin = 1.0 - plan.sum(1) if seed % 2 else None
    got = plan_metrics(plan, target, values=values, dustbin_mass=dustbin)
    want = _direct_plan_metrics(plan, target, values, dustbin)
    for name, value in want.items():
        assert getattr(got, name) == pytest.approx(value, rel=1e-10, nan_ok=True), name
    assert got.n_annotated == int((target >= 0).sum())
    assert got.n_ce == (lq if dustbin is not None else got.n_annotated)


def test_plan_metrics_heads_average():
    rng = np.random.default_rng(9)
    plans = rng.random((3, 10, 12))
    target = np.array([0, 1, 3, -1, 5, 6, 6, 8, -1, 11])
    values = rng.normal(size=(3, 12, 2))
    joint = plan_metrics(plans, target, values=values)
    per_head = [plan_metrics(plans[h], target, values=values[h]) for h in range(3)]
    pooled = PlanMetrics.pool(per_head)
    for name in ("reconstruction", "sparse_ce", "barycenter_mae", "within5",
                 "monotonicity_violation"):
        assert getattr(joint, name) == pytest.approx(np.mean([getattr(m, name) for m in per_head]))
        assert getattr(pooled, name) == pytest.approx(getattr(joint, name))
    assert joint.n_annotated == 3 * 8


def test_monotonicity_by_hand():
    plan = np.eye(4)[[0, 2, 1, 3]]  # point masses: b = 0, 2, 1, 3
    m = plan_metrics(plan, np.array([0, 1, 2, 3]))
    assert m.monotonicity_violation == pytest.approx(1 / 3) and m.n_consecutive == 3
    m = plan_metrics(plan, np.array([0, 1, -1, 3]))  # only rows (0, 1) are adjacent+annotated
    assert m.monotonicity_violation == 0.0 and m.n_consecutive == 1
    np.testing.assert_allclose(barycenters(plan), [0, 2, 1, 3])
    assert m.barycenter_mae == pytest.approx((0 + 1 + 0) / 3)


def test_diagonal_reference_metrics():
    target = np.array([0, 2, -1, 3, 4])
    values = np.arange(12.0).reshape(6, 2)  # V_j = (2j, 2j + 1)
    diag = [0, 1, 2, 4, 5]  # round(i * 5 / 4): 0, 1.25, 2.5, 3.75, 5 -> 0, 1, 2, 4, 5
    np.testing.assert_array_equal(diagonal_plan(5, 6).argmax(1), diag)
    m = diagonal_plan_metrics(target, 6, values=values)
    # annotated rows 0, 1, 3, 4: |diag - c| = 0, 1, 1, 1; ||V_diag - V_c||^2 = 8 (j - c)^2
    assert m.barycenter_mae == pytest.approx(3 / 4)
    assert m.within5 == 1.0
    assert m.reconstruction == pytest.approx(8 * 3 / 4)
    assert m.sparse_ce == pytest.approx(-math.log(1e-12) * 3 / 4)  # hit on row 0 only
    m = diagonal_plan_metrics(target, 6, values=values, dustbin=True)
    assert m.n_ce == 5 and m.sparse_ce == pytest.approx(-math.log(1e-12) * 4 / 5)


def test_plan_metrics_validation():
    plan = np.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="length"):
        plan_metrics(plan, np.array([0, 1]))
    with pytest.raises(ValueError, match="out of range"):
        plan_metrics(plan, np.array([0, 1, 4]))
    with pytest.raises(ValueError, match="values"):
        plan_metrics(plan, np.array([0, 1, 2]), values=np.ones((3, 2)))
    with pytest.raises(ValueError, match="dustbin_mass"):
        plan_metrics(plan, np.array([0, 1, 2]), dustbin_mass=np.ones(4))
    m = plan_metrics(plan, np.array([-1, -1, -1]))
    assert m.n_annotated == 0 and math.isnan(m.barycenter_mae) and math.isnan(m.reconstruction)


# --- reliability of per-pair confidences ----------------------------------------------------------

def test_pairs_in_reference_matches_the_true_positives():
    target = np.array([0, 2, -1, 3, 5])
    pairs = np.array([[0, 0], [1, 1], [2, 2], [3, 3], [4, 5]])
    np.testing.assert_array_equal(pairs_in_reference(pairs, target), [True, False, False, True, True])
    assert pairs_in_reference(pairs, target).sum() == alignment_counts(pairs, target)[0]
    assert pairs_in_reference(np.zeros((0, 2)), target).shape == (0,)
    with pytest.raises(ValueError, match="out of range"):
        pairs_in_reference([[5, 0]], target)


def test_reliability_by_hand():
    conf = np.array([0.05, 0.15, 0.12, 0.95, 1.0, 1.2])  # 1.2: plan mass above 1, clipped
    correct = np.array([False, True, False, True, True, False])
    rel = reliability(reliability_sums(conf, correct))
    assert rel["n_pairs"] == 6 and len(rel["bins"]) == 10
    assert [b["count"] for b in rel["bins"]] == [1, 2, 0, 0, 0, 0, 0, 0, 0, 3]
    first, second, last = rel["bins"][0], rel["bins"][1], rel["bins"][9]
    assert (first["low"], first["high"], last["low"], last["high"]) == (0.0, 0.1, 0.9, 1.0)
    assert first["mean_confidence"] == pytest.approx(0.05) and first["precision"] == 0.0
    assert second["mean_confidence"] == pytest.approx(0.135) and second["precision"] == 0.5
    assert last["mean_confidence"] == pytest.approx(2.95 / 3) and last["precision"] == pytest.approx(2 / 3)
    assert math.isnan(rel["bins"][5]["precision"]) and math.isnan(rel["bins"][5]["mean_confidence"])
    # ECE = (1 * 0.05 + 2 * 0.365 + 3 * (2.95 - 2) / 3) / 6
    assert rel["ece"] == pytest.approx((0.05 + 0.73 + 0.95) / 6)
    # Brier = mean (c - y)^2 with c clipped: .05^2 + .85^2 + .12^2 + .05^2 + 0 + 1
    assert rel["brier"] == pytest.approx((0.0025 + 0.7225 + 0.0144 + 0.0025 + 0 + 1) / 6)


def test_reliability_matches_a_brute_force_loop_and_pools_by_adding():
    rng = np.random.default_rng(0)
    conf = np.concatenate([rng.uniform(0, 1.1, 500), [0.0, 0.5, 1.0]])
    correct = rng.uniform(size=conf.size) < 0.6
    n_bins = 7
    rel = reliability(reliability_sums(conf, correct, n_bins=n_bins))
    c = np.minimum(conf, 1.0)
    ece = brier = 0.0
    for k in range(n_bins):
        lo, hi = k / n_bins, (k + 1) / n_bins
        members = [n for n in range(c.size) if lo <= c[n] < hi or (k == n_bins - 1 and c[n] == 1.0)]
        cell = rel["bins"][k]
        assert cell["count"] == len(members)
        assert cell["mean_confidence"] == pytest.approx(np.mean(c[members]))
        assert cell["precision"] == pytest.approx(np.mean(correct[members]))
        ece += len(members) / c.size * abs(np.mean(correct[members]) - np.mean(c[members]))
    for n in range(c.size):
        brier += (c[n] - float(correct[n])) ** 2 / c.size
    assert rel["ece"] == pytest.approx(ece) and rel["brier"] == pytest.approx(brier)
    # pooled over two halves (folds) = computed on all pairs
    half = conf.size // 2
    parts = [reliability_sums(conf[s], correct[s], n_bins=n_bins) for s in (slice(None, half), slice(half, None))]
    np.testing.assert_allclose(parts[0] + parts[1], reliability_sums(conf, correct, n_bins=n_bins))


def test_reliability_separates_calibrated_from_overconfident():
    rng = np.random.default_rng(1)
    conf = rng.uniform(size=200_000)
    calibrated = reliability(reliability_sums(conf, rng.uniform(size=conf.size) < conf))
    overconfident = reliability(reliability_sums(conf, rng.uniform(size=conf.size) < conf ** 3))
    assert calibrated["ece"] < 0.01
    assert calibrated["brier"] == pytest.approx(1 / 6, abs=0.005)  # E[c (1 - c)], c ~ U(0, 1)
    assert overconfident["ece"] > 0.2  # E[c - c^3] = 1/4 before binning
    assert all(b["precision"] < b["mean_confidence"] for b in overconfident["bins"])


def test_reliability_validation_and_empty():
    with pytest.raises(ValueError, match="length"):
        reliability_sums([0.5, 0.5], [True])
    with pytest.raises(ValueError, match="bool"):
        reliability_sums([0.5], [1])
    with pytest.raises(ValueError, match=">= 0"):
        reliability_sums([-0.1], [True])
    with pytest.raises(ValueError, match="finite"):
        reliability_sums([np.nan], [True])
    with pytest.raises(ValueError, match="sums"):
        reliability(np.zeros((10, 3)))
    empty = reliability(reliability_sums([], np.zeros(0, bool)))
    assert empty["n_pairs"] == 0 and math.isnan(empty["ece"]) and math.isnan(empty["brier"])


def test_one_pair_has_a_value_and_no_interval():
    """A single pair has no spread to resample: its interval is NaN (as a one-group cell of
    paired_f1_difference), not the zero-width interval a bootstrap of one would give."""
    out = prf_summary([[3, 4, 5]], n_boot=200)
    assert out["micro"]["f1"]["value"] == pytest.approx(6 / 9)
    assert math.isnan(out["micro"]["f1"]["low"]) and math.isnan(out["micro"]["f1"]["high"])
    two = prf_summary([[3, 4, 5], [1, 4, 5]], n_boot=200)
    assert two["micro"]["f1"]["low"] < two["micro"]["f1"]["high"]


def test_paired_difference_needs_one_identity_per_pair():
    counts = [[3, 4, 5], [1, 4, 5], [2, 2, 2]]
    for pid in (40.0, [40.0]):
        with pytest.raises(ValueError, match="percent_identity must have shape"):
            paired_f1_difference(counts, counts, pid)


# --- boundaries and guards (a mutation sweep's survivors) ----------------------------------------

def test_pair_counts_tell_transposed_pairs_apart():
    # (0, 1) and (1, 0) are different pairs: a key without the row stride, or with a stride of
    # the largest column rather than one more, made them the same key
    assert pair_counts([[0, 1]], [[1, 0]]) == (0, 1, 1)
    assert pair_counts([[0, 1], [1, 0]], [[1, 0]]) == (1, 2, 1)


def test_alignment_counts_refuse_a_query_index_equal_to_the_target_length():
    with pytest.raises(ValueError, match="out of range"):
        alignment_counts([[2, 0]], [0, 1])


def test_counts_refuse_more_true_positives_than_reference_pairs():
    with pytest.raises(ValueError, match="tp <= n_reference"):
        prf_summary([[3, 5, 2]], n_boot=0)
    with pytest.raises(ValueError, match="tp <= n_predicted"):
        prf_summary([[3, 2, 5]], n_boot=0)


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5])
def test_interval_level_must_be_inside_the_open_unit_interval(level):
    with pytest.raises(ValueError, match="level"):
        prf_summary([[1, 2, 2], [2, 2, 2]], n_boot=10, level=level)


def test_pairs_in_reference_refuses_negative_indices():
    with pytest.raises(ValueError, match="out of range"):
        pairs_in_reference([[-1, 1]], [0, 1])  # would read target[-1] == 1: "correct"
    with pytest.raises(ValueError, match="out of range"):
        pairs_in_reference([[0, -1]], [-1, 1])  # would match the unaligned marker -1


def test_pool_weights_each_metric_by_its_count_and_skips_empty_ones():
    a = PlanMetrics(1.0, 1.0, float("nan"), float("nan"), float("nan"), 1, 1, 0, 0)
    b = PlanMetrics(3.0, 3.0, 3.0, 0.0, 1.0, 3, 3, 3, 3)
    pooled = PlanMetrics.pool([a, b])
    assert pooled.reconstruction == pytest.approx((1 * 1.0 + 3 * 3.0) / 4)  # not (1 + 3) / 2
    assert pooled.sparse_ce == pytest.approx(2.5)
    assert pooled.barycenter_mae == 3.0 and pooled.within5 == 0.0  # count 0: NaN skipped
    assert pooled.monotonicity_violation == 1.0
    assert (pooled.n_annotated, pooled.n_barycenter, pooled.n_consecutive) == (4, 3, 3)


def test_within5_counts_exactly_5_and_a_tie_is_no_monotonicity_violation():
    plan = np.zeros((2, 8))
    plan[:, 5] = 1.0  # both rows' barycenter at key 5: rows annotated to keys 0 and 1
    m = plan_metrics(plan, [0, 1])
    assert m.barycenter_mae == pytest.approx(4.5)
    assert m.within5 == pytest.approx(1.0)  # |5 - 0| = 5 is within 5
    assert m.monotonicity_violation == 0.0 and m.n_consecutive == 1  # b_1 == b_0: not a decrease


def test_n_annotated_counts_rows_times_heads_without_values():
    plan = np.zeros((3, 2, 8))
    plan[..., 0, 0] = plan[..., 1, 1] = 1.0
    m = plan_metrics(plan, [0, 1])
    assert np.isnan(m.reconstruction) and m.n_annotated == 6  # 2 rows x 3 heads, as n_ce
    assert m.n_ce == 6
