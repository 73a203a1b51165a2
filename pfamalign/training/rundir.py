"""The run directory: its config (new, resumed, or refused), ``metrics.jsonl`` /
TensorBoard, and the progress line.

``RUN/config.json`` holds the resolved run config (``{"model", "train", "data", "devices",
"processes"}``, ``train`` flat: ``{field: value}``); re-running into the same directory
resumes only with the same model, trajectory and dataset (see ``check_resumable``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import sys
from typing import Any

import jax

from pfamalign import checkpoint as ckpt
from pfamalign import jsonio
from pfamalign.configs import CONFIG_NAMES, RESUMABLE_FIELDS, RunConfig, apply_overrides, get_config
from pfamalign.pipelines import reader, records
from pfamalign.pipelines.locks import LOCK_NAME
from pfamalign.training.errors import OptionsError, TrainingError


def read_saved(out_dir: str | os.PathLike) -> dict | None:
    """The run directory's ``config.json``, or None for a new run; TrainingError naming the
    file when it is unreadable (a torn copy, an edit gone wrong)."""
    path = pathlib.Path(out_dir) / "config.json"
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError(f"a JSON {type(saved).__name__}, not an object")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise TrainingError(f"{path} is damaged ({err}): restore it from a copy to resume this "
                            "run, or give a new --out") from None
    return saved


def run_config(data_dir: str | os.PathLike, out_dir: str | os.PathLike, name: str | None, *,
               overrides: dict[str, Any] | None = None) -> RunConfig:
    """The config of a ``pfamalign train`` invocation: the named config (required for a new
    run) or the one saved in ``out_dir``, with overrides. Refuses (``OptionsError``) another
    named config than the one of a run that has checkpoints."""
    reader.PairDataset(data_dir)  # a --data that is no dataset is the first thing to fix
    check_out_dir(data_dir, out_dir)
    saved = read_saved(out_dir)
    if name is None and saved is None:
        raise OptionsError(f"--config is required for a new run (one of {', '.join(CONFIG_NAMES)})")
    if (name is not None and saved is not None and saved["model"]["name"] != name
            and (pathlib.Path(out_dir) / "checkpoints").is_dir()):
        raise OptionsError(f"{out_dir} holds a run of the {saved['model']['name']!r} configuration; use "
                           f"a new --out for {name!r}")
    return resolve_config(data_dir, name, overrides=overrides,
                          saved=None if name is not None else saved)


def check_out_dir(data_dir: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Refuses (``OptionsError``) a run directory that would mix checkpoints with other
    files: the dataset or a folder inside it, or a non-empty directory that is not a run
    (its ``config.json`` has the run's ``train`` section; a model directory's has not). A
    lone lock file is a run killed before it wrote its config: a new run may use it."""
    out, data = pathlib.Path(out_dir).resolve(), pathlib.Path(data_dir).resolve()
    if out == data or data in out.parents:
        raise OptionsError(f"--out {out_dir} is the dataset --data {data_dir} or inside it; "
                           "write the run to a directory of its own")
    if not out.is_dir() or "train" in (read_saved(out) or {}):
        return
    if any(p.name != LOCK_NAME for p in out.iterdir()):
        raise OptionsError(f"--out {out_dir} holds other files and no `pfamalign train` run "
                           "(no run config.json); give a new or empty directory, or a run to resume")


def resolve_config(data_dir: str | os.PathLike, name: str | None, *,
                   overrides: dict[str, Any] | None = None,
                   saved: dict | None = None) -> RunConfig:
    """The run config: the named config for the dataset's features (or the config saved in
    the run directory when ``name`` is None), with overrides applied (CLI options and
    ``--set`` pairs, as ``{key: value}``)."""
    ds = reader.PairDataset(data_dir)
    if name is None:
        if saved is None:
            raise TrainingError("--config is required for a new run")
        cfg = RunConfig.from_dict(saved)
    else:
        cfg = get_config(name, embedder_id=ds.embedder_id, feature_dim=ds.dim)
    cfg = apply_overrides(cfg, overrides or {})
    if cfg.model.feature_dim != ds.dim or cfg.model.embedder_id != ds.embedder_id:
        raise TrainingError(
            f"the run was configured for {cfg.model.embedder_id} features (D="
            f"{cfg.model.feature_dim}) but {data_dir} has {ds.embedder_id} (D={ds.dim})")
    return cfg


