"""``pfamalign eval``: score the aligner and the baselines against reference alignments."""

from __future__ import annotations

import itertools
import pathlib

import click

from pfamalign.commands._common import decoder_options, decoder_settings, fail


def _stockholm_records(paths, pairs_per_family: int, seed: int, max_len: int):
    """Pair records sampled from Stockholm files (the same sampler as `prepare`)."""
    from pfamalign.pipelines.pairs import SamplingConfig, sample_family
    from pfamalign.pipelines.stockholm import read_families

    cfg = SamplingConfig(pairs_per_family=pairs_per_family, max_len=max_len)
    for family in read_families([str(p) for p in paths]):
        for rec in sample_family(family, cfg, seed=seed, split="eval").pairs:
            yield {**rec, "target": rec["target"]}


@click.command("eval")
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
              help="Dataset directory from `pfamalign prepare shards`.")
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"]),
              help="Dataset split to score (with --data).")
@click.option("--stockholm", "stockholm", multiple=True, type=click.Path(exists=True, path_type=pathlib.Path),
              help="Score pairs sampled from these Stockholm files (or directories) instead. Repeatable.")
@click.option("--pairs-per-family", type=int, default=50, show_default=True,
              help="Pairs sampled per family with --stockholm.")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
              help="Model directory (default: the model shipped with pfamalign).")
@click.option("--no-model", is_flag=True, help="Score the baselines only.")
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path),
              help="ESM-2 weights for ESM-2 checkpoints.")
@click.option("--baselines", default="diagonal,nw,sw", show_default=True,
              help="Comma-separated baselines: diagonal, nw, sw (empty for none).")
@click.option("--max-pairs", type=int, default=None, help="Score at most this many pairs (first ones).")
@click.option("--bootstrap", type=int, default=1000, show_default=True, help="Bootstrap resamples for the CIs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap and the sampling.")
@decoder_options
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="Write the full results (every number, with intervals) as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="PNG of F1 by identity bin per method.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def evaluate(data, split, stockholm, pairs_per_family, checkpoint, no_model, weights, baselines, max_pairs,
             bootstrap, seed, json_out, plot, quiet, **decoding):
    """Score the aligner against reference alignments, beside the baselines.

    \b
    Metrics, every method on the same pairs: aligned-pair precision / recall / F1 of the
    decoded alignment (micro; macro in --json) overall and by percent identity (<30, 30-50,
    >=50 %), with bootstrap 95 % intervals; for the model and the diagonal reference also the
    seed paper's plan metrics (sparse CE, barycenter MAE, within-5, monotonicity violation).

    \b
    Examples:
      pfamalign eval --data data/ --split test --plot f1.png
      pfamalign eval --stockholm PF00595.sto --checkpoint runs/x/model --json eval.json
    """

    from pfamalign import evaluation
    from pfamalign.pipelines.progress import Bars, progress_enabled

    if (data is None) == (not stockholm):
        raise click.UsageError("give exactly one of --data DIR or --stockholm FILE")
    base = [b.strip() for b in baselines.split(",") if b.strip()]
    unknown = [b for b in base if b not in evaluation.BASELINES]
    if unknown:
        raise click.UsageError(f"unknown baseline(s) {unknown}; choose from {sorted(evaluation.BASELINES)}")
    predictor = settings = None
    if not no_model:
        from pfamalign.inference import Predictor

        try:
            predictor = Predictor(checkpoint, weights=weights)
        except (FileNotFoundError, ValueError) as err:
            fail(str(err))
        settings = decoder_settings(predictor.decoding, decoding)
    features = "featurize"
    if data is not None:
        from pfamalign.pipelines import reader

        ds = reader.PairDataset(data)
        if split not in ds.splits or ds.num_pairs(split) == 0:
            fail(f"{data} has no pairs in split {split!r} (splits: {ds.splits})")
        same = predictor is not None and ds.embedder_id == predictor.config.embedder_id
        features = "records" if same else "featurize"
        records = reader.iter_pairs(data, split, features=same)
        total = ds.num_pairs(split)
    else:
        records = _stockholm_records(stockholm, pairs_per_family, seed, 1022)
        total = None
    if max_pairs is not None:
        records = itertools.islice(records, max_pairs)
        total = min(total, max_pairs) if total is not None else max_pairs
    try:
        with Bars(progress_enabled(quiet)) as bars:
            ev = evaluation.evaluate(records, predictor=predictor, features=features, baselines=base,
                                     decoding=settings,
                                     advance=bars.task("scoring pairs", total))
    except ValueError as err:
        fail(str(err))
    if not ev.pid:
        fail("no pairs to score")
    summary = ev.summary(n_boot=bootstrap, seed=seed)
    evaluation.render(summary)
    if json_out:
        json_out.write_text(evaluation.to_json(summary))
    if plot:
        evaluation.plot(summary, plot)
