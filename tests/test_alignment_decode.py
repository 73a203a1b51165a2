"""MEA decoder: brute force on tiny plans, an independent cell-by-cell DP on medium ones,
hand-derived cases for thresholds / dustbins, and the large sizes it must handle."""

import itertools

import numpy as np
import pytest

from pfamalign.alignment.decode import _allowed, expected_f1, mea_decode, mea_decode_many


def _allowed_reference(plan, row_db, col_db, min_mass):
    """The decoder's pair rule, restated from its specification."""
    lq, lk = plan.shape
    ok = np.zeros((lq, lk), bool)
    for i in range(lq):
        for j in range(lk):
            ok[i, j] = plan[i, j] > 0 and plan[i, j] >= min_mass
            if row_db is not None and row_db[i] > max(plan[i]):
                ok[i, j] = False
            if col_db is not None and col_db[j] > max(plan[:, j]):
                ok[i, j] = False
    return ok


def _objective(plan, pairs, gap_cost):
    lq, lk = plan.shape
    return sum(plan[i, j] for i, j in pairs) - gap_cost * (lq + lk - 2 * len(pairs))


def _brute_force(plan, ok, gap_cost):
    """Best objective over every proper alignment of allowed pairs."""
    lq, lk = plan.shape
    best = -np.inf
    for k in range(min(lq, lk) + 1):
        for rows in itertools.combinations(range(lq), k):
            for cols in itertools.combinations(range(lk), k):
                pairs = list(zip(rows, cols))
                if all(ok[i, j] for i, j in pairs):
                    best = max(best, _objective(plan, pairs, gap_cost))
    return best


def _check_proper(aln, lq, lk):
    p = aln.pairs
    assert p.shape[1] == 2
    if len(p):
        assert p[:, 0].min() >= 0 and p[:, 0].max() < lq
        assert p[:, 1].min() >= 0 and p[:, 1].max() < lk
        assert np.all(np.diff(p[:, 0]) > 0) and np.all(np.diff(p[:, 1]) > 0)


@pytest.mark.parametrize("seed", range(40))
def test_brute_force_tiny(seed):
    rng = np.random.default_rng(seed)
    lq, lk = rng.integers(1, 6, size=2)
    plan = rng.random((lq, lk)) * (rng.random((lq, lk)) < 0.7)  # some exact zeros
    min_mass = [0.0, 0.3][seed % 2]
    gap_cost = [0.0, 0.0, 0.1, 0.4][seed % 4]
    row_db = rng.random(lq) if seed % 3 == 0 else None
    col_db = rng.random(lk) * 0.8 if seed % 5 == 0 else None
    aln = mea_decode(plan, row_dustbin=row_db, col_dustbin=col_db, min_mass=min_mass,
                     gap_cost=gap_cost)
    ok = _allowed_reference(plan, row_db, col_db, min_mass)
    np.testing.assert_array_equal(_allowed(plan, row_db, col_db, min_mass), ok)  # mea_decode's
    _check_proper(aln, lq, lk)
    assert all(ok[i, j] for i, j in aln.pairs)
    best = _brute_force(plan, ok, gap_cost)
    assert aln.score == pytest.approx(best, abs=1e-12)
    assert aln.score == pytest.approx(_objective(plan, aln.pairs.tolist(), gap_cost), abs=1e-12)
    np.testing.assert_allclose(aln.confidence, plan[aln.pairs[:, 0], aln.pairs[:, 1]])


def _cellwise_dp(plan, gap_cost):
    """Textbook O(Lq Lk) DP with explicit gap costs (no weight shift), scores only."""
    lq, lk = plan.shape
    m = np.zeros((lq + 1, lk + 1))
    m[:, 0] = -gap_cost * np.arange(lq + 1)
    m[0, :] = -gap_cost * np.arange(lk + 1)
    for i in range(1, lq + 1):
        for j in range(1, lk + 1):
            diag = m[i - 1, j - 1] + plan[i - 1, j - 1] if plan[i - 1, j - 1] > 0 else -np.inf
            m[i, j] = max(diag, m[i - 1, j] - gap_cost, m[i, j - 1] - gap_cost)
    return m[lq, lk]


@pytest.mark.parametrize("seed", range(6))
def test_matches_cellwise_dp_medium(seed):
    rng = np.random.default_rng(100 + seed)
    lq, lk = rng.integers(20, 60, size=2)
    plan = rng.random((lq, lk)) ** 6 * (rng.random((lq, lk)) < 0.5)
    gap_cost = [0.0, 0.05, 0.3][seed % 3]
    aln = mea_decode(plan, gap_cost=gap_cost)
    _check_proper(aln, lq, lk)
    assert aln.score == pytest.approx(_cellwise_dp(plan, gap_cost), abs=1e-9)


@pytest.mark.parametrize("lq, lk", [(64, 70), (65, 40), (129, 90)])
def test_matches_cellwise_dp_across_row_blocks(lq, lk):
    # the DP keeps its rows a block of 64 at a time: block edges and a short last block
    rng = np.random.default_rng(lq * lk)
    plan = rng.random((lq, lk)) ** 6 * (rng.random((lq, lk)) < 0.5)
    for gap_cost in (0.0, 0.05):
        aln = mea_decode(plan, gap_cost=gap_cost)
        _check_proper(aln, lq, lk)
        assert aln.score == pytest.approx(_cellwise_dp(plan, gap_cost), abs=1e-9)


