"""``pfamalign verify``: check a dataset, a model or a training run against its checksums."""

from __future__ import annotations

import json
import pathlib

import click

from pfamalign.commands._common import fail
from pfamalign.outputs import TEMPORARY_GLOB


def verify_directory(directory: pathlib.Path) -> tuple[list[str], list[str]]:
    """``(what was checked, problems)`` of a dataset (every shard's SHA-256 in its
    manifest), a model directory, an ensemble (each member model), or a run directory (its
    model and every checkpoint), plus temporary files a killed run left behind."""
    from pfamalign import ensemble
    from pfamalign.runs import (CHECKSUMS, MODEL_RECORDS, incomplete_steps, params_unrecorded, read_checksums,
                                verify_checksums)
    from pfamalign.inference import ENSEMBLE_FILE
    from pfamalign.pipelines.prepare import REPLACEMENT
    from pfamalign.pipelines.reader import EmbeddingSource, dataset_files, dataset_problems, manifest_problems

    checked, problems = [], []
    manifest = directory / "manifest.json"
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
            return [], [f"{manifest}: unreadable ({err})"]
        shape = manifest_problems(data) if isinstance(data, dict) else ["manifest.json is not a JSON object"]
        if shape:  # named files outside the dataset, or not a manifest's shape: nothing more to read
            return [], [f"{directory}: {p}" for p in shape]
        problems += [f"{directory}: {p}" for p in dataset_problems(directory, data, full=True)]
        if not problems and data["embeddings"]["count"]:  # the width the manifest gives its records
            try:
                EmbeddingSource(directory)[0]
            except ValueError as err:
                problems.append(str(err))
        checked.append(f"dataset {directory}: {len(data.get('shards', []))} shards")
        recorded = {row["path"] for row in data.get("shards", []) + data.get("tables", [])}
        bare = [name for name in dataset_files(data) if name not in recorded]
        if bare:  # a manifest from before the tables had checksums
            checked.append(f"{UNVERIFIED}{directory}: {len(bare)} files without checksums in its manifest "
                           f"({', '.join(bare[:3])}{', ...' if len(bare) > 3 else ''}); re-run "
                           "prepare into a new --out to record them")
    # a run's compiled model (``train --compile``) is one of its parts too
    models = [d for d in (directory, directory / "model", directory / "compiled") if (d / "params").is_dir()]
    if ensemble.is_ensemble(directory):
        problems += verify_checksums(directory)  # its own files (none recorded before 2026-11-29)
        if not (directory / CHECKSUMS).is_file():  # as for a model: nothing vouches for ensemble.json
            problems.append(f"{directory}: no {CHECKSUMS} (saved by an older pfamalign, or killed before "
                            "it was written): its members and powers cannot be verified; rebuild it with "
                            "`pfamalign ensemble` to record them")
        try:
            members = [directory / m.path for m in ensemble.read_members(directory)]
        except ValueError as err:  # a damaged ensemble.json: its checksum said so above, if recorded
            problems.append(str(err))
            members = []
        problems += [f"{d}: ensemble member missing" for d in members if not (d / "params").is_dir()]
        models += [d for d in members if (d / "params").is_dir()]
        try:
            recorded = read_checksums(directory)
        except ValueError:  # reported among the damage
            recorded = None
        if recorded is not None:
            own = [n for n in (ENSEMBLE_FILE, *MODEL_RECORDS) if (directory / n).is_file()]
            checked.append(_unrecorded(directory, own, recorded) or f"ensemble {directory}: {len(own)} files")
    steps = directory / "checkpoints"
    saved = sorted((d for d in steps.iterdir() if d.is_dir() and d.name.isdigit()),
                   key=lambda d: int(d.name)) if steps.is_dir() else []
    models += saved
    if saved and not (directory / "model" / "params").is_dir():  # a run stopped before its model
        checked.append(f"{NOTE}{directory}: an unfinished run (newest checkpoint: step {saved[-1].name}; no "
                       "model/ yet); re-run the same `pfamalign train` command to finish it")
    intact = {}  # model or checkpoint -> whether its files match their checksums
    problems += [f"{d}: an incomplete checkpoint (no params/: a partial copy, or emptied by hand); remove that "
                 "step directory to resume from the one before" for d in (incomplete_steps(steps) if saved else [])]
    for d in models:
        if params_unrecorded(d):
            problems += _model_problems(d)
            problems.append(f"{d}: no {CHECKSUMS} (saved by an older pfamalign, or killed before it was "
                            "written): cannot be verified" if not (d / CHECKSUMS).is_file() else
                            f"{d}: its {CHECKSUMS} records no parameter file (edited): cannot be verified")
            continue
        damaged = verify_checksums(d)  # first: the damage is what to report of a damaged file
        intact[d] = not damaged
        problems += damaged + _model_problems(d, damaged=damaged)
        try:
            sums = read_checksums(d)
        except ValueError:  # reported among the damage
            continue
        checked.append(f"{d}: {len(sums)} files")
        # settings saved before they were recorded, or unfinished (training.json records them)
        checked += filter(None, [_unrecorded(d, [n for n in MODEL_RECORDS if (d / n).is_file()], sums)])
    if saved:
        problems += _run_config_problems(directory, saved[-1], intact.get(saved[-1], False))
    if not (checked or problems):
        if "train" in (_saved_or_none(directory) or {}):  # a run killed before its first checkpoint
            return [f"{NOTE}{directory}: a training run with no checkpoint yet (nothing to verify); re-run "
                    "the same `pfamalign train` command to start it again"], []
        return [], []  # not one of ours: its temporary files are not ours either
    temporaries = sorted(directory.rglob(TEMPORARY_GLOB))
    for unfinished in (directory / name for name in ("work", REPLACEMENT)):
        # an interrupted `prepare` keeps its work here to resume (a replacement is built beside
        # the dataset it replaces): the dataset is not touched, its files are not stray
        mine = [p for p in temporaries if p.is_relative_to(unfinished)]
        if mine:
            checked.append(f"{NOTE}{unfinished}: the unfinished work of an interrupted `pfamalign prepare` "
                           f"({len(mine)} temporary file(s)); re-run that command to finish it, or delete "
                           f"{unfinished.name}/ to give it up")
            temporaries = [p for p in temporaries if p not in mine]
    work = directory / "work"
    if (directory / "manifest.json").is_file() and work.is_dir() and not any(
            line.startswith(f"{NOTE}{work}:") for line in checked):
        checked.append(f"{NOTE}{work}: working files beside a finished dataset (kept by --keep-work, or "
                       "left by a run stopped just after it wrote the manifest); not part of the dataset: "
                       "delete work/ if you do not need it")
    replacement = directory / REPLACEMENT
    if replacement.is_dir() and not any(line.startswith(f"{NOTE}{replacement}:") for line in checked):
        # built whole, then stopped before the swap (no temporary left to report it)
        files = sum(1 for p in replacement.rglob("*") if p.is_file())
        checked.append(f"{NOTE}{replacement}: the replacement an interrupted `pfamalign prepare --overwrite` "
                       f"built ({files} file(s)); re-run that command to finish it, or delete "
                       f"{REPLACEMENT}/ to give it up")
    problems += [f"{p}: temporary file left by an interrupted run (safe to delete)" for p in temporaries]
    return checked, problems


