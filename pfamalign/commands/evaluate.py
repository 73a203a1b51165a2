"""``pfamalign eval``: score the aligner and the baselines against reference alignments."""

from __future__ import annotations

import pathlib

import click
from click.core import ParameterSource

from pfamalign.commands._common import (DatasetDirectory, OutputFile, check_figure, check_outputs, checkpoint_option,
                                       decoder_options, decoder_settings, engine_options, fail,
                                       strict_option)


@click.command("eval", short_help="Score the aligner against reference alignments and baselines.")
@click.option("--data", type=DatasetDirectory(), help="Dataset directory from `pfamalign prepare shards`.")
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"]),
              help="Dataset split to score (with --data).")
@click.option("--stockholm", "stockholm", multiple=True, type=click.Path(exists=True, path_type=pathlib.Path),
              help="Score pairs sampled from these Stockholm files (or directories) instead. Repeatable.")
@click.option("--pairs-per-family", type=click.IntRange(min=1), default=50, show_default=True,
              help="Pairs sampled per family with --stockholm.")
@checkpoint_option()
@click.option("--no-model", is_flag=True, help="Score the baselines only.")
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path),
              help="ESM-2 weights for ESM-2 checkpoints.")
@click.option("--baselines", default="diagonal,nw,sw", show_default=True,
              help="Comma-separated baselines: diagonal, nw, sw, probcons, muscle (the last two "
                   "run the installed Debian packages; empty for none).")
@click.option("--max-pairs", type=click.IntRange(min=1), default=None, help="Score at most this many pairs, drawn across the families (seeded by --seed; "
                   "every family represented when N >= the number of families).")
@click.option("--bootstrap", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Bootstrap resamples for the CIs (0: no CIs).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the bootstrap and the sampling.")
@decoder_options
@engine_options
@click.option("--json", "json_out", type=OutputFile(),
              help="Write the full results (every number, with intervals) as JSON here (- for standard "
                   "output; the tables then go to standard error).")
@click.option("--plot", type=OutputFile(),
              help="Figure (format from the extension: .png, .svg, .pdf, ...) of F1 by identity bin per "
                   "method, beside the model's reliability curve.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@strict_option
@click.pass_context
def evaluate(ctx, data, split, stockholm, pairs_per_family, checkpoint, no_model, weights, baselines, max_pairs,
             bootstrap, seed, engine, steps, json_out, plot, quiet, strict, **decoding):
    """Score the aligner against reference alignments, beside the baselines.

    \b
    Metrics, every method on the same pairs: aligned-pair precision / recall / F1 of the
    decoded alignment (micro; macro in --json) overall and by percent identity (<30, 30-50,
    >=50 %), with bootstrap 95 % intervals; for the model and the diagonal reference also the
    plan metrics (sparse CE, barycenter MAE, within-5, monotonicity violation);
    for the model the calibration of its pair confidences (precision per confidence bin,
    ECE, Brier; the reliability panel of --plot).

    \b
    A malformed family of a --stockholm file is reported (file:line) on standard error and
    in --json ("errors"), the others are scored, and the exit status is 1 at the end;
    --strict stops at the first.

    \b
    Examples:
      pfamalign eval --data data/ --split test --plot f1.png
      pfamalign eval --stockholm PF00595.sto --checkpoint runs/x/model --json eval.json
    """

    if (data is None) == (not stockholm):  # before the heavy import: usage errors stay instant
        raise click.UsageError("give exactly one of --data DIR or --stockholm FILE")
    given = lambda name: ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT,
                                                               ParameterSource.DEFAULT_MAP)
    if stockholm and given("split"):
        raise click.UsageError("--split picks a split of --data; --stockholm files have none (drop --split)")
    if data is not None and given("pairs_per_family"):
        raise click.UsageError("--pairs-per-family samples --stockholm families; a dataset's pairs "
                               "are drawn when it is prepared (use --max-pairs to score fewer)")
    from pfamalign import evaluation
    from pfamalign.batch import BatchErrors

    check_outputs(json_out, plot, inputs=(data, *stockholm, checkpoint, weights))
    check_figure(plot)
    base = [b.strip() for b in baselines.split(",") if b.strip()]
    unknown = [b for b in base if b not in evaluation.BASELINES]
    if unknown:
        raise click.UsageError(f"unknown baseline(s) {unknown}; choose from {sorted(evaluation.BASELINES)}")
    if twice := sorted({b for b in base if base.count(b) > 1}):
        raise click.UsageError(f"--baselines names {', '.join(twice)} twice; name each baseline once")
    # a program the user named is required (the library leaves a missing one out, for scripts)
    if missing := [why for b in base if b in evaluation.EXTERNAL_ALIGNERS
                   and (why := evaluation.EXTERNAL_ALIGNERS[b].missing())]:
        raise click.UsageError("; ".join(missing))
    if len({pathlib.Path(p).resolve() for p in stockholm}) < len(stockholm):
        raise click.UsageError("--stockholm names one file twice (its pairs would count twice); "
                               "give each file once")
    if no_model and not base:
        raise click.UsageError("nothing to score: --no-model with no --baselines; name at least "
                               f"one of {', '.join(evaluation.BASELINES)} or drop --no-model")
    model_options = ["--" + name.replace("_", "-") for name in ("checkpoint", "weights", "engine", "steps",
                                                                *decoding) if given(name)]
    if no_model and model_options:  # they would change nothing: a typo'd intent, not silence
        raise click.UsageError(f"{', '.join(model_options)} set{'s' if len(model_options) == 1 else ''} up the "
                               "model, which --no-model leaves out; drop one or the other")
    predictor = settings = None
    if not no_model:
        from pfamalign.inference import Predictor

        try:
            predictor = Predictor(checkpoint, weights=weights, engine=engine, steps=steps)
        except (FileNotFoundError, ValueError) as err:
            fail(str(err))
        settings = decoder_settings(predictor.decoding, decoding)
    errors = BatchErrors(strict)
    json_to_stdout = str(json_out) == "-"  # written last, after the tables (to stderr)
    try:
        summary = evaluation.run(data=data, split=split, stockholm=stockholm,
                                 pairs_per_family=pairs_per_family, max_pairs=max_pairs,
                                 predictor=predictor, baselines=base, decoding=settings,
                                 n_boot=bootstrap, seed=seed, json_path=None if json_to_stdout else json_out, plot_path=plot,
                                 quiet=quiet, errors=errors)
    except ValueError as err:
        fail(str(err))
    except evaluation.ExternalAlignerError as err:  # the program failed, not the command line
        fail(str(err), code=1)
    left_out = summary.get("left_out") or []
    if left_out:
        click.echo(f"Warning: left out {len(left_out)} famil{'y' if len(left_out) == 1 else 'ies'} with no "
                   f"pairs to score: {'; '.join(left_out[:5])}{'; ...' if len(left_out) > 5 else ''}",
                   err=True)
    overlap = summary.get("training_overlap") or {}
    for key, what in (("trained_on", "trained on"), ("tuned_on", "had its decoder tuned on")):
        if overlap.get(key):
            click.echo(f"Warning: the model {what} {len(overlap[key])} of the evaluated families "
                       f"({', '.join(overlap[key])}): these scores overstate its accuracy on new "
                       "families; score families it never saw (the test split of its dataset).",
                       err=True)
    if json_to_stdout:
        from pfamalign import jsonio
        from pfamalign.outputs import table_console

        evaluation.render(summary, table_console(stderr=True))
        click.echo(jsonio.dumps(summary, indent=2))
    else:
        evaluation.render(summary)
    if errors:
        fail(errors.summary(), code=1)