def test_the_numba_dp_finds_the_numpy_dps_pairs_ties_included(monkeypatch):
    """Once a process uses numba (``numba_jit``), ``_mea_pairs_many`` runs its compiled twin:
    the same pairs, ties broken alike (masses on a grid of quarters tie everywhere), with
    disallowed cells, gap bonuses and pair costs, one shape at a time."""
    from pfamalign.alignment import decode, numba_jit

    rng = np.random.default_rng(12)
    sizes = [(1, 1), (70, 40), (30, 90), (129, 128), (64, 64), (5, 1)]
    plans = [np.round(rng.random(size) ** 3 * 4) / 4 for size in sizes]
    oks = [rng.random(size) < 0.8 for size in sizes]
    for bonuses in ([0.0] * 6, [0.1, -0.3, 0.25, -0.1, 0.0, -1.0]):
        monkeypatch.setattr(numba_jit, "_started", False)
        ref = decode._mea_pairs_many(plans, oks, bonuses)
        monkeypatch.setattr(numba_jit, "_started", True)
        got = decode._mea_pairs_many(plans, oks, bonuses)
        for r, g in zip(ref, got):
            assert g.dtype == r.dtype and g.shape == r.shape
            np.testing.assert_array_equal(g, r)
        assert sum(len(r) for r in ref) > 50  # not all empty


@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
def test_the_numba_gotoh_dp_finds_the_numpy_dps_pairs_and_value(monkeypatch, local):
    """Once a process uses numba, the affine (Gotoh) DP runs compiled (``_compiled_gotoh``):
    the same pairs and the same value to the bit, on real-valued scores, integer scores
    (ties everywhere), scores on a grid of quarters and barred (-inf) cells, with and without
    gap costs."""
    from pfamalign.alignment import decode, numba_jit

    rng = np.random.default_rng(13)
    aligned = 0
    for trial in range(120):
        lq, lk = (int(x) for x in rng.integers(1, 40, size=2))
        score = [rng.normal(size=(lq, lk)), rng.integers(-3, 4, size=(lq, lk)).astype(float),
                 np.round(rng.normal(size=(lq, lk)) * 4) / 4,
                 np.where(rng.random((lq, lk)) < 0.3, -np.inf, rng.normal(size=(lq, lk)))][trial % 4]
        gap_open, gap_extend = [(0.0, 0.0), (1.0, 0.25), (3.0, 0.5), (0.5, 0.5)][trial // 4 % 4]
        monkeypatch.setattr(numba_jit, "_started", False)
        ref_pairs, ref_value = decode._gotoh_pairs(score, gap_open, gap_extend, local)
        monkeypatch.setattr(numba_jit, "_started", True)
        pairs, value = decode._gotoh_pairs(score, gap_open, gap_extend, local)
        assert pairs.dtype == ref_pairs.dtype and repr(value) == repr(ref_value)
        np.testing.assert_array_equal(pairs, ref_pairs)
        aligned += len(pairs)
    assert aligned > 500  # not all empty


@pytest.mark.parametrize("objective", ["accuracy", "f1"])
@pytest.mark.parametrize("mode", ["global", "local"])
def test_many_plans_at_once_are_each_plan_alone(objective, mode):
    # sizes on both sides of the row blocks, wider and taller than each other, one 1 x 1
    rng = np.random.default_rng(11)
    sizes = [(70, 40), (30, 90), (1, 1), (129, 128), (64, 64)]
    plans = [rng.random(size) ** 4 * (rng.random(size) < 0.6) for size in sizes]
    row_dbs = [rng.random(lq) * 0.5 for lq, _ in sizes]
    for kwargs in (dict(gap_cost=0.0), dict(gap_cost=0.05, min_mass=0.01, pair_cost=0.1)):
        many = mea_decode_many(plans, row_dustbins=row_dbs, mode=mode, objective=objective, **kwargs)
        for plan, row_db, got in zip(plans, row_dbs, many):
            alone = mea_decode(plan, row_dustbin=row_db, mode=mode, objective=objective, **kwargs)
            np.testing.assert_array_equal(got.pairs, alone.pairs)
            assert got.score == alone.score and (got.query_length, got.key_length) == plan.shape


def test_recovers_planted_path():
    rng = np.random.default_rng(7)
    lq, lk = 80, 95
    rows = np.sort(rng.choice(lq, 60, replace=False))
    cols = np.sort(rng.choice(lk, 60, replace=False))
    plan = rng.random((lq, lk)) * 0.01
    plan[rows, cols] = 0.9
    aln = mea_decode(plan, min_mass=0.05)
    np.testing.assert_array_equal(aln.pairs, np.stack([rows, cols], 1))
    assert aln.score == pytest.approx(0.9 * 60)


def test_non_crossing_beats_row_argmax():
    # Row argmaxes (0,1) and (1,0) cross; the best proper alignment is (0,0),(1,1): 0.95 > 0.6.
    plan = np.array([[0.5, 0.6], [0.6, 0.45]])
    aln = mea_decode(plan)
    assert aln.pairs.tolist() == [[0, 0], [1, 1]]
    assert aln.score == pytest.approx(0.95)


def test_min_mass_and_dustbin_rows_become_gaps():
    plan = np.array([[0.8, 0.0, 0.0], [0.0, 0.2, 0.0], [0.0, 0.0, 0.7]])
    assert mea_decode(plan).pairs.tolist() == [[0, 0], [1, 1], [2, 2]]
    assert mea_decode(plan, min_mass=0.25).pairs.tolist() == [[0, 0], [2, 2]]
    # row 1 sends 0.7 to the dustbin (> its best real entry 0.2): a gap
    aln = mea_decode(plan, row_dustbin=np.array([0.1, 0.7, 0.2]))
    assert aln.pairs.tolist() == [[0, 0], [2, 2]]
    assert aln.confidence.tolist() == [0.8, 0.7]
    # column 2 receives 0.9 from the dustbin row (> 0.7): a gap
    aln = mea_decode(plan, col_dustbin=np.array([0.0, 0.0, 0.9]))
    assert aln.pairs.tolist() == [[0, 0], [1, 1]]


def test_empty_and_gap_cost_score():
    aln = mea_decode(np.zeros((3, 4)), gap_cost=0.5)
    assert aln.pairs.shape == (0, 2) and aln.confidence.shape == (0,)
    assert aln.score == pytest.approx(-0.5 * 7)
    # the lone positive pair is taken (it saves two gap costs): 0.1 - g * (4 - 2)
    plan = np.zeros((2, 2))
    plan[1, 0] = 0.1
    aln = mea_decode(plan, gap_cost=0.5)
    assert aln.pairs.tolist() == [[1, 0]]
    assert aln.score == pytest.approx(0.1 - 0.5 * 2)


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="Lq, Lk"):
        mea_decode(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="empty"):
        mea_decode(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="non-negative"):
        mea_decode(np.array([[0.1, -0.2]]))
    with pytest.raises(ValueError, match="non-negative"):
        mea_decode(np.array([[0.1, np.nan]]))
    with pytest.raises(ValueError, match="row_dustbin"):
        mea_decode(np.ones((2, 2)), row_dustbin=np.ones(3))
    with pytest.raises(ValueError, match="gap_cost"):
        mea_decode(np.ones((2, 2)), gap_cost=-1.0)
    with pytest.raises(ValueError, match="min_mass"):
        mea_decode(np.ones((2, 2)), min_mass=-0.1)
    with pytest.raises(TypeError):
        mea_decode(np.ones((2, 2)), None, None)  # options are keyword-only


