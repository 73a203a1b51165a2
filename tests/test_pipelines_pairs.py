"""Column-based targets, percent identity, pair sampling and family splits."""

import pathlib
import re

import numpy as np
import pytest

from pfamalign.pipelines import pairs as pp
from pfamalign.pipelines import splits
from pfamalign.pipelines import stockholm as st

DATA = pathlib.Path(__file__).parent / "data" / "pfam_seed"


def _family(rows, ids=None, key="PF99999.1"):
    ids = ids or [f"s{i}" for i in range(len(rows))]
    return st.Family(key=key, name="toy", source="mem", start_line=1, seq_ids=tuple(ids),
                     rows=tuple(rows))


def _reference_target(q_row, k_row, inserts_aligned):
    """Brute force: walk the columns, count residues, pair those sharing a column."""
    target, qi, kj = [], -1, -1
    for cq, ck in zip(q_row, k_row):
        q_res, k_res = cq.isalpha(), ck.isalpha()
        kj += k_res
        if q_res:
            qi += 1
            ok = k_res and (inserts_aligned or (cq.isupper() and ck.isupper()))
            target.append(kj if ok else -1)
    return target


def _reference_pid(q_row, k_row, inserts_aligned):
    al = idn = 0
    for cq, ck in zip(q_row, k_row):
        if cq.isalpha() and ck.isalpha() and (inserts_aligned or (cq.isupper() and ck.isupper())):
            al += 1
            idn += cq.upper() == ck.upper()
    return (100.0 * idn / al if al else 0.0), al


TOY = ["AC-DEfgH..IK", "ACqDE-gHkkIK", "-CQD.FGH..IR"]


@pytest.mark.parametrize("inserts_aligned", [False, True])
def test_targets_and_identity_match_brute_force(inserts_aligned):
    fam = _family(TOY)
    fa = pp.family_arrays(fam, inserts_aligned=inserts_aligned)
    assert fa.residues == ("ACDEFGHIK", "ACQDEGHKKIK", "CQDFGHIR")
    for q in range(3):
        for k in range(3):
            if q == k:
                continue
            t = pp.pair_target(fa, q, k)
            assert t.tolist() == _reference_target(TOY[q], TOY[k], inserts_aligned)
            pid, n_al = pp.pair_identity(fa, np.array([q]), np.array([k]))
            ref_pid, ref_al = _reference_pid(TOY[q], TOY[k], inserts_aligned)
            assert n_al[0] == ref_al == (t >= 0).sum()
            assert pid[0] == pytest.approx(ref_pid)


def test_insert_state_residues_are_never_aligned_by_default():
    fa = pp.family_arrays(_family(TOY))
    # row 0 "fg" (lower case) and row 1 "q", "g", "kk": inserts
    t01 = pp.pair_target(fa, 0, 1).tolist()
    assert t01 == [0, 1, 3, 4, -1, -1, 6, 9, 10]
    t10 = pp.pair_target(fa, 1, 0).tolist()
    assert t10 == [0, 1, -1, 2, 3, -1, 6, -1, -1, 7, 8]
    on = pp.family_arrays(_family(TOY), inserts_aligned=True)
    assert pp.pair_target(on, 0, 1).tolist() == [0, 1, 3, 4, -1, 5, 6, 9, 10]


def _check_pair_invariants(fam, rec):
    t = rec["target"].astype(int)
    assert len(t) == rec["q_len"] and rec["n_aligned"] == (t >= 0).sum()
    aligned = t[t >= 0]
    assert np.all(np.diff(aligned) > 0) and (aligned.size == 0 or aligned.max() < rec["k_len"])
    rows = dict(zip(fam.seq_ids, fam.rows))
    q_row, k_row = rows[rec["q_id"]], rows[rec["k_id"]]
    assert t.tolist() == _reference_target(q_row, k_row, False)
    assert rec["pid"] == pytest.approx(_reference_pid(q_row, k_row, False)[0])
    assert rec["q_seq"] == re.sub(r"[^A-Za-z]", "", q_row).upper()


