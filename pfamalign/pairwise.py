"""The Python API: what ``pfamalign align`` does, as objects.

    import pfamalign

    aln = pfamalign.align("MKVLAAGIVGLLLAQSPEDRW", "MKVLSAGIVGLAQSPDRW")
    print(aln.format("text"))            # or emboss, fasta, stockholm, cigar, json
    aln.pairs, aln.confidence, aln.identity, aln.gapped()

    aligner = pfamalign.PairAligner(mode="local")      # a model and decoder loaded once
    for aln in aligner.align_many(records):            # (a, b) items, batched as the CLI does
        print(aligner.format(aln, "json"), end="")
    for result in aligner.search(queries, database):   # `pfamalign search`: ranked hits
        print(result.query.id, [(h.record.id_b, h.columns["evalue"]) for h in result.hits])

A ``PairAligner`` runs the same batch path as the command line (``batch.aligned`` over
``Predictor.align_records``), so each alignment it formats is byte for byte what ``pfamalign
align`` prints for that pair with the same model and decoder settings (a many-pair file of the
command opens its text once with a file header and names each pair on its CIGAR line). A pair
planned in a batch of another size can differ in the eighth digit of its numbers, and so in a
printed score's last digit (README, the rounding note under Quick start).
"""

from __future__ import annotations

import collections.abc
import io
import os
import threading
from typing import TYPE_CHECKING, Iterable, Iterator

from pfamalign import search as search_lib
from pfamalign.alignment.formats import AlignmentRecord, id_problem

if TYPE_CHECKING:
    from pfamalign.search import QueryResult

__all__ = ["PairAligner", "align", "AlignmentRecord"]

Sequence = "str | Bio.Seq.Seq | tuple[str, str] | Bio.SeqRecord.SeqRecord"  # one side of a pair