@pytest.mark.parametrize("length", [500, 2000])
def test_large_plans_decode_to_proper_alignments(length):
    # (speed: scripts/bench_align.py)
    rng = np.random.default_rng(length)
    plan = rng.random((length, length)).astype(np.float32) ** 8
    aln = mea_decode(plan)
    _check_proper(aln, length, length)
    assert aln.score == pytest.approx(float(plan[aln.pairs[:, 0], aln.pairs[:, 1]].sum()))


# ---- affine-gap decoding -----------------------------------------------------------------------

from pfamalign.alignment.decode import affine_decode  # noqa: E402


def _proper_alignments(lq, lk):
    """Every proper alignment (pairs strictly increasing in i and j) of tiny lengths."""
    cells = [(i, j) for i in range(lq) for j in range(lk)]
    for n in range(min(lq, lk) + 1):
        for combo in itertools.combinations(cells, n):
            if all(a[0] < b[0] and a[1] < b[1] for a, b in zip(combo, combo[1:])):
                yield combo


def _affine_objective(plan, pairs, threshold, gap_open, gap_extend, ends=None):
    """Only gaps between pairs are charged, unless ``ends = (Lq, Lk)`` (global: end gaps too)."""
    value = sum(plan[i, j] - threshold for i, j in pairs)
    steps = list(pairs)
    if ends is not None:
        steps = [(-1, -1)] + steps + [ends]
    for (i0, j0), (i1, j1) in zip(steps, steps[1:]):
        for gap in (i1 - i0 - 1, j1 - j0 - 1):
            if gap > 0:
                value -= gap_open + (gap - 1) * gap_extend
    return value


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["global", "local"])
def test_affine_decode_is_optimal_against_brute_force(seed, mode):
    rng = np.random.default_rng(100 + seed)
    lq, lk = rng.integers(1, 5, size=2)
    plan = rng.random((lq, lk)) ** 2
    gap_open = float(rng.uniform(0, 0.6))
    gap_extend = float(rng.uniform(0, gap_open))
    threshold = float(rng.uniform(0, 0.3))
    ends = (int(lq), int(lk)) if mode == "global" else None
    aln = affine_decode(plan, gap_open=gap_open, gap_extend=gap_extend, threshold=threshold, mode=mode)
    best = max(_affine_objective(plan, p, threshold, gap_open, gap_extend, ends)
               for p in _proper_alignments(lq, lk))
    got = _affine_objective(plan, [tuple(p) for p in aln.pairs], threshold, gap_open, gap_extend, ends)
    assert got == pytest.approx(best, abs=1e-12)
    assert aln.score == pytest.approx(best, abs=1e-12)
    _check_proper(aln, lq, lk)


