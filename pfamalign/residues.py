"""Protein residues, in one place: which characters are residues, the alphabets, BLOSUM62 and
the per-pair match symbols (docs/design.md §4).

Residue policy (used by the command line, the output formats, the baselines, the Stockholm
reader and the embedders):

* A residue is an ASCII letter; lowercase is accepted and upper-cased (Pfam writes
  insert-state residues in lowercase). Anything else (gap characters ``-`` ``.``, the stop
  ``*``, digits, whitespace, non-ASCII letters) is rejected with a ``ValueError``: strip them
  upstream. :func:`first_invalid` is that rule; :func:`normalize_sequence` applies it to one
  sequence. A sequence a user gives (a FASTA record, a residue argument, a pairs-file or Python
  API sequence: :func:`input_sequence`) may end in one ``*``, a translation's stop codon
  (EMBOSS ``transeq`` writes one), which is dropped.
* All 26 letters are IUPAC protein codes. BLOSUM62 covers the 20 standard residues plus
  ``B`` (D/N), ``Z`` (E/Q) and ``X`` (unknown). The three it lacks are mapped for *scoring
  only*: ``U`` (selenocysteine) -> ``C``, ``O`` (pyrrolysine) -> ``K``, ``J`` (I/L) -> ``X``.
  Output formats always print the residues as given (upper-cased), never the mapped letters.
* The embedders read residues over :data:`AA_ALPHABET`, the 20 standard residues then
  ``X B Z U O`` (each an ESM-2 token of its own). ``J``, the one letter outside it (and not an
  ESM-2 token), is read as ``X``.
"""

from __future__ import annotations

import functools
import re

import numpy as np

AA_ALPHABET = "ACDEFGHIKLMNPQRSTVWYXBZUO"  # the embedders' letters, in the builtin column order
EMBEDDING_MAP = {"J": "X"}  # the letter outside AA_ALPHABET -> its stand-in
BLOSUM62_ALPHABET = "ARNDCQEGHILKMFPSTWYVBZX"  # the letters of Biopython's BLOSUM62 (minus '*')
SCORING_MAP = {"U": "C", "O": "K", "J": "X"}  # residues BLOSUM62 lacks -> their stand-ins
_TO_SCORING = str.maketrans(SCORING_MAP)


@functools.lru_cache(maxsize=None)
def _not_allowed(extra: str) -> re.Pattern:
    return re.compile(f"[^A-Za-z{re.escape(extra)}]")


def first_invalid(seq: str, extra: str = "") -> int | None:
    """0-based position of the first character of ``seq`` that is neither a residue letter
    nor in ``extra`` (e.g. an aligned row's gap characters); None when there is none."""
    bad = _not_allowed(extra).search(seq)
    return None if bad is None else bad.start()


def normalize_sequence(seq: str, *, name: str = "sequence") -> str:
    """Returns ``seq`` upper-cased after checking it is a non-empty string of letters.

    Raises ``ValueError`` naming the first offending character and its 1-based position (as
    every output numbers residues).
    """
    if not isinstance(seq, str):
        raise ValueError(f"{name} must be a str, got {type(seq).__name__}")
    if not seq:
        raise ValueError(f"{name} is empty")
    pos = first_invalid(seq)
    if pos is not None:
        raise ValueError(
            f"{name} has a non-protein character {seq[pos]!r} at position {pos + 1} (1-based; "
            "expected letters only: no gaps, stops, digits or whitespace)")
    return seq.upper()


def input_sequence(seq: str, *, name: str = "sequence") -> str:
    """A sequence as a user gives it: one trailing ``*`` (a stop codon) dropped, then
    ``normalize_sequence``."""
    if isinstance(seq, str) and seq.endswith("*"):
        seq = seq[:-1]
    return normalize_sequence(seq, name=name)


def scoring_sequence(seq: str, *, name: str = "sequence") -> str:
    """The sequence as BLOSUM62 scores it: normalized, then ``U->C``, ``O->K``, ``J->X``."""
    seq = normalize_sequence(seq, name=name)
    return seq.translate(_TO_SCORING)


@functools.lru_cache(maxsize=None)
def blosum62():
    """Biopython's BLOSUM62 ``substitution_matrices.Array`` (loaded once)."""
    from Bio.Align import substitution_matrices

    return substitution_matrices.load("BLOSUM62")


