"""``pfamalign search``: align queries with a database of sequences and rank the hits."""

from __future__ import annotations

import pathlib

import click

from pfamalign import inputs
from pfamalign import search as lib  # the defaults, one place (numpy: only this command loads it)
from pfamalign.commands._common import (Number, OutputFile, batch_options, batch_progress, check_outputs,
                                       checkpoint_option, decoder_options, decoder_settings, engine_options, error_line,
                                       fail, max_length_option, max_memory_option)


@click.command(short_help="Search queries against a database: hits, E-values.")
@click.argument("query")
@click.argument("database", required=False)
@click.option("--all-vs-all", is_flag=True,
              help="Search every sequence of QUERY against all the others (no DATABASE).")
@click.option("--max-hits", type=click.IntRange(min=1), default=lib.DEFAULT_MAX_HITS, show_default=True,
              help="Report at most this many hits per query (the best).")
@click.option("--evalue", type=Number(min=0, finite=False), default=lib.DEFAULT_EVALUE, show_default=True,
              help="Report hits with an E-value at most this.")
@click.option("--decoys", type=click.IntRange(min=lib.MIN_DECOYS, max=lib.MAX_DECOYS), default=lib.DEFAULT_DECOYS,
              show_default=True,
              help="Shuffled decoys scored per query for the E-value fit, each at the time of one "
                   "more subject scored. The fit is loose at the default: across --seed a "
                   "significant hit's E-value moves by a median factor of about 10 (up to 1e10 for "
                   "the strongest), one near 1e-3 by 3-4; 200 halve those exponents. For E-values "
                   "stable near a cutoff, give 200.")
@click.option("--max-candidates", type=click.IntRange(min=0), default=lib.DEFAULT_MAX_CANDIDATES,
              show_default=True,
              help="Against a database larger than this, score only the sequences a BLAST-like "
                   "word prefilter ranks highest, this many per query (0: score every sequence).")
@click.option("--composition-shift/--no-composition-shift", default=True, show_default=True,
              help="Charge each hit the score its residue composition alone explains, measured by "
                   f"{lib.SUBJECT_SHUFFLES} shuffles of it (as BLAST's composition-based statistics; "
                   "off: more sensitive, E-values optimistic between composition-biased sequences "
                   "such as two membrane proteins).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the decoys and shuffles.")
@click.option("-f", "--format", "fmt", type=click.Choice(["tsv", "blast6", "blast7", "json"]), default="tsv",
              show_default=True,
              help="tsv: the hit table below; blast6 / blast7: BLAST+ -outfmt 6 (no comments) / 7 "
                   "(comment lines per query), its twelve standard columns; json: one JSON object per "
                   "hit (JSON lines) with its columns, its `score` (the homology log-odds), its "
                   "composition `shift` (the E-value is that of score - shift) and the full "
                   "`alignment` (as `align -f json`, whose own `score` is the aligner's).")
@click.option("-o", "--out", type=OutputFile(),
              help="Write the hits here instead of standard output.")
@checkpoint_option()
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path), help="ESM-2 weights.")
@decoder_options
@engine_options
@max_length_option("Leave out sequences longer than this (residues), each reported as a bad record "
                   "(exit status 1 at the end).")