def test_affine_decode_without_costs_is_mea():
    rng = np.random.default_rng(7)
    plan = rng.random((30, 26)) ** 3
    mea = mea_decode(plan)
    aff = affine_decode(plan, gap_open=0.0, gap_extend=0.0)
    assert aff.score == pytest.approx(mea.confidence.sum())


def test_affine_decode_prefers_one_long_gap_over_scattered_ones():
    # true path: one 2-residue gap in the key; a slightly heavier decoy pair (2, 3) would
    # split it into two 1-residue gaps. MEA takes the decoy, affine gaps do not.
    plan = np.zeros((5, 7))
    for i, j in [(0, 0), (1, 1), (2, 4), (3, 5), (4, 6)]:
        plan[i, j] = 0.9
    plan[2, 4] = 0.45
    plan[2, 3] = 0.5
    truth = [(0, 0), (1, 1), (2, 4), (3, 5), (4, 6)]
    assert [tuple(p) for p in affine_decode(plan, gap_open=0.6, gap_extend=0.05).pairs] == truth
    assert (2, 3) in {tuple(p) for p in mea_decode(plan).pairs}


def test_affine_decode_rejects_bad_costs():
    with pytest.raises(ValueError, match="gap_open >= gap_extend"):
        affine_decode(np.ones((2, 2)), gap_open=0.1, gap_extend=0.2)


# ---- hybrid decoding (BLOSUM62 + plan) ---------------------------------------------------------

from pfamalign.alignment.decode import hybrid_decode  # noqa: E402
from pfamalign.residues import substitution_scores  # noqa: E402

_AA = list("ACDEFGHIKLMNPQRSTVWY")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", ["global", "local"])
def test_hybrid_without_the_plan_is_needleman_wunsch_or_smith_waterman(seed, mode):
    from Bio import Align
    from Bio.Align import substitution_matrices

    rng = np.random.default_rng(seed)
    a = "".join(rng.choice(_AA, rng.integers(5, 40)))
    b = "".join(rng.choice(_AA, rng.integers(5, 40)))
    aligner = Align.PairwiseAligner(mode=mode, open_gap_score=-11, extend_gap_score=-1,
                                    substitution_matrix=substitution_matrices.load("BLOSUM62"))
    plan = rng.random((len(a), len(b)))
    aln = hybrid_decode(plan, a, b, plan_weight=0.0, mode=mode)
    assert aln.score == pytest.approx(aligner.score(a, b))
    _check_proper(aln, len(a), len(b))
    s = substitution_scores(a, b)  # the traceback's own objective equals the score
    assert _affine_objective(s, [tuple(p) for p in aln.pairs], 0.0, 11.0, 1.0,
                             ends=(len(a), len(b)) if mode == "global" else None) == pytest.approx(aln.score)


def test_hybrid_follows_a_confident_plan_and_scores_its_objective():
    rng = np.random.default_rng(0)
    a, b = "".join(rng.choice(_AA, 30)), "".join(rng.choice(_AA, 26))
    truth = [(i, i - 4) for i in range(4, 14)] + [(i, i - 2) for i in range(14, 28)]  # key gap 10-11
    plan = np.full((30, 26), 1e-3)
    for i, j in truth:
        plan[i, j] = 1.0
    aln = hybrid_decode(plan, a, b, plan_weight=100.0, mode="local")
    assert [tuple(p) for p in aln.pairs] == truth
    s = substitution_scores(a, b)
    expected = sum(s[i, j] + 100.0 * plan[i, j] for i, j in truth) - 11.0 - 1.0  # one 2-gap
    assert aln.score == pytest.approx(expected)
    np.testing.assert_allclose(aln.confidence, 1.0)


def test_hybrid_rejects_bad_inputs():
    with pytest.raises(ValueError, match="does not match"):
        hybrid_decode(np.ones((3, 4)), "ACD", "ACD", plan_weight=1.0)
    with pytest.raises(ValueError, match="plan_weight"):
        hybrid_decode(np.ones((3, 3)), "ACD", "ACD", plan_weight=-1.0)


# ---- global and local modes of every decoder -----------------------------------------------------