def test_seed_with_insert_lowercase_pf02463():
    (fam,) = st.read_families(DATA / "PF02463.sto")
    cfg = pp.SamplingConfig(pairs_per_family=20, max_len=2000)
    out = pp.sample_family(fam, cfg, seed=0, split="train")
    assert len(out.pairs) == 20 and out.skip is None
    for rec in out.pairs:
        _check_pair_invariants(fam, rec)


def test_hmmalign_targets_use_match_columns_only(shared_pfam):
    for path in sorted((shared_pfam / "hmmalign_stockholm").glob("*.sto"))[:6]:
        (fam,) = st.read_families(path)
        out = pp.sample_family(fam, pp.SamplingConfig(pairs_per_family=10), seed=1, split="x")
        rows = dict(zip(fam.seq_ids, fam.rows))
        for rec in out.pairs:
            _check_pair_invariants(fam, rec)
            # aligned residues sit in RF match columns ('x'), on both sides
            q_row, k_row = rows[rec["q_id"]], rows[rec["k_id"]]
            q_cols = [c for c, ch in enumerate(q_row) if ch.isalpha()]
            k_cols = [c for c, ch in enumerate(k_row) if ch.isalpha()]
            for i, j in enumerate(rec["target"]):
                if j >= 0:
                    assert q_cols[i] == k_cols[j] and fam.rf[q_cols[i]] == "x"


def test_sampling_is_deterministic_distinct_and_bounded():
    (fam,) = st.read_families(DATA / "PF00041.sto")
    cfg = pp.SamplingConfig(pairs_per_family=30)
    a = pp.sample_family(fam, cfg, seed=3, split="train")
    b = pp.sample_family(fam, cfg, seed=3, split="train")
    c = pp.sample_family(fam, cfg, seed=4, split="train")
    key = lambda out: [(p["q_id"], p["k_id"]) for p in out.pairs]  # noqa: E731
    assert key(a) == key(b) != key(c)
    assert len(a.pairs) == 30
    unordered = {frozenset(k) for k in key(a)}
    assert len(unordered) == 30 and all(len(u) == 2 for u in unordered)
    assert set(a.seqs) == {p["q_hash"] for p in a.pairs} | {p["k_hash"] for p in a.pairs}
    # a family with 3 sequences has 3 unordered pairs
    (small,) = st.read_families(DATA / "PF02184.sto")
    out = pp.sample_family(small, cfg, seed=0, split="train")
    assert len(out.pairs) == 3


def test_a_family_of_fragments_still_gives_pairs_per_family():
    """27 rows cover the first 20 columns, 13 the last 20: a third of the pairs share no
    column. The first pool (twice pairs_per_family) holds 46 usable pairs; it is drawn again,
    larger, until it holds the 50 asked for."""
    rng = np.random.default_rng(0)
    half = lambda: "".join(rng.choice(list("ACDEFGHIKL"), size=20))
    rows = [half() + "-" * 20 for _ in range(27)] + ["-" * 20 + half() for _ in range(13)]
    cfg = pp.SamplingConfig(pairs_per_family=50)
    key = lambda out: [(p["q_id"], p["k_id"]) for p in out.pairs]  # noqa: E731
    out = pp.sample_family(_family(rows), cfg, seed=0, split="train")
    assert len(set(map(frozenset, key(out)))) == 50
    assert key(pp.sample_family(_family(rows), cfg, seed=0, split="train")) == key(out)  # deterministic


def test_large_family_uses_rejection_sampling():
    rng = np.random.default_rng(0)
    rows = ["".join(rng.choice(list("ACDE"), size=20)) for _ in range(400)]
    out = pp.sample_family(_family(rows), pp.SamplingConfig(pairs_per_family=50), seed=0,
                           split="train")
    assert len({frozenset((p["q_id"], p["k_id"])) for p in out.pairs}) == 50


def test_stratified_sampling_covers_identity_bins(shared_pfam):
    (fam,) = st.read_families(shared_pfam / "hmmalign_stockholm" / "PF00397.sto")
    plain = pp.sample_family(fam, pp.SamplingConfig(pairs_per_family=30), seed=0, split="x")
    strat = pp.sample_family(fam, pp.SamplingConfig(pairs_per_family=30, stratify_pid=True),
                             seed=0, split="x")
    bins = lambda out: np.bincount(np.digitize([p["pid"] for p in out.pairs], [30, 50]),  # noqa
                                   minlength=3)
    b_plain, b_strat = bins(plain), bins(strat)
    assert b_strat.sum() == 30
    assert b_strat.min() >= min(10, b_plain.min()) and b_strat.min() > 0
    assert b_strat.std() <= b_plain.std()


