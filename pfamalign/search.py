"""Database search: every query scored against every database sequence by the pair-HMM's
homology log-odds, E-values from an extreme-value fit on shuffled decoys, and the hits that
pass the E-value and count limits aligned by the model and its decoder.

Score. The log-likelihood ratio of the pair (``pairhmm.log_likelihood_ratio``, in nats): the
two sequences under the model's pair-HMM, summed over all their alignments (the forward
pass), against both drawn from the background; in the decoder's mode (``local``: the segment
model, unrelated flanks free). It is the pair-HMM's evidence for homology, where the decoder's
objective (the expected number of correct pairs of its alignment) measures how well an
alignment is placed, not whether the sequences are related; and it needs one forward pass
(about 1 ms for a 300 x 300 pair), so a database is scored first and only the reported hits
are aligned by the model. The transport plan does not enter the score: its log-odds under the
plan pair-HMM separate homologs no better than chance (``docs/design.md``, search).

Prefilter. A database of more than ``max_candidates`` sequences (``--max-candidates``,
default ``DEFAULT_MAX_CANDIDATES``) is first ranked for each query in two stages
(``alignment.prefilter``: BLAST's ungapped stage, neighbourhood-word hits extended without
gaps by X-drop, about 0.2 s for 10,000 subjects; then a banded gapped score for the best of
them) and only the ``max_candidates`` best are scored by the forward pass; the others are not reported. E-values still count all ``N`` sequences, so a
reported hit has the E-value an exhaustive search gives it.

Statistics (the SSEARCH / FASTA recipe with shuffled decoys). For each query, ``decoys``
database sequences drawn at random (seeded by ``seed`` and the query's residues, not by its
place in the batch, and drawn from the database's sequences sorted, not in file order: a
query's E-values are the same alone or among others, against the database in any order) are shuffled
residue by residue (same length and composition, no homology left) and scored against the
query. Their scores are fitted by maximum likelihood with a Gumbel (extreme-value) law,

    P(S >= s | n) = 1 - exp(-exp(-lambda (s - mu(n)))),

whose location ``mu(n) = mu + slope n`` moves with the subject's length ``n`` in global
mode: a global score charges the end gaps between two lengths, so a decoy's score falls with
its length (within a query, correlation about -0.5). In local mode the flanks are free and the
location is one number (a fitted slope made local E-values optimistic on real unrelated
pairs). Outside the decoys' length range the location is the more conservative of the line
and its value at the nearest end of the range. For a database of ``N`` sequences

    E(s, n) = N * P(S >= s | n),      bits(s, n) = lambda (s - mu(n)) / ln 2,

so ``E ~= N 2^-bits`` in the tail, as for BLAST's bit scores (the search space counted in
sequences, not residues). Hits are ranked by E-value (then score); the bit score orders them
the same way.

Tail (``TAIL_FROM``). The fitted law describes the decoys' body. A score summed over all
alignments has an exponential upper tail with slope about 1 per nat (on shuffled Pfam
sequences 1.0-1.2 at P = 1e-3 to 1e-4), where local mode's fitted lambda is 1.2-2.9: past
the score the law leaves 1 % above, P(S >= s) is never taken below ``TAIL_FROM *
exp(-(s - s0))`` (``Gumbel.tail_from``; bits follow, ``-log2(-log(1 - P))``). Global mode's
lambda is below 1, its own tail the heavier: unchanged there. Without it, local-mode
queries of held-out families against 20,000 shuffled sequences drew 19x the false hits at
E <= 1 that the E-values allowed and 1,200x at E <= 0.001 (``scripts/bench_null_search.py``).

Composition shift (``correct_composition``, on by default; the role of BLAST's
composition-based statistics). Two unrelated sequences of the same biased composition (two
membrane proteins) score high against each other, where the decoys, shuffles of random
database sequences, mostly do not: at 92,000 sequences, queries of training families with
membrane proteins among them got up to six times the unrelated hits their E-values allowed. So each subject that may be reported
is shuffled ``SUBJECT_SHUFFLES`` times and scored against the query: the mean of those
scores above the decoys' mean at its length, less ``SHIFT_STANDARD_ERRORS`` standard errors
and never negative (``composition_shift``), is what its composition alone adds, and is taken
off its score. Every decoy is charged its own shift the same way before the fit, so the
corrected scores of unrelated subjects follow the fitted law (a null search over shuffled
sequences stays calibrated). A shift only lowers a score, so a subject whose E-value misses
the cutoff before its shift misses it after; those are not shuffled.

Hit table: BLAST tabular columns (``COLUMNS``) over the aligned region, the stretch from the
first to the last aligned pair (end gaps of a global alignment are not part of it), 1-based
inclusive coordinates; ``length`` counts the region's columns (pairs and gap columns),
``pident`` is 100 x identical pairs / ``length`` (``residues.identical_pairs``: X-X is no
identity, where BLAST+ counts it), ``mismatch`` the non-identical pairs,
``gapopen`` the gap runs (between two pairs, ``seq_a``'s unaligned residues form one run and
``seq_b``'s another, as every output of the package prints them); plus ``mean_confidence``,
the mean of the aligned pairs' confidences (the decoder's posterior of each pair, as
``align`` prints them). Numbers are written as BLAST+ tabular output writes them. A hit whose
alignment has no aligned pair is not reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
import sys
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from pfamalign.batch import aligned
from pfamalign.inputs import BadRecord, FastaRecord
from pfamalign.residues import identical_pairs

COLUMNS = ("qseqid", "sseqid", "pident", "length", "mismatch", "gapopen", "qstart", "qend",
           "sstart", "send", "evalue", "bitscore", "mean_confidence")
# BLAST+ ``-outfmt 6`` / ``7`` columns (its default "std" set, ids as qseqid / sseqid) and the
# names ``-outfmt 7`` gives them on its ``# Fields:`` line, which parsers of commented tables
# read (Bio.SearchIO's "blast-tab" maps them back to the specifiers)
BLAST_FIELD_NAMES = {
    "qseqid": "query id", "sseqid": "subject id", "pident": "% identity", "length": "alignment length",
    "mismatch": "mismatches", "gapopen": "gap opens", "qstart": "q. start", "qend": "q. end",
    "sstart": "s. start", "send": "s. end", "evalue": "evalue", "bitscore": "bit score"}
BLAST_COLUMNS = tuple(BLAST_FIELD_NAMES)
DEFAULT_DECOYS = 50
DEFAULT_EVALUE = 10.0  # hits reported up to this E-value, at most DEFAULT_MAX_HITS per query
DEFAULT_MAX_HITS = 500
DEFAULT_MAX_CANDIDATES = 2000  # subjects the prefilter passes to the forward pass, per query
MIN_DECOYS = 10  # fewer cannot pin down two parameters
MAX_DECOYS = 10_000  # with the composition shift each costs 11 forward passes per query


# The null law's tail (``Gumbel.tail_from``): beyond the score where the fitted law leaves
# TAIL_FROM of the null above it, P(S >= s) falls no faster than exp(-TAIL_LAMBDA s), the
# exponential tail that log-odds summed over all alignments (forward scores) have, with
# slope 1 per nat. A Gumbel fitted to 50 decoys describes their body, not that tail: in local
# mode its lam is 1.2 to 2.9 and its E-values ran up to 24x optimistic at P = 1e-4 (a
# search's E = 1e-3 at 10,000 sequences). TAIL_FROM was chosen on training families' null
# scores (docs/design.md, search).
TAIL_FROM = 0.01
TAIL_LAMBDA = 1.0


@dataclasses.dataclass(frozen=True)
class Gumbel:
    """A Gumbel (maximum) law, ``P(S >= s | n) = 1 - exp(-exp(-lam (s - location(n))))``,
    its location ``mu + slope n`` linear in the subject's length ``n`` over ``lengths`` (the
    fitted range) and, outside it, the larger of the line and its value at the range's
    nearest end (extrapolating never makes E-values smaller). ``slope`` 0: one location.

    ``tail_from`` (None: the plain law): past the score ``s0`` where ``P(S >= s0) =
    tail_from``, ``P(S >= s)`` is the larger of the law's and ``tail_from exp(-TAIL_LAMBDA
    (s - s0))``, so that the tail never falls faster than exponentially with slope
    ``TAIL_LAMBDA`` (a law with ``lam <= TAIL_LAMBDA`` is unchanged)."""

    mu: float
    lam: float
    slope: float = 0.0
    lengths: tuple[float, float] = (0.0, 0.0)
    tail_from: float | None = None

    def location(self, length=0, *, lower: bool = False) -> np.ndarray:
        """The law's location at ``length``; outside the fitted lengths the larger of the line
        and its value at the nearest fitted length (extrapolating never lowers an E-value), or
        with ``lower`` the smaller (what a composition shift is measured against: a higher
        location would understate the shift and so lower the E-value)."""
        n = np.asarray(length, np.float64)
        pick = np.minimum if lower else np.maximum
        return self.mu + pick(self.slope * n, self.slope * np.clip(n, *self.lengths))

    def _z(self, s, length=0) -> np.ndarray:
        """The standardized score ``z`` with ``P(S >= s) = 1 - exp(-exp(-z))``: ``lam (s -
        location)`` for the plain law; past the tail's start the exponential tail's z where it
        is the heavier (computed from its log-probability: no underflow)."""
        z = self.lam * (np.asarray(s, np.float64) - self.location(length))
        if self.tail_from is None:
            return z
        z0 = -math.log(-math.log1p(-self.tail_from))
        log_p = math.log(self.tail_from) - TAIL_LAMBDA * np.maximum(z - z0, 0.0) / self.lam
        p = np.clip(np.exp(log_p), 1e-300, self.tail_from)  # the clip: np.where computes both sides
        # -log(-log(1 - p)) = -log p - p / 2 - ...: -log p alone where p is negligible
        z_tail = np.where(log_p < -30, -log_p, -np.log(-np.log1p(-p)))
        return np.where(z > z0, np.minimum(z, z_tail), z)

    def sf(self, s, length=0) -> np.ndarray:
        """``P(S >= s | length)``, accurate in the far tail (``-expm1``)."""
        return -np.expm1(-np.exp(-self._z(s, length)))

    def bits(self, s, length=0) -> np.ndarray:
        """``-log2(-log(1 - sf))``: ``lam (s - location) / ln 2`` for the plain law, and
        ``E ~= N 2^-bits`` wherever ``sf`` is small."""
        return self._z(s, length) / math.log(2)

    @classmethod
    def fit(cls, scores: Sequence[float], lengths: Sequence[float] | None = None) -> "Gumbel":
        """Maximum-likelihood fit; with ``lengths``, of the location's slope too (the profile
        likelihood over the slope, maximized by Brent's method: for a given slope the
        residuals ``s - slope n`` are a plain Gumbel sample, fitted by ``_fit_location``)."""
        x = np.asarray(scores, np.float64)
        if x.ndim != 1 or len(x) < 2 or not np.all(np.isfinite(x)):
            raise ValueError("need at least two finite scores to fit a Gumbel law")
        if lengths is None or np.ptp(np.asarray(lengths, np.float64)) == 0:
            return cls(*_fit_location(x))
        from scipy.optimize import minimize_scalar

        n = np.asarray(lengths, np.float64)
        if n.shape != x.shape:
            raise ValueError(f"{len(n)} lengths for {len(x)} scores")

        def negative_log_likelihood(slope: float) -> float:
            mu, lam = _fit_location(x - slope * n)
            z = lam * (x - slope * n - mu)
            return float(-np.sum(np.log(lam) - z - np.exp(-z)))

        guess = np.polyfit(n, x, 1)[0]  # least squares: a bracket's start
        step = max(abs(guess), x.std() / n.std()) * 0.1
        slope = float(minimize_scalar(negative_log_likelihood, bracket=(guess, guess + step)).x)
        mu, lam = _fit_location(x - slope * n)
        return cls(mu=mu, lam=lam, slope=slope, lengths=(float(n.min()), float(n.max())))


def _fit_location(x: np.ndarray) -> tuple[float, float]:
    """``(mu, lam)`` of the plain Gumbel law by maximum likelihood. With ``beta = 1 / lam`` the
    likelihood equations are ``beta = mean(x) - sum(x w) / sum(w)``, ``w = exp(-x / beta)``
    (solved by bisection: the difference falls monotonically in beta) and ``mu = -beta log
    mean(w)``."""
    spread = float(x.std())
    if spread <= 1e-9 * max(1.0, float(np.abs(x).max())):  # equal but for the summation's rounding
        raise ValueError("all decoy scores are equal; cannot fit a Gumbel law")
    z = x - x.min()  # shift for stable exponentials; shifts mu only

    def excess(beta):
        w = np.exp(-z / beta)
        return z.mean() - (z * w).sum() / w.sum() - beta

    lo, hi = spread * 1e-6, spread * 10  # excess(lo) > 0 > excess(hi)
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
        if hi / lo < 1 + 1e-12:
            break
    beta = math.sqrt(lo * hi)
    mu = x.min() - beta * math.log(np.mean(np.exp(-z / beta)))
    return float(mu), 1.0 / beta


EULER_GAMMA = 0.5772156649015329  # the Gumbel law's mean is location + EULER_GAMMA / lam


# The composition shift charged is the excess less this many standard errors: a one-sided
# 99.9 % lower bound. Chosen on the training families' queries at 92,000 sequences as the
# most sensitive setting keeping unrelated hits within half of what the E-values allow
# (scripts/bench_search.py, README "Against 92,000 sequences").
SHIFT_STANDARD_ERRORS = 3.0


def composition_shift(null: Gumbel, shuffle_scores: np.ndarray, length: int) -> float:
    """How much a subject's own composition raises the query's scores, in nats: the mean
    score of the subject's shuffles above the null's mean at its length, less
    ``SHIFT_STANDARD_ERRORS`` standard errors (a lower bound: what the shuffles do not
    establish is not charged), and never below 0 (a shift only lowers a score)."""
    x = np.asarray(shuffle_scores, np.float64)
    excess = x.mean() - (float(null.location(length, lower=True)) + EULER_GAMMA / null.lam)
    return max(0.0, float(excess - SHIFT_STANDARD_ERRORS * x.std(ddof=1) / math.sqrt(len(x))))


def shuffled(seq: str, rng: np.random.Generator) -> str:
    """The residues of ``seq`` in random order (same length and composition)."""
    return "".join(rng.permutation(list(seq)))


def hit_columns(rec) -> dict | None:
    """The BLAST tabular columns (all but evalue / bitscore) of an AlignmentRecord, or None
    for an alignment without aligned pairs (no hit)."""
    pairs = rec.pairs
    if len(pairs) == 0:
        return None
    identical = int(identical_pairs(rec.seq_a, rec.seq_b, pairs).sum())
    steps = np.diff(pairs, axis=0) - 1  # unaligned residues of each sequence between pairs
    length = len(pairs) + int(steps.sum())
    conf = rec.confidence
    return {
        "qseqid": rec.id_a, "sseqid": rec.id_b,
        "pident": 100.0 * identical / length, "length": length,
        "mismatch": len(pairs) - identical, "gapopen": int((steps > 0).sum()),
        "qstart": int(pairs[0, 0]) + 1, "qend": int(pairs[-1, 0]) + 1,
        "sstart": int(pairs[0, 1]) + 1, "send": int(pairs[-1, 1]) + 1,
        "mean_confidence": float(conf.mean()) if conf is not None else float("nan"),
    }


@dataclasses.dataclass
class Hit:
    record: object  # AlignmentRecord
    columns: dict  # hit_columns plus evalue and bitscore
    score: float  # the pair's log-likelihood ratio (nats)
    shift: float = 0.0  # its composition shift (nats), taken off the score for the E-value


@dataclasses.dataclass
class QueryResult:
    query: FastaRecord
    hits: list[Hit]  # best first, after the E-value and count limits
    null: Gumbel
    n_database: int
    unaligned: int = 0  # subjects within the limits whose decoded alignment has no pair (no hit)


SCORE_CHUNK = 512  # subjects scored per call (progress moves per chunk)
SUBJECT_SHUFFLES = 10  # per subject that may be reported, for its composition shift
# Shorter queries get a warning: in a search of 1,212 shuffled Pfam sequences (null: every hit
# false) queries of 1, 3 and 5 residues drew 5.6x, 1.5x and 1.4x the expected false hits at
# E <= 1 (40 queries each); from 8 residues on the count was as expected or fewer.
MIN_CALIBRATED_QUERY = 8


def short_query_warning(query: FastaRecord) -> str | None:
    """The warning for a query too short for its E-values to hold (None: long enough)."""
    if len(query.seq) >= MIN_CALIBRATED_QUERY:
        return None
    return (f"Warning: {query.where}: query {query.id!r} has {len(query.seq)} residue(s): the E-values "
            f"of queries shorter than {MIN_CALIBRATED_QUERY} residues are optimistic (more unrelated "
            "hits than they promise); read its hits with caution")


def _check_options(*, decoys, max_hits, evalue, max_candidates, seed) -> None:
    """The search options in their ranges (the command line's), named as keywords."""
    def integer(x) -> bool:
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    problems = []
    if not (integer(decoys) and MIN_DECOYS <= decoys <= MAX_DECOYS):
        problems.append(f"decoys must be an integer from {MIN_DECOYS} to {MAX_DECOYS} (the E-value fit), got {decoys!r}")
    if max_hits is not None and not (integer(max_hits) and max_hits >= 1):
        problems.append(f"max_hits must be an integer >= 1 or None, got {max_hits!r}")
    if evalue is not None and not (isinstance(evalue, numbers.Real) and not isinstance(evalue, bool)
                                   and evalue >= 0):  # inf: every hit; nan fails this test
        problems.append(f"evalue must be a number >= 0 or None, got {evalue!r}")
    if max_candidates is not None and not (integer(max_candidates) and max_candidates >= 0):
        problems.append(f"max_candidates must be an integer >= 0 (0 or None: every subject), got {max_candidates!r}")
    if not (integer(seed) and seed >= 0):
        problems.append(f"seed must be an integer >= 0, got {seed!r}")
    if problems:
        raise ValueError("; ".join(problems))


def check_all_vs_all(sequences: Sequence) -> None:
    """All against all needs two usable sequences: one would be searched against nothing."""
    if len(sequences) < 2:
        raise ValueError(f"all against all (--all-vs-all; no database in Python) needs at least two usable "
                         f"sequences, found {len(sequences)}: give a database to search against")


def scored_per_query(n_database: int, max_candidates: int | None) -> int:
    """Database sequences a query's forward pass scores: all, or the prefilter's ``max_candidates``."""
    return n_database if max_candidates is None else min(n_database, max_candidates)


def search(predictor, queries: Sequence[FastaRecord], database: Sequence[FastaRecord], settings, errors, *,
           all_vs_all: bool = False, decoys: int = DEFAULT_DECOYS, max_hits: int | None = None,
           evalue: float | None = None, max_candidates: int | None = None, seed: int = 0,
           correct_composition: bool = True, advance: Callable[[int], None] = lambda n=1: None,
           advance_shuffles: Callable[[int], None] = lambda n=1: None,
           advance_hits: Callable[[int], None] = lambda n=1: None) -> Iterator[QueryResult | BadRecord]:
    """Streams one QueryResult per query (in order; see the module docstring for the score and
    the statistics) and the BadRecord of each hit that could not be aligned (also given to
    ``errors``, a ``batch.BatchErrors``). ``all_vs_all``: ``queries`` is ``database`` and a
    sequence is not searched against itself. ``max_candidates``: when the database has more
    sequences than this, only the ones ``prefilter.candidates`` ranks highest are scored
    (None: all). ``correct_composition``: charge each subject that may be reported its
    composition shift (``composition_shift``, from ``SUBJECT_SHUFFLES`` shuffles of it; the
    module docstring). ``advance(n)``: n more pairs scored (decoys and database,
    ``decoys + scored_per_query(N, max_candidates)`` per query); ``advance_shuffles(n)``: n
    more composition shuffles scored (``SUBJECT_SHUFFLES`` per decoy and per subject charged);
    ``advance_hits(n)``: n more hits aligned (their number is known only once a query's
    E-values are)."""
    _check_options(decoys=decoys, max_hits=max_hits, evalue=evalue, max_candidates=max_candidates, seed=seed)
    max_candidates = max_candidates or None  # 0: every subject, as on the command line
    if not database:
        raise ValueError("the database has no usable sequences")
    if all_vs_all:
        check_all_vs_all(database)
    local = settings.mode == "local"
    n_db = len(database) - (1 if all_vs_all else 0)
    index = None
    if scored_per_query(n_db, max_candidates) < n_db:
        from pfamalign.alignment import prefilter

        index = prefilter.Database.of([s.seq for s in database])

    def scores(query: FastaRecord, subjects: Sequence[str], *, count: Callable[[int], None] = advance) -> np.ndarray:
        from pfamalign.alignment.pairhmm_numba import log_likelihood_ratios

        out = []
        for at in range(0, len(subjects), SCORE_CHUNK):
            chunk = subjects[at:at + SCORE_CHUNK]
            out.append(log_likelihood_ratios(predictor.pairhmm, [(query.seq, s) for s in chunk], local=local))
            count(len(chunk))
        return np.concatenate(out) if out else np.zeros(0)

    def shifts(query: FastaRecord, null: Gumbel, subjects: Sequence[str]) -> np.ndarray:
        """Each subject's composition shift, from its own shuffles (seeded by the pair)."""
        rngs = [np.random.default_rng([seed, _sequence_key(query.seq), _sequence_key(s)]) for s in subjects]
        shuffles = [shuffled(s, rng) for s, rng in zip(subjects, rngs) for _ in range(SUBJECT_SHUFFLES)]
        per_subject = scores(query, shuffles, count=advance_shuffles).reshape(len(subjects), SUBJECT_SHUFFLES)
        return np.array([composition_shift(null, x, len(s)) for x, s in zip(per_subject, subjects)])

    # decoys are drawn from the database's sequences in sorted order, not as the file lists
    # them: the same database, reordered, gives the same decoys, so the same E-values
    pool = sorted(s.seq for s in database)
    for qn, query in enumerate(queries):
        warning = short_query_warning(query)
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
        rng = np.random.default_rng([seed, _sequence_key(query.seq)])  # not its position:
        # a query gets the same decoys, so the same E-values, alone or in any batch
        decoy_seqs = [shuffled(pool[n], rng) for n in rng.integers(len(pool), size=decoys)]
        decoy_lengths = None if local else [len(s) for s in decoy_seqs]
        try:
            decoy_scores = scores(query, decoy_seqs)
            null = Gumbel.fit(decoy_scores, decoy_lengths)
            if correct_composition:  # the decoys are charged as the subjects are: one meaning
                reference = null
                null = Gumbel.fit(decoy_scores - shifts(query, reference, decoy_seqs), decoy_lengths)
            null = dataclasses.replace(null, tail_from=TAIL_FROM)
        except ValueError as err:  # e.g. a database of one low-complexity sequence: every shuffle alike
            raise ValueError(f"query {query.id}: no E-values: {err} (the decoys are shuffles of the database's "
                             f"sequences; search a larger or more varied database)") from None
        if index is None:
            subjects = [s for sn, s in enumerate(database) if not (all_vs_all and sn == qn)]
        else:
            subjects = [database[sn] for sn in prefilter.candidates(
                query.seq, index, max_candidates, exclude=qn if all_vs_all else None)]
        score = scores(query, [s.seq for s in subjects])
        lengths = np.array([len(s.seq) for s in subjects])
        e_values = n_db * null.sf(score, lengths)
        # a subject whose composition resembles the query's (two membrane proteins) scores
        # high against it without homology, where most decoys do not: each subject that is
        # reported is charged its own shift. A shift only lowers a score, so a subject's
        # unshifted E-value bounds its shifted one from below: the subjects past the cutoff
        # stay past it, and the max_hits best are found by shifting the best by that bound
        # until they are all shifted (usually one or two rounds; a shifted subject can fall
        # behind one not yet shifted, which must then be charged too)
        shift = np.zeros(len(subjects))
        charged = np.zeros(len(subjects), bool) if correct_composition else np.ones(len(subjects), bool)
        reportable = np.flatnonzero(e_values <= evalue) if evalue is not None else np.arange(len(subjects))
        while True:
            e_values = n_db * null.sf(score - shift, lengths)
            ranked = reportable[np.lexsort((-(score - shift)[reportable], e_values[reportable]))]
            if evalue is not None:
                ranked = ranked[e_values[ranked] <= evalue]
            ranked = ranked[:max_hits]
            due = ranked[~charged[ranked]]
            if not len(due):
                break
            shift[due] = shifts(query, reference, [subjects[i].seq for i in due])
            charged[due] = True
        ranked = [int(i) for i in ranked]
        hits, unaligned = [], 0
        for item in aligned(predictor, (_pair(query, subjects[i], i) for i in ranked),
                            settings, errors):
            advance_hits(1)
            if isinstance(item, BadRecord):
                yield item
                continue
            pair, rec, _ = item
            columns = hit_columns(rec)
            unaligned += columns is None
            if columns is not None:
                i = pair["sn"]
                columns.update(evalue=float(e_values[i]),
                               bitscore=float(null.bits(score[i] - shift[i], lengths[i])))
                hits.append(Hit(rec, columns, float(score[i]), float(shift[i])))
        yield QueryResult(query, hits, null, n_db, unaligned)


def _sequence_key(seq: str) -> int:
    return int.from_bytes(hashlib.sha256(seq.encode()).digest()[:8], "little")


def _pair(query: FastaRecord, subject: FastaRecord, sn: int) -> dict:
    return {"q_id": query.id, "k_id": subject.id, "q_seq": query.seq, "k_seq": subject.seq,
            "target": None, "pid": None, "where": subject.where, "sn": sn}


def usable_records(items: Iterable[FastaRecord | BadRecord], predictor, errors) -> list[FastaRecord]:
    """The records of a FASTA stream that ``predictor`` can search: embeddable, and within the
    memory budget against a sequence as long as itself, which every pair and decoy of usable
    records then is (the longer sequence sets a pair's grid); the others go to ``errors``
    once (not once per query or decoy)."""
    kept = []
    for item in items:
        problem = None if isinstance(item, BadRecord) else predictor.pair_problem(item.seq, item.seq)
        if problem is not None:
            item = BadRecord(item.where, f"{item.id}: {problem}")
        if isinstance(item, BadRecord):
            errors.add(item)
        else:
            kept.append(item)
    return kept


def blast_evalue(evalue: float) -> str:
    """An E-value as BLAST+ tabular output prints it: ``0.0`` below 1e-180, two-decimal
    scientific below 0.0009, then 3 / 2 / 1 decimals below 0.1 / 1 / 10, an integer above."""
    if evalue < 1e-180:
        return "0.0"
    if evalue < 0.0009:
        return f"{evalue:.2e}"
    for below, decimals in ((0.1, 3), (1.0, 2), (10.0, 1)):
        if evalue < below:
            return f"{evalue:.{decimals}f}"
    return f"{evalue:.0f}"


def blast_bits(bits: float) -> str:
    """A bit score as BLAST+ prints it: 1 decimal in four places up to 99.9 (`` 9.2``), the
    integer part above (BLAST truncates), three-decimal scientific above 99999; never ``-0.0``."""
    if bits > 99999:
        return f"{bits:.3e}"
    if bits > 99.9:
        return str(int(bits))
    return f"{round(bits, 1) or 0.0:4.1f}"  # -0.0 is falsy: a rounded-away tiny loss prints 0.0


def format_tsv_row(columns: dict, names: Sequence[str] = COLUMNS) -> str:
    """One hit-table line of the columns ``names``, numbers as BLAST+ tabular output writes
    them (``pident`` 3 decimals, ``blast_evalue``, ``blast_bits``); ``mean_confidence`` 3
    decimals."""
    cells = []
    for name in names:
        value = columns[name]
        if name in ("pident", "mean_confidence"):
            cells.append(f"{value:.3f}")
        elif name == "evalue":
            cells.append(blast_evalue(value))
        elif name == "bitscore":
            cells.append(blast_bits(value))
        else:
            cells.append(str(value))
    return "\t".join(cells) + "\n"


def provenance_comments(provenance: dict | None = None) -> str:
    """What produced a hit table (``Predictor.provenance``), as ``#`` lines: they open the
    ``tsv`` and the ``-outfmt 7`` tables."""
    from pfamalign.alignment.formats import provenance_lines

    return "".join(f"# {line}\n" for line in provenance_lines(provenance))


def tsv_header(provenance: dict | None = None) -> str:
    """The hit table's comment lines: ``provenance_comments``, then the ``# Fields:`` line."""
    return provenance_comments(provenance) + "# Fields: " + ", ".join(COLUMNS) + "\n"


def blast7_block(result: QueryResult, database: str) -> str:
    """One query of a BLAST+ ``-outfmt 7`` table: its comment lines (the program and version,
    where BLAST+ writes ``# BLASTP 2.12.0+``; ``# Query:`` with the query's whole definition
    line (id and description, as BLAST+ writes it), ``# Database:``, the ``# Fields:``
    line when there are hits, ``# N hits found``), then its hits as ``-outfmt 6`` lines
    (``BLAST_COLUMNS``)."""
    from pfamalign import __version__

    definition = " ".join(filter(None, (result.query.id, result.query.description)))
    lines = [f"# pfamalign search {__version__}", f"# Query: {definition}", f"# Database: {database}"]
    if result.hits:
        lines.append("# Fields: " + ", ".join(BLAST_FIELD_NAMES.values()))
    lines.append(f"# {len(result.hits)} hits found")
    return "".join(line + "\n" for line in lines) + "".join(
        format_tsv_row(hit.columns, BLAST_COLUMNS) for hit in result.hits)


def blast7_footer(n_queries: int) -> str:
    return f"# pfamalign search processed {n_queries} queries\n"