def _decoder_case(decoder, mode, seed):
    """A tiny random plan (exact zeros, dustbin-heavy rows), the decoder's alignment, its pair
    score matrix with barred pairs at -inf, and its gap costs, restated from the docstrings."""
    rng = np.random.default_rng(1000 + seed)
    lq, lk = (int(n) for n in rng.integers(1, 6, size=2))
    plan = rng.random((lq, lk)) * (rng.random((lq, lk)) < 0.8)
    row_db = rng.random((lq,)) * 0.9
    min_mass = [0.0, 0.2][seed % 2]
    if decoder == "hybrid":
        a, b = "".join(rng.choice(_AA, lq)), "".join(rng.choice(_AA, lk))
        weight = float(rng.uniform(0, 10))
        aln = hybrid_decode(plan, a, b, plan_weight=weight, min_mass=min_mass, mode=mode)
        score = np.where(plan >= min_mass, substitution_scores(a, b) + weight * plan, -np.inf)
        return aln, score, 11.0, 1.0
    ok = _allowed_reference(plan, row_db, None, min_mass)
    if decoder == "mea":
        gap = float(rng.uniform(0, 0.4))
        aln = mea_decode(plan, row_dustbin=row_db, min_mass=min_mass, gap_cost=gap, mode=mode)
        return aln, np.where(ok, plan, -np.inf), gap, gap  # a run of n unaligned residues: n gaps
    gap_open = float(rng.uniform(0, 0.6))
    gap_extend = float(rng.uniform(0, gap_open))
    threshold = float(rng.uniform(0, 0.4))
    aln = affine_decode(plan, gap_open=gap_open, gap_extend=gap_extend, threshold=threshold,
                        row_dustbin=row_db, min_mass=min_mass, mode=mode)
    return aln, np.where(ok, plan - threshold, -np.inf), gap_open, gap_extend


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("mode", ["global", "local"])
@pytest.mark.parametrize("decoder", ["affine", "mea", "hybrid"])
def test_every_decoder_and_mode_is_optimal_against_brute_force(decoder, mode, seed):
    # global: end gaps charged like inner ones; local: only gaps between pairs, so the empty
    # alignment (value 0) is always a candidate and barred or negative flanks stay unaligned
    aln, score, gap_open, gap_extend = _decoder_case(decoder, mode, seed)
    lq, lk = score.shape
    ends = (lq, lk) if mode == "global" else None
    best = max(_affine_objective(score, p, 0.0, gap_open, gap_extend, ends)
               for p in _proper_alignments(lq, lk))
    _check_proper(aln, lq, lk)
    assert all(np.isfinite(score[i, j]) for i, j in aln.pairs)
    got = _affine_objective(score, [tuple(p) for p in aln.pairs], 0.0, gap_open, gap_extend, ends)
    assert got == pytest.approx(best, abs=1e-9)
    assert aln.score == pytest.approx(best, abs=1e-9)
    if mode == "local":
        assert best >= 0.0


def test_local_mode_leaves_flanks_unaligned_where_global_must_pay_for_them():
    # a confident 6-pair diagonal block inside 5-residue random flanks on each side of both
    # sequences; the flank rows send their mass to the dustbin
    rng = np.random.default_rng(3)
    plan = rng.random((16, 16)) * 0.02
    block = [(5 + n, 5 + n) for n in range(6)]
    for i, j in block:
        plan[i, j] = 0.9
    row_db = np.where(np.isin(np.arange(16), [i for i, _ in block]), 0.05, 0.9)
    local = affine_decode(plan, gap_open=0.5, gap_extend=0.1, threshold=0.05, row_dustbin=row_db,
                          mode="local")
    assert [tuple(p) for p in local.pairs] == block
    assert local.score == pytest.approx(6 * (0.9 - 0.05))
    glob = affine_decode(plan, gap_open=0.5, gap_extend=0.1, threshold=0.05, row_dustbin=row_db,
                         mode="global")
    assert [tuple(p) for p in glob.pairs] == block  # the dustbin rows are gaps either way ...
    assert glob.score == pytest.approx(local.score - 4 * (0.5 + 4 * 0.1))  # ... charged here
    assert mea_decode(plan, gap_cost=0.1, mode="local").score > mea_decode(plan, gap_cost=0.1).score


@pytest.mark.parametrize("decode", [
    lambda mode: mea_decode(np.ones((2, 2)), mode=mode),
    lambda mode: affine_decode(np.ones((2, 2)), gap_open=1.0, gap_extend=0.5, mode=mode),
    lambda mode: hybrid_decode(np.ones((2, 2)), "AC", "AC", plan_weight=1.0, mode=mode),
])
def test_unknown_mode_is_refused(decode):
    with pytest.raises(ValueError, match="mode must be 'global' or 'local'"):
        decode("semiglobal")


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["global", "local"])
def test_pair_cost_is_optimal_against_brute_force(mode, seed):
    # sum (P_ij - pair_cost) - gap_cost * unaligned: a pair is taken only where it pays
    rng = np.random.default_rng(2000 + seed)
    lq, lk = (int(n) for n in rng.integers(1, 6, size=2))
    plan = rng.random((lq, lk)) ** 2
    pair_cost, gap = float(rng.uniform(0, 0.6)), [0.0, 0.1][seed % 2]
    aln = mea_decode(plan, pair_cost=pair_cost, gap_cost=gap, mode=mode)
    ends = (lq, lk) if mode == "global" else None
    best = max(_affine_objective(plan - pair_cost, p, 0.0, gap, gap, ends) for p in _proper_alignments(lq, lk))
    _check_proper(aln, lq, lk)
    assert aln.score == pytest.approx(best, abs=1e-9)
    assert all(plan[i, j] > pair_cost - 2 * gap for i, j in aln.pairs)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("mode", ["global", "local"])
