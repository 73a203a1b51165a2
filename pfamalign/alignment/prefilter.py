"""The search prefilter: which database sequences a query's pair-HMM forward pass scores.

Scoring every subject costs a forward pass (about 1 ms for a 300 x 300 pair on one core), so
a database of 20,000 sequences takes about ten seconds per query on two cores. The prefilter
ranks the subjects in two stages, as BLAST and FASTA do, and ``search`` scores only the
``keep`` best (``--max-candidates``); the rest are not reported. E-values still count the
whole database, so a reported hit's E-value is what an exhaustive search gives it.

First stage, every subject (BLAST's ungapped stage; about 20 µs a 300 x 300 pair, 0.2 s for
10,000 subjects on two cores), in BLOSUM62 units:

- Words: ``WORD`` consecutive residues, all among the 20 standard amino acids (after the
  scoring map, ``U->C``, ``O->K``; words with X, B or Z are not seeds). A *word hit* is a
  query word at ``i`` and a subject word at ``j`` scoring at least ``NEIGHBOR_SCORE``
  together (the query's neighbourhood words; BLAST's ``T`` is 11).
- Hits are taken diagonal by diagonal (``d = j - i``) in increasing ``i``; each is extended
  unless it starts before the end of an earlier extension on its diagonal (BLAST's one-hit
  mode).
- Extension: the word's score plus the best gain to the right (from ``i + WORD``) and to the
  left (from ``i - 1``), each run until its running sum falls more than ``X_DROP`` below its
  best (BLAST's ungapped X-drop, 7 bits); the extension ends after the right side's best
  residue.
- The score is the best extension's (0 without one), its diagonal the best extension's (the
  lowest on a tie; 0 without one). Subjects are ranked by the score less
  ``ln(subject length) / LAMBDA``, the subject-dependent part of an ungapped bit score
  (Karlin-Altschul, ``E = K m n e^(-lambda S)``): a long unrelated subject has more
  diagonals to find a high segment on.

Second stage, the first stage's ``POOL * keep`` best (FASTA's banded ``opt`` score): the best
local alignment (BLOSUM62, a gap of ``g`` residues costs ``GAP_OPEN + g * GAP_EXTEND``, 11 + g
as blastp's) within ``BAND`` diagonals of the first stage's best one, ranked by that score less
``ln(subject length) / GAPPED_LAMBDA``; the ``keep`` best are the candidates. It rescues
relatives whose best ungapped segment is short but whose alignment holds several, joined by
gaps. A database of at most ``keep`` subjects is scored in full.

How it was chosen, and what it misses (``docs/design.md`` §8). First stage, on the training
families (60 queries against a database of 1,560 sequences): the share of related pairs among
each query's ``K`` candidates was 0.906 / 0.928 / 0.967 / 0.994 at K = 50 / 100 / 200 / 500
with these settings; two-hit mode, ``T`` = 11 and raw scores each did worse at K >= 200.
Second stage, on the training families against 91,000 sequences (65 queries of 11 families,
their families' sequences and the Pfam full-alignment domains of four other training
families), K = 2,000: of the related pairs the forward pass finds at E <= 10, the first stage
alone kept 0.952, both stages with ``POOL`` 5 and ``BAND`` 8 kept 0.960 (at E <= 1: 0.987 and
0.989), for about 0.06 s more per query; pools of 10-20 and bands of 16-32 kept at most 0.003
more at two to four times the cost.

The pairs both stages lose are short or remote relatives without a strong segment (two
31-residue PPR repeats: best segment 11, forward score 23 bits), which the forward pass finds.

``reference_hit`` and ``reference_gapped`` state both stages on the full substitution table
(slow, for the tests); ``hits`` and ``gapped_scores`` compute them with numba kernels: the
first scans each subject once against the query's table of neighbourhood words, the second
runs Gotoh's recursions in band coordinates.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np

from pfamalign import resources
from pfamalign.alignment.numba_jit import kernel_factory, njit
from pfamalign.residues import BLOSUM62_ALPHABET, blosum62_table, scoring_sequence

WORD = 3  # the kernels read a word as three residues
NEIGHBOR_SCORE = 10  # T (BLAST's blastp: 11; 10 kept more relatives on the training families)
X_DROP = 16  # BLOSUM62 units (7 bits, BLAST's ungapped X-drop)
LAMBDA = 0.3176  # BLOSUM62's ungapped Karlin-Altschul lambda (nats per unit score)
GAP_OPEN, GAP_EXTEND = 11, 1  # the second stage's gaps (BLAST's blastp defaults)
GAPPED_LAMBDA = 0.267  # BLOSUM62 11/1 gapped lambda (BLAST's table)
BAND = 8  # the second stage's half-width around the first stage's best diagonal
POOL = 5  # the second stage scores this many times ``keep`` subjects
WORD_LETTERS = 20  # the first 20 letters of BLOSUM62_ALPHABET, the standard amino acids
SCAN_CHUNK = 256  # subjects per task on the thread pool


@functools.lru_cache(maxsize=None)
def _letter_codes() -> np.ndarray:
    """ASCII code -> index into ``BLOSUM62_ALPHABET`` (255 off it)."""
    lookup = np.full(128, 255, np.uint8)
    lookup[np.frombuffer(BLOSUM62_ALPHABET.encode("ascii"), np.uint8)] = np.arange(len(BLOSUM62_ALPHABET))
    return lookup


def encode(seq: str) -> np.ndarray:
    """``seq``'s letters as indices into ``BLOSUM62_ALPHABET`` (uint8)."""
    return _letter_codes()[np.frombuffer(scoring_sequence(seq).encode("ascii"), np.uint8)]


