"""Null search: are `pfamalign search`'s E-values true at database scale? Queries of held-out
families against a database of shuffled sequences (every hit false): the hits at E <= x
against the x per query the E-values allow, with the null law's exponential tail
(``search.TAIL_FROM``, the default) and without it (the plain Gumbel fit, before 2026-11-25).

    nice python scripts/bench_null_search.py --json --mode local     # the README figures (~5 min)
    nice python scripts/bench_null_search.py --json --mode global

Queries: ``--queries`` sequences (seeded draw) of the dataset's ``--split`` families (default:
the test split of ``data_b62_1k``, families the shipped model never trained on), at most
``--max-len`` residues. Database: ``--database`` shuffles (residue order permuted: same
length and composition, no homology) of sequences drawn from the same families. Every
subject is scored (no prefilter), the composition shift on, as `search` runs by default.
One JSON line per setting: the hit counts at each E-value and what they allow.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

import _common
from bench_search import DEFAULT_DATA, family_sequences

THRESHOLDS = (10.0, 1.0, 0.1, 0.01, 0.001)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA,
                        help=f"prepared dataset (default {DEFAULT_DATA}, relative to the working directory)")
    parser.add_argument("--split", default="test", help="families of this split (default test)")
    parser.add_argument("--queries", type=int, default=24, help="query sequences (default 24)")
    parser.add_argument("--database", type=int, default=20000, help="shuffled database sequences (default 20000)")
    parser.add_argument("--max-len", type=int, default=400, help="longest sequence used (default 400)")
    parser.add_argument("--mode", choices=("global", "local"), default="local", help="decoder mode (default local)")
    parser.add_argument("--decoys", type=int, default=50, help="decoys per query (default 50, as search)")
    parser.add_argument("--seed", type=int, default=5)
    _common.add_output_args(parser, repeats=None)
    args = parser.parse_args(argv)

    import pfamalign
    from pfamalign import search as lib

    seqs = [s for _, _, s in family_sequences(args.data, args.split, None, args.max_len, 0)]
    if not seqs:
        raise SystemExit(f"no sequences in the {args.split} split of {args.data}")
    rng = np.random.default_rng(args.seed)
    queries = [(f"q{i}", seqs[i]) for i in rng.choice(len(seqs), min(args.queries, len(seqs)), replace=False)]
    database = [(f"s{j}", lib.shuffled(seqs[i], rng)) for j, i in enumerate(rng.integers(len(seqs), size=args.database))]
    aligner = pfamalign.PairAligner(mode=args.mode)
    config = {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}
    report = _common.Report(f"null search ({args.mode} mode): {len(queries)} queries against {len(database):,} "
                            "shuffled sequences, every hit false",
                            ["tail", *(f"E<={t:g}" for t in THRESHOLDS), "seconds"],
                            json_lines=args.json, script="bench_null_search", config=config)
    shipped = lib.TAIL_FROM
    try:
        for tail in (shipped, None):
            lib.TAIL_FROM = tail
            start = time.perf_counter()
            evalues = np.array([h.columns["evalue"] for result in aligner.search(
                queries, database, evalue=max(THRESHOLDS), max_hits=None, decoys=args.decoys,
                max_candidates=0) for h in result.hits])
            report.add(tail="none (plain Gumbel)" if tail is None else f"from P = {tail:g}",
                       **{f"E<={t:g}": int((evalues <= t).sum()) for t in THRESHOLDS},
                       allowed={f"E<={t:g}": t * len(queries) for t in THRESHOLDS},
                       seconds=time.perf_counter() - start)
    finally:
        lib.TAIL_FROM = shipped
    report.note("allowed: " + " / ".join(f"{t * len(queries):g}" for t in THRESHOLDS)
                + f" at E <= {' / '.join(f'{t:g}' for t in THRESHOLDS)} ({len(queries)} queries)")
    report.finish()


if __name__ == "__main__":
    main()
