"""``pfamalign align``: align two sequences (or many pairs) with a trained aligner."""

from __future__ import annotations

import contextlib
import pathlib
import sys
import time

import click

from pfamalign.commands._common import decoder_options, decoder_settings, fail

FORMATS = ("text", "fasta", "stockholm", "cigar", "json")
_WRITER = {"text": "pair"}  # our name -> the formats module's name


@click.command()
@click.argument("seq_a", required=False)
@click.argument("seq_b", required=False)
@click.option("--pairs", "pairs_file", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="Tab-separated file of pairs (SEQ_A SEQ_B, or ID_A SEQ_A ID_B SEQ_B per line); "
                   "streamed, the model is loaded once.")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
              help="Model directory from `pfamalign train` (RUN/model). Default: the model shipped "
                   "with pfamalign (builtin features, no downloads).")
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path),
              help="ESM-2 weights for checkpoints trained on ESM-2 features.")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="Output format. json writes one object per pair (JSON lines with --pairs).")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="Write the alignment(s) here instead of standard output.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="Figure of the plan with marginals and the decoded path (single pair), in the "
                   "format its extension names (.png, .svg, .pdf, ...). Sequences longer than "
                   "400 residues show the band around the path.")
@click.option("-v", "--verbose", is_flag=True,
              help="Report to standard error: pairs, time, the batch shapes run and the programs "
                   "compiled (and loaded from the compile cache).")
@decoder_options
@click.option("--max-length", type=int, default=4096, show_default=True,
              help="Refuse sequences longer than this (residues).")
def align(seq_a, seq_b, pairs_file, checkpoint, weights, fmt, out, plot, verbose, max_length, **decoding):
    """Align SEQ_A with SEQ_B (residue strings or FASTA files).

    \b
    The aligner computes a transport plan between the two sequences and decodes a monotone
    alignment from it with the model's decoder settings (the shipped model: maximum expected
    accuracy on the plan mixed half and half with a pair-HMM's match posteriors); each aligned
    pair carries its mixed posterior as confidence.

    \b
    Symmetric: the model reads its two inputs differently, so the plan is the mean of both
    directions (A against B and B against A, transposed). Swapping SEQ_A and SEQ_B swaps the
    alignment and keeps its score. Pairs run in batches of similar length (--pairs). Every
    output records the program version, the model (name and content hash) and the decoder
    settings; residues are numbered 1-based inclusive (JSON pairs: 0-based indices).

    \b
    Examples:
      pfamalign align MKVLAAGIVGLLLA MKVLSAGIVGLA
      pfamalign align query.fasta target.fasta -f json --plot plan.png
      pfamalign align --pairs pairs.tsv -f json -o alignments.jsonl
    """
    from pfamalign import inputs
    from pfamalign.alignment.formats import format_alignment
    from pfamalign.inference import Predictor
    from pfamalign.outputs import OutputError, atomic_path

    if pairs_file is None and (seq_a is None or seq_b is None):
        raise click.UsageError("give two sequences (SEQ_A SEQ_B) or --pairs FILE")
    if pairs_file is not None and (seq_a is not None or plot is not None):
        raise click.UsageError("--pairs takes no SEQ_A/SEQ_B arguments and no --plot")
    try:  # sequences are checked before the model loads; a pairs file streams
        if plot is not None:
            from pfamalign.alignment.plots import figure_format

            plot_fmt = figure_format(plot)
        pairs = (inputs.read_pairs_tsv(pairs_file) if pairs_file
                 else [inputs.pair_from_sequences(seq_a, seq_b)])
        start = time.perf_counter()
        counter = _compile_counter() if verbose else None
        predictor = Predictor(checkpoint, weights=weights, max_length=max_length)
        settings = decoder_settings(predictor.decoding, decoding)
        provenance = predictor.provenance(settings)
        n_pairs = 0
        with open(out, "w") if out else contextlib.nullcontext(sys.stdout) as sink:
            for rec, pp in predictor.align_records(pairs, settings):
                n_pairs += 1
                sink.write(format_alignment(rec, _WRITER.get(fmt, fmt), provenance=provenance))
                if plot is not None:
                    from pfamalign.alignment.plots import plot_plan

                    with atomic_path(plot, [out]) as tmp:
                        plot_plan(pp.real, tmp, pairs=rec.pairs, row_dustbin=pp.row_dustbin,
                                  col_dustbin=pp.col_dustbin, title=f"{rec.id_a} vs {rec.id_b}",
                                  fmt=plot_fmt)
        if counter is not None:
            shapes = ", ".join(f"{b}x{n}" for b, n in sorted(predictor.shapes)) or "none"
            click.echo(f"{n_pairs} pair(s) in {time.perf_counter() - start:.2f} s; plan batches "
                       f"(pairs x padded length): {shapes}; programs compiled: {counter.compiled}, "
                       f"loaded from the compile cache: {counter.cached}", err=True)
            counter.close()
    except (FileNotFoundError, ValueError, OutputError) as err:
        fail(str(err))


def _compile_counter():
    from pfamalign.compile_cache import CompileCounter

    return CompileCounter()
