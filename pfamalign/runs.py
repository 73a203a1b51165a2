"""What a run directory and its model directory hold, read without jax or flax (a warm
``align`` of a trained run and ``verify`` read them): the training record (``checkpoint``
writes it), the finished checkpoint steps, and the checksums (written and checked here).
``checkpoint`` re-exports these names."""

from __future__ import annotations

import json
import os
import pathlib

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
    steps = []
    for child in directory.iterdir():
        if child.is_dir() and child.name.isdigit() and (child / "params").is_dir():
            steps.append(int(child.name))
    return sorted(steps)


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
