"""``pfamalign ensemble``: combine trained aligners into one model whose plan is their posteriors' mean."""

from __future__ import annotations

import pathlib

import click

from pfamalign.commands._common import DatasetDirectory, fail


@click.command(name="ensemble", short_help="Combine trained aligners into one model.")
@click.argument("models", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path))
@click.option("--data", type=DatasetDirectory(), required=True,
              help="Dataset (`pfamalign prepare` output) whose --split pairs choose each member's "
                   "plan power and the ensemble's decoder.")
@click.option("--split", default="val", show_default=True, type=click.Choice(["train", "val"]),
              help="Split to choose on (val: families none of the models trained on).")
@click.option("--max-pairs", type=click.IntRange(min=1), default=500, show_default=True,
              help="Pairs to choose on, drawn across the split's families.")
@click.option("--no-tune", is_flag=True,
              help="Keep the decoder of the shipped model instead of choosing one on --split.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the pair sampling.")
@click.option("-o", "--out", type=click.Path(path_type=pathlib.Path), required=True,
              help="New ensemble directory (must not exist).")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def ensemble(models, data, split, max_pairs, no_tune, seed, out, quiet):
    """Combine two or more trained aligners (MODEL directories, `pfamalign train`'s RUN/model,
    all on the same features) into an ensemble: each member's plan enters the plan pair-HMM
    at its own power, chosen on --split pairs, and the ensemble's plan is the mean of the
    members' match posteriors, decoded by a decoder chosen the way `pfamalign train` chooses
    one. OUT holds copies of the models and loads wherever a model directory does (`align`,
    `eval`, `search`, `barycenter`); certificates and `compile` need one member
    (OUT/MEMBER). An ensemble costs the sum of its members' plans; what that buys in
    accuracy is in the README's cross-validated table (conv + CETA: +0.006 F1 with the
    tuned decoder, +0.016 with the plan alone, at about 3x the time).

    \b
    Examples:
      pfamalign ensemble runs/conv/model runs/ceta/model --data data/ -o runs/ens
      pfamalign align --checkpoint runs/ens SEQ_A SEQ_B
    """
    from pfamalign import ensemble as ens, jsonio
    from pfamalign.tuning import describe

    say = (lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True))
    try:
        record = ens.build(out, list(models), data, split=split, max_pairs=max_pairs, seed=seed,
                           tune_decoder=not no_tune, say=say)
    except (ValueError, FileNotFoundError) as err:  # CheckpointError, EmbedderError among them
        fail(str(err))
    say(describe(record["decoder"]))
    click.echo(jsonio.dumps_line({"ensemble": str(out), "members": [
        {k: m[k] for k in ("path", "source", "plan_power")} for m in record["members"]],
        "decoder": record["decoder"].get("settings")}))
