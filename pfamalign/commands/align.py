"""``pfamalign align``: align two sequences (or many pairs) with a trained aligner."""

from __future__ import annotations

import json
import os
import pathlib
import time

import click

from pfamalign.commands._common import (Number, OutputFile, batch_options, batch_progress, check_figure,
                                       check_outputs, checkpoint_option, decoder_options, decoder_settings, engine_options,
                                       error_line, fail, max_length_option, max_memory_option,
                                       sequence_paths)

# formats.ONE_PAIR's names, written out: the help must not import the formats module (numpy)
FORMATS = ("text", "emboss", "fasta", "stockholm", "cigar", "json")
# The shipped decoder's settings, read for the help text (the help must not load the model)
_SHIPPED_DECODING = pathlib.Path(__file__).parents[1] / "assets" / "default_model" / "decoding.json"


def _shipped_mix() -> str:
    """The shares of the shipped decoder's mixed posterior (its alpha), for the help text."""
    try:
        alpha = float(json.loads(_SHIPPED_DECODING.read_text())["alpha"])
    except (OSError, ValueError, KeyError, TypeError):
        return "in the shares its decoding.json sets"
    return f"{alpha:.0%} plan, {1 - alpha:.0%} pair-HMM"


@click.command(short_help="Align two sequences, or many pairs.")
@click.argument("seq_a", required=False)
@click.argument("seq_b", required=False)
@click.option("--pairs", "pairs_file",
              type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=pathlib.Path),
              help="Tab-separated file of pairs (SEQ_A SEQ_B, or ID_A SEQ_A ID_B SEQ_B per line; "
                   "- reads standard input; a first line of column names such as query/target "
                   "is skipped, and so are lines that start with '#': comments); streamed, the "
                   "model is loaded once.")
@click.option("--all-pairs", is_flag=True,
              help="With one multi-FASTA SEQ_A: align every pair of records, not only the first "
                   "record against each of the others.")
@checkpoint_option("Model directory from `pfamalign train` (RUN/model) or `pfamalign ensemble`")
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path),
              help="ESM-2 weights for checkpoints trained on ESM-2 features.")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="Output format. text: EMBOSS srspair with pfamalign's confidence line and keys; "
                   "emboss: the same layout as EMBOSS needle writes (water's for --mode local: the aligned "
                   "region only), without them (no gap penalty lines); json: one object per pair (JSON lines "
                   "for many pairs); cigar: seq_a the reference (D: its residues opposite a gap, "
                   "I: seq_b's), for many pairs ID_A<TAB>ID_B<TAB>CIGAR lines; fasta: two records "
                   "per pair, pairs one after another. Every format writes residues upper-cased.")
@click.option("-o", "--out", type=OutputFile(),
              help="Write the alignment(s) here instead of standard output.")
@click.option("--plot", type=OutputFile(),
              help="Figure of the plan with marginals and the decoded path (single pair), in the "
                   "format its extension names (.png, .svg, .pdf, ...). Sequences longer than "
                   "400 residues show the band around the path.")
@click.option("--score-noise", type=Number(min=0), default=None, metavar="R",
              help="With -f json: mark each aligned pair `stable` when it is certified to stay its "
                   "row's and column's winner under any score change of gauge-reduced size R "
                   "(as `certify --score-noise`), with a per-pair `stable_matches` summary. It "
                   "applies to a balanced plan solved to convergence (unit rows and columns); "
                   "the shipped models' dustbin plans are not, and the summary says so "
                   "(`applies: false`, with the reason; each `stable` then null: not tested).")
@click.option("-v", "--verbose", is_flag=True,
              help="Report to standard error: pairs, time, the batch shapes run and the programs "
                   "compiled (and loaded from the compile cache).")
