"""The search prefilter (``pfamalign.alignment.prefilter``): the numba kernels of both stages
against their references on real Pfam sequences (the banded gapped stage also against
Biopython's Smith-Waterman), the scores' bounds, and ``candidates``."""

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
        score, diagonal = prefilter.hits(query, database)
        expected = [prefilter.reference_hit(query, s) for s in sequences]
        assert list(zip(score.tolist(), diagonal.tolist())) == expected


@pytest.mark.parametrize("band", [0, 3, prefilter.BAND])
def test_gapped_kernel_equals_the_banded_reference(sequences, band):
    """Around each subject's best ungapped diagonal and around arbitrary ones (the band may
    leave the matrix on either side)."""
    rng = np.random.default_rng(band)
    database = prefilter.Database.of(sequences)
    subjects = np.arange(len(sequences))
    for query in sequences[1:20:3] + sequences[-8:]:
        _, best = prefilter.hits(query, database)
        for diagonals in (best, rng.integers(-60, 60, len(sequences))):
            fast = prefilter.gapped_scores(query, database, subjects, diagonals, band)
            expected = [prefilter.reference_gapped(query, s, int(d), band) for s, d in zip(sequences, diagonals)]
            np.testing.assert_array_equal(fast, expected)


def test_a_band_wider_than_the_matrix_is_smith_waterman(sequences):
    """The gapped stage with a band that holds every cell is plain Smith-Waterman with BLAST's
    gaps: Biopython's local score (a gap of g residues: open 12 for the first, 1 each after,
    i.e. 11 + g) on the 20 standard letters."""
    from Bio.Align import PairwiseAligner, substitution_matrices

    aligner = PairwiseAligner(mode="local", substitution_matrix=substitution_matrices.load("BLOSUM62"),
                              open_gap_score=-(prefilter.GAP_OPEN + prefilter.GAP_EXTEND),
                              extend_gap_score=-prefilter.GAP_EXTEND)
    standard = [s for s in sequences if not set(s) - set("ARNDCQEGHILKMFPSTWYV")]
    database = prefilter.Database.of(standard)
    for query in standard[:6]:
        fast = prefilter.gapped_scores(query, database, np.arange(len(standard)), np.zeros(len(standard)), 2000)
        np.testing.assert_array_equal(fast, [aligner.score(query, s) for s in standard])


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
            score, _ = prefilter.reference_hit(a, b)
            assert 0 <= score <= bound
            exact += score == bound
    assert exact >= 20  # of 36 pairs: the seeds reach the best segment where it is strong
    assert prefilter.reference_hit("MK", "MK") == (0, 0)


def test_a_sequence_against_itself_scores_its_whole_diagonal(sequences):
    """Every residue of the identity diagonal scores positive (BLOSUM62's diagonal), so the
    extension of its first word hit runs from end to end."""
    for seq in sequences[:10]:
        if set(seq) - set("ARNDCQEGHILKMFPSTWYV"):
            continue
        whole = int(np.trace(substitution_scores(seq, seq)))
        assert prefilter.reference_hit(seq, seq) == (whole, 0)
        assert prefilter.hits(seq, prefilter.Database.of([seq]))[0][0] == whole


def test_relatives_rank_above_shuffles():
    """On real families the prefilter ranks a query's relatives above shuffled sequences of
    the same composition (what it is for): ROC1 per query, averaged."""
    seqs, families = _pfam_sequences(per_family=5, labelled=True)
    rng = np.random.default_rng(1)
    shuffles = ["".join(rng.permutation(list(s))) for s in seqs for _ in range(4)]
    database = prefilter.Database.of(seqs + shuffles)
    roc1 = []
    for q, query in enumerate(seqs):
        score, _ = prefilter.hits(query, database)
        relatives = [s for s in range(len(seqs)) if families[s] == families[q] and s != q]
        roc1.append(np.mean(score[relatives] > score[len(seqs):].max()))
    assert np.mean(roc1) > 0.8, np.mean(roc1)


def test_candidates_follow_the_two_stages(sequences):
    """``candidates`` is the documented rule, recomputed from the references: the first
    stage's ``POOL * keep`` best (ungapped score less ln(length) / LAMBDA), of those the
    ``keep`` best by banded gapped score less ln(length) / GAPPED_LAMBDA (ties: the earlier
    subject), the excluded subject never among them."""
    database = prefilter.Database.of(sequences)
    log_length = np.log(np.maximum([len(s) for s in sequences], 1))
    for q in (0, 5, 17):
        query = sequences[q]
        first = [prefilter.reference_hit(query, s) for s in sequences]
        for keep in (1, 3, 8, len(sequences)):
            for exclude in (None, q):
                rank = np.array([h for h, _ in first]) - log_length / prefilter.LAMBDA
                order = [n for n in np.argsort(-rank, kind="stable") if n != exclude]
                pool = order[:prefilter.POOL * keep]
                second = np.array([prefilter.reference_gapped(query, sequences[n], first[n][1]) for n in pool])
                rank = second - log_length[pool] / prefilter.GAPPED_LAMBDA
                expected = sorted(pool if len(pool) <= keep else
                                  [pool[i] for i in np.argsort(-rank, kind="stable")[:keep]])
                got = prefilter.candidates(query, database, keep, exclude=exclude)
                assert got.tolist() == expected, (q, keep, exclude)


def test_candidates_keep_the_best_ties_by_position_and_leave_out_the_excluded():
    """Equal subjects tie: the earlier one is kept; the excluded one never is."""
    query = "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE"
    subjects = ["GGGGGGGGGG", query, "PPPPPPPPPP", query[:20], query, "WWWW"]
    database = prefilter.Database.of(subjects)
    score, _ = prefilter.hits(query, database)
    assert score[1] == score[4] > score[3] > 0 and score[[0, 2, 5]].max() == 0
    np.testing.assert_array_equal(prefilter.candidates(query, database, 1), [1])
    np.testing.assert_array_equal(prefilter.candidates(query, database, 2), [1, 4])
    np.testing.assert_array_equal(prefilter.candidates(query, database, 2, exclude=1), [3, 4])
    assert len(prefilter.candidates(query, database, 10, exclude=0)) == 5
    assert len(prefilter.candidates(query, prefilter.Database.of([]), 3)) == 0