class PairAligner:
    """A loaded aligner model and its decoder settings.

    Args:
      model: a model directory (``pfamalign train``'s ``RUN`` or ``RUN/model``, an ensemble,
        a ``pfamalign compile`` output) or a shipped model's name; None: the default model.
      weights: ESM-2 weights, for models trained on ESM-2 features.
      engine, steps: how plans are computed (``sinkhorn``, ``steps`` with ``steps`` plain
        Sinkhorn steps, ``asap``), as ``pfamalign align --engine``.
      max_length: longest sequence accepted (residues).
      max_memory: refuse a pair whose estimated memory is larger: bytes or a size such as
        ``"8G"``; 0: no limit; None (default): the command line's default budget.
      **decoder: decoder settings overriding the model's ``decoding.json``, named as the
        command line's options without dashes: ``decoder``, ``mode``, ``gap_open``,
        ``gap_extend``, ``threshold``, ``gap_cost``, ``min_mass``, ``alpha``, ``objective``,
        ``plan_power``, ``plan_weight``.
    """

    def __init__(self, model: str | os.PathLike | None = None, *, weights=None,
                 engine: str = "sinkhorn", steps: int | None = None, max_length: int = 4096,
                 max_memory: int | str | None = None, **decoder):
        from pfamalign import compile_cache, resources
        from pfamalign.decoding import DecoderSettings
        from pfamalign.inference import Predictor
        from pfamalign.asap import MAX_ENGINE_STEPS

        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model is a directory path or a shipped model's name, got {type(model).__name__}")
        _check_int("max_length", max_length, 1)
        if steps is not None:
            _check_int("steps", steps, 1, MAX_ENGINE_STEPS)
        if max_memory is not None:
            if isinstance(max_memory, str):
                try:
                    resources.parse_size(max_memory)
                except ValueError as err:
                    raise ValueError(f"max_memory: {err}") from None
            else:
                _check_int("max_memory", max_memory, 0)
        # the command line's persistent cache: a process's first aligner compiles ~10 programs
        # (8-10 s of a 10-pair job on 2 cores) that a later process then loads
        compile_cache.enable_unless_configured()
        self.predictor = Predictor(model, weights=weights, max_length=max_length,
                                   max_memory=resources.budget(max_memory),
                                   engine=engine, steps=steps)
        self.decoding: DecoderSettings = self.predictor.decoding.override(**decoder)
        unread = self.decoding.unread(decoder)
        if unread:  # as the command line refuses them: they would change nothing
            raise ValueError(f"{', '.join(unread)} {'does' if len(unread) == 1 else 'do'} not apply to the "
                             f"{self.decoding.decoder} decoder, which reads "
                             f"{', '.join(self.decoding.READS[self.decoding.decoder])}")
        self.provenance: dict = self.predictor.provenance(self.decoding)

    def align(self, seq_a: Sequence, seq_b: Sequence) -> AlignmentRecord:
        """One pair. Each side is a sequence string (or a Biopython ``Seq``), an ``(id,
        sequence)`` tuple or an object with ``id`` and ``seq`` (a Biopython ``SeqRecord``).
        Raises ValueError naming the pair when it cannot be aligned (not protein, empty, too
        long, over the memory budget)."""
        named = [(default, str(x)) if isinstance(x, str) or _bio_seq(x) else x
                 for default, x in (("seq_a", seq_a), ("seq_b", seq_b))]  # as `pfamalign align A B`
        return next(self.align_many([named]))

    def align_many(self, pairs: Iterable[tuple[Sequence, Sequence]]) -> Iterator[AlignmentRecord]:
        """The alignments of ``pairs``, in order, computed in batches as they stream in (items as
        in ``align``). The first pair that cannot be aligned raises ValueError, naming it
        (``pair N``, 1-based, and its ids) once the pairs before it are yielded; an item that
        is no pair (not two sides, a dict or a set, a side of the wrong type) raises TypeError,
        also in its place. Sequence strings get the ids of a ``--pairs`` file's line N:
        ``pairN_a``, ``pairN_b``."""
        from pfamalign.batch import BatchErrors, aligned
        from pfamalign.inputs import BadRecord, bare_pair

        def record(n: int, a, b) -> dict:
            (id_a, sa), (id_b, sb) = _side(a, f"pair{n}_a", n), _side(b, f"pair{n}_b", n)
            return {**bare_pair(id_a, sa, id_b, sb), "where": f"pair {n} ({id_a} vs {id_b})"}

        if isinstance(pairs, (str, bytes)):
            raise TypeError("align_many takes an iterable of (a, b) pairs, got a single string")

        def pair_of(n: int, pair) -> tuple:  # a dict or a set has no order of sides
            if (isinstance(pair, (str, bytes, collections.abc.Mapping, collections.abc.Set))
                    or not hasattr(pair, "__len__") or len(pair) != 2):
                raise TypeError(f"pair {n}: each item is an (a, b) tuple or list of two sequences, got "
                                f"{type(pair).__name__}" + (f" of length {len(pair)}" if hasattr(pair, "__len__") else ""))
            return pair

        class Malformed(BadRecord):  # an item that is no pair: raised as the TypeError it is
            def __init__(self, err: TypeError):
                super().__init__("align_many", str(err))
                self.error = err

        def records() -> Iterator[dict | BadRecord]:
            for n, pair in enumerate(pairs, start=1):
                try:
                    yield record(n, *pair_of(n, pair))
                except TypeError as err:
                    yield Malformed(err)  # in its place: the pairs before it come out first
                    return

        # not strict: a bad record comes out in its place, after the pairs read before it
        errors = BatchErrors(stream=io.StringIO())  # raised here, not printed
        for item in aligned(self.predictor, records(), self.decoding, errors):
            if isinstance(item, BadRecord):
                raise item.error if isinstance(item, Malformed) else item
            yield item[1]

    def search(self, queries: Iterable[Sequence], database: Iterable[Sequence] | None = None, *,
               evalue: float | None = search_lib.DEFAULT_EVALUE,
               max_hits: int | None = search_lib.DEFAULT_MAX_HITS, decoys: int = search_lib.DEFAULT_DECOYS,
               max_candidates: int | None = search_lib.DEFAULT_MAX_CANDIDATES, seed: int = 0
               ) -> Iterator["QueryResult"]:
        """``pfamalign search`` (same defaults): one ``search.QueryResult`` per query, in
        order, its ``hits`` best first, each with its ``record`` (an ``AlignmentRecord``),
        ``score`` and BLAST ``columns`` (``evalue``, ``bitscore``, ``pident``, ...). No
        ``database``: all against all of ``queries``, none against itself. Items as in
        ``align``; sequence strings get ids ``query1``, ``query2``, ... and ``subject1``, ...
        ``max_candidates`` None: every subject scored (no prefilter). A sequence that cannot
        be searched raises ValueError naming it, before any work."""
        from pfamalign.batch import BatchErrors
        from pfamalign.inputs import FastaRecord
        from pfamalign.residues import input_sequence

        def records(items, role: str) -> list:
            out = []
            for n, item in enumerate(items, start=1):
                name, seq = _side(item, f"{role}{n}", n, what=f"{role} {n}")
                where = f"{role} {n} ({name})"
                problem = id_problem(name)  # a hit's id is a tabular column: checked before any work
                if problem is not None:
                    raise ValueError(f"{where}: the sequence id {problem}")
                try:  # residues checked as the FASTA reader checks them
                    out.append(FastaRecord(name, input_sequence(seq, name=name), where))
                except ValueError as err:
                    raise ValueError(f"{where}: {err}") from None
            return out

        for name, items in (("queries", queries), ("database", database)):
            if isinstance(items, (str, bytes)):
                raise TypeError(f"{name} is a list of sequences, got a single string: wrap it in a list")
            if isinstance(items, (collections.abc.Mapping, collections.abc.Set)):  # keys / no order
                raise TypeError(f"{name} is a list of sequences or (id, sequence) pairs, got a "
                                f"{type(items).__name__}: pass list(d.items()) for a dict of id -> sequence")
        errors = BatchErrors(strict=True)  # a bad sequence raises (its BadRecord: a ValueError)
        query_records = search_lib.usable_records(records(queries, "query"), self.predictor, errors)
        db = (query_records if database is None
              else search_lib.usable_records(records(database, "subject"), self.predictor, errors))
        if not query_records:
            raise ValueError("no query sequences")
        yield from search_lib.search(self.predictor, query_records, db, self.decoding, errors,
                              all_vs_all=database is None, decoys=decoys, max_hits=max_hits,
                              evalue=evalue, max_candidates=max_candidates, seed=seed)

    def format(self, aln: AlignmentRecord, fmt: str = "text") -> str:
        """``aln`` as ``pfamalign align -f FMT`` writes one pair, with this aligner's provenance
        in the formats that carry it."""
        if not isinstance(aln, AlignmentRecord):
            raise TypeError(f"format takes an AlignmentRecord (what align returns), got {type(aln).__name__}")
        return aln.format(fmt, provenance=self.provenance)


