"""What a run directory and its model directory hold, read without jax or flax (a warm
``align`` of a trained run reads them): the training record and the finished checkpoint
steps. ``checkpoint`` writes them and re-exports these names."""

from __future__ import annotations

import json
import os
import pathlib

TRAINING_RECORD = "training.json"


class CheckpointError(ValueError):
    """A path that is not a loadable model or checkpoint."""


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