@functools.lru_cache(maxsize=None)
def substitution_table() -> np.ndarray:
    """BLOSUM62 ``[23, 23]`` (int32) over ``BLOSUM62_ALPHABET``."""
    codes = np.frombuffer(BLOSUM62_ALPHABET.encode("ascii"), np.uint8)
    return np.ascontiguousarray(blosum62_table()[codes[:, None], codes[None, :]], np.int32)


@dataclasses.dataclass(frozen=True)
class Database:
    """Encoded subjects: ``codes`` of all, concatenated; subject ``s`` is
    ``codes[offsets[s]:offsets[s + 1]]``."""

    codes: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, seqs: Sequence[str]) -> "Database":
        encoded = [encode(s) for s in seqs]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        codes = np.concatenate(encoded) if encoded else np.zeros(0, np.uint8)
        return cls(codes, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1


def _extend(q, s, i, j, table) -> tuple[int, int]:
    """``(score, end)`` of the ungapped X-drop extension of the word hit at ``(i, j)``; ``end``:
    the query position after the right side's best residue (pure Python: the reference's;
    the kernel inlines the same loop)."""
    score = sum(int(table[q[i + t], s[j + t]]) for t in range(WORD))
    run = best = 0
    end = i + WORD
    p, r = i + WORD, j + WORD
    while p < len(q) and r < len(s):
        run += int(table[q[p], s[r]])
        if run > best:
            best, end = run, p + 1
        elif run < best - X_DROP:
            break
        p, r = p + 1, r + 1
    run = left = 0
    p, r = i - 1, j - 1
    while p >= 0 and r >= 0:
        run += int(table[q[p], s[r]])
        if run > left:
            left = run
        elif run < left - X_DROP:
            break
        p, r = p - 1, r - 1
    return score + best + left, end


def reference_hit(query: str, subject: str) -> tuple[int, int]:
    """``(score, diagonal)`` of one pair's best ungapped extension (the first stage's score;
    its diagonal ``j - i``, the lowest on a tie, 0 without one), from the module docstring's
    definition: word hits read off the full ``[Lq, Ls]`` substitution table, diagonal by
    diagonal."""
    q, s = encode(query), encode(subject)
    table = substitution_table()
    if len(q) < WORD or len(s) < WORD:
        return 0, 0
    sub = table[q[:, None], s[None, :]]
    word_ok_q = np.array([all(c < WORD_LETTERS for c in q[i:i + WORD]) for i in range(len(q) - WORD + 1)])
    word_ok_s = np.array([all(c < WORD_LETTERS for c in s[j:j + WORD]) for j in range(len(s) - WORD + 1)])
    best = best_d = 0
    for d in range(-(len(q) - 1), len(s)):
        covered = 0
        for i in range(max(0, -d), min(len(q), len(s) - d) - WORD + 1):
            j = i + d
            if not (word_ok_q[i] and word_ok_s[j]) or sub[i, j] + sub[i + 1, j + 1] + sub[i + 2, j + 2] < NEIGHBOR_SCORE:
                continue
            if i < covered:
                continue
            score, covered = _extend(q, s, i, j, table)
            if score > best:
                best, best_d = score, d
    return best, best_d


def reference_gapped(query: str, subject: str, diagonal: int, band: int = BAND) -> int:
    """The second stage's score of one pair, from its definition: the best local alignment
    (BLOSUM62, a gap of ``g`` residues costs ``GAP_OPEN + g * GAP_EXTEND``) whose cells all
    lie within ``band`` of ``diagonal`` (``|j - i - diagonal| <= band``), by Gotoh's
    recursions on the full matrix with the cells off the band forbidden."""
    q, s = encode(query), encode(subject)
    table = substitution_table()
    never = -(1 << 40)
    h = np.zeros((len(q) + 1, len(s) + 1), np.int64)
    e = np.full_like(h, never)  # ends in a gap in the query (a subject residue unaligned)
    f = np.full_like(h, never)  # ends in a gap in the subject
    best = 0
    for i in range(1, len(q) + 1):
        for j in range(1, len(s) + 1):
            if abs(j - i - diagonal) > band:
                h[i, j] = never
                continue
            e[i, j] = max(h[i, j - 1] - GAP_OPEN - GAP_EXTEND, e[i, j - 1] - GAP_EXTEND)
            f[i, j] = max(h[i - 1, j] - GAP_OPEN - GAP_EXTEND, f[i - 1, j] - GAP_EXTEND)
            h[i, j] = max(0, h[i - 1, j - 1] + int(table[q[i - 1], s[j - 1]]), e[i, j], f[i, j])
            best = max(best, int(h[i, j]))
    return best


@kernel_factory
def _kernels():
    """``(lookup, scan)``: the query's neighbourhood-word table and the subjects' scores."""
    word, letters, threshold, x_drop = WORD, WORD_LETTERS, NEIGHBOR_SCORE, X_DROP

    @njit()
    def lookup(q, table):
        """``(starts [20^3 + 1], positions)``: the query positions of each subject word's
        hits are ``positions[starts[w]:starts[w + 1]]``, increasing."""
        n_words = letters ** word
        lq = len(q)
        counts = np.zeros(n_words + 1, np.int64)
        for pass_ in range(2):
            if pass_ == 1:
                for w in range(n_words):
                    counts[w + 1] += counts[w]
                positions = np.empty(counts[n_words], np.int32)
                fill = counts[:n_words].copy()
            for i in range(lq - word + 1):
                a, b, c = q[i], q[i + 1], q[i + 2]
                if a >= letters or b >= letters or c >= letters:
                    continue
                for x in range(letters):
                    sx = table[a, x]
                    for y in range(letters):
                        sxy = sx + table[b, y]
                        for z in range(letters):
                            if sxy + table[c, z] >= threshold:
                                w = (x * letters + y) * letters + z
                                if pass_ == 0:
                                    counts[w + 1] += 1
                                else:
                                    positions[fill[w]] = i
                                    fill[w] += 1
        return counts, positions

    @njit()
    def scan(q, starts, positions, codes, offsets, lo, hi, table, out, diagonal):
        lq = len(q)
        longest = 0
        for s in range(lo, hi):
            longest = max(longest, offsets[s + 1] - offsets[s])
        covered = np.empty(longest + lq, np.int64)
        for s in range(lo, hi):
            at = offsets[s]
            ls = offsets[s + 1] - at
            covered[:ls + lq] = 0
            top = 0
            top_d = 0
            for j in range(ls - word + 1):
                a, b, c = codes[at + j], codes[at + j + 1], codes[at + j + 2]
                if a >= letters or b >= letters or c >= letters:
                    continue
                w = (a * letters + b) * letters + c
                for k in range(starts[w], starts[w + 1]):
                    i = positions[k]
                    d = j - i + lq - 1
                    if i < covered[d]:
                        continue
                    score = table[q[i], a] + table[q[i + 1], b] + table[q[i + 2], c]
                    run = 0
                    best = 0
                    end = i + word
                    p, r = i + word, j + word
                    while p < lq and r < ls:
                        run += table[q[p], codes[at + r]]
                        if run > best:
                            best = run
                            end = p + 1
                        elif run < best - x_drop:
                            break
                        p += 1
                        r += 1
                    run = 0
                    left = 0
                    p, r = i - 1, j - 1
                    while p >= 0 and r >= 0:
                        run += table[q[p], codes[at + r]]
                        if run > left:
                            left = run
                        elif run < left - x_drop:
                            break
                        p -= 1
                        r -= 1
                    covered[d] = end
                    total = score + best + left
                    if total > top or (total == top and j - i < top_d):  # ties: the lowest diagonal
                        top = total
                        top_d = j - i
            out[s] = top
            diagonal[s] = top_d

    @njit()
    def gapped(q, codes, offsets, subjects, diagonals, lo, hi, band, table, gap_open, gap_extend, out):
        """``reference_gapped`` of subjects ``subjects[lo:hi]`` around ``diagonals[lo:hi]``, row
        by row in band coordinates: slot ``k`` (1..2 band + 1) of row ``i`` is column ``j = i +
        d - band + k - 1``; slots 0 and 2 band + 2 stand for the forbidden cells beside the band.
        A cell off the matrix is a boundary (h 0: a local alignment may start after it)."""
        lq = len(q)
        width = 2 * band + 1
        never = -(1 << 40)
        h_prev = np.empty(width + 2, np.int64)
        f_prev = np.empty(width + 2, np.int64)
        h = np.empty(width + 2, np.int64)
        e = np.empty(width + 2, np.int64)
        f = np.empty(width + 2, np.int64)
        opening = gap_open + gap_extend
        for t in range(lo, hi):
            sn = subjects[t]
            at = offsets[sn]
            ls = offsets[sn + 1] - at
            d = diagonals[t]
            h_prev[:] = 0  # the boundary row
            h_prev[0] = never
            h_prev[width + 1] = never
            f_prev[:] = never
            h[0] = never
            h[width + 1] = never
            e[0] = never
            f[0] = never
            f[width + 1] = never
            best = 0
            for i in range(max(0, -(d + band)), min(lq, ls - d + band)):
                first = i + d - band - 1  # column of slot 0
                for k in range(1, width + 1):
                    j = first + k
                    if j < 0 or j >= ls:
                        h[k] = 0
                        e[k] = never
                        f[k] = never
                        continue
                    e[k] = max(h[k - 1] - opening, e[k - 1] - gap_extend)
                    f[k] = max(h_prev[k + 1] - opening, f_prev[k + 1] - gap_extend)
                    cell = max(0, h_prev[k] + table[q[i], codes[at + j]], e[k], f[k])
                    h[k] = cell
                    if cell > best:
                        best = cell
                h_prev[:] = h
                f_prev[:] = f
            out[t] = best

    return lookup, scan, gapped


def _in_chunks(count: int, run) -> None:
    """``run(lo, hi)`` over ``[0, count)`` in ``SCAN_CHUNK`` pieces on the thread pool (the
    numba kernels release the GIL and write disjoint slices of their outputs)."""
    list(resources.thread_pool("prefilter").map(lambda lo: run(lo, min(lo + SCAN_CHUNK, count)), range(0, count, SCAN_CHUNK)))


def hits(query: str, database: Database) -> tuple[np.ndarray, np.ndarray]:
    """``(score, diagonal)`` (``reference_hit``) of ``query`` against every subject (int32)."""
    lookup, scan, _ = _kernels()
    table = substitution_table()
    q = encode(query)
    out = np.zeros(len(database), np.int32)
    diagonal = np.zeros(len(database), np.int32)
    if len(q) < WORD or len(database) == 0:
        return out, diagonal
    starts, positions = lookup(q, table)
    _in_chunks(len(database), lambda lo, hi: scan(q, starts, positions, database.codes, database.offsets,
                                                  lo, hi, table, out, diagonal))
    return out, diagonal


def gapped_scores(query: str, database: Database, subjects: np.ndarray, diagonals: np.ndarray,
                  band: int = BAND) -> np.ndarray:
    """``reference_gapped`` of ``query`` against each of ``subjects`` around its diagonal."""
    _, _, gapped = _kernels()
    q = encode(query)
    subjects = np.ascontiguousarray(subjects, np.int64)
    diagonals = np.ascontiguousarray(diagonals, np.int64)
    out = np.zeros(len(subjects), np.int64)
    table = substitution_table()
    _in_chunks(len(subjects), lambda lo, hi: gapped(q, database.codes, database.offsets, subjects, diagonals,
                                                    lo, hi, band, table, GAP_OPEN, GAP_EXTEND, out))
    return out


def candidates(query: str, database: Database, keep: int, *, exclude: int | None = None) -> np.ndarray:
    """Indices (increasing) of the ``keep`` subjects the two stages rank highest, leaving out
    subject ``exclude``: the first stage's ``POOL * keep`` best by ungapped score less
    ``ln(length) / LAMBDA``, of those the ``keep`` best by banded gapped score less
    ``ln(length) / GAPPED_LAMBDA`` (ties, in both: the earlier subject)."""
    score, diagonal = hits(query, database)
    log_length = np.log(np.maximum(np.diff(database.offsets), 1))
    order = np.argsort(-(score - log_length / LAMBDA), kind="stable")
    pool = (order if exclude is None else order[order != exclude])[:POOL * keep]
    if len(pool) <= keep:
        return np.sort(pool)
    pool = np.sort(pool)  # the second stage's ties go to the earlier subject too
    rank = gapped_scores(query, database, pool, diagonal[pool]) - log_length[pool] / GAPPED_LAMBDA
    return np.sort(pool[np.argsort(-rank, kind="stable")[:keep]])
