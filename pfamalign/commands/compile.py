"""``pfamalign compile``: fit the compiled transport (ASAP) of a trained aligner."""

from __future__ import annotations

import dataclasses
import pathlib

import click

from pfamalign.commands._common import DatasetDirectory, Number, checkpoint_option, fail


@click.command(name="compile", short_help="Fit a compiled plan operator (ASAP) to a model.")
@checkpoint_option("Model directory to compile", ensembles=False)
@click.option("--data", type=DatasetDirectory(),
              help="Dataset (`pfamalign prepare` output) whose pairs calibrate the operator. "
                   "Default: the dataset the model trained on, when it is still at the path its "
                   "training record names.")
@click.option("--split", default="train", show_default=True, type=click.Choice(["train", "val", "test"]),
              help="Split of --data to calibrate on (the model's training families: unlabeled use).")
@click.option("--pairs", "n_pairs", type=click.IntRange(min=1), default=64, show_default=True,
              help="Calibration pairs (drawn across the families).")
@click.option("--held-out", type=click.IntRange(min=0), default=16, show_default=True,
              help="Further pairs of the split, not fitted, for the fit statistics.")
@click.option("--slices", type=click.IntRange(min=0), default=0, show_default=True,
              help="Random slices whose 1-D Kantorovich potentials are features besides the "
                   "per-residue ones (ASAP's original features; on the shipped model they add nothing).")
@click.option("--ceta-slices", type=click.IntRange(min=0), default=None,
              help="Slices of the operators of the encoder's CETA layers (a model with CETA "
                   "attention; they also use the per-residue features). [default: 64]")
@click.option("--passes", type=click.Choice(["1", "3"]), default="3", show_default=True,
              help="c-transforms rebuilding the plan (and each CETA layer's): 1 (ASAP-0: column "
                   "sums exact) or 3 (key, query, key).")
@click.option("--ridge", type=Number(min=0), default=1e-4, show_default=True,
              help="Ridge penalty (relative to the mean diagonal of the normal matrix).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the slices and the sampling.")
@click.option("-o", "--out", type=click.Path(path_type=pathlib.Path), required=True,
              help="New model directory: the checkpoint plus its compiled operator.")
def compile_model(checkpoint, data, split, n_pairs, held_out, slices, ceta_slices, passes, ridge, seed, out):
    """Compile the alignment plan of a trained aligner (ASAP): fit a closed-form map from
    per-residue features to the Sinkhorn dual on calibration pairs, so that `--engine asap`
    rebuilds the plan with c-transforms instead of iterating. Every weight stays frozen. A
    model whose encoder has CETA layers also gets one operator per layer (sliced 1-D
    potentials and per-residue features of the layer's queries and keys), which `--engine
    asap` uses in place of the layers' Sinkhorn.

    \b
    OUT loads wherever a model loads; `asap.json` in it holds the operator(s), their settings,
    their fit statistics (R^2 of the dual, plan errors against the Sinkhorn plan on held-out
    calibration pairs, per CETA layer too) and the hash of the parameters they fit: used with
    other parameters they are refused. The statistics are printed as JSON.

    \b
    Examples:
      pfamalign compile --data data_b62_1k -o compiled/    # the shipped model, its dataset
      pfamalign compile --checkpoint runs/x/model --data data/ -o runs/x/compiled
      pfamalign align --checkpoint compiled/ --engine asap SEQ_A SEQ_B

    Without --data, the dataset the model trained on is used if it is at the path its training
    record names (the shipped model's, data_b62_1k, is looked for in the current directory
    and in data/). Any prepared dataset calibrates: with other stored features than the
    model's, its sequences are featurized with the model's embedder.
    """
    from pfamalign import asap, jsonio
    from pfamalign.inference import default_model_dir

    try:
        settings = asap.AsapSettings(slices=slices, passes=int(passes), ridge=ridge, seed=seed)
        ceta = dataclasses.replace(asap.CETA_SETTINGS, passes=int(passes), ridge=ridge, seed=seed,
                                   **({} if ceta_slices is None else {"slices": ceta_slices}))
        op = compile_into(checkpoint if checkpoint is not None else default_model_dir(), out, data=data,
                          split=split, n_pairs=n_pairs, held_out=held_out, settings=settings,
                          ceta_settings=ceta, seed=seed)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    click.echo(jsonio.dumps({"out": str(out), "params_hash": op.params_hash, **op.stats,
                             **({"layers": [layer.stats for layer in op.layers]} if op.layers else {})}))


