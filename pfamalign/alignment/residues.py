"""Protein residues: input validation, the BLOSUM62 alphabet and the per-pair match symbols.

Residue policy (one place, used by the baselines and the output formats):

* Input is an unaligned protein sequence of letters. Lowercase is accepted and upper-cased
  (Pfam writes insert-state residues in lowercase). Anything else (gap characters ``-`` ``.``,
  the stop ``*``, digits, whitespace) is rejected with a ``ValueError``: strip them upstream.
* All 26 letters are IUPAC protein codes. BLOSUM62 covers the 20 standard residues plus
  ``B`` (D/N), ``Z`` (E/Q) and ``X`` (unknown). The three it lacks are mapped for *scoring
  only*: ``U`` (selenocysteine) -> ``C``, ``O`` (pyrrolysine) -> ``K``, ``J`` (I/L) -> ``X``.
  Output formats always print the residues as given (upper-cased), never the mapped letters.
"""

from __future__ import annotations

import functools
import re

import numpy as np

BLOSUM62_ALPHABET = "ARNDCQEGHILKMFPSTWYVBZX"  # the letters of Biopython's BLOSUM62 (minus '*')
SCORING_MAP = {"U": "C", "O": "K", "J": "X"}  # residues BLOSUM62 lacks -> their stand-ins
_LETTERS = re.compile(r"[A-Za-z]+")


def normalize_sequence(seq: str, *, name: str = "sequence") -> str:
    """Returns ``seq`` upper-cased after checking it is a non-empty string of letters.

    Raises ``ValueError`` naming the first offending character and its 0-based position.
    """
    if not isinstance(seq, str):
        raise ValueError(f"{name} must be a str, got {type(seq).__name__}")
    if not seq:
        raise ValueError(f"{name} is empty")
    if not _LETTERS.fullmatch(seq):
        pos = next(i for i, ch in enumerate(seq) if not ch.isascii() or not ch.isalpha())
        raise ValueError(
            f"{name} has a non-protein character {seq[pos]!r} at position {pos} "
            "(expected letters only: no gaps, stops, digits or whitespace)")
    return seq.upper()


def scoring_sequence(seq: str, *, name: str = "sequence") -> str:
    """The sequence as BLOSUM62 scores it: normalized, then ``U->C``, ``O->K``, ``J->X``."""
    seq = normalize_sequence(seq, name=name)
    return seq.translate(str.maketrans(SCORING_MAP))


@functools.lru_cache(maxsize=None)
def blosum62():
    """Biopython's BLOSUM62 ``substitution_matrices.Array`` (loaded once)."""
    from Bio.Align import substitution_matrices

    return substitution_matrices.load("BLOSUM62")


@functools.lru_cache(maxsize=None)
def blosum62_table() -> np.ndarray:
    """BLOSUM62 as a dense ``[128, 128]`` int table indexed by ASCII code (0 off-alphabet)."""
    matrix = blosum62()
    table = np.zeros((128, 128), dtype=np.int64)
    for a in BLOSUM62_ALPHABET:
        for b in BLOSUM62_ALPHABET:
            table[ord(a), ord(b)] = int(matrix[a, b])
    return table


def substitution_scores(seq_a: str, seq_b: str) -> np.ndarray:
    """BLOSUM62 score of every residue pair ``[len(seq_a), len(seq_b)]``."""
    a = np.frombuffer(scoring_sequence(seq_a, name="seq_a").encode("ascii"), np.uint8)
    b = np.frombuffer(scoring_sequence(seq_b, name="seq_b").encode("ascii"), np.uint8)
    return blosum62_table()[a[:, None], b[None, :]]


def pair_substitution_scores(seq_a: str, seq_b: str, pairs: np.ndarray) -> np.ndarray:
    """BLOSUM62 score of each aligned pair ``[n]`` (sequences already normalized)."""
    a = np.frombuffer(seq_a.translate(str.maketrans(SCORING_MAP)).encode("ascii"), np.uint8)
    b = np.frombuffer(seq_b.translate(str.maketrans(SCORING_MAP)).encode("ascii"), np.uint8)
    return blosum62_table()[a[pairs[:, 0]], b[pairs[:, 1]]]


def match_symbols(seq_a: str, seq_b: str, pairs: np.ndarray) -> list[str]:
    """Per-pair match symbol: ``|`` identical, ``:`` BLOSUM62-positive, ``.`` other.

    Identity compares the residues as given (``U`` matches only ``U``); similarity uses the
    scoring map. Sequences must already be normalized; ``pairs`` is ``[n, 2]``.
    """
    if len(pairs) == 0:
        return []
    scores = pair_substitution_scores(seq_a, seq_b, pairs)
    a = np.frombuffer(seq_a.encode("ascii"), np.uint8)[pairs[:, 0]]
    b = np.frombuffer(seq_b.encode("ascii"), np.uint8)[pairs[:, 1]]
    sym = np.where(a == b, "|", np.where(scores > 0, ":", "."))
    return sym.tolist()