@decoder_options
@engine_options
@max_length_option()
@max_memory_option()
@batch_options
def align(seq_a, seq_b, pairs_file, all_pairs, checkpoint, weights, fmt, out, plot, score_noise, verbose,
          engine, steps, max_length, max_memory, strict, quiet, **decoding):
    """Align SEQ_A with SEQ_B (residue strings or FASTA files; - reads standard input).

    \b
    The aligner computes a transport plan between the two sequences and decodes a monotone
    alignment from it with the model's decoder settings (the shipped model: maximum expected
    accuracy on the plan mixed with a pair-HMM's match posteriors, {shipped_mix}); each
    aligned pair carries its mixed posterior as confidence.

    \b
    Symmetric: the model reads its two inputs differently, so the plan is the mean of both
    directions (A against B and B against A, transposed). Swapping SEQ_A and SEQ_B swaps the
    alignment and keeps its score. Pairs run in batches of similar length (--pairs). The
    text, Stockholm and JSON outputs record the program version, the model (name and content
    hash) and the decoder settings (FASTA and CIGAR have no place for them); residues are
    numbered 1-based inclusive (JSON pairs: 0-based indices).

    \b
    Many pairs: one multi-FASTA SEQ_A alone aligns its first record with each of the others
    (--all-pairs: every pair); --pairs reads a TSV. A bad record (file:line) is reported on
    standard error and, as a '#' line or a JSON object, in text, cigar and json output (fasta
    and stockholm files stay valid), the rest are aligned, and the exit status is 1 at the
    end; --strict stops at the first.

    \b
    Examples:
      pfamalign align MKVLAAGIVGLLLA MKVLSAGIVGLA
      pfamalign align query.fasta target.fasta -f json --plot plan.png
      cat family.fasta | pfamalign align - --all-pairs -f cigar
      pfamalign align --pairs pairs.tsv -f json -o alignments.jsonl
      pfamalign align --checkpoint compiled/ --engine asap SEQ_A SEQ_B   # see `compile`
      pfamalign align query.fasta target.fasta -f json --score-noise 1e-3
    """
    from pfamalign import inputs, resources
    from pfamalign.alignment.formats import (MANY_PAIRS, ONE_PAIR, SKIPPED_IN_OUTPUT, format_alignment,
                                             pair_file_header)
    from pfamalign.batch import BatchErrors, aligned
    from pfamalign.inference import Predictor
    from pfamalign.outputs import atomic_path, open_output

    if pairs_file is None and seq_a is None:
        raise click.UsageError("give two sequences (SEQ_A SEQ_B), one multi-FASTA file, or --pairs FILE")
    if pairs_file is not None and (seq_a is not None or plot is not None):
        raise click.UsageError("--pairs takes no SEQ_A/SEQ_B arguments and no --plot")
    if seq_a == seq_b == inputs.STDIN:
        raise click.UsageError("standard input (-) can be SEQ_A or SEQ_B, not both")
    many = pairs_file is not None or seq_b is None
    if all_pairs and not (seq_a is not None and seq_b is None):
        raise click.UsageError("--all-pairs needs one multi-FASTA file (SEQ_A alone)")
    if score_noise is not None and fmt != "json":
        raise click.UsageError(f"--score-noise marks pairs in JSON output only; add -f json (got -f {fmt})")
    errors = BatchErrors(strict or not many)
    sources = (pairs_file, *sequence_paths(seq_a, seq_b), checkpoint, weights)
    check_outputs(out, plot, inputs=sources)
    plot_fmt = check_figure(plot)
    try:  # sequences are checked before the model loads; a pairs file streams
        if pairs_file is not None:
            pairs = inputs.read_pairs_tsv(pairs_file)
            total = inputs.count_pairs_tsv(pairs_file)  # None for a pipe: a bar without a total
        elif seq_b is None:
            if seq_a != "-" and not os.path.exists(seq_a) and seq_a.isalpha():  # a sequence, not a file
                raise click.UsageError(f"{seq_a[:20]}{'...' if len(seq_a) > 20 else ''} is not a file: give two "
                                       "sequences (pfamalign align SEQ_A SEQ_B), or one FASTA file")
            pairs = inputs.fasta_pairs(inputs.fasta_argument(seq_a), all_pairs=all_pairs)
            total = len(pairs)
            if plot is not None and total != 1:
                raise click.UsageError(f"--plot draws a single pair, and {seq_a} holds {total} pairs or "
                                       "bad records; give SEQ_A and SEQ_B, or a file of two records")
        else:
            pairs = [inputs.pair_from_sequences(seq_a, seq_b)]
            total = 1
        start = time.perf_counter()
        counter = _compile_counter() if verbose else None
        budget = resources.budget(max_memory)
        predictor = Predictor(checkpoint, weights=weights, max_length=max_length, max_memory=budget,
                              engine=engine, steps=steps)
        if isinstance(pairs, inputs.FastaPairs):  # a record the model cannot take: named once
            pairs = pairs.screened(predictor.sequence_problem)
            total = len(pairs)
        settings = decoder_settings(predictor.decoding, decoding)
        provenance = predictor.provenance(settings)
        n_pairs = 0
        writer = (MANY_PAIRS if many else ONE_PAIR)[fmt]
        with open_output(out, inputs=sources) as sink, \
                batch_progress("aligning pairs", total, quiet or not many, lines=True) as advance:
            # the pair text's file header opens the output with its first line, not before:
            # a file that fails before any pair is written stays empty
            header = [pair_file_header(provenance=provenance)] if writer.endswith("_block") else []

            def write(text: str) -> None:
                sink.write("".join(header) + text)
                header.clear()

            for item in aligned(predictor, pairs, settings, errors):
                if isinstance(item, inputs.BadRecord):  # ``errors`` printed it on stderr
                    if writer in SKIPPED_IN_OUTPUT:
                        write(error_line(item, fmt == "json"))
                    advance()  # counted in the total
                    continue
                _, rec, pp = item
                n_pairs += 1
                extra = None if score_noise is None else _stability(predictor, rec, score_noise)
                write(format_alignment(rec, writer, provenance=provenance, extra=extra))
                advance()
                if plot is not None:
                    from pfamalign.alignment.plots import plot_plan

                    with atomic_path(plot, inputs=sources) as tmp:
                        plot_plan(pp.real, tmp, pairs=rec.pairs, row_dustbin=pp.row_dustbin,
                                  col_dustbin=pp.col_dustbin, title=f"{rec.id_a} vs {rec.id_b}",
                                  names=(rec.id_a, rec.id_b), fmt=plot_fmt)
        if counter is not None:
            shapes = ", ".join(f"{b}x{n}" for b, n in sorted(predictor.shapes)) or "none"
            from pfamalign.alignment import numba_jit

            kernels = ""
            if numba_jit.started():  # a job of many pairs: the pair-HMM and the DP on numba
                compiled, loaded = numba_jit.counts()
                kernels = f"; numba kernels compiled: {compiled}, loaded from its cache: {loaded}"
            click.echo(f"{n_pairs} pair(s) in {time.perf_counter() - start:.2f} s; plan batches "
                       f"(pairs x padded length): {shapes}; programs compiled: {counter.compiled}, "
                       f"loaded from the compile cache: {counter.cached}{kernels}", err=True)
            counter.close()
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    if errors:
        fail(errors.summary(), code=1)


align.help = align.help.replace("{shipped_mix}", _shipped_mix())


def _stability(predictor, rec, radius: float) -> dict:
    """The JSON fields of ``--score-noise``: ``stable`` per aligned pair and the summary."""
    from pfamalign.certify import stable_matches

    summary = stable_matches(predictor, rec.seq_a, rec.seq_b, rec.pairs, radius)
    stable = summary.pop("stable")
    del summary["pairs"]  # the pairs flagged in ``stable``
    return {"stable": stable, "stable_matches": summary}


def _compile_counter():
    from pfamalign.compile_cache import CompileCounter

    return CompileCounter()