def data_info(data_dir) -> dict:
    """What the run directory records of its dataset (the config hash guards resumes)."""
    ds = reader.PairDataset(data_dir)
    return {"path": str(pathlib.Path(data_dir).absolute()), "config_hash": ds.config_hash,
            "embedder_id": ds.embedder_id, "dim": ds.dim,
            "pairs": {s: ds.num_pairs(s) for s in ds.splits}}


def split_families(data_dir, split: str) -> list[str]:
    """The version-free accessions of the families with pairs in ``split`` (the dataset's
    families table)."""
    ds = reader.PairDataset(data_dir)
    path = ds.path / ds.manifest["families_table"]
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return sorted({row["accession_base"] for row in csv.DictReader(f, delimiter="\t")
                           if row["split"] == split and int(row["n_pairs"] or 0) > 0})
    except (UnicodeDecodeError, KeyError, ValueError, TypeError) as err:  # damaged or edited by hand
        raise ValueError(f"{path}: unreadable families table ({err}); `pfamalign verify {ds.path}` checks the "
                         "dataset, and prepare builds it again") from None


def _diff(new: dict, old: dict, prefix: str) -> list[str]:
    return [f"{key}: {a!r} -> {b!r}" for key, a, b in jsonio.changes(old, new, prefix)]


def check_resumable(cfg: RunConfig, saved: dict, data: dict, *,
                    allow_changes: bool = False) -> list[str]:
    """Refuses to resume a run directory with a different model, trajectory or dataset.

    ``allow_changes`` accepts other training settings, the optimiser's and the batches' (e.g.
    a lower learning rate after a divergence); the model and the dataset must still match.
    Returns the changed settings."""
    new, old = cfg.to_dict(), RunConfig.from_dict(saved).to_dict()  # either config.json form
    diffs = _diff(new["model"], old["model"], "model.")
    changed = [d for d in _diff(new["train"], old["train"], "train.")
               if d.split(":")[0].split(".")[-1] not in RESUMABLE_FIELDS]
    if not allow_changes:
        diffs += changed
    old_hash = saved.get("data", {}).get("config_hash")
    if old_hash is not None and old_hash != data["config_hash"]:
        diffs.append(f"data.config_hash: {old_hash!r} -> {data['config_hash']!r}")
    if diffs:
        hint = ("" if allow_changes or any(d.startswith(("model.", "data.")) for d in diffs)
                else " (or pass --allow-changes to continue with the new optimisation settings)")
        raise TrainingError("the run directory holds a run with other settings; resume with the "
                            f"same ones or use a new --out{hint}:\n  " + "\n  ".join(diffs))
    return changed if allow_changes else []


def open_run(out_dir: pathlib.Path, data_dir, cfg: RunConfig, mesh, *,
             allow_changes: bool = False) -> tuple[int | None, list[str]]:
    """Checks a resume and writes ``config.json`` (process 0); returns ``(the checkpoint
    step to resume from or None, the changed optimisation settings)``."""
    saved, data = read_saved(out_dir), data_info(data_dir)
    resume_step, changed = None, []
    manager_dir = out_dir / "checkpoints"
    steps = ckpt.finished_steps(manager_dir) if manager_dir.is_dir() else []
    incomplete = ckpt.incomplete_steps(manager_dir) if manager_dir.is_dir() else []
    if incomplete:
        raise TrainingError(f"{incomplete[-1]} is an incomplete checkpoint (no params/: a partial copy, or "
                            "emptied by hand); remove that step directory and run again")
    if saved is not None and steps:
        changed = check_resumable(cfg, saved, data, allow_changes=allow_changes)
        resume_step = steps[-1]
        if changed and cfg.train.steps < resume_step:
            raise TrainingError(f"{out_dir} is at step {resume_step}; --steps {cfg.train.steps} would train "
                                f"nothing (give --steps above {resume_step} to continue it)")
        if resume_step >= cfg.train.steps:  # nothing to train: the recorded settings stand
            return resume_step, []
        moved = [f"{key}: {saved[key]} -> {now}" for key, now in (("devices", mesh.devices.size),
                                                                  ("processes", jax.process_count()))
                 if saved.get(key) not in (None, now)]
        if moved:  # allowed: each step's global batch is the same, summed in another order
            changed = changed + moved + ["(the same batches; parameters equal the uninterrupted run's to "
                                         "rounding, not bit for bit)"]
    if jax.process_index() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        records.write_json(out_dir / "config.json",
                           {**cfg.to_dict(), "data": data, "devices": mesh.devices.size,
                            "processes": jax.process_count()}, indent=2)
    return resume_step, changed


