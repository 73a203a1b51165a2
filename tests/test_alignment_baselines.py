"""Needleman-Wunsch / Smith-Waterman baselines against an independent Gotoh DP, the gap
convention, residue handling, the diagonal reference, and the external aligners (ProbCons,
MUSCLE): their aligned FASTA read back into pairs, the missing-binary path, and a real run
when installed."""

import shutil

import numpy as np
import pytest
from Bio.Align import substitution_matrices

from pfamalign import evaluation
from pfamalign.alignment.baselines import (EXTERNAL_ALIGNERS, ExternalAlignerError,
                                           aligned_fasta_pairs, diagonal_pairs, external_align,
                                           needleman_wunsch, smith_waterman)
from pfamalign.residues import normalize_sequence, scoring_sequence

B62 = substitution_matrices.load("BLOSUM62")
AA = "ACDEFGHIKLMNPQRSTVWY"
OPEN, EXTEND = 11.0, 1.0


def _gap(n):
    return OPEN + (n - 1) * EXTEND if n > 0 else 0.0


def _gotoh(a, b, local):
    """Best affine-gap score (gap of length n costs OPEN + (n - 1) EXTEND), O(n m) loops."""
    n, m = len(a), len(b)
    neg = -1e18
    M = np.full((n + 1, m + 1), neg)  # ends in a pair
    X = np.full((n + 1, m + 1), neg)  # ends with a[i] opposite a gap
    Y = np.full((n + 1, m + 1), neg)  # ends with b[j] opposite a gap
    M[0, 0] = 0.0
    for i in range(1, n + 1):
        X[i, 0] = 0.0 if local else -_gap(i)
    for j in range(1, m + 1):
        Y[0, j] = 0.0 if local else -_gap(j)
    best = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            prev = max(M[i - 1, j - 1], X[i - 1, j - 1], Y[i - 1, j - 1])
            if local:
                prev = max(prev, 0.0)
            M[i, j] = prev + B62[a[i - 1], b[j - 1]]
            X[i, j] = max(M[i - 1, j] - OPEN, X[i - 1, j] - EXTEND, Y[i - 1, j] - OPEN)
            Y[i, j] = max(M[i, j - 1] - OPEN, Y[i, j - 1] - EXTEND, X[i, j - 1] - OPEN)
            best = max(best, M[i, j])
    return best if local else max(M[n, m], X[n, m], Y[n, m])


def _score_of_pairs(a, b, pairs, local):
    """Affine-gap score of the full alignment the pairs define (flanks free when local)."""
    score = sum(B62[a[i], b[j]] for i, j in pairs)
    bounds = [(-1, -1)] + [tuple(p) for p in pairs] + [(len(a), len(b))]
    for k, ((i0, j0), (i1, j1)) in enumerate(zip(bounds[:-1], bounds[1:])):
        if local and (k == 0 or k == len(bounds) - 2):
            continue
        score -= _gap(i1 - i0 - 1) + _gap(j1 - j0 - 1)
    return score


def _random_seq(rng, n):
    return "".join(rng.choice(list(AA), n))


