"""Baseline aligners scored with the same protocol as the model (docs/design.md §5).

* Needleman-Wunsch (global) and Smith-Waterman (local) with BLOSUM62 and affine gaps through
  Biopython's ``PairwiseAligner``. Gap convention: a gap of length n costs
  ``gap_open + (n - 1) * gap_extend`` (EMBOSS / Biopython style), so the defaults 11 / 1 are
  ``open_gap_score=-11, extend_gap_score=-1``. Note that BLAST's "existence 11, extension 1"
  means ``11 + n`` (Biopython's ``scoring="blastp"`` preset: open -12); pass ``gap_open=12``
  for that convention.
* The diagonal reference: query row i -> ``round(i (Lk - 1) / (Lq - 1))``.
* External aligners (ProbCons, MUSCLE 5; the Debian packages ``probcons``, ``muscle``) run as
  subprocesses on a two-sequence FASTA with their default settings; their aligned FASTA is
  read back into aligned pairs (``aligned_fasta_pairs``).

Residues are validated and mapped for scoring as described in ``pfamalign.residues`` (``U->C``,
``O->K``, ``J->X``; lowercase accepted).
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import shutil
import subprocess
import tempfile
from typing import Callable

import numpy as np

from pfamalign.alignment.pairs import PairAlignment, diagonal_target
from pfamalign.inputs import BadRecord, fasta_records
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


# ---- external aligners -----------------------------------------------------------------------


class ExternalAlignerError(RuntimeError):
    """An external aligner is missing, failed, or printed something that is not the alignment."""


@dataclasses.dataclass(frozen=True)
class ExternalAligner:
    """A command-line aligner: ``argv(in_fasta, out_fasta)``; the aligned FASTA comes on stdout
    when ``stdout_output``, else in ``out_fasta``."""

    binary: str
    package: str  # the Debian package that installs it
    argv: Callable[[str, str], list[str]]
    stdout_output: bool

    def missing(self) -> str | None:
        """None when the binary is on PATH, else a message naming the package."""
        if shutil.which(self.binary):
            return None
        return (f"{self.binary} not found on PATH: install the Debian package "
                f"'{self.package}' (apt install {self.package}) to score it")


EXTERNAL_ALIGNERS = {
    # ProbCons prints its banner on stderr and the alignment (input order) on stdout.
    "probcons": ExternalAligner("probcons", "probcons", lambda fa, out: ["probcons", fa], True),
    # One thread: the evaluation runs many small alignments, threads only add overhead.
    "muscle": ExternalAligner("muscle", "muscle", lambda fa, out: [
        "muscle", "-align", fa, "-output", out, "-threads", "1"], False),
}


def read_fasta(text: str) -> dict[str, str]:
    """``{name: row}`` of an aligner's FASTA output (``inputs.fasta_records``, rows as written:
    gaps kept); ExternalAlignerError when it is not FASTA or a name appears twice."""
    rows: dict[str, str] = {}
    try:
        for rec in fasta_records(io.StringIO(text), "aligner output", validate=False):
            if isinstance(rec, BadRecord):
                raise rec
            if rec.id in rows:
                raise ExternalAlignerError(f"FASTA name {rec.id!r} appears twice")
            rows[rec.id] = rec.seq
    except ExternalAlignerError:
        raise
    except ValueError as err:
        raise ExternalAlignerError(str(err)) from err
    return rows


def aligned_fasta_pairs(text: str, query: str = "q", key: str = "k") -> np.ndarray:
    """Aligned pairs ``[n, 2]`` (0-based query / key residue indices) of the rows named
    ``query`` and ``key`` of an aligned FASTA: the columns where neither has a gap ('-' or
    '.')."""
    rows = read_fasta(text)
    for name in (query, key):
        if name not in rows:
            raise ExternalAlignerError(f"aligned FASTA has no row {name!r} (rows: {list(rows)})")
    a, b = rows[query], rows[key]
    if len(a) != len(b):
        raise ExternalAlignerError(f"aligned rows differ in length: {len(a)} vs {len(b)}")
    gap_a = np.array([c in "-." for c in a], bool)
    gap_b = np.array([c in "-." for c in b], bool)
    index_a = np.cumsum(~gap_a) - 1  # residue index of each column (valid where not a gap)
    index_b = np.cumsum(~gap_b) - 1
    both = ~gap_a & ~gap_b
    return np.stack([index_a[both], index_b[both]], axis=1).astype(np.int64).reshape(-1, 2)


def external_align(name: str, seq_a: str, seq_b: str, *, timeout: float = 600.0) -> PairAlignment:
    """Aligns two sequences with the external aligner ``name`` (``EXTERNAL_ALIGNERS``);
    ExternalAlignerError when it is missing, fails, or loses a residue."""
    tool = EXTERNAL_ALIGNERS[name]
    message = tool.missing()
    if message:
        raise ExternalAlignerError(message)
    a = scoring_sequence(seq_a, name="seq_a")  # the aligners know the 20 + X B Z codes
    b = scoring_sequence(seq_b, name="seq_b")
    with tempfile.TemporaryDirectory(prefix=f"pfamalign-{name}-") as tmp:
        fasta, out = pathlib.Path(tmp, "in.fa"), pathlib.Path(tmp, "out.fa")
        fasta.write_text(f">q\n{a}\n>k\n{b}\n")
        try:
            proc = subprocess.run(tool.argv(str(fasta), str(out)), capture_output=True, text=True,
                                  timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired as err:
            raise ExternalAlignerError(f"{name} took over {timeout:.0f} s") from err
        if proc.returncode != 0:
            raise ExternalAlignerError(f"{name} failed (exit {proc.returncode}): "
                                       f"{proc.stderr.strip()[-500:]}")
        if not tool.stdout_output and not out.is_file():
            raise ExternalAlignerError(f"{name} exited 0 but wrote no alignment: "
                                       f"{proc.stderr.strip()[-500:] or 'no message'}")
        text = proc.stdout if tool.stdout_output else out.read_text()
    rows = read_fasta(text)
    for label, seq in (("q", a), ("k", b)):
        got = rows.get(label, "").replace("-", "").replace(".", "").upper()
        if got != seq:
            raise ExternalAlignerError(f"{name} returned row {label!r} that is not the input sequence")
    return PairAlignment(pairs=aligned_fasta_pairs(text), confidence=None, score=float("nan"),
                         query_length=len(a), key_length=len(b))

