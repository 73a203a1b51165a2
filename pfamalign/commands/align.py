"""``pfamalign align``: align two sequences (or many pairs) with a trained aligner."""

from __future__ import annotations

import pathlib

import click

from pfamalign.commands._common import (batch_options, batch_progress, decoder_options,
                                       decoder_settings, engine_options, error_line, fail)

FORMATS = ("text", "fasta", "stockholm", "cigar", "json")
_WRITER = {"text": "pair"}  # our name -> the formats module's name


@click.command()
@click.argument("seq_a", required=False)
@click.argument("seq_b", required=False)
@click.option("--pairs", "pairs_file", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="Tab-separated file of pairs (SEQ_A SEQ_B, or ID_A SEQ_A ID_B SEQ_B per line); "
                   "streamed, the model is loaded once.")
@click.option("--all-pairs", is_flag=True,
              help="With one multi-FASTA SEQ_A: align every pair of records, not only the first "
                   "record against each of the others.")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
              help="Model directory from `pfamalign train` (RUN/model). Default: the model shipped "
                   "with pfamalign (builtin features, no downloads).")
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path),
              help="ESM-2 weights for checkpoints trained on ESM-2 features.")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="Output format. json writes one object per pair (JSON lines for many pairs).")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="Write the alignment(s) here instead of standard output.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="PNG of the plan heatmap with marginals and the decoded path (single pair).")
@decoder_options
@engine_options
@click.option("--max-length", type=int, default=4096, show_default=True,
              help="Refuse sequences longer than this (residues).")
@batch_options
def align(seq_a, seq_b, pairs_file, all_pairs, checkpoint, weights, fmt, out, plot, engine, steps, max_length,
          strict, quiet, **decoding):
    """Align SEQ_A with SEQ_B (residue strings or FASTA files; - reads standard input).

    \b
    The aligner computes a transport plan between the two sequences and decodes a monotone
    alignment from it with the model's decoder settings (the shipped model: a global DP on
    BLOSUM62 plus the plan); each aligned pair carries its plan mass as confidence.

    \b
    Many pairs: one multi-FASTA SEQ_A alone aligns its first record with each of the others
    (--all-pairs: every pair); --pairs reads a TSV. A bad record (file:line) is reported on
    standard error and in the output, the rest are aligned, and the exit status is 1 at the
    end; --strict stops at the first.

    \b
    Examples:
      pfamalign align MKVLAAGIVGLLLA MKVLSAGIVGLA
      pfamalign align query.fasta target.fasta -f json --plot plan.png
      cat family.fasta | pfamalign align - --all-pairs -f cigar
      pfamalign align --pairs pairs.tsv -f json -o alignments.jsonl
      pfamalign align --checkpoint compiled/ --engine asap SEQ_A SEQ_B   # see `compile`
    """
    from pfamalign import inputs
    from pfamalign.alignment.formats import format_alignment
    from pfamalign.batch import BatchErrors, aligned
    from pfamalign.inference import Predictor
    from pfamalign.outputs import open_output

    if pairs_file is None and seq_a is None:
        raise click.UsageError("give two sequences (SEQ_A SEQ_B), one multi-FASTA file, or --pairs FILE")
    if pairs_file is not None and (seq_a is not None or plot is not None):
        raise click.UsageError("--pairs takes no SEQ_A/SEQ_B arguments and no --plot")
    if seq_a == seq_b == inputs.STDIN:
        raise click.UsageError("standard input (-) can be SEQ_A or SEQ_B, not both")
    many = pairs_file is not None or seq_b is None
    if all_pairs and not (seq_a is not None and seq_b is None):
        raise click.UsageError("--all-pairs needs one multi-FASTA file (SEQ_A alone)")
    if many and plot is not None:
        raise click.UsageError("--plot draws a single pair; give SEQ_A and SEQ_B")
    errors = BatchErrors(strict or not many)
    try:  # sequences are checked before the model loads; a pairs file streams
        if pairs_file is not None:
            pairs = inputs.read_pairs_tsv(pairs_file)
        elif seq_b is None:
            pairs = inputs.fasta_pairs(seq_a, all_pairs=all_pairs)
        else:
            pairs = [inputs.pair_from_sequences(seq_a, seq_b)]
        predictor = Predictor(checkpoint, weights=weights, max_length=max_length, engine=engine, steps=steps)
        settings = decoder_settings(predictor.decoding, decoding)
        with open_output(out, inputs=(pairs_file, seq_a, seq_b)) as sink, \
                batch_progress("aligning pairs", None, quiet or not many) as advance:
            for item in aligned(predictor, pairs, settings, errors):
                if isinstance(item, inputs.BadRecord):
                    sink.write(error_line(item, fmt == "json"))
                    continue
                _, rec, pp = item
                sink.write(format_alignment(rec, _WRITER.get(fmt, fmt)))  # ends with a newline
                advance()
                if plot is not None:
                    from pfamalign.alignment.plots import plot_plan

                    plot_plan(pp.real, plot, pairs=rec.pairs, row_dustbin=pp.row_dustbin,
                              title=f"{rec.id_a} vs {rec.id_b}")
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    if errors:
        fail(errors.summary(), code=1)