def compile_into(source, out, *, data=None, split: str = "train", n_pairs: int = 64, held_out: int = 16,
                 settings=None, ceta_settings=None, seed: int = 0, replace: bool = False):
    """Fits the model directory ``source``'s operator(s) on ``n_pairs`` calibration pairs of
    ``data``'s ``split`` (default: the model's training dataset), ``held_out`` more for the
    statistics, and writes the compiled model directory ``out`` (``asap.write_compiled``;
    ``replace``: over an earlier compiled one). Returns the operator; ValueError /
    FileNotFoundError on bad input. `compile` and `train --compile` share it."""
    import numpy as np

    from pfamalign import asap, checkpoint as ckpt
    from pfamalign.ensemble import is_ensemble, read_members
    from pfamalign.evaluation import pair_records
    from pfamalign.inference import Predictor

    if is_ensemble(source):
        raise ValueError(f"{source} is an ensemble, whose plans come from its members' own solves; "
                         f"compile one member's directory (e.g. {pathlib.Path(source) / read_members(source)[0].path}) "
                         "and use it on its own")
    config_path, params_path = ckpt.resolve_model_path(pathlib.Path(source))
    if params_path.parent != config_path.parent:
        raise ValueError(f"{source} is not a model directory (config.json + params/); compile RUN/model")
    source = config_path.parent
    asap.check_output_dir(source, out, replace=replace)  # before the slow part
    ckpt.check_copyable(source)  # copied at the end, as the output's model
    data = data or _training_data(source)
    predictor = Predictor(source)
    records, _, features = pair_records(data=data, split=split, max_pairs=n_pairs + held_out, seed=seed,
                                        embedder_id=predictor.config.embedder_id)
    records = list(records)
    need = 2 if held_out else 1  # one to fit (and one to hold out)
    if len(records) < need:
        raise ValueError(f"{data} split {split!r} gave {len(records)} pair(s); compiling needs at least {need}"
                         + (" (one to fit, one to hold out; or --held-out 0)" if held_out else ""))
    if features == "records":
        pairs = [(np.asarray(r["q_feat"], np.float32), np.asarray(r["k_feat"], np.float32)) for r in records]
    else:
        flat = predictor.featurize([s for r in records for s in (r["q_seq"], r["k_seq"])])
        pairs = list(zip(flat[0::2], flat[1::2]))
    order = np.random.default_rng(seed).permutation(len(pairs))
    n_fit = min(n_pairs, len(pairs) - (1 if held_out else 0))
    fit = [pairs[i] for i in order[:n_fit]]
    rest = [pairs[i] for i in order[n_fit:]]
    if n_fit < n_pairs or len(rest) < held_out:  # a small split: say what the statistics rest on
        click.echo(f"Warning: {data} split {split!r} has {len(pairs)} pairs, fewer than the {n_pairs} "
                   f"calibration + {held_out} held-out pairs asked for: fitting {n_fit}, holding out "
                   f"{len(rest)}", err=True)
    op = asap.fit(predictor.model, fit, settings or asap.AsapSettings(), held_out=rest,
                  ceta_settings=ceta_settings)
    op.stats.update({"data": str(data), "split": split})
    asap.write_compiled(source, out, op, replace=replace)
    return op


def _training_data(model_dir: pathlib.Path) -> pathlib.Path:
    """The dataset the model trained on, where its training record says it is."""
    from pfamalign.checkpoint import read_training_record

    from pfamalign.pipelines.reader import PairDataset

    record = read_training_record(model_dir) or {}
    path, trained = record.get("dataset", {}).get("path"), record.get("dataset", {}).get("config_hash")
    candidates = [pathlib.Path(path), pathlib.Path("data") / path] if path else []
    for candidate in candidates:
        if candidate.is_dir():
            found = PairDataset(candidate).config_hash
            if trained is not None and found != trained:  # any dataset calibrates, but not unannounced
                click.echo(f"Warning: {candidate} is not the dataset the model trained on (config hash {found}, "
                           f"the model's {trained}: prepared again since, with other options); calibrating on "
                           "it anyway; pass --data DIR to choose the calibration data", err=True)
            return candidate
    where = (f"is not here (looked for {' and '.join(str(c) for c in candidates)})" if candidates
             else "is not recorded")
    raise ValueError(f"no calibration data: the model's training dataset ({path or 'unrecorded'}) "
                     f"{where}; pass --data DIR")