def _unrecorded(directory: pathlib.Path, names: list[str], recorded: dict) -> str | None:
    """The ``UNVERIFIED`` line of the files ``names`` of ``directory`` that hold no recorded
    checksum; None when every one has its checksum."""
    bare = [name for name in names if name not in recorded]
    return (f"{UNVERIFIED}{directory}: {', '.join(bare)} (no checksum recorded: an edit to them goes "
            "unnoticed)") if bare else None


def _saved_or_none(run: pathlib.Path) -> dict | None:
    """A run directory's config, or None (none, or unreadable)."""
    from pfamalign.training.errors import TrainingError
    from pfamalign.training.rundir import read_saved

    try:
        return read_saved(run)
    except TrainingError:
        return None


def _run_config_problems(run: pathlib.Path, newest: pathlib.Path, newest_intact: bool) -> list[str]:
    """A run's ``config.json`` (what a resume reads, and rewrites, so no checksum can vouch
    for it): present, readable, and asking for the parameters its newest checkpoint holds
    (compared when that checkpoint is ``newest_intact``: its own damage is reported with it)."""
    from pfamalign.checkpoint import DamagedParameters, abstract_params, param_mismatches
    from pfamalign.configs import RunConfig
    from pfamalign.training.errors import TrainingError
    from pfamalign.training.rundir import read_saved

    path = run / "config.json"
    try:
        saved = read_saved(run)
        if saved is None:
            return [f"{path}: missing; the run cannot resume without it (restore it from a copy)"]
        config = RunConfig.from_dict(saved).model
    except TrainingError as err:
        return [str(err)]
    except (KeyError, TypeError, ValueError) as err:
        return [f"{path}: not a run config ({err}); restore it from a copy"]
    if not newest_intact:
        return []
    try:
        mismatches = param_mismatches(abstract_params(config)[1], newest / "params")
    except DamagedParameters as err:  # no checksums to have caught it
        return [str(err)]
    return [f"{path} does not match the parameters of checkpoint {newest.name}: {m}" for m in mismatches[:5]]


UNVERIFIED = "not verified: "  # a ``checked`` line naming what has no checksum to check
NOTE = "note: "  # a ``checked`` line saying something worth knowing that is not a problem


