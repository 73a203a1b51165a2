"""The search prefilter (``pfamalign.alignment.prefilter``): the numba scan against the
per-diagonal reference on real Pfam sequences, the score's bounds, and ``candidates``."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from pfamalign.alignment import prefilter
from pfamalign.residues import substitution_scores

SEED = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"


def _pfam_sequences(per_family: int = 4, *, labelled: bool = False):
    """The first ``per_family`` sequences of each fixture family (``labelled``: and their
    family's number)."""
    from pfamalign.pipelines.pairs import family_arrays
    from pfamalign.pipelines.stockholm import read_families

    seqs, labels = [], []
    for path in sorted(SEED.glob("*.sto")):
        for family in read_families([str(path)]):
            rows = family_arrays(family).residues[:per_family]
            seqs += rows
            labels += [len(set(labels))] * len(rows)
    return (seqs, np.array(labels)) if labelled else seqs


@pytest.fixture(scope="module")
def sequences() -> list[str]:
    rng = np.random.default_rng(0)
    odd = ["".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWYXBZUO"), size=n)) for n in (1, 2, 3, 5, 40, 90)]
    return _pfam_sequences() + odd + ["XXXXXXXX", "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE"]


def test_scan_equals_the_per_diagonal_reference(sequences):
    database = prefilter.Database.of(sequences)
    for query in sequences[::2]:
        fast = prefilter.scores(query, database)
        expected = [prefilter.reference_score(query, s) for s in sequences]
        np.testing.assert_array_equal(fast, expected)


def _best_ungapped_segment(a: str, b: str) -> int:
    """The best-scoring ungapped segment over all diagonals (Kadane on each)."""
    sub = substitution_scores(a, b)
    best = 0
    for d in range(-(len(a) - 1), len(b)):
        run = 0
        for x in np.diagonal(sub, d):
            run = max(0, run + int(x))
            best = max(best, run)
    return best


def test_score_is_at_most_the_best_ungapped_segment(sequences):
    """An extension scores one ungapped segment, so never more than the best of them (and
    often exactly it); zero for sequences shorter than a word."""
    exact = 0
    for a in sequences[:12:2]:
        for b in sequences[1:12:2]:
            bound = _best_ungapped_segment(a, b)
            assert 0 <= prefilter.reference_score(a, b) <= bound
            exact += prefilter.reference_score(a, b) == bound
    assert exact >= 20  # of 36 pairs: the seeds reach the best segment where it is strong
    assert prefilter.reference_score("MK", "MK") == 0


def test_a_sequence_against_itself_scores_its_whole_diagonal(sequences):
    """Every residue of the identity diagonal scores positive (BLOSUM62's diagonal), so the
    extension of its first word hit runs from end to end."""
    for seq in sequences[:10]:
        if set(seq) - set("ARNDCQEGHILKMFPSTWYV"):
            continue
        whole = int(np.trace(substitution_scores(seq, seq)))
        assert prefilter.reference_score(seq, seq) == whole
        assert prefilter.scores(seq, prefilter.Database.of([seq]))[0] == whole


def test_relatives_rank_above_shuffles():
    """On real families the prefilter ranks a query's relatives above shuffled sequences of
    the same composition (what it is for): ROC1 per query, averaged."""
    seqs, families = _pfam_sequences(per_family=5, labelled=True)
    rng = np.random.default_rng(1)
    shuffles = ["".join(rng.permutation(list(s))) for s in seqs for _ in range(4)]
    database = prefilter.Database.of(seqs + shuffles)
    roc1 = []
    for q, query in enumerate(seqs):
        score = prefilter.scores(query, database)
        relatives = [s for s in range(len(seqs)) if families[s] == families[q] and s != q]
        roc1.append(np.mean(score[relatives] > score[len(seqs):].max()))
    assert np.mean(roc1) > 0.8, np.mean(roc1)


def test_candidates_keep_the_best_ties_by_position_and_leave_out_the_excluded():
    """Ranked by score less ln(length) / LAMBDA: among equal scores the shorter subject first."""
    query = "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE"
    subjects = ["GGGGGGGGGG", query, "PPPPPPPPPP", query[:20], query, "WWWW"]
    database = prefilter.Database.of(subjects)
    score = prefilter.scores(query, database)
    assert score[1] == score[4] > score[3] > 0 and score[[0, 2, 5]].max() == 0
    np.testing.assert_array_equal(prefilter.candidates(query, database, 1), [1])
    np.testing.assert_array_equal(prefilter.candidates(query, database, 2), [1, 4])
    np.testing.assert_array_equal(prefilter.candidates(query, database, 2, exclude=1), [3, 4])
    # then the 4-residue subject (no hit), then the first of the two 10-residue ones
    np.testing.assert_array_equal(prefilter.candidates(query, database, 3, exclude=1), [3, 4, 5])
    np.testing.assert_array_equal(prefilter.candidates(query, database, 4, exclude=1), [0, 3, 4, 5])
    assert len(prefilter.candidates(query, database, 10, exclude=0)) == 5
    assert len(prefilter.candidates(query, prefilter.Database.of([]), 3)) == 0