def test_length_limits_and_small_families_are_counted():
    (fam,) = st.read_families(DATA / "PF02162.sto")  # 7 sequences of 5 residues
    out = pp.sample_family(fam, pp.SamplingConfig(), seed=0, split="train")
    assert out.skip == "fewer than two sequences within the length limits"
    assert out.seq_skips == {"shorter than min_len=10": 7}
    out = pp.sample_family(fam, pp.SamplingConfig(min_len=5), seed=0, split="train")
    assert out.skip is None and len(out.pairs) == 21
    one = _family(["ACDEFGHIKL"])
    assert pp.sample_family(one, pp.SamplingConfig(), seed=0, split="x").skip == \
        "fewer than two sequences"
    out = pp.sample_family(_family(["ACDEFGHIKL------", "ACDEFGHIKLMNPQRS", "-" * 16,
                                    "ACDEFGHIKL------"]), pp.SamplingConfig(max_len=12),
                           seed=0, split="x", max_residues=1022)
    assert out.seq_skips == {"longer than max_len=12": 1, "empty (all gaps)": 1}
    assert len(out.pairs) == 1


def test_nonstandard_residues_are_kept_and_compared_by_letter():
    rows = ["ACXBZUOJ", "ACXBZUOJ", "ACDEFGHI"]
    fam = _family(rows)
    out = pp.sample_family(fam, pp.SamplingConfig(min_len=2), seed=0, split="x")
    seqs = {p["q_seq"] for p in out.pairs} | {p["k_seq"] for p in out.pairs}
    assert "ACXBZUOJ" in seqs
    fa = pp.family_arrays(fam)
    pid, n = pp.pair_identity(fa, np.array([0, 0]), np.array([1, 2]))
    assert pid.tolist() == [100.0, 25.0] and n.tolist() == [8, 8]


def test_pair_identity_in_batches_is_the_same_as_at_once():
    """Pairs scored a batch at a time (a pool of every pair of a large family: its [P, C] masks
    at once took 2.5 GB for 2,000 rows of 300 columns) give the one-batch figures."""
    rng = np.random.default_rng(0)
    rows = ["".join(rng.choice(list("ACDEFGHIKL-"), 40)) for _ in range(30)]
    fa = pp.family_arrays(_family(rows))
    q, k = np.triu_indices(len(rows), k=1)
    whole = pp.pair_identity(fa, q, k, batch=len(q))
    for batch in (1, 7, 100):
        got = pp.pair_identity(fa, q, k, batch=batch)
        assert all(np.array_equal(a, b) for a, b in zip(got, whole)), batch
    assert whole[1].min() < whole[1].max()  # the rows differ: the check can fail


def test_config_validation():
    with pytest.raises(ValueError, match="pairs_per_family"):
        pp.SamplingConfig(pairs_per_family=0)
    with pytest.raises(ValueError, match="min_len"):
        pp.SamplingConfig(min_len=20, max_len=10)
    for bins in ((30.0, 150.0), (-5.0, 50.0), (float("nan"),)):
        with pytest.raises(ValueError, match=r"percent identities in \[0, 100\]"):
            pp.SamplingConfig(pid_bins=bins)
    assert pp.SamplingConfig(pid_bins=(0.0, 100.0)).pid_bins == (0.0, 100.0)


# ------------------------------------------------------------------------------------------
# Splits
# ------------------------------------------------------------------------------------------