@pytest.mark.parametrize("seed", range(12))
def test_needleman_wunsch_is_optimal_and_consistent(seed):
    rng = np.random.default_rng(seed)
    a = _random_seq(rng, int(rng.integers(1, 20)))
    b = _random_seq(rng, int(rng.integers(1, 20)))
    if seed % 2:  # related sequences: mutate a copy with an indel
        b = a[: len(a) // 2] + _random_seq(rng, 3) + a[len(a) // 2 + 2:]
    aln = needleman_wunsch(a, b)
    assert aln.confidence is None
    assert (aln.query_length, aln.key_length) == (len(a), len(b))
    assert aln.score == pytest.approx(_gotoh(a, b, local=False))
    assert _score_of_pairs(a, b, aln.pairs.tolist(), local=False) == pytest.approx(aln.score)


@pytest.mark.parametrize("seed", range(12))
def test_smith_waterman_is_optimal_and_consistent(seed):
    rng = np.random.default_rng(1000 + seed)
    core = _random_seq(rng, 12)
    a = _random_seq(rng, int(rng.integers(0, 10))) + core + _random_seq(rng, 5)
    b = _random_seq(rng, int(rng.integers(0, 10))) + core[:5] + core[6:] + _random_seq(rng, 3)
    aln = smith_waterman(a, b)
    assert aln.score == pytest.approx(_gotoh(a, b, local=True))
    assert _score_of_pairs(a, b, aln.pairs.tolist(), local=True) == pytest.approx(aln.score)


def test_gap_convention_open_11_extend_1():
    # WWWW vs WW: two W-W pairs (11 each) and one gap of length 2 costing 11 + 1.
    assert needleman_wunsch("WWWW", "WW").score == pytest.approx(2 * 11 - 12)
    # BLAST's 11 + n convention is gap_open=12 here
    assert needleman_wunsch("WWWW", "WW", gap_open=12).score == pytest.approx(2 * 11 - 13)
    # free end gaps: the two unpaired W are free
    assert needleman_wunsch("WWWW", "WW", free_end_gaps=True).score == pytest.approx(22)


def test_local_finds_embedded_segment_and_empty_case():
    a = "PPPPPMKWVTFISLLFLFSSAYSPPPP"
    b = "GGGMKWVTFISLLFLFSSAYSGG"
    aln = smith_waterman(a, b)
    start_a, start_b = a.index("MKW"), b.index("MKW")
    expected = [[start_a + k, start_b + k] for k in range(len("MKWVTFISLLFLFSSAYS"))]
    assert aln.pairs.tolist() == expected
    empty = smith_waterman("WWW", "PPP")  # W-P scores -4: no positive segment
    assert empty.pairs.shape == (0, 2) and empty.score == 0.0


def test_residue_mapping_and_validation():
    assert normalize_sequence("mkvU") == "MKVU"
    assert scoring_sequence("UOJ") == "CKX"
    assert needleman_wunsch("U", "C").score == B62["C", "C"]  # U scored as C
    assert needleman_wunsch("O", "K").score == B62["K", "K"]  # O scored as K
    assert needleman_wunsch("J", "L").score == B62["X", "L"]  # J scored as X
    assert needleman_wunsch("bzx", "BZX").score == B62["B", "B"] + B62["Z", "Z"] + B62["X", "X"]
    for bad, what in [("MK-V", "'-'"), ("MK*", r"'\*'"), ("MK V", "' '"), ("MK1", "'1'")]:
        with pytest.raises(ValueError, match=what):
            needleman_wunsch(bad, "MKV")
    with pytest.raises(ValueError, match="seq_b is empty"):
        smith_waterman("MKV", "")
    with pytest.raises(ValueError, match="gap costs"):
        needleman_wunsch("MKV", "MKV", gap_open=-1)


def test_diagonal_pairs():
    # Lq=3, Lk=5: i * 4 / 2 = 0, 2, 4
    assert diagonal_pairs(3, 5).tolist() == [[0, 0], [1, 2], [2, 4]]
    # Lq=5, Lk=3: i * 2 / 4 = 0, .5, 1, 1.5, 2 -> half to even: 0, 0, 1, 2, 2
    assert diagonal_pairs(5, 3)[:, 1].tolist() == [0, 0, 1, 2, 2]
    assert diagonal_pairs(1, 7).tolist() == [[0, 0]]
    assert diagonal_pairs(4, 4)[:, 1].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        diagonal_pairs(0, 3)


# ---- external aligners ------------------------------------------------------------------------


def test_aligned_fasta_pairs_of_a_hand_made_alignment():
    # columns:  0 1 2 3 4 5 6 7
    #   q:      M K - V L . A W     q residues: M0 K1 V2 L3 A4 W5
    #   k:      M - R V - G A W     k residues: M0 R1 V2 G3 A4 W5
    text = ">k some description\nM-RV\n-GAW\n>q\nMK-VL.AW\n"
    pairs = aligned_fasta_pairs(text)
    assert pairs.dtype == np.int64
    assert pairs.tolist() == [[0, 0], [2, 2], [4, 4], [5, 5]]
    assert aligned_fasta_pairs(text, query="k", key="q").tolist() == [[0, 0], [2, 2], [4, 4], [5, 5]]
    assert aligned_fasta_pairs(">q\nAB-\n>k\n--C\n").shape == (0, 2)
    for bad, match in [(">q\nAB\n>k\nA\n", "differ in length"), (">q\nAB\n", "no row 'k'"),
                       ("AB\n>q\nAB\n", "header"), (">q\nA\n>q\nA\n", "twice")]:
        with pytest.raises(ExternalAlignerError, match=match):
            aligned_fasta_pairs(bad)


def test_missing_external_aligner_is_named_and_evaluation_goes_on(monkeypatch):
    monkeypatch.setenv("PATH", "")
    for name, tool in EXTERNAL_ALIGNERS.items():
        assert f"Debian package '{tool.package}'" in tool.missing()
        with pytest.raises(ExternalAlignerError, match=f"apt install {tool.package}"):
            external_align(name, "MKV", "MKV")
    record = {"q_seq": "MKVLAAG", "k_seq": "MKVLSAG", "target": np.arange(7), "pid": 71.0,
              "family": "PF00001"}
    ev = evaluation.evaluate([record], baselines=("nw", "probcons", "muscle"))
    assert ev.methods == ["nw"] and set(ev.skipped) == {"probcons", "muscle"}
    summary = ev.summary(n_boot=0)
    assert list(summary["methods"]) == ["nw"]
    assert "apt install muscle" in summary["skipped_baselines"]["muscle"]
    assert summary["methods"]["nw"]["prf"]["all"]["micro"]["f1"]["value"] == 1.0


@pytest.mark.parametrize("name", sorted(EXTERNAL_ALIGNERS))
def test_external_aligner_runs_when_installed(name):
    if shutil.which(EXTERNAL_ALIGNERS[name].binary) is None:
        pytest.skip(f"{name} is not installed")
    a, b = "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE", "MKVLSAGIVGLAQSPDRWKNLSTGYFAE"
    aln = external_align(name, a, b)
    assert (aln.query_length, aln.key_length) == (len(a), len(b))
    pairs = aln.pairs
    assert (np.diff(pairs, axis=0) > 0).all()  # a proper alignment: monotone in both sequences
    assert pairs[:, 0].max() < len(a) and pairs[:, 1].max() < len(b)
    # the shared prefix and suffix are aligned residue to residue
    assert [[k, k] for k in range(11)] == pairs[:11].tolist()
    assert pairs[-2:].tolist() == [[len(a) - 2, len(b) - 2], [len(a) - 1, len(b) - 1]]
    same = external_align(name, "ACDEFGHIKLMNPQRSTVWY", "ACDEFGHIKLMNPQRSTVWY").pairs
    assert same.tolist() == [[k, k] for k in range(20)]
    record = {"q_seq": a, "k_seq": b, "target": np.full(len(a), -1), "pid": 80.0}
    record["target"][pairs[:, 0]] = pairs[:, 1]  # its own alignment as the reference: F1 1
    summary = evaluation.evaluate([record], baselines=(name,)).summary(n_boot=0)
    assert summary["methods"][name]["prf"]["all"]["micro"]["f1"]["value"] == 1.0
    assert summary["methods"][name]["seconds"] > 0
