"""The search prefilter: which database sequences a query's pair-HMM forward pass scores.

Scoring every subject costs a forward pass (about 1 ms for a 300 x 300 pair on one core), so
a database of 20,000 sequences takes about ten seconds per query on two cores. The prefilter
ranks the subjects by BLAST's ungapped stage, a score about twenty times cheaper (0.2 s for
10,000 subjects of 150-450 residues against a 300-residue query, two cores), and ``search``
scores only the ``keep`` best (``--max-candidates``); the rest are not reported. E-values
still count the whole database, so a reported hit's E-value is what an exhaustive search
gives it.

The prefilter score of a (query, subject) pair, in BLOSUM62 units:

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
- The score is the best extension's (0 without one).

``candidates`` ranks subjects by the score less ``ln(subject length) / LAMBDA``, the
subject-dependent part of an ungapped bit score (Karlin-Altschul, ``E = K m n e^(-lambda S)``):
a long unrelated subject has more diagonals to find a high segment on.

How it was chosen, and what it misses (``docs/design.md`` §8): on the training families
(60 queries against a database of 1,560 sequences) the share of related pairs among each
query's ``K`` candidates was 0.906 / 0.928 / 0.967 / 0.994 at K = 50 / 100 / 200 / 500 with
these settings; two-hit mode, ``T`` = 11 and raw scores each did worse at K >= 200. The pairs
it loses are short or remote relatives without a strong ungapped segment (two 31-residue
PPR repeats: best segment 11, forward score 23 bits), which the forward pass finds.

``reference_score`` states this per diagonal on the full substitution table (slow, for the
tests); ``scores`` computes it for a whole database with a numba kernel that scans each
subject once against the query's table of neighbourhood words.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Sequence

import numpy as np

from pfamalign.alignment.numba_jit import kernel_factory, njit
from pfamalign.residues import BLOSUM62_ALPHABET, blosum62_table, scoring_sequence

WORD = 3  # the kernels read a word as three residues
NEIGHBOR_SCORE = 10  # T (BLAST's blastp: 11; 10 kept more relatives on the training families)
X_DROP = 16  # BLOSUM62 units (7 bits, BLAST's ungapped X-drop)
LAMBDA = 0.3176  # BLOSUM62's ungapped Karlin-Altschul lambda (nats per unit score)
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


def reference_score(query: str, subject: str) -> int:
    """The prefilter score of one pair, from the module docstring's definition: word hits
    read off the full ``[Lq, Ls]`` substitution table, diagonal by diagonal."""
    q, s = encode(query), encode(subject)
    table = substitution_table()
    if len(q) < WORD or len(s) < WORD:
        return 0
    sub = table[q[:, None], s[None, :]]
    word_ok_q = np.array([all(c < WORD_LETTERS for c in q[i:i + WORD]) for i in range(len(q) - WORD + 1)])
    word_ok_s = np.array([all(c < WORD_LETTERS for c in s[j:j + WORD]) for j in range(len(s) - WORD + 1)])
    best = 0
    for d in range(-(len(q) - 1), len(s)):
        covered = 0
        for i in range(max(0, -d), min(len(q), len(s) - d) - WORD + 1):
            j = i + d
            if not (word_ok_q[i] and word_ok_s[j]) or sub[i, j] + sub[i + 1, j + 1] + sub[i + 2, j + 2] < NEIGHBOR_SCORE:
                continue
            if i < covered:
                continue
            score, covered = _extend(q, s, i, j, table)
            best = max(best, score)
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
    def scan(q, starts, positions, codes, offsets, lo, hi, table, out):
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
                    if score + best + left > top:
                        top = score + best + left
            out[s] = top

    return lookup, scan


@functools.lru_cache(maxsize=1)
def _pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="prefilter")


def scores(query: str, database: Database) -> np.ndarray:
    """The prefilter score (``reference_score``) of ``query`` against every subject (int32)."""
    lookup, scan = _kernels()
    table = substitution_table()
    q = encode(query)
    out = np.zeros(len(database), np.int32)
    if len(q) < WORD or len(database) == 0:
        return out
    starts, positions = lookup(q, table)
    chunks = range(0, len(database), SCAN_CHUNK)
    list(_pool().map(lambda lo: scan(q, starts, positions, database.codes, database.offsets, lo,
                                     min(lo + SCAN_CHUNK, len(database)), table, out), chunks))
    return out


def candidates(query: str, database: Database, keep: int, *, exclude: int | None = None) -> np.ndarray:
    """Indices (increasing) of the ``keep`` subjects ranked highest by prefilter score less
    ``ln(length) / LAMBDA`` (ties: the earlier subject), leaving out subject ``exclude``."""
    rank = scores(query, database) - np.log(np.maximum(np.diff(database.offsets), 1)) / LAMBDA
    if exclude is not None:
        rank[exclude] = -np.inf
    order = np.argsort(-rank, kind="stable")
    kept = order[:keep]
    if exclude is not None:
        kept = kept[kept != exclude]
    return np.sort(kept)
