"""Batch jobs that survive bad records: ``align --pairs``, multi-FASTA ``align``, ``search`` and
``eval`` report a record they cannot use (its ``file:line`` and why) on standard error and in
their output, go on with the rest, and exit non-zero at the end; ``--strict`` stops at the
first one instead.

``aligned(predictor, items, settings, errors)`` runs pair records through the one batch API,
``Predictor.align_records``, after checking each one (residues, length) so that a bad pair
never reaches the engine, and hands back results and errors in input order although the
engine may read ahead of what it yields.
"""

from __future__ import annotations

import collections
import sys
from typing import Iterable, Iterator

from pfamalign.inputs import BadRecord


class BatchErrors:
    """The bad records of one job: each is echoed on standard error as it is met; ``strict``
    raises the first one instead (the command turns it into its error exit)."""

    def __init__(self, strict: bool = False, stream=None):
        self.strict = strict
        self.stream = stream
        self.records: list[BadRecord] = []

    def add(self, error: BadRecord) -> None:
        if self.strict:
            raise error
        self.records.append(error)
        print(f"Error: skipped {error}", file=self.stream or sys.stderr, flush=True)

    def __len__(self) -> int:
        return len(self.records)

    def summary(self) -> str:
        return (f"{len(self)} record(s) failed and were skipped (listed above); "
                "fix them, or pass --strict to stop at the first")


def check_pair(pair: dict, predictor) -> dict:
    """The pair record with validated, upper-cased residues; a BadRecord naming its ``where``
    when a sequence is not protein or the predictor cannot align the pair (empty, longer than
    its ``max_length``, over its memory budget: ``Predictor.pair_problem``) or an id cannot
    name it in the output (empty, with whitespace)."""
    from pfamalign.alignment.formats import id_problem
    from pfamalign.residues import input_sequence

    pair_name = f"{pair['q_id']} vs {pair['k_id']}"
    where = pair.get("where", pair_name)
    try:
        seqs = {}
        for key, id_key in (("q_seq", "q_id"), ("k_seq", "k_id")):
            problem = id_problem(pair[id_key])
            if problem is not None:
                raise ValueError(f"sequence id {problem}")
            seqs[key] = input_sequence(pair[key], name=str(pair[id_key]))
            problem = predictor.sequence_problem(seqs[key])
            if problem is not None:  # which of the two
                raise ValueError(f"{pair[id_key]}: {problem}")
        problem = predictor.pair_problem(seqs["q_seq"], seqs["k_seq"])
        if problem is not None:  # the two together (memory); named, unless ``where`` names them
            raise ValueError(problem if pair_name in where else f"{pair_name}: {problem}")
    except ValueError as err:
        raise BadRecord(where, str(err)) from err
    return {**pair, **seqs}


def aligned(predictor, items: Iterable[dict | BadRecord], settings, errors: BatchErrors
            ) -> Iterator[tuple[dict, object, object] | BadRecord]:
    """``(pair, AlignmentRecord, PairPlan)`` per usable pair and the ``BadRecord`` of each
    unusable one, in input order (each error is also given to ``errors`` when it is yielded)."""
    pending: collections.deque = collections.deque()  # what the engine has read, not yet yielded

    def usable() -> Iterator[dict]:
        for item in items:
            if not isinstance(item, BadRecord):
                try:
                    item = check_pair(item, predictor)
                except BadRecord as err:
                    item = err
            pending.append(item)
            if not isinstance(item, BadRecord):
                yield item
            elif errors.strict:  # read no further: the pairs before it are aligned and
                return  # yielded, then it raises in its turn (flush_errors)

    def flush_errors() -> Iterator[BadRecord]:
        while pending and isinstance(pending[0], BadRecord):
            error = pending.popleft()
            errors.add(error)
            yield error

    for rec, pp in predictor.align_records(usable(), settings):
        yield from flush_errors()
        yield pending.popleft(), rec, pp
    yield from flush_errors()