# BLOSUM62 over BLOSUM62_ALPHABET (rows and columns in that order), as Biopython ships it
# (tests/test_residues.py checks every entry): written out so that scoring an alignment's
# output needs no Biopython import (about 25 ms of every ``pfamalign align``)
_BLOSUM62_ROWS = """
 4 -1 -2 -2  0 -1 -1  0 -2 -1 -1 -1 -1 -2 -1  1  0 -3 -2  0 -2 -1  0
-1  5  0 -2 -3  1  0 -2  0 -3 -2  2 -1 -3 -2 -1 -1 -3 -2 -3 -1  0 -1
-2  0  6  1 -3  0  0  0  1 -3 -3  0 -2 -3 -2  1  0 -4 -2 -3  3  0 -1
-2 -2  1  6 -3  0  2 -1 -1 -3 -4 -1 -3 -3 -1  0 -1 -4 -3 -3  4  1 -1
 0 -3 -3 -3  9 -3 -4 -3 -3 -1 -1 -3 -1 -2 -3 -1 -1 -2 -2 -1 -3 -3 -2
-1  1  0  0 -3  5  2 -2  0 -3 -2  1  0 -3 -1  0 -1 -2 -1 -2  0  3 -1
-1  0  0  2 -4  2  5 -2  0 -3 -3  1 -2 -3 -1  0 -1 -3 -2 -2  1  4 -1
 0 -2  0 -1 -3 -2 -2  6 -2 -4 -4 -2 -3 -3 -2  0 -2 -2 -3 -3 -1 -2 -1
-2  0  1 -1 -3  0  0 -2  8 -3 -3 -1 -2 -1 -2 -1 -2 -2  2 -3  0  0 -1
-1 -3 -3 -3 -1 -3 -3 -4 -3  4  2 -3  1  0 -3 -2 -1 -3 -1  3 -3 -3 -1
-1 -2 -3 -4 -1 -2 -3 -4 -3  2  4 -2  2  0 -3 -2 -1 -2 -1  1 -4 -3 -1
-1  2  0 -1 -3  1  1 -2 -1 -3 -2  5 -1 -3 -1  0 -1 -3 -2 -2  0  1 -1
-1 -1 -2 -3 -1  0 -2 -3 -2  1  2 -1  5  0 -2 -1 -1 -1 -1  1 -3 -1 -1
-2 -3 -3 -3 -2 -3 -3 -3 -1  0  0 -3  0  6 -4 -2 -2  1  3 -1 -3 -3 -1
-1 -2 -2 -1 -3 -1 -1 -2 -2 -3 -3 -1 -2 -4  7 -1 -1 -4 -3 -2 -2 -1 -2
 1 -1  1  0 -1  0  0  0 -1 -2 -2  0 -1 -2 -1  4  1 -3 -2 -2  0  0  0
 0 -1  0 -1 -1 -1 -1 -2 -2 -1 -1 -1 -1 -2 -1  1  5 -2 -2  0 -1 -1  0
-3 -3 -4 -4 -2 -2 -3 -2 -2 -3 -2 -3 -1  1 -4 -3 -2 11  2 -3 -4 -3 -2
-2 -2 -2 -3 -2 -1 -2 -3  2 -1 -1 -2 -1  3 -3 -2 -2  2  7 -1 -3 -2 -1
 0 -3 -3 -3 -1 -2 -2 -3 -3  3  1 -2  1 -1 -2 -2  0 -3 -1  4 -3 -2 -1
-2 -1  3  4 -3  0  1 -1  0 -3 -4  0 -3 -3 -2  0 -1 -4 -3 -3  4  1 -1
-1  0  0  1 -3  3  4 -2  0 -3 -3  1 -1 -3 -1  0 -1 -3 -2 -2  1  4 -1
 0 -1 -1 -1 -2 -1 -1 -1 -1 -1 -1 -1 -1 -1 -2  0  0 -2 -1 -1 -1 -1 -1
"""


@functools.lru_cache(maxsize=None)
def blosum62_table() -> np.ndarray:
    """BLOSUM62 as a dense ``[128, 128]`` int table indexed by ASCII code (0 off-alphabet)."""
    scores = np.array([row.split() for row in _BLOSUM62_ROWS.strip().splitlines()], dtype=np.int64)
    codes = np.frombuffer(BLOSUM62_ALPHABET.encode("ascii"), np.uint8)
    table = np.zeros((128, 128), dtype=np.int64)
    table[codes[:, None], codes[None, :]] = scores
    return table


def substitution_scores(seq_a: str, seq_b: str) -> np.ndarray:
    """BLOSUM62 score of every residue pair ``[len(seq_a), len(seq_b)]``."""
    a = np.frombuffer(scoring_sequence(seq_a, name="seq_a").encode("ascii"), np.uint8)
    b = np.frombuffer(scoring_sequence(seq_b, name="seq_b").encode("ascii"), np.uint8)
    return blosum62_table()[a[:, None], b[None, :]]


def pair_substitution_scores(seq_a: str, seq_b: str, pairs: np.ndarray) -> np.ndarray:
    """BLOSUM62 score of each aligned pair ``[n]`` (sequences already normalized)."""
    a = np.frombuffer(seq_a.translate(_TO_SCORING).encode("ascii"), np.uint8)
    b = np.frombuffer(seq_b.translate(_TO_SCORING).encode("ascii"), np.uint8)
    return blosum62_table()[a[pairs[:, 0]], b[pairs[:, 1]]]


def identical_pairs(seq_a: str, seq_b: str, pairs: np.ndarray) -> np.ndarray:
    """Whether each aligned pair ``[n, 2]`` holds the same residue: the letters as given
    (``U`` matches only ``U``), an unknown ``X`` never (BLOSUM62 scores X/X -1; EMBOSS leaves
    it unmarked). The one rule for identity: match lines, identity figures, hit tables."""
    a = np.frombuffer(seq_a.encode("ascii"), np.uint8)[pairs[:, 0]]
    b = np.frombuffer(seq_b.encode("ascii"), np.uint8)[pairs[:, 1]]
    return (a == b) & (a != ord("X"))


def match_symbols(seq_a: str, seq_b: str, pairs: np.ndarray) -> list[str]:
    """Per-pair match symbol: ``|`` identical (``identical_pairs``), ``:`` BLOSUM62-positive,
    ``.`` other. Similarity uses the scoring map. Sequences must already be normalized;
    ``pairs`` is ``[n, 2]``.
    """
    if len(pairs) == 0:
        return []
    scores = pair_substitution_scores(seq_a, seq_b, pairs)
    sym = np.where(identical_pairs(seq_a, seq_b, pairs), "|", np.where(scores > 0, ":", "."))
    return sym.tolist()