@max_memory_option()
@batch_options
def search(query, database, all_vs_all, max_hits, evalue, decoys, max_candidates, composition_shift, seed, fmt, out,
           checkpoint, weights,
           engine, steps, max_length, max_memory, strict, quiet, **decoding):
    """Search the sequences of QUERY (FASTA; - reads standard input) against DATABASE (FASTA).

    \b
    Every query is scored against every database sequence by the pair-HMM's homology
    log-odds (the two sequences under the pair-HMM, summed over all alignments, against
    unrelated background sequences; in --mode local the segment model), and the hits that
    pass --evalue and --max-hits are aligned by the model and its decoder. Against a
    database of more than --max-candidates sequences, a word prefilter (BLAST's ungapped
    stage) first picks the ones scored; E-values still count the whole database.

    \b
    Statistics: per query, --decoys database sequences shuffled residue by residue are
    scored the same way and a Gumbel (extreme-value) law is fitted to their scores by
    maximum likelihood, its location linear in the subject's length (global mode: a global
    score pays for the end gaps); for a database of N sequences
      E-value = N * P(decoy score >= score | subject length),
      bitscore = lambda (score - mu(length)) / ln 2,
    as SSEARCH does with shuffled sequences (E ~ N 2^-bits in the tail). Beyond the law's
    top 1 %, P never falls faster than exp(-score) (the exponential tail of scores summed
    over all alignments; --mode local's E-values need it at scale), and the bit score
    follows it (-log2 P there). A subject that
    may be reported is also shuffled itself: what its composition alone adds to the
    query's score (a lower bound, never negative) is taken off before the E-value, so two
    unrelated sequences of the same biased composition are not reported as related
    (--no-composition-shift: not). Hits are ranked by E-value.

    \b
    Output (tsv): after a '# Fields:' line, BLAST tabular columns, best hit first per query,
      qseqid sseqid pident length mismatch gapopen qstart qend sstart send evalue bitscore
    plus mean_confidence (mean confidence of the aligned pairs, as align prints them). Coordinates are 1-based
    inclusive over the aligned region (first to last aligned pair); length counts its
    columns, gaps included; pident = 100 x identical pairs / length (an unknown X is never
    identical, as in align's outputs; BLAST+ counts X-X pairs as identities). blast6 and blast7
    write the first twelve columns as BLAST+ -outfmt 6 and 7 do (blast7: per query, the
    program line '# pfamalign search VERSION', '# Query:', '# Database:', '# Fields:' with
    BLAST's column names and '# N hits found').

    \b
    A bad record (file:line) is reported on standard error and, in tsv and json, in the
    output too (a '# error:' line; an {"error": ...} object), the rest is searched, and the
    exit status is 1 at the end; --strict stops at the first.

    \b
    Examples:
      pfamalign search query.fasta db.fasta -o hits.tsv
      pfamalign search family.fasta --all-vs-all --evalue 1e-3
      cat q.fasta | pfamalign search - db.fasta -f json --max-hits 10
      pfamalign search query.fasta db.fasta -f blast6 -o hits.m8
    """
    import json

    from pfamalign import resources
    from pfamalign.alignment.formats import to_json
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.jsonio import dumps_line
    from pfamalign.outputs import open_output, same_file

    try:  # @FILE: the file FILE, as every sequence argument reads it
        query, database = (None if a is None else inputs.fasta_argument(a) for a in (query, database))
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if all_vs_all == (database is not None):
        raise click.UsageError("give QUERY DATABASE, or one file with --all-vs-all")
    if query == database == inputs.STDIN:
        raise click.UsageError("standard input (-) can be QUERY or DATABASE, not both")
    check_outputs(out, inputs=(query, database, checkpoint, weights))
    errors = BatchErrors(strict)
    try:  # the files are read before the model loads: a wrong file fails at once
        query_records = inputs.fasta_in_memory(query)
        # one file as both (not --all-vs-all: each query meets itself too) is read and checked once
        same = all_vs_all or (inputs.STDIN not in (query, database)
                              and same_file(pathlib.Path(query), pathlib.Path(database)))
        db_records = query_records if same else inputs.fasta_in_memory(database)
        predictor = Predictor(checkpoint, weights=weights, max_length=max_length, engine=engine, steps=steps,
                              max_memory=resources.budget(max_memory))
        settings = decoder_settings(predictor.decoding, decoding)
        queries = lib.usable_records(query_records, predictor, errors)
        db = queries if same else lib.usable_records(db_records, predictor, errors)
        if not queries:
            raise ValueError(f"{query}: no usable query sequences")
        if all_vs_all:
            try:
                lib.check_all_vs_all(queries)  # before the output is opened
            except ValueError as err:
                raise ValueError(f"{query}: {err}") from None
        max_candidates = max_candidates or None  # 0: every sequence
        per_query = decoys + lib.scored_per_query(len(db) - (1 if all_vs_all else 0), max_candidates)
        provenance = predictor.provenance(settings)
        # BLAST's tables have no place for a skipped record ('#' lines would break -outfmt 6
        # readers, or be taken for -outfmt 7's own); standard error has them anyway
        errors_in_output = fmt in ("tsv", "json")
        searched = database if not all_vs_all else query
        stages = (("composition shuffles", None),) if composition_shift else ()
        with open_output(out, inputs=(query, database)) as sink, \
                batch_progress("scoring pairs", len(queries) * per_query, quiet, lines=True,
                               more=stages + (("aligning hits", None),)) as (advance, *later):
            if fmt == "tsv":
                sink.write(lib.tsv_header(provenance))
            elif fmt == "blast7":
                sink.write(lib.provenance_comments(provenance))
            for error in errors.records if errors_in_output else ():  # dropped while reading
                sink.write(error_line(error, fmt == "json"))
            n_queries = unaligned = 0
            for result in lib.search(predictor, queries, db, settings, errors, all_vs_all=all_vs_all,
                                     decoys=decoys, max_hits=max_hits, evalue=evalue,
                                     max_candidates=max_candidates, seed=seed,
                                     correct_composition=composition_shift, advance=advance,
                                     advance_shuffles=later[0] if composition_shift else (lambda n=1: None),
                                     advance_hits=later[-1]):
                if isinstance(result, inputs.BadRecord):
                    if errors_in_output:
                        sink.write(error_line(result, fmt == "json"))
                    continue
                n_queries += 1
                unaligned += result.unaligned
                if fmt == "blast7":
                    sink.write(lib.blast7_block(result, "standard input" if searched == inputs.STDIN
                                                else searched))
                elif fmt == "json":
                    for hit in result.hits:
                        alignment = json.loads(to_json(hit.record, provenance=provenance))
                        sink.write(dumps_line({**hit.columns, "score": hit.score, "shift": hit.shift,
                                               "alignment": alignment}) + "\n")
                else:
                    names = lib.COLUMNS if fmt == "tsv" else lib.BLAST_COLUMNS
                    sink.writelines(lib.format_tsv_row(hit.columns, names) for hit in result.hits)
            if fmt == "blast7":
                sink.write(lib.blast7_footer(n_queries))
        if unaligned:  # within --evalue and --max-hits, but the decoder aligned no pair of them
            click.echo(f"Warning: {unaligned} hit(s) within the limits are not reported: the decoder "
                       "aligned no residue pair of them (a high --min-mass or --threshold leaves none; "
                       "lower it to report them)", err=True)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    if errors:
        fail(errors.summary(), code=1)
