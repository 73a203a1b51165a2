"""Retrieval on held-out Pfam families: pfamalign search against Smith-Waterman BLOSUM62,
NCBI BLAST+ ``blastp`` and HMMER's ``phmmer`` (each tool skipped, with a note, when it is not
on PATH).

    nice -n 10 python scripts/bench_search.py --json          # the README figures (~5 min)
    python scripts/bench_search.py --per-family 3 --decoys 10  # a quick look

Sequences: ``--per-family`` sequences (seeded draw, at most ``--max-len`` residues) of every
family of the dataset's ``--split`` (default: the test split of ``data_b62_1k``, the dataset
``pfamalign/assets/default_model/TRAINING.md`` builds,
families the shipped model never trained on) with at least three usable sequences; a family
present in two source files is read from the first. Every sequence is a query against all
the others (``pfamalign.search.search`` with ``all_vs_all``); a hit is relevant when it comes
from the query's family. Both methods rank the same pairs: pfamalign by its bit score (the
order of ``pfamalign search``: its E-values, which depend on the subject's length, not on
the raw log-odds alone), SW by its BLOSUM62 score (gap open 11, extend 1).

With ``--background N`` the database also holds N sequences of the other splits' families
(unrelated to every query) for every method, and each query is searched against the whole
database (its own entry left out of the figures): the setting of the search prefilter
(``--max-candidates``; the share of related pairs among each query's candidates is reported).
``--background-fasta FILE`` (repeatable) adds every sequence of FILE (a FASTA file, aligned
or not: gaps are dropped; a family named by the file's stem, whose sequences are then no
queries) to it, e.g. the ~90,000 Pfam full-alignment domains of ``pfam/full_match_columns``
(training families) for a database at the scale where the prefilter matters.

Per query: ROC1 (the share of the query's relatives scored above its best-scoring unrelated
sequence) and average precision; the figures are means over queries with 95 % intervals
from a bootstrap over *families* (the queries of a family are not independent), and the
paired differences pfamalign - tool on the same resamples. Calibration (pfamalign, blastp,
phmmer: the tools with E-values): unrelated hits with E <= 0.1, 1 and 10 against what the
E-values promise (at most x per query; every tool's E-values are for this database);
sensitivity: the share of related pairs found at E <= 1e-3, 0.01, 1 and 10.
One JSON line per method, one per difference, one per tool for calibration.
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterable

import numpy as np

import _common

DEFAULT_DATA = pathlib.Path("data_b62_1k")  # built as the shipped model's TRAINING.md says


def family_sequences(data: pathlib.Path, split: str, per_family: int | None, max_len: int, seed: int,
                     max_families: int | None = None, *, other_splits: bool = False
                     ) -> list[tuple[str, str, str]]:
    """``(family, id, residues)`` of the chosen sequences (see the module docstring);
    ``per_family`` None: every usable one; ``other_splits``: of the families outside
    ``split``."""
    from pfamalign.pipelines.pairs import family_arrays
    from pfamalign.pipelines.stockholm import read_families

    rng = np.random.default_rng(seed)
    chosen, seen = [], set()
    with open(data / "families.tsv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle, delimiter="\t") if (r["split"] == split) != other_splits]
    for row in rows:
        base = row["accession_base"]
        if base in seen or len(seen) == max_families:
            continue
        for family in read_families([row["source"]]):
            fa = family_arrays(family)
            usable = [i for i, s in enumerate(fa.residues) if 10 <= len(s) <= max_len]
            if len(usable) < 3:
                continue
            seen.add(base)
            for i in sorted(rng.choice(usable, min(per_family or len(usable), len(usable)), replace=False)):
                chosen.append((base, family.seq_ids[i].replace(" ", "_"), fa.residues[i]))
    return chosen


def background_sequences(path: pathlib.Path, max_len: int) -> list[tuple[str, str, str]]:
    """``(family, id, residues)`` of every distinct sequence of FASTA ``path`` (gaps dropped,
    upper-cased) of 10 to ``max_len`` residues; the family is the file's stem."""
    from pfamalign.inputs import BadRecord, fasta_records

    seen, out = set(), []
    with open(path) as handle:
        records = list(fasta_records(handle, str(path), validate=False))  # aligned: gaps allowed
    for rec in records:
        if isinstance(rec, BadRecord):
            raise SystemExit(str(rec))
        seq = rec.seq.replace("-", "").replace(".", "").upper()
        if 10 <= len(seq) <= max_len and seq not in seen:
            seen.add(seq)
            out.append((path.stem, f"{path.stem}_{len(out)}", seq))
    return out


