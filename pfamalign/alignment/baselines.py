"""Baseline aligners scored with the same protocol as the model (docs/design.md §5).

* Needleman-Wunsch (global) and Smith-Waterman (local) with BLOSUM62 and affine gaps through
  Biopython's ``PairwiseAligner``. Gap convention: a gap of length n costs
  ``gap_open + (n - 1) * gap_extend`` (EMBOSS / Biopython style), so the defaults 11 / 1 are
  ``open_gap_score=-11, extend_gap_score=-1``. Note that BLAST's "existence 11, extension 1"
  means ``11 + n`` (Biopython's ``scoring="blastp"`` preset: open -12); pass ``gap_open=12``
  for that convention.
* The diagonal reference: query row i -> ``round(i (Lk - 1) / (Lq - 1))``.

Residues are validated and mapped for scoring as described in ``pfamalign.residues`` (``U->C``,
``O->K``, ``J->X``; lowercase accepted).
"""

from __future__ import annotations

import numpy as np

from pfamalign.alignment.pairs import PairAlignment, diagonal_target
from pfamalign.residues import blosum62, scoring_sequence


def _aligner(mode: str, gap_open: float, gap_extend: float, free_end_gaps: bool):
    from Bio.Align import PairwiseAligner

    if gap_open < 0 or gap_extend < 0:
        raise ValueError(f"gap costs must be >= 0, got open {gap_open}, extend {gap_extend}")
    aligner = PairwiseAligner(mode=mode, substitution_matrix=blosum62(),
                              open_gap_score=-float(gap_open),
                              extend_gap_score=-float(gap_extend))
    if free_end_gaps:
        aligner.end_gap_score = 0.0
    return aligner


def _biopython_align(seq_a: str, seq_b: str, *, mode: str, gap_open: float, gap_extend: float,
                     free_end_gaps: bool = False) -> PairAlignment:
    a = scoring_sequence(seq_a, name="seq_a")
    b = scoring_sequence(seq_b, name="seq_b")
    aligner = _aligner(mode, gap_open, gap_extend, free_end_gaps)
    aln = next(iter(aligner.align(a, b)), None)  # one optimal alignment (Biopython's first)
    if aln is None:  # local mode with no positive-scoring segment
        return PairAlignment(pairs=np.zeros((0, 2), np.int64), confidence=None, score=0.0,
                             query_length=len(a), key_length=len(b))
    idx = np.asarray(aln.indices)  # [2, columns]; -1 marks a gap in that row
    both = (idx[0] >= 0) & (idx[1] >= 0)
    pairs = idx[:, both].T.astype(np.int64)  # [n, 2]
    return PairAlignment(pairs=pairs, confidence=None, score=float(aln.score),
                         query_length=len(a), key_length=len(b))


def needleman_wunsch(seq_a: str, seq_b: str, *, gap_open: float = 11.0,
                     gap_extend: float = 1.0, free_end_gaps: bool = False) -> PairAlignment:
    """Global BLOSUM62 alignment (end gaps penalized like internal ones unless
    ``free_end_gaps``); ``score`` is the alignment score, ``confidence`` is None."""
    return _biopython_align(seq_a, seq_b, mode="global", gap_open=gap_open,
                            gap_extend=gap_extend, free_end_gaps=free_end_gaps)


def smith_waterman(seq_a: str, seq_b: str, *, gap_open: float = 11.0,
                   gap_extend: float = 1.0) -> PairAlignment:
    """Local BLOSUM62 alignment: pairs of the best-scoring local segment only (empty when no
    pair scores positive)."""
    return _biopython_align(seq_a, seq_b, mode="local", gap_open=gap_open,
                            gap_extend=gap_extend)


def diagonal_pairs(query_length: int, key_length: int) -> np.ndarray:
    """Diagonal reference as pairs ``[Lq, 2]``: ``(i, round(i (Lk-1)/(Lq-1)))`` for every row.

    One pair per query row, as docs/design.md §5 defines it. When ``Lq > Lk`` rows share keys, so the
    result is a pair *set* (fine for the pair metrics) but not a proper alignment.
    """
    target = diagonal_target(query_length, key_length)
    return np.stack([np.arange(query_length), target], axis=1).astype(np.int64)


BASELINES = {"needleman_wunsch": needleman_wunsch, "smith_waterman": smith_waterman}