def test_expected_f1_objective_is_optimal_against_brute_force(mode, seed):
    # the largest 2 sum_A P / (|A| + sum P) over every proper alignment, found by enumeration
    rng = np.random.default_rng(3000 + seed)
    lq, lk = (int(n) for n in rng.integers(1, 6, size=2))
    plan = rng.random((lq, lk)) ** 3 * (rng.random((lq, lk)) < 0.8)
    aln = mea_decode(plan, objective="f1", mode=mode)
    _check_proper(aln, lq, lk)
    best = max(expected_f1(plan, p) for p in _proper_alignments(lq, lk) if all(plan[i, j] > 0 for i, j in p))
    assert expected_f1(plan, aln.pairs) == pytest.approx(best, abs=1e-12)


def test_expected_f1_started_from_the_sure_pairs_is_the_optimum_in_fewer_decodes(monkeypatch):
    # posterior-like plans (faint noise, a few pairs above 1/2 in order): the search started
    # from the sure pairs reaches the brute-force optimum and the cold start's alignment,
    # with fewer DP decodes in all
    from pfamalign.alignment import decode

    decoded = []
    dp = decode._mea_pairs_many
    monkeypatch.setattr(decode, "_mea_pairs_many", lambda plans, *a: decoded.append(len(plans)) or dp(plans, *a))
    warm_calls = cold_calls = 0
    for seed in range(25):
        rng = np.random.default_rng(4000 + seed)
        lq, lk = (int(n) for n in rng.integers(2, 6, size=2))
        plan = rng.random((lq, lk)) ** 3 * 0.3
        sure = int(rng.integers(1, min(lq, lk) + 1))
        rows, cols = np.sort(rng.choice(lq, sure, replace=False)), np.sort(rng.choice(lk, sure, replace=False))
        plan[rows, cols] = rng.uniform(0.55, 0.95, size=sure)
        assert [tuple(p) for p in decode._sure_pairs(plan, plan > 0)] == list(zip(rows, cols))
        decoded.clear()
        warm = mea_decode(plan, objective="f1")
        warm_calls += sum(decoded)
        best = max(expected_f1(plan, p) for p in _proper_alignments(lq, lk))
        assert expected_f1(plan, warm.pairs) == pytest.approx(best, abs=1e-12)
        with monkeypatch.context() as m:
            m.setattr(decode, "_sure_pairs", lambda plan, ok: None)
            decoded.clear()
            cold = mea_decode(plan, objective="f1")
            cold_calls += sum(decoded)
        np.testing.assert_array_equal(warm.pairs, cold.pairs)
        assert warm.score == pytest.approx(cold.score, abs=1e-12)
    assert warm_calls < cold_calls


def test_crossing_or_absent_sure_pairs_are_no_start():
    from pfamalign.alignment.decode import _sure_pairs

    crossing = np.array([[0.1, 0.6], [0.7, 0.1]])
    twice_in_a_row = np.array([[0.6, 0.6], [0.1, 0.1]])
    assert _sure_pairs(crossing, crossing > 0) is None
    assert _sure_pairs(twice_in_a_row, twice_in_a_row > 0) is None
    assert _sure_pairs(np.full((3, 3), 0.3), np.ones((3, 3), bool)) is None
    assert _sure_pairs(np.eye(3) * 0.9, np.eye(3) * 0.9 > 0.95) is None  # not allowed: none left


def test_expected_f1_drops_pairs_plain_mea_takes_and_gains_in_f1():
    # one sure pair and four pairs of probability 0.1 beside it: MEA takes all five (each adds
    # mass), the expected F1 is best with the sure pair alone
    plan = np.full((5, 5), 0.0)
    plan[0, 0] = 1.0
    for n in range(1, 5):
        plan[n, n] = 0.1
    mea = mea_decode(plan)
    f1 = mea_decode(plan, objective="f1")
    assert len(mea.pairs) == 5 and [tuple(p) for p in f1.pairs] == [(0, 0)]
    assert expected_f1(plan, f1.pairs) == pytest.approx(2 * 1.0 / (1 + 1.4))
    assert expected_f1(plan, f1.pairs) > expected_f1(plan, mea.pairs) == pytest.approx(2 * 1.4 / (5 + 1.4))


def test_bad_objective_and_pair_cost_are_errors():
    with pytest.raises(ValueError, match="objective"):
        mea_decode(np.ones((2, 2)), objective="recall")
    with pytest.raises(ValueError, match="pair_cost"):
        mea_decode(np.ones((2, 2)), pair_cost=-0.1)


def test_the_f1_objective_scores_its_alignment_without_the_pair_cost():
    # the score compares across pairs (search ranks hits by it): the summed plan mass of the
    # chosen pairs less gap costs, as the accuracy objective would score the same pairs
    rng = np.random.default_rng(7)
    plan = rng.random((9, 11)) ** 4
    for gap in (0.0, 0.05):
        aln = mea_decode(plan, objective="f1", gap_cost=gap)
        unaligned = 9 + 11 - 2 * len(aln.pairs)
        assert aln.score == pytest.approx(plan[aln.pairs[:, 0], aln.pairs[:, 1]].sum() - gap * unaligned)


