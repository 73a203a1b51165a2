"""What a run directory and its model directory hold, read without jax or flax (a warm
``align`` of a trained run and ``verify`` read them): the training record (``checkpoint``
writes it), the finished checkpoint steps, and the checksums (written and checked here).
``checkpoint`` re-exports these names."""

from __future__ import annotations

import json
import os
import pathlib
import sys

from pfamalign.pipelines import records

TRAINING_RECORD = "training.json"
# A model directory's settings files beside its parameters: what it aligns with (config,
# decoder, pair-HMM) and what it learnt from. A finished model records their checksums too.
MODEL_RECORDS = ("config.json", "decoding.json", "pairhmm.json", TRAINING_RECORD)


class CheckpointError(ValueError):
    """A path that is not a loadable model or checkpoint."""


class DamagedParameters(CheckpointError):
    """A parameter directory whose own listing orbax cannot read back: damaged files, which
    no config.json fixes (not a mismatch between the parameters and a config)."""


def read_training_record(directory: str | os.PathLike) -> dict | None:
    """``MODEL/training.json``, or None for a model directory without one; CheckpointError
    naming the file when it is unreadable or a part its readers use has another shape
    (``eval``'s ``trained_on.families: 5`` was a TypeError traceback)."""
    path = pathlib.Path(directory) / TRAINING_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    strings = lambda x: isinstance(x, list) and all(isinstance(v, str) for v in x)  # noqa: E731
    text = lambda x: x is None or isinstance(x, str)  # noqa: E731
    shapes = (("trained_on", lambda v: isinstance(v, dict) and strings(v.get("families", []))),
              ("decoder", lambda v: v is None or isinstance(v, dict) and strings(v.get("families", []))),
              ("dataset", lambda v: isinstance(v, dict) and text(v.get("path")) and text(v.get("config_hash"))),
              ("step", lambda v: isinstance(v, int) and not isinstance(v, bool)))
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: not a training record (a JSON object); restore it or train again")
    for key, fits in shapes:
        if key in record and not fits(record[key]):
            raise CheckpointError(f"{path}: {key!r} is not what a training record holds there; restore the "
                                  "file or train again")
    return record


def finished_steps(directory: pathlib.Path) -> list[int]:
    """The steps of ``RUN/checkpoints`` whose parameters were written, oldest first."""
    return sorted(int(child.name) for child in _step_dirs(directory) if (child / "params").is_dir())


def incomplete_steps(directory: pathlib.Path) -> list[pathlib.Path]:
    """The step directories of ``RUN/checkpoints`` without ``params/``, oldest first: never
    left by a save (orbax writes a step beside it and renames it whole), so a partial copy or
    one emptied by hand. A resume skipped one, trained its step again and then could not save
    over it, on every retry."""
    return sorted((child for child in _step_dirs(directory) if not (child / "params").is_dir()),
                  key=lambda child: int(child.name))


def _step_dirs(directory: pathlib.Path) -> list[pathlib.Path]:
    return [child for child in directory.iterdir() if child.is_dir() and child.name.isdigit()]


# ---------------------------------------------------------------------------------------------
# Checksums: MODEL/checksums.json and RUN/checkpoints/N/checksums.json record the SHA-256 of
# every file the parameters (and optimiser state) were saved to; loading verifies them, so a
# flipped bit or a truncated copy is an error, not a silently different model. Directories
# saved before checksums existed (or killed between the save and the record) load unverified.
# ---------------------------------------------------------------------------------------------

CHECKSUMS = "checksums.json"


def write_checksums(directory: pathlib.Path, parts: tuple[str, ...]) -> None:
    """Records the SHA-256 of every file under ``directory / part`` for each part (a part
    may be one file)."""
    files = lambda p: [p] if p.is_file() else sorted(p.rglob("*"))
    sums = {str(f.relative_to(directory)): records.file_sha256(f)
            for part in parts for f in files(directory / part) if f.is_file()}
    records.write_json(directory / CHECKSUMS, {"sha256": sums}, indent=2)