def _model_problems(model: pathlib.Path, *, damaged: list[str] = ()) -> list[str]:
    """A model directory's settings and its parameters' shapes. Its JSON settings files (whose
    checksums a finished model records, ``checkpoint.write_training_record``) must each parse
    and pass the same field checks as on load, and the parameters' names, shapes and dtypes must be those
    config.json asks for; a compiled operator (asap.json) must load and, when nothing else is
    wrong, have been fitted to these parameters and this configuration (``_operator_fit_problems``);
    a training run's ``model/`` must be finished (training.json, written last). Files named in ``damaged``
    (checksum problems) are not read: a corrupt parameter file's metadata fails in orbax's
    threads (tracebacks) and would blame config.json for the damage."""
    intact = lambda part: not any(p.startswith(str(model / part)) for p in damaged)
    from pfamalign.asap import OPERATOR_FILE, CompileError, load_operator
    from pfamalign.checkpoint import (TRAINING_RECORD, CheckpointError, DamagedParameters, abstract_params,
                                      param_mismatches, read_model_config)
    from pfamalign.decoding import DecoderSettings

    problems, config = [], None
    if (model / "config.json").is_file():
        try:
            config = read_model_config(model / "config.json")
        except CheckpointError as err:
            problems.append(str(err))
        else:
            if intact("params") and (model / "params").is_dir():
                try:
                    mismatches = param_mismatches(abstract_params(config)[1], model / "params")
                except DamagedParameters as err:  # no checksums to have caught it
                    problems.append(str(err))
                else:
                    problems += [f"{model}: config.json does not match the parameters: {m}" for m in mismatches[:5]]
    if (model / "decoding.json").is_file():
        try:
            DecoderSettings.load(model)
        except ValueError as err:
            problems.append(str(err))
    if (model / OPERATOR_FILE).is_file() and intact(OPERATOR_FILE):
        try:
            operator = load_operator(model)
        except CompileError as err:  # it names the file
            problems.append(str(err))
        else:
            if not (problems or damaged) and config is not None and (model / "params").is_dir():
                problems += _operator_fit_problems(model, config, operator)
    if model.name == "model" and (model.parent / "checkpoints").is_dir() and not (model / TRAINING_RECORD).is_file():
        problems.append(f"{model}: unfinished (no {TRAINING_RECORD}: training stopped before it "
                        "finished the model); re-run the same `pfamalign train` command to finish it")
    return problems


def _operator_fit_problems(model: pathlib.Path, config, operator) -> list[str]:
    """Whether a compiled operator was fitted to the parameters and configuration beside it,
    as ``align --engine asap`` checks on load (checksums alone pass one compiled by an older
    pfamalign, or a directory without checksums holding another model's operator). Called on
    an undamaged directory only; the parameters are read from it, not from a cached copy."""
    from pfamalign.asap import OPERATOR_FILE, CompileError
    from pfamalign.checkpoint import CheckpointError, restore_model
    from pfamalign.runs import CHECKSUMS

    try:
        operator.check(restore_model(config, model / "config.json", model / "params"))
    except CheckpointError as err:  # the parameters themselves: it names them
        return [str(err)]
    except CompileError as err:
        unvouched = "" if (model / CHECKSUMS).is_file() else (
            f" (no {CHECKSUMS} vouches for the parameters either: if they are not the ones it was "
            "compiled from, restore them instead)")
        return [f"{model / OPERATOR_FILE}: {err}{unvouched}"]
    return []


@click.command(short_help="Check a dataset, model or run against its checksums.")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path))
def verify(directory):
    """Check DIRECTORY (a dataset, a model, an ensemble or a training run) byte for byte
    against the checksums recorded when it was written; exits 1 on any problem.

    \b
    Examples:
      pfamalign verify data/            # every shard against manifest.json
      pfamalign verify runs/align_ce    # the model and every checkpoint
      pfamalign verify ens/             # every member of an ensemble
    """
    from pfamalign.pipelines.reader import unfinished_prepare

    checked, problems = verify_directory(directory)
    if not checked and not problems:
        fail(f"{directory} is {unfinished_prepare(directory) or 'not a pfamalign dataset, model, ensemble or run directory'}")
    unverified = [line for line in checked if line.startswith(UNVERIFIED)]
    for line in checked:
        click.echo(line if line.startswith((UNVERIFIED, NOTE)) else f"checked {line}")
    for line in problems:
        click.echo(f"problem: {line}", err=True)
    if problems:
        fail(f"{len(problems)} problem(s) in {directory}", code=1)
    click.echo("ok: everything with a checksum matches it" + (
        f"; {len(unverified)} part(s) could not be verified (above)" if unverified else ""))