@pytest.mark.parametrize("objective", ["accuracy", "f1"])
def test_mea_decode_many_of_no_plans_is_empty_and_dustbins_must_match(objective):
    assert mea_decode_many([], objective=objective) == []
    plans = [np.full((2, 2), 0.4), np.full((3, 2), 0.3)]
    with pytest.raises(ValueError, match="row_dustbins must hold one entry"):
        mea_decode_many(plans, row_dustbins=[None], objective=objective)


@pytest.mark.parametrize("shape", [(7, 7), (6, 9), (9, 6)])
@pytest.mark.parametrize("decoder", ["mea-global", "mea-local", "mea-f1", "affine-global", "affine-local"])
def test_a_transposed_plan_decodes_to_the_transposed_alignment_ties_included(shape, decoder):
    """Swapping the sequences transposes the plan; the decoded alignment must be the same pairs
    swapped. With exact ties (plans of a few distinct values, as repeats give) the DPs broke
    them by row order: poly-A 400 against 399 residues moved the affine decoder's gap by three."""
    from pfamalign.alignment.decode import affine_decode, mea_decode

    kind, mode = decoder.split("-")
    decode = {
        "mea": lambda p, **kw: mea_decode(p, mode="local" if mode == "local" else "global",
                                          objective="f1" if mode == "f1" else "accuracy", gap_cost=0.05, **kw),
        "affine": lambda p, **kw: affine_decode(p, gap_open=0.3, gap_extend=0.1, threshold=0.05, mode=mode, **kw),
    }[kind]
    rng = np.random.default_rng(0)
    broken = 0
    for n in range(60):
        plan = rng.choice([0.0, 0.25, 0.5], size=shape)  # few values: many exact ties
        if n % 3 == 0 and shape[0] == shape[1]:
            plan = np.triu(plan) + np.triu(plan, 1).T  # its own transpose: the dustbins decide
        rows, cols = rng.uniform(0, 0.3, shape[0]), rng.uniform(0, 0.3, shape[1])
        a = decode(plan, row_dustbin=rows, col_dustbin=cols)
        b = decode(plan.T.copy(), row_dustbin=cols, col_dustbin=rows)
        assert a.score == pytest.approx(b.score, abs=1e-12)
        broken += not np.array_equal(a.pairs, b.pairs[:, ::-1])
    assert broken == 0


# --- boundaries, tie rules and settings (a mutation sweep's survivors) ---------------------------

def test_a_dustbin_entry_equal_to_the_best_real_mass_does_not_dominate():
    """A row (column) is barred only where its dustbin mass exceeds its best real mass."""
    plan = np.array([[0.4, 0.1], [0.1, 0.3]])
    assert _allowed(plan, np.array([0.4, 0.3]), np.array([0.4, 0.3]), 0.0).all()
    assert not _allowed(plan, np.array([0.41, 0.0]), None, 0.0)[0].any()
    aln = mea_decode(plan, row_dustbin=[0.4, 0.0], col_dustbin=[0.4, 0.05])
    assert aln.pairs.tolist() == [[0, 0], [1, 1]]
    aln = mea_decode(plan.T.copy(), row_dustbin=[0.4, 0.05], col_dustbin=[0.4, 0.0])
    assert aln.pairs.tolist() == [[0, 0], [1, 1]]
    aln = affine_decode(plan, gap_open=0.0, gap_extend=0.0, threshold=0.0, row_dustbin=[0.4, 0.0],
                        col_dustbin=[0.4, 0.05])
    assert aln.pairs.tolist() == [[0, 0], [1, 1]]


def test_exact_ties_break_by_the_documented_orientation_and_gap_order():
    """``_decoded_transposed``'s orientation (the shorter sequence as rows; a square plan by its
    first entry off its transpose; a symmetric one by its dustbins) and the traceback's gaps
    before pairs on ties (left before up)."""
    assert mea_decode(np.array([[0, 0.5], [0.5, 0]])).pairs.tolist() == [[1, 0]]  # symmetric
    assert mea_decode(np.array([[0, 0, 0.5], [0.5, 0, 0]])).pairs.tolist() == [[1, 0]]  # 2 x 3: as given
    assert mea_decode(np.array([[0, 0.5], [0, 0], [0.5, 0]])).pairs.tolist() == [[0, 1]]  # 3 x 2: turned
    assert mea_decode(np.array([[0, 0, 0.5], [0, 0, 0], [0.5, 0.1, 0]])).pairs.tolist() == [[2, 0]]  # square
    sym = np.array([[0, 0.5], [0.5, 0]])  # symmetric: the dustbins decide
    assert mea_decode(sym, row_dustbin=[0.1, 0.0], col_dustbin=[0.0, 0.0]).pairs.tolist() == [[0, 1]]
    assert mea_decode(sym, row_dustbin=[0.0, 0.0], col_dustbin=[0.1, 0.0]).pairs.tolist() == [[1, 0]]


def _f1_from_the_cold_start(plan, gap_cost):
    """Dinkelbach's iteration from the plain decode (no sure-pairs start)."""
    best = mea_decode(plan, gap_cost=gap_cost)
    value = expected_f1(plan, best.pairs)
    for _ in range(50):
        nxt = mea_decode(plan, gap_cost=gap_cost, pair_cost=value / 2)
        reached = expected_f1(plan, nxt.pairs)
        if not reached > value + 1e-12:
            break
        best, value = nxt, reached
    return best