def add_checksums(directory: pathlib.Path, names: tuple[str, ...], extra: dict[str, str] | None = None) -> None:
    """Adds the SHA-256 of the files ``names`` that exist in ``directory`` (and the digests
    ``extra`` of files about to be written) to its checksums file, keeping the digests
    recorded there (never re-reading what they vouch for)."""
    sums = read_checksums(directory)
    sums.update({name: records.file_sha256(directory / name) for name in names if (directory / name).is_file()})
    sums.update(extra or {})
    records.write_json(directory / CHECKSUMS, {"sha256": sums}, indent=2)


def read_checksums(directory: pathlib.Path) -> dict[str, str]:
    """The digests recorded in ``directory``'s checksums file, by file name ({} when there is
    none); ValueError naming the file when it is unreadable (not JSON, or not a table of file
    names to digests: edited or damaged by hand)."""
    path = pathlib.Path(directory) / CHECKSUMS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from None
    sums = data.get("sha256") if isinstance(data, dict) else None
    if not (isinstance(sums, dict) and all(isinstance(v, str) for v in sums.values())):
        raise ValueError(f'{path}: unreadable (no "sha256" table of file names to digests)')
    outside = [name for name in sums if not records.stays_inside(name)]
    if outside:  # read and hashed, "params/../../../etc/passwd" would be checked outside the model
        raise ValueError(f"{path}: unreadable (names a file outside its directory: {outside[0]!r})")
    return sums


def params_unrecorded(directory: pathlib.Path) -> bool:
    """Whether nothing vouches for ``directory/params``: no checksums file, or one whose table
    records no file under ``params/`` (emptied by hand: it passed as "nothing recorded" with
    no warning, and named the parameter cache of every such model alike). An unreadable
    checksums file is not this: checking it reports it."""
    try:
        sums = read_checksums(directory)
    except ValueError:
        return False
    return not any(name.startswith("params/") for name in sums)


_WARNED_UNVERIFIABLE: set[pathlib.Path] = set()


def check_parameter_files(params_path: pathlib.Path) -> None:
    """CheckpointError when the files of ``params_path`` (a model's or a checkpoint step's
    ``params/``) fail the checksums its directory records; a warning, once per directory,
    when nothing records them (saved by an older pfamalign, or killed before it was written):
    they load with nothing to check them against."""
    params_path = pathlib.Path(params_path)
    problems = verify_checksums(params_path.parent, params_path.name)
    if problems:
        raise CheckpointError(f"{params_path} fails its checksums: " + "; ".join(problems[:5]))
    directory = params_path.parent.absolute()
    if params_unrecorded(directory) and directory not in _WARNED_UNVERIFIABLE:
        _WARNED_UNVERIFIABLE.add(directory)
        print(f"Warning: {directory} has no {CHECKSUMS} recording its parameters: they load unverified (saved "
              "by an older pfamalign, or killed before it was written); a damaged file shows only as an error "
              "or a wrong result", file=sys.stderr, flush=True)


def verify_checksums(directory: pathlib.Path, part: str | None = None) -> list[str]:
    """The problems of ``directory`` against its checksums (only ``part``, a file or the files
    under it, if given): missing, changed or unrecorded files, or an unreadable checksums
    file. [] when all match or nothing is recorded."""
    directory = pathlib.Path(directory)
    try:
        sums = read_checksums(directory)
    except ValueError as err:
        return [str(err)]
    if not sums:  # saved before checksums (or killed before they were written): loads unverified
        return []
    problems = []
    for name, digest in sorted(sums.items()):
        if part and not (name == part or name.startswith(f"{part}/")):
            continue
        f = directory / name
        if not f.is_file():
            problems.append(f"{f}: missing")
        elif records.file_sha256(f) != digest:
            problems.append(f"{f}: checksum mismatch (corrupt or modified)")
    roots = [directory / part] if part else [directory / n.split("/")[0] for n in sums]
    for root in set(roots):
        for f in sorted(root.rglob("*")) if root.is_dir() else []:
            if f.is_file() and str(f.relative_to(directory)) not in sums:
                problems.append(f"{f}: not in {CHECKSUMS}")
    return problems