def _fasta(path: pathlib.Path, records) -> None:
    path.write_text("".join(f">{r.id}\n{r.seq}\n" for r in records))


def _tool_matrices(hits: Iterable[tuple[str, str, float, float]], index: dict[str, int], n_queries: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(bits, evalues)`` ``[n_queries, n]`` from ``(query, subject, evalue, bits)`` rows (the
    queries are the database's first ``n_queries``): a pair's best row (a tool may report
    several HSPs or domains of one pair), NaN where none."""
    n = len(index)
    bits, evalues = np.full((n_queries, n), np.nan), np.full((n_queries, n), np.nan)
    for q, s, e, b in hits:
        i, j = index[q], index[s]
        if np.isnan(bits[i, j]) or b > bits[i, j]:
            bits[i, j], evalues[i, j] = b, e
    return bits, evalues


def blastp(queries, records, index: dict[str, int], work: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    _fasta(work / "db.fasta", records)
    _fasta(work / "queries.fasta", queries)
    subprocess.run(["makeblastdb", "-in", str(work / "db.fasta"), "-dbtype", "prot", "-out", str(work / "db")],
                   check=True, capture_output=True)
    out = subprocess.run(["blastp", "-query", str(work / "queries.fasta"), "-db", str(work / "db"), "-evalue", "1e6",
                          "-max_target_seqs", str(len(records)), "-outfmt", "6 qseqid sseqid evalue bitscore"],
                         check=True, capture_output=True, text=True).stdout
    rows = (line.split("\t") for line in out.splitlines() if line)
    return _tool_matrices(((q, s, float(e), float(b)) for q, s, e, b in rows), index, len(queries))


def phmmer(queries, records, index: dict[str, int], work: pathlib.Path, *, filters: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """``filters`` False: ``--max``, HMMER's acceleration filters off (every pair scored)."""
    _fasta(work / "db.fasta", records)
    _fasta(work / "queries.fasta", queries)
    subprocess.run(["phmmer", "--noali", "-o", os.devnull, "--tblout", str(work / "hits.tbl"), "-E", "1e6",
                    "--domE", "1e6", "--cpu", "2", *([] if filters else ["--max"]),
                    str(work / "queries.fasta"), str(work / "db.fasta")], check=True, capture_output=True)
    rows = (line.split() for line in (work / "hits.tbl").read_text().splitlines() if not line.startswith("#"))
    # --tblout: target, its accession, query, its accession, full-sequence E-value, score, ...
    return _tool_matrices(((t[2], t[0], float(t[4]), float(t[5])) for t in rows), index, len(queries))


TOOLS = {"blastp": ("NCBI BLAST+ blastp", "blastp", blastp), "phmmer": ("HMMER phmmer", "phmmer", phmmer),
         "phmmer_max": ("HMMER phmmer --max", "phmmer", lambda *a: phmmer(*a, filters=False))}


def roc1_ap(scores: np.ndarray, relevant: np.ndarray) -> tuple[float, float]:
    """ROC1 and average precision of one query's ranking (higher score first; ties broken
    against the relevant ones, so a constant score earns nothing)."""
    order = np.lexsort((relevant, -scores))  # by score, unrelated first among equals
    rel = relevant[order]
    n_pos = rel.sum()
    first_negative = np.argmax(~rel) if (~rel).any() else len(rel)
    roc1 = rel[:first_negative].sum() / n_pos
    ranks = np.flatnonzero(rel) + 1
    ap = float(np.mean(np.arange(1, n_pos + 1) / ranks))
    return float(roc1), ap


def family_bootstrap(values: dict[str, np.ndarray], families: np.ndarray, n_boot: int, seed: int) -> dict:
    """Mean over queries and 95 % percentile interval over family resamples, for each array
    in ``values`` (the same resamples for all)."""
    rng = np.random.default_rng(seed)
    names = np.unique(families)
    members = [np.flatnonzero(families == f) for f in names]
    out = {k: {"mean": float(v.mean()), "boot": []} for k, v in values.items()}
    for _ in range(n_boot):
        idx = np.concatenate([members[i] for i in rng.integers(len(names), size=len(names))])
        for k, v in values.items():
            out[k]["boot"].append(v[idx].mean())
    for k in out:
        lo, hi = np.percentile(out[k].pop("boot"), [2.5, 97.5])
        out[k]["ci"] = [round(float(lo), 4), round(float(hi), 4)]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA,
                        help=f"dataset directory with families.tsv (default {DEFAULT_DATA})")
    parser.add_argument("--split", default="test", help="families of this split (default test)")
    parser.add_argument("--per-family", type=int, default=6, help="sequences per family (default 6)")
    parser.add_argument("--max-families", type=int, default=None, help="use only the first N families")
    parser.add_argument("--max-len", type=int, default=400, help="longest sequence used (default 400)")
    parser.add_argument("--decoys", type=int, default=30, help="decoys per query for the E-values (default 30)")
    parser.add_argument("--background", type=int, default=0,
                        help="add this many sequences of the other splits' families to the database of "
                             "every method (unrelated to every query; default 0)")
    parser.add_argument("--background-fasta", type=pathlib.Path, action="append", default=[],
                        help="add every sequence of this FASTA file to the database (repeatable; its "
                             "family is the file's stem and must not be a query family)")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"external tools to compare, comma-separated (default {','.join(TOOLS)})")
    parser.add_argument("--timed-queries", type=int, default=8,
                        help="queries searched with and without the prefilter for its speed (default 8)")
    parser.add_argument("--prefilter-pool", type=int, default=None,
                        help="the prefilter's second stage scores this many times --max-candidates "
                             "subjects (default: prefilter.POOL; 1: the first stage alone)")
    parser.add_argument("--max-candidates", type=int, default=None,
                        help="pfamalign search's --max-candidates (default: its default; 0: score all)")
    parser.add_argument("--evalue", type=float, default=None,
                        help="pfamalign reports (and aligns) hits up to this E-value (default: every pair; "
                             "10, search's default, keeps --background runs short)")
    parser.add_argument("--no-sw", action="store_true", help="leave out Smith-Waterman (slow with --background)")
    parser.add_argument("--compare-composition", action="store_true",
                        help="also run pfamalign search without its composition shift (a method of its own)")
    parser.add_argument("--checkpoint", type=pathlib.Path, default=None, help="model (default: the shipped one)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="family resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--objective", choices=("accuracy", "f1"), default=None,
                        help="decoder objective (default: the model's, as `pfamalign search`)")
    parser.add_argument("--mode", choices=("global", "local"), default=None,
                        help="decoder mode (default: the model's, as `pfamalign search`)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="posterior decoder: the plan's share (default: the model's)")
    _common.add_output_args(parser, repeats=None)
    args = parser.parse_args(argv)

    from pfamalign import search as lib
    from pfamalign.alignment.baselines import smith_waterman
    from pfamalign.batch import BatchErrors
    from pfamalign.evaluation import training_overlap
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord

    chosen = family_sequences(args.data, args.split, args.per_family, args.max_len, args.seed,
                              args.max_families)
    in_background = {path.stem for path in args.background_fasta}
    chosen = [c for c in chosen if c[0] not in in_background]  # a background family queries nothing
    tools = [t for t in args.tools.split(",") if t]
    unknown = set(tools) - set(TOOLS)
    if unknown:
        parser.error(f"--tools: unknown {sorted(unknown)}; choose from {','.join(TOOLS)}")
    n = len(chosen)  # the queries
    if args.background:
        pool = family_sequences(args.data, args.split, None, args.max_len, args.seed, other_splits=True)
        picked = np.random.default_rng(args.seed).choice(len(pool), min(args.background, len(pool)), replace=False)
        chosen += [pool[i] for i in sorted(picked)]
    for path in args.background_fasta:
        chosen += background_sequences(path, args.max_len)
    has_background = len(chosen) > n
    database = [FastaRecord(f"{n}_{sid}", seq, fam) for n, (fam, sid, seq) in enumerate(chosen)]
    records = database[:n]
    family_of = {r.id: fam for r, (fam, _, _) in zip(database, chosen)}
    index = {r.id: n for n, r in enumerate(database)}
    n, m = len(records), len(database)
    max_candidates = lib.DEFAULT_MAX_CANDIDATES if args.max_candidates is None else args.max_candidates or None
    predictor = Predictor(args.checkpoint)
    if args.prefilter_pool is not None:
        from pfamalign.alignment import prefilter

        prefilter.POOL = args.prefilter_pool
    families = sorted({family_of[r.id] for r in records})  # the queries'
    overlap = training_overlap(predictor.path, families) or {}
    config = {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items() if k != "json"}
    config.update(n_sequences=n, n_database=m, families=families, trained_on=overlap.get("trained_on", []),
                  tuned_on=overlap.get("tuned_on", []))
    report = _common.Report("retrieval: each sequence against all others, same family = relevant",
                            ["method", "roc1", "roc1_ci", "map", "map_ci", "seconds"],
                            json_lines=args.json, script="bench_search", config=config)

    settings = predictor.decoding.override(objective=args.objective, alpha=args.alpha, mode=args.mode)

    def run_pfamalign(correct_composition: bool) -> tuple[np.ndarray, np.ndarray, float]:
        """``(bit scores, E-values, seconds)``: without background all against all; with it,
        the queries against the database they open (its self-hit left out below)."""
        model_scores, evalues = np.full((n, m), np.nan), np.full((n, m), np.nan)
        start = time.perf_counter()
        for done, result in enumerate(lib.search(
                predictor, records, database, settings, BatchErrors(strict=True), all_vs_all=not has_background,
                decoys=args.decoys, seed=args.seed, evalue=args.evalue, max_candidates=max_candidates,
                correct_composition=correct_composition), start=1):
            q = index[result.query.id]
            for hit in result.hits:
                s = index[hit.columns["sseqid"]]
                if s != q:
                    model_scores[q, s], evalues[q, s] = hit.columns["bitscore"], hit.columns["evalue"]
            print(f"  query {done}/{n}", file=sys.stderr, flush=True)
        return model_scores, evalues, time.perf_counter() - start

    methods = {"pfamalign": ("pfamalign", *run_pfamalign(True))}
    model_seconds = methods["pfamalign"][3]
    if args.compare_composition:
        methods["noshift"] = ("pfamalign --no-composition-shift", *run_pfamalign(False))
    start = time.perf_counter()
    if not args.no_sw:
        sw_scores = np.full((n, m), np.nan)
        for a in range(n):
            for b in range(m):
                if a != b:
                    sw_scores[a, b] = smith_waterman(records[a].seq, database[b].seq).score
        methods["sw"] = ("SW-BLOSUM62", sw_scores, None, time.perf_counter() - start)
    for key in tools:
        label, binary, run = TOOLS[key]
        if shutil.which(binary) is None:
            report.note(f"{label}: {binary} is not on PATH, skipped")
            continue
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:
            bits, tool_evalues = run(records, database, index, pathlib.Path(work))
        methods[key] = (label, bits, tool_evalues, time.perf_counter() - start)

    fam_db = np.array([family_of[r.id] for r in database])
    fam = fam_db[:n]
    per_query = {f"{name}_{x}": [] for name in methods for x in ("roc1", "ap")}
    for q in range(n):
        others = np.arange(m) != q
        relevant = fam_db[others] == fam[q]
        for name, (_, scores, _, _) in methods.items():
            row = np.nan_to_num(scores[q, others], nan=-np.inf)  # a pair without a hit ranks last
            roc1, ap = roc1_ap(row, relevant)
            per_query[f"{name}_roc1"].append(roc1)
            per_query[f"{name}_ap"].append(ap)
    values = {k: np.array(v) for k, v in per_query.items()}
    baselines = [m for m in methods if m != "pfamalign"]
    for name in baselines:
        for x in ("roc1", "ap"):
            values[f"diff_{name}_{x}"] = values[f"pfamalign_{x}"] - values[f"{name}_{x}"]
    boot = family_bootstrap(values, fam, args.bootstrap, args.seed)
    rows = [(name, label, seconds) for name, (label, _, _, seconds) in methods.items()]
    rows += [(f"diff_{name}", f"pfamalign - {methods[name][0]}", None) for name in baselines]
    for name, label, seconds in rows:
        report.add(method=label, roc1=boot[f"{name}_roc1"]["mean"], roc1_ci=boot[f"{name}_roc1"]["ci"],
                   map=boot[f"{name}_ap"]["mean"], map_ci=boot[f"{name}_ap"]["ci"], seconds=seconds,
                   n_queries=n, n_families=len(families))
    itself = np.eye(n, m, dtype=bool)
    unrelated = (fam[:, None] != fam_db[None, :]) & ~itself
    related = (fam[:, None] == fam_db[None, :]) & ~itself
    for name, (label, _, tool_evalues, _) in methods.items():
        if tool_evalues is None:
            continue
        found = np.nan_to_num(tool_evalues, nan=np.inf)  # not reported: not found at any E
        calibration = {f"unrelated_hits_E<={x}": int((found[unrelated] <= x).sum()) for x in (0.1, 1, 10)}
        sensitivity = {f"related_found_E<={x:g}": round(float((found[related] <= x).mean()), 4)
                       for x in (1e-3, 0.01, 1, 10)}
        scored = lib.scored_per_query(m - (0 if has_background else 1), max_candidates)
        extra = {"model_pairs_per_s": n * (scored + args.decoys) / model_seconds} if name == "pfamalign" else {}
        report.add(method=f"calibration: {label}", seconds=None, n_queries=n, **calibration,
                   expected_at_most={f"E<={x}": x * n for x in (0.1, 1, 10)}, **sensitivity, **extra)
        report.note(f"{label}: unrelated hits with E <= 0.1 / 1 / 10: {list(calibration.values())} "
                    f"(E-values promise at most {0.1 * n:g} / {n} / {10 * n}); related pairs found at "
                    f"E <= 1e-3 / 0.01 / 1 / 10: {list(sensitivity.values())}")
    if max_candidates is not None and max_candidates < m - 1:
        from pfamalign.alignment import prefilter

        index_db = prefilter.Database.of([r.seq for r in database])
        passed = np.zeros((n, m), bool)
        for q in range(n):
            passed[q, prefilter.candidates(records[q].seq, index_db, max_candidates,
                                             exclude=None if has_background else q)] = True
        share = float(passed[related].mean())
        # speed in this run: the first queries searched with and without the prefilter, alternating
        timed = records[:args.timed_queries]
        seconds = {"exhaustive": 0.0, "prefiltered": 0.0}
        for _ in range(2):
            for name, keep in (("exhaustive", None), ("prefiltered", max_candidates)):
                start = time.perf_counter()
                for _ in lib.search(predictor, timed, database, settings, BatchErrors(strict=True),
                                    decoys=args.decoys, seed=args.seed, evalue=args.evalue, max_candidates=keep):
                    pass
                seconds[name] += (time.perf_counter() - start) / 2
        report.add(method="prefilter: related pairs passed", seconds=None, n_queries=n,
                   related_passed=round(share, 4), max_candidates=max_candidates, timed_queries=len(timed),
                   seconds_exhaustive=round(seconds["exhaustive"], 2),
                   seconds_prefiltered=round(seconds["prefiltered"], 2),
                   speedup=round(seconds["exhaustive"] / seconds["prefiltered"], 2))
        report.note(f"prefilter: {share:.4f} of related pairs among each query's {max_candidates} candidates; "
                    f"{len(timed)} queries searched in {seconds['prefiltered']:.1f} s against "
                    f"{seconds['exhaustive']:.1f} s exhaustive (mean of two alternating runs)")
    report.note(f"{n} queries from {len(families)} {args.split} families ({', '.join(families)}); "
                f"database {m} sequences ({m - n} background: other splits, --background-fasta)")
    report.finish()


if __name__ == "__main__":
    main()