def test_f1_with_a_gap_cost_starts_from_the_cold_decode_not_the_sure_pairs():
    """The sure-pairs start is for global decoding without a gap cost only (docs/design.md)."""
    rng = np.random.default_rng(1)
    for _ in range(12):
        n, m = rng.integers(3, 9, 2)
        plan = rng.random((n, m)) ** rng.integers(1, 8) * rng.random()
        k = rng.integers(0, min(n, m))
        idx = np.sort(rng.choice(min(n, m), k, replace=False))
        plan[idx, idx] = 0.5 + 0.5 * rng.random(k)
        got = mea_decode(plan, gap_cost=0.3, objective="f1")
        assert got.pairs.tolist() == _f1_from_the_cold_start(plan, 0.3).pairs.tolist()


def test_affine_decode_refuses_a_non_finite_threshold():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="threshold"):
            affine_decode(np.full((2, 2), 0.5), gap_open=1.0, gap_extend=0.5, threshold=bad)


def test_hybrid_decode_of_swapped_sequences_is_the_swapped_alignment_ties_included():
    """BLOSUM62's integer scores tie often; the DP breaks ties by row order, so the hybrid
    decoder turns its problem as the others do (by its scores: a zero plan is symmetric).
    Before, 16 of 600 such decodes were not each other's swap."""
    plan = np.zeros((3, 3))
    a = hybrid_decode(plan, "GCG", "CGC", plan_weight=0.0)
    b = hybrid_decode(plan.T.copy(), "CGC", "GCG", plan_weight=0.0)
    assert a.score == b.score and a.pairs.tolist() == b.pairs[:, ::-1].tolist()
    rng = np.random.default_rng(0)
    for _ in range(60):
        n, m = rng.integers(2, 9, 2)
        sa, sb = ("".join(rng.choice(list("ACG"), k)) for k in (n, m))
        p = rng.choice([0.0, 0.5], (n, m))
        for mode in ("global", "local"):
            x = hybrid_decode(p, sa, sb, plan_weight=1.0, mode=mode)
            y = hybrid_decode(p.T.copy(), sb, sa, plan_weight=1.0, mode=mode)
            assert x.score == y.score and x.pairs.tolist() == y.pairs[:, ::-1].tolist(), (sa, sb, mode)


def test_decoder_settings_bounds_and_the_hybrid_defaults():
    from pfamalign.decoding import DecoderSettings

    with pytest.raises(ValueError, match="gap_open >= gap_extend"):
        DecoderSettings(decoder="mea", gap_open=0.1, gap_extend=0.5)
    assert DecoderSettings(min_mass=1.0).min_mass == 1.0
    with pytest.raises(ValueError, match="min_mass must be >= 0"):
        DecoderSettings(min_mass=-0.1)
    with pytest.raises(ValueError, match="min_mass"):
        DecoderSettings(min_mass=1.01)
    hybrid = DecoderSettings.for_decoder("hybrid")
    assert (hybrid.gap_open, hybrid.gap_extend, hybrid.mode) == (11.0, 1.0, "global")  # as SW's 11 / 1
    assert DecoderSettings().override(decoder="hybrid") == hybrid
    with pytest.raises(ValueError, match="finite number"):
        DecoderSettings(threshold=True)
    assert not DecoderSettings(decoder="posterior", alpha=0.0, plan_power=0.1).uses_plan_hmm()
    assert DecoderSettings(decoder="posterior", alpha=0.5, plan_power=0.1).uses_plan_hmm()


def test_a_model_directory_without_decoding_json_decodes_with_the_defaults(tmp_path):
    from pfamalign.decoding import DecoderSettings

    assert DecoderSettings.load(tmp_path) == DecoderSettings()
    assert DecoderSettings.load(tmp_path).decoder == "affine"


@pytest.mark.parametrize("decoder", ["mea", "affine"])
def test_the_settings_decoders_bar_the_plans_dustbin_dominated_rows(decoder):
    from pfamalign.decoding import DecoderSettings
    from pfamalign.plans import PairPlan

    full = np.zeros((4, 4))
    full[:3, :3] = np.diag([0.8, 0.2, 0.7])
    full[:3, 3] = [0.1, 0.7, 0.2]  # row 1: dustbin 0.7 > its best real 0.2
    settings = DecoderSettings.for_decoder(decoder).override(gap_open=0.0, gap_extend=0.0, threshold=0.0)
    assert settings.decode(PairPlan(full)).pairs.tolist() == [[0, 0], [2, 2]]


def test_the_affine_setting_subtracts_its_threshold():
    from pfamalign.decoding import DecoderSettings
    from pfamalign.plans import PairPlan

    full = np.zeros((4, 4))
    full[:3, :3] = np.diag([0.8, 0.2, 0.7])
    settings = DecoderSettings(decoder="affine", gap_open=0.0, gap_extend=0.0, threshold=0.3)
    assert settings.decode(PairPlan(full)).pairs.tolist() == [[0, 0], [2, 2]]
    assert settings.override(threshold=0.1).decode(PairPlan(full)).pairs.tolist() == [[0, 0], [1, 1], [2, 2]]