def test_split_ignores_version_and_is_deterministic():
    for acc in ("PF00041", "PF00076", "PF00004"):
        s = splits.assign_split(f"{acc}.20", seed=0)
        assert s == splits.assign_split(f"{acc}.24", seed=0) == splits.assign_split(acc, seed=0)
    keys = [f"PF{i:05d}" for i in range(3000)]
    a = [splits.assign_split(k, seed=0) for k in keys]
    assert a == [splits.assign_split(k, seed=0) for k in keys]
    b = [splits.assign_split(k, seed=1) for k in keys]
    assert a != b
    frac = {s: a.count(s) / len(a) for s in splits.SPLITS}
    assert abs(frac["train"] - 0.8) < 0.03 and abs(frac["val"] - 0.1) < 0.02
    # adding families never moves others: the assignment is per family
    more = [splits.assign_split(k, seed=0) for k in keys + [f"PF9{i:04d}" for i in range(100)]]
    assert more[:3000] == a


def test_folds_partition_families_and_keep_versions_together():
    keys = [f"PF{i:05d}" for i in range(2000)]
    n = 5
    by_fold = [[splits.assign_fold_split(k, fold=f, n_folds=n, seed=0) for k in keys] for f in range(n)]
    for i, key in enumerate(keys):  # test in exactly one fold: the fold of its split fraction
        tested = [f for f in range(n) if by_fold[f][i] == "test"]
        u = splits.split_fraction_of(key, 0)
        assert tested == [int(u * n)] and tested[0] / n <= u < (tested[0] + 1) / n
    for f in range(n):
        counts = {s: by_fold[f].count(s) / len(keys) for s in splits.SPLITS}
        assert abs(counts["test"] - 1 / n) < 0.03
        assert abs(counts["val"] - splits.FOLD_VAL_FRACTION * (1 - 1 / n)) < 0.025
    # the validation slices differ between folds (the second hash is salted with the fold)
    assert [s == "val" for s in by_fold[0]] != [s == "val" for s in by_fold[1]]
    # seed and hmmalign versions of one family land on the same side of every fold
    for acc in ("PF00041", "PF00076"):
        for f in range(n):
            assert (splits.assign_fold_split(f"{acc}.20", fold=f, n_folds=n)
                    == splits.assign_fold_split(f"{acc}.24", fold=f, n_folds=n)
                    == splits.assign_fold_split(acc, fold=f, n_folds=n))
    assert by_fold[0] == [splits.assign_fold_split(k, fold=0, n_folds=n, seed=0) for k in keys]
    assert by_fold[0] != [splits.assign_fold_split(k, fold=0, n_folds=n, seed=1) for k in keys]
    for fold, n_folds in ((5, 5), (-1, 5), (0, 1)):
        with pytest.raises(ValueError, match="K/N"):
            splits.assign_fold_split("PF00001", fold=fold, n_folds=n_folds)


def test_split_fraction_validation():
    with pytest.raises(ValueError, match="summing to 1"):
        splits.assign_split("PF00001", fractions=(0.5, 0.1, 0.1))
    assert splits.assign_split("PF00001", fractions=(0.0, 0.0, 1.0)) == "test"


def test_sampling_limits_are_inclusive_and_tilde_is_a_gap():
    """A sequence exactly ``max_len`` (or ``min_len``) long is used and one residue more (or
    fewer) is not; a pair with exactly ``min_aligned`` aligned residues is kept; ``~`` is a gap
    (the Stockholm reader takes it as one), never a residue."""
    ten = _family(["ACDEFGHIKL", "ACDEFGHIKM", "ACDEFGHIKN"])
    out = pp.sample_family(ten, pp.SamplingConfig(pairs_per_family=5, min_len=10, max_len=10), seed=0, split="x")
    assert out.skip is None and len(out.pairs) == 3
    for cfg in (pp.SamplingConfig(min_len=1, max_len=9), pp.SamplingConfig(min_len=11, max_len=20)):
        assert pp.sample_family(ten, cfg, seed=0, split="x").skip is not None
    one_column = _family(["ACDEFGHIKL---------", "---------LMNPQRSTVW"])  # the L column only
    for min_aligned, pairs in ((1, 1), (2, 0)):
        cfg = pp.SamplingConfig(min_len=1, min_aligned=min_aligned)
        assert len(pp.sample_family(one_column, cfg, seed=0, split="x").pairs) == pairs
    tilde = pp.family_arrays(_family(["ACD~~EFGHIK", "ACDLLEFGHIK"]))
    assert tilde.residues[0] == "ACDEFGHIK" and not tilde.is_res[0, 3:5].any()