class MetricsWriter:
    """Process-0 ``metrics.jsonl`` (+ optional TensorBoard). On resume the lines of steps
    after the restored checkpoint (written by the interrupted run) are dropped. Non-finite
    numbers are written as null (``jsonio.clean``)."""

    def __init__(self, out_dir: pathlib.Path, *, resume_step: int | None,
                 tensorboard: bool = False):
        self.active = jax.process_index() == 0
        self.path = out_dir / "metrics.jsonl"
        self._tb = None
        if not self.active:
            return
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            # a run handed over with a link here would have its target read and rewritten
            raise TrainingError(f"{self.path} is a symbolic link or not a regular file: a run's "
                                "metrics.jsonl is a file of its own; move it away and run again")
        if self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    continue  # a torn last line of a killed run
                step = rec.get("step", 0) if isinstance(rec, dict) else None  # a line of another form: dropped
                if isinstance(step, (int, float)) and resume_step is not None and step <= resume_step:
                    keep.append(line)
            records.write_text(self.path, "".join(line + "\n" for line in keep))
        self._file = open(self.path, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(out_dir / "tensorboard"))

    def write(self, step: int, record: dict[str, Any]) -> None:
        if not self.active:
            return
        rec = jsonio.clean({"step": step, **record})
        self._file.write(jsonio.dumps_line(rec) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in rec.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self.active:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


def _clock(seconds: float) -> str:
    """``h:mm:ss`` of a duration."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressLine:
    """Training progress on standard error: a live rich line on a terminal; elsewhere (a log
    file, ``nohup``, CI) a plain line every ``every`` steps; silent when quiet. The rate and
    the time left come from the median of the recent step times (``update``'s ``step_time``),
    so a step that compiled a new batch shape does not set them."""

    RECENT = 50  # steps whose median time is the rate shown

    def __init__(self, total: int, start: int, *, quiet: bool, every: int = 0):
        import collections

        self.quiet = quiet or jax.process_index() != 0
        self.enabled = not self.quiet and sys.stderr.isatty() and not os.environ.get("CI")
        self.total, self.every = total, every
        self._times = collections.deque(maxlen=self.RECENT)
        self._progress = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                      TextColumn("left {task.fields[left]}"), transient=False,
                                      console=Console(stderr=True))
            self._progress.start()
            self._task = self._progress.add_task("train", total=total, completed=start,
                                                 info="compiling the training step", left="-")

    def update(self, step: int, info: str, *, step_time: float | None = None, batch_size: int | None = None) -> None:
        """Step ``step`` done in ``step_time`` seconds (``batch_size`` examples): ``info`` and
        the typical rate, shown live or, without a terminal, every ``every`` steps."""
        if step_time is not None:
            self._times.append(step_time)
        left = "-"
        if self._times:
            # the lower median: of an even count (two steps, one of them compiling) the faster
            typical = float(sorted(self._times)[(len(self._times) - 1) // 2])
            left = _clock(typical * (self.total - step))
            if batch_size:
                info = f"{info}  {batch_size / typical:.1f} ex/s"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info, left=left)
        elif not self.quiet and self.every and (step % self.every == 0 or step == self.total):
            print(f"step {step}/{self.total}  {info}  left {left}", file=sys.stderr, flush=True)

    def log(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        elif not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