def _side(item, default_id: str, n: int, *, what: str | None = None) -> tuple[str, str]:
    """``(id, sequence)`` of one side of pair ``n`` (or of the sequence called ``what``)."""
    if isinstance(item, str) or _bio_seq(item):
        return default_id, str(item)
    if hasattr(item, "id") and hasattr(item, "seq"):  # a Biopython SeqRecord
        if item.seq is None or isinstance(item.seq, (bytes, bytearray)):
            raise TypeError(f"{what or f'pair {n}'}: the record's seq is a string or a Bio.Seq, got "
                            f"{type(item.seq).__name__}")
        return str(item.id), str(item.seq)
    if isinstance(item, tuple) and len(item) == 2:
        name, seq = item
        if not isinstance(name, str):
            raise TypeError(f"{what or f'pair {n}'}: an (id, sequence) tuple's id is a string, got "
                            f"{type(name).__name__} {name!r}")
        if isinstance(seq, str) or _bio_seq(seq):
            return name, str(seq)
        raise TypeError(f"{what or f'pair {n}'}: an (id, sequence) tuple's sequence is a string or a Bio.Seq, "
                        f"got {type(seq).__name__}")
    kind = "each side" if what is None else "each item"
    raise TypeError(f"{what or f'pair {n}'}: {kind} is a sequence string (or Bio.Seq), an (id, "
                    f"sequence) tuple or a SeqRecord, got {type(item).__name__}")


def _bio_seq(item) -> bool:
    """A Biopython ``Seq`` or ``MutableSeq`` (recognized without importing Biopython)."""
    return type(item).__module__ == "Bio.Seq" and type(item).__name__ in ("Seq", "MutableSeq")


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    """``value`` is an integer (not a bool) in [low, high]; else the error names ``name``."""
    import numbers

    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise (ValueError if ok or isinstance(value, numbers.Real) else TypeError)(
            f"{name} must be an integer {bound}, got {value!r}")


_DEFAULT: list[PairAligner] = []  # the default model's aligner, made once per process
_DEFAULT_LOCK = threading.Lock()


def _default_aligner() -> PairAligner:
    """The default model's aligner, made by the first call (a lock: threads calling ``align``
    at once each loaded the model, where an lru_cache let them all miss)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(PairAligner())
        return _DEFAULT[0]


def align(seq_a: Sequence, seq_b: Sequence, **settings) -> AlignmentRecord:
    """One pair with the default model (loaded once per process and kept) or, given
    ``settings`` (``PairAligner``'s arguments), with an aligner made for this call."""
    aligner = PairAligner(**settings) if settings else _default_aligner()
    return aligner.align(seq_a, seq_b)
