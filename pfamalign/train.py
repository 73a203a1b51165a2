"""Training an aligner: ``pfamalign train`` (big_vision style: one file, read top to bottom).

Sections: run configuration and the run directory; devices and the data-parallel mesh; data
(checkpointable grain iterator, per-process slices of each global batch); model and
optimiser; the jitted train step; validation; metrics (JSONL, TensorBoard, progress line);
the loop (checkpoints, resume, SIGTERM, non-finite stop).

Data parallelism: a 1-D mesh ``("data",)`` over every device JAX sees (all hosts with
``--distributed``); parameters and optimiser state are replicated, the global batch is split
over the mesh, and the loss is the global mean, so 1 device and N devices take the same step
for the same global batch. Multi-host: every process plans the same global batches (same
seed, same length bucketing, same padded length) and loads only its own rows; the arrays are
assembled with ``jax.make_array_from_process_local_data``.

Resume: ``RUN/checkpoints/N`` holds the parameters, the optimiser state, the grain iterator
state (``{"next_index": N}``) and bookkeeping after N steps. Re-running the same command
restores the newest checkpoint and continues with batch N: the parameters after the run are
bit-identical to those of an uninterrupted run (tested with SIGKILL). SIGTERM / SIGINT save a
checkpoint at the current step and exit cleanly. A non-finite loss or gradient stops the run
without saving (the step is not applied), so the last good checkpoint stays the newest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pfamalign import checkpoint as ckpt
from pfamalign.configs import RESUMABLE_FIELDS, RunConfig, TrainConfig, apply_overrides, get_config
from pfamalign.model import Aligner, aligner_loss
from pfamalign.pipelines import reader

BATCH_KEYS = ("q_feat", "k_feat", "q_len", "k_len", "target", "valid")


class TrainingError(RuntimeError):
    """A run that cannot start or continue (bad options, a foreign run directory)."""


class NonFiniteLoss(TrainingError):
    """The loss or the gradient became NaN / inf; nothing was saved for that step."""


# =============================================================================================
# Run configuration and run directory
# =============================================================================================

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


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(f"{prefix}{k}: {vb!r} -> {va!r}")
    return keys


def check_resumable(cfg: RunConfig, saved: dict, data_info: dict, *,
                    allow_changes: bool = False) -> list[str]:
    """Refuses to resume a run directory with a different model, trajectory or dataset.

    ``allow_changes`` accepts other optimisation settings (e.g. a lower learning rate after
    a divergence); the model and the dataset must still match. Returns the changed
    optimisation settings."""
    new = cfg.to_dict()
    diffs = _diff(new["model"], saved["model"], "model.")
    changed = [d for d in _diff(new["train"], saved["train"], "train.")
               if d.split(":")[0].split(".")[-1] not in RESUMABLE_FIELDS]
    if not allow_changes:
        diffs += changed
    old_hash = saved.get("data", {}).get("config_hash")
    if old_hash is not None and old_hash != data_info["config_hash"]:
        diffs.append(f"data.config_hash: {old_hash!r} -> {data_info['config_hash']!r}")
    if diffs:
        hint = ("" if allow_changes or any(d.startswith(("model.", "data.")) for d in diffs)
                else " (or pass --allow-changes to continue with the new optimisation settings)")
        raise TrainingError("the run directory holds a run with other settings; resume with the "
                            f"same ones or use a new --out{hint}:\n  " + "\n  ".join(diffs))
    return changed if allow_changes else []


# =============================================================================================
# Devices and the data-parallel mesh
# =============================================================================================

def make_mesh(devices=None) -> jax.sharding.Mesh:
    """A 1-D ``("data",)`` mesh over ``devices`` (default: every device of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    return jax.make_mesh((len(devices),), ("data",),
                         axis_types=(jax.sharding.AxisType.Auto,), devices=devices)


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


def check_batch(batch_size: int, mesh) -> None:
    n = mesh.devices.size
    if batch_size % n:
        raise TrainingError(f"global batch {batch_size} is not divisible by the {n} devices; "
                            f"use a multiple of {n} (--batch-size)")
    if batch_size % jax.process_count():
        raise TrainingError(f"global batch {batch_size} is not divisible by the "
                            f"{jax.process_count()} processes")


def shard_batch(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
    """This process's rows of a global batch -> global arrays sharded over ``data``."""
    sharding = batch_sharding(mesh)
    out = {}
    for key in BATCH_KEYS:
        local = np.asarray(batch[key])
        global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
        out[key] = jax.make_array_from_process_local_data(sharding, local, global_shape)
    return out


# =============================================================================================
# Data
# =============================================================================================

class _LoadRows:
    """Picklable grain map: a global batch's record indices -> this process's padded rows.

    The padded length comes from the whole global batch (same on every process).
    """

    def __init__(self, source, lengths: np.ndarray, keep: np.ndarray, pad_multiple: int,
                 process_index: int, process_count: int):
        self.source, self.lengths, self.keep = source, lengths, keep
        self.pad_multiple = pad_multiple
        self.process_index, self.process_count = process_index, process_count

    def __call__(self, plan_indices: np.ndarray) -> dict[str, np.ndarray]:
        records = self.keep[np.asarray(plan_indices)]
        pad = reader.round_up(int(self.lengths[records].max()), self.pad_multiple)
        n = len(records) // self.process_count
        mine = records[self.process_index * n:(self.process_index + 1) * n]
        batch = reader.collate([self.source[i] for i in mine], batch_size=n, pad_to=pad,
                               dim=self.source.dim, with_strings=False)
        return {k: batch[k] for k in BATCH_KEYS}


def _kept(lengths: np.ndarray, max_len: int) -> np.ndarray:
    if not max_len:
        return np.arange(len(lengths))
    return np.flatnonzero(lengths.max(axis=1) <= max_len)


def train_iterator(data_dir, cfg: TrainConfig):
    """A checkpointable grain iterator over this process's rows of the global batches
    (shuffled, length-bucketed, repeating; ``get_state()`` / ``set_state()``)."""
    import grain

    ds = reader.PairDataset(data_dir)
    lengths = ds.lengths("train")
    keep = _kept(lengths, cfg.max_len)
    if len(keep) < cfg.batch_size:
        raise TrainingError(f"{data_dir}: the train split has {len(keep)} usable pairs "
                            f"(max_len={cfg.max_len or 'none'}), fewer than one batch of "
                            f"{cfg.batch_size}")
    plan = reader.BatchPlan(lengths[keep], cfg.batch_size, seed=cfg.seed, shuffle=True,
                            num_epochs=None, bucket_window=cfg.bucket_window)
    load = _LoadRows(ds.source("train"), lengths, keep, cfg.pad_multiple, jax.process_index(),
                     jax.process_count())
    it_ds = grain.MapDataset.source(plan).map(load).to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))
    return iter(it_ds)


def val_batches(data_dir, cfg: TrainConfig) -> list[dict[str, np.ndarray]]:
    """The validation batches: ``eval_pairs`` pairs of the val split (evenly spaced in stored
    order, so every family is represented) within ``max_len``, length-sorted, padded like
    training; [] when there is no val split."""
    ds = reader.PairDataset(data_dir)
    if "val" not in ds.splits or ds.num_pairs("val") == 0:
        return []
    lengths = ds.lengths("val")
    keep = _kept(lengths, cfg.max_len)
    if cfg.eval_pairs and len(keep) > cfg.eval_pairs:  # evenly spaced: every family shows
        keep = keep[np.linspace(0, len(keep) - 1, cfg.eval_pairs).round().astype(int)]
    if not len(keep):
        return []
    src = ds.source("val")
    order = keep[np.argsort(lengths[keep].max(axis=1), kind="stable")]
    out = []
    for start in range(0, len(order), cfg.eval_batch_size):
        idx = order[start:start + cfg.eval_batch_size]
        batch = reader.collate([src[i] for i in idx], batch_size=cfg.eval_batch_size,
                               pad_multiple=cfg.pad_multiple, dim=ds.dim, with_strings=False)
        out.append({k: batch[k] for k in BATCH_KEYS})
    return out


# =============================================================================================
# Model and optimiser
# =============================================================================================

def make_optimizer(cfg: TrainConfig) -> tuple[optax.GradientTransformation, Callable]:
    """AdamW (decay on matrices only) with linear warmup + cosine decay and global-norm
    clipping; returns ``(tx, schedule)``."""
    warmup = min(cfg.warmup_steps, max(cfg.steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=cfg.lr / (warmup + 1), peak_value=cfg.lr, warmup_steps=warmup,
        decay_steps=max(cfg.steps, warmup + 1), end_value=cfg.lr * cfg.final_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adamw(schedule, weight_decay=cfg.weight_decay, mask=decay_mask))
    return tx, schedule


@dataclasses.dataclass
class TrainState:
    """The replicated training state (``params`` a nested dict of arrays)."""

    graphdef: Any
    params: Any
    opt_state: Any
    tx: optax.GradientTransformation
    schedule: Callable


def init_state(cfg: RunConfig, mesh) -> TrainState:
    """Fresh parameters (seeded by ``cfg.train.seed``) and optimiser state, replicated."""
    model = Aligner(cfg.model, rngs=nnx.Rngs(params=cfg.train.seed))
    graphdef, state = nnx.split(model)
    tx, schedule = make_optimizer(cfg.train)
    params = jax.device_put(nnx.to_pure_dict(state), replicated(mesh))
    opt_state = jax.jit(tx.init, out_shardings=replicated(mesh))(params)
    return TrainState(graphdef, params, opt_state, tx, schedule)


def abstract_state(state: TrainState):
    """ShapeDtypeStruct trees (with shardings) of the params and optimiser state."""
    struct = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return jax.tree.map(struct, state.params), jax.tree.map(struct, state.opt_state)


# =============================================================================================
# The train step
# =============================================================================================

def make_train_step(cfg: RunConfig, mesh) -> Callable:
    """``step(params, opt_state, batch) -> (params, opt_state, metrics)``, jitted with the
    batch sharded over ``data`` and everything else replicated. A non-finite loss or
    gradient leaves params and optimiser state unchanged (``metrics["finite"]`` is False).

    Cached per (model config, optimisation settings, mesh): runs in one process (a resume,
    tests) reuse the compiled step.
    """
    t = cfg.train
    key = (cfg.model, t.steps, t.lr, t.warmup_steps, t.final_lr_ratio, t.weight_decay,
           t.clip_norm, mesh)
    if key not in _STEP_CACHE:
        _STEP_CACHE[key] = _build_train_step(cfg, mesh)
    return _STEP_CACHE[key]


_STEP_CACHE: dict[tuple, Callable] = {}


def _build_train_step(cfg: RunConfig, mesh) -> Callable:
    graphdef, _ = ckpt.abstract_params(cfg.model)
    tx, _ = make_optimizer(cfg.train)

    def loss_fn(params, batch):
        return aligner_loss(nnx.merge(graphdef, params), batch)

    def step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        metrics = dict(metrics, grad_norm=grad_norm, finite=ok)
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    rep, data = replicated(mesh), batch_sharding(mesh)
    return jax.jit(step, in_shardings=(rep, rep, data), out_shardings=(rep, rep, rep),
                   donate_argnums=(0, 1))


# =============================================================================================
# Validation
# =============================================================================================

PLAN_METRICS = ("reconstruction", "sparse_ce", "barycenter_mae", "within5",
                "monotonicity_violation")


@nnx.jit
def _eval_batch(model: Aligner, batch):
    _, metrics = aligner_loss(model, batch)
    q_len = jnp.where(batch["valid"], batch["q_len"], 0)
    k_len = jnp.where(batch["valid"], batch["k_len"], 0)
    plan, v, tv = model.head_plans(batch["q_feat"], batch["k_feat"], q_len, k_len)
    return metrics, plan, v, tv


def local_params(params):
    """A host copy of replicated parameters (works on every process of a multi-host run)."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), params)


def evaluate(model: Aligner, batches: list[dict]) -> dict[str, float]:
    """Validation metrics: the training objective (``val/loss``, ``val/recon``, ``val/ce``,
    ``val/mono``) and the DESIGN §5 plan metrics of the dense per-head plans
    (``val/<metric>``, via ``pfamalign.alignment.metrics.plan_metrics``) next to the diagonal
    reference scored with the same values (``diag/<metric>``)."""
    from pfamalign.alignment.metrics import PlanMetrics, diagonal_plan_metrics, plan_metrics

    dustbin = model.cfg.dustbin
    device = jax.local_devices()[0]
    ours, diag, sums, weight = [], [], {}, 0.0
    for batch in batches:
        metrics, plan, v, tv = _eval_batch(model, jax.device_put(batch, device))
        metrics, plan, v, tv = jax.device_get((metrics, plan, v, tv))
        w = float(metrics["n_annotated"])
        for key in ("loss", "recon", "ce", "mono"):
            sums[key] = sums.get(key, 0.0) + float(metrics[key]) * w
        weight += w
        for b in np.flatnonzero(batch["valid"]):
            ql, kl = int(batch["q_len"][b]), int(batch["k_len"][b])
            target = batch["target"][b, :ql]
            p = plan[b, :, :ql, :kl].astype(np.float64)  # [H, ql, kl]
            dust = plan[b, :, :ql, -1].astype(np.float64)  # [H, ql]
            values = v[b, :, :kl].astype(np.float64)  # [H, kl, dv]
            outputs = p @ values + dust[..., None] * tv[:, None, :]
            ours.append(plan_metrics(p, target, values=values, outputs=outputs,
                                     dustbin_mass=dust if dustbin else None))
            diag.append(diagonal_plan_metrics(target, kl, values=values, dustbin=dustbin))
    if not ours:
        return {}
    out = {f"val/{k}": v / max(weight, 1.0) for k, v in sums.items()}
    for prefix, items in (("val", ours), ("diag", diag)):
        pooled = PlanMetrics.pool(items)
        out.update({f"{prefix}/{m}": float(getattr(pooled, m)) for m in PLAN_METRICS})
    out["val/n_pairs"] = len(ours)
    return out


# =============================================================================================
# Metrics: JSONL, TensorBoard, progress line
# =============================================================================================

class MetricsWriter:
    """Process-0 ``metrics.jsonl`` (+ optional TensorBoard). On resume the lines of steps
    after the restored checkpoint (written by the interrupted run) are dropped."""

    def __init__(self, out_dir: pathlib.Path, *, resume_step: int | None,
                 tensorboard: bool = False):
        self.active = jax.process_index() == 0
        self.path = out_dir / "metrics.jsonl"
        self._tb = None
        if not self.active:
            return
        if self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line of a killed run
                if resume_step is not None and rec.get("step", 0) <= resume_step:
                    keep.append(line)
            self.path.write_text("".join(line + "\n" for line in keep))
        self._file = open(self.path, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(out_dir / "tensorboard"))

    def write(self, step: int, record: dict[str, Any]) -> None:
        if not self.active:
            return
        rec = {"step": step, **{k: _jsonable(v) for k, v in record.items()}}
        self._file.write(json.dumps(rec) + "\n")
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


def _jsonable(x):
    if isinstance(x, (np.generic, np.ndarray)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


class ProgressLine:
    """A live rich progress line (silent when quiet, not a TTY, or CI is set)."""

    def __init__(self, total: int, start: int, *, quiet: bool):
        self.quiet = quiet or jax.process_index() != 0
        self.enabled = not self.quiet and sys.stderr.isatty() and not os.environ.get("CI")
        self._progress = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                      TimeRemainingColumn(), transient=False,
                                      console=Console(stderr=True))
            self._progress.start()
            self._task = self._progress.add_task("train", total=total, completed=start, info="")

    def update(self, step: int, info: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)

    def log(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        elif not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


# =============================================================================================
# The loop
# =============================================================================================

@dataclasses.dataclass
class TrainResult:
    """What a run did."""

    out_dir: pathlib.Path
    step: int
    start_step: int
    interrupted: bool
    signal: int | None
    last_metrics: dict[str, float]
    last_eval: dict[str, float]
    model_dir: pathlib.Path | None


class _StopFlag:
    """SIGTERM / SIGINT set a flag (the loop saves and exits); a second SIGINT aborts."""

    def __init__(self):
        self.signal: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handler
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def stop_requested(self) -> bool:
        flag = self.signal is not None
        if jax.process_count() > 1:  # every process must agree before saving
            from jax.experimental import multihost_utils

            flag = bool(np.any(multihost_utils.process_allgather(np.array([flag]))))
        return flag


def _data_info(data_dir) -> dict:
    ds = reader.PairDataset(data_dir)
    return {"path": str(pathlib.Path(data_dir).absolute()), "config_hash": ds.config_hash,
            "embedder_id": ds.embedder_id, "dim": ds.dim,
            "pairs": {s: ds.num_pairs(s) for s in ds.splits}}


def _mean_records(records: list[dict]) -> dict[str, float]:
    out = {}
    for key in records[0]:
        if key in ("finite",):
            continue
        values = [float(r[key]) for r in records]
        out[key] = float(np.sum(values)) if key == "ce_offsupport" else float(np.mean(values))
    return out


def run(data_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: RunConfig, *,
        mesh=None, tensorboard: bool = False, quiet: bool = False,
        allow_changes: bool = False) -> TrainResult:
    """Trains (or resumes) a run into ``out_dir``; see the module docstring.

    ``allow_changes``: resume even if the optimisation settings differ from the saved run's
    (see ``check_resumable``); the run's ``config.json`` then records the new ones.

    Raises ``TrainingError`` for unusable settings and ``NonFiniteLoss`` when the loss
    diverges (the newest checkpoint is then the last good one).
    """
    t_cfg = cfg.train
    out_dir = pathlib.Path(out_dir).absolute()
    mesh = mesh if mesh is not None else make_mesh()
    check_batch(t_cfg.batch_size, mesh)
    data_info = _data_info(data_dir)
    config_path = out_dir / "config.json"
    saved = json.loads(config_path.read_text()) if config_path.exists() else None
    manager_dir = out_dir / "checkpoints"
    it = train_iterator(data_dir, t_cfg)  # validates the data before anything is written
    resume_step, changed = None, []
    if saved is not None and manager_dir.is_dir():
        steps = ckpt._finished_steps(manager_dir)
        if steps:
            changed = check_resumable(cfg, saved, data_info, allow_changes=allow_changes)
            resume_step = steps[-1]
    if jax.process_index() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        resolved = {**cfg.to_dict(), "data": data_info, "devices": mesh.devices.size,
                    "processes": jax.process_count()}
        ckpt._write_json(config_path, resolved)

    # -- state --------------------------------------------------------------------------------
    state = init_state(cfg, mesh)
    checkpoints = ckpt.TrainCheckpoints(manager_dir, keep=t_cfg.keep_checkpoints)
    step = 0
    if resume_step is not None:
        abs_params, abs_opt = abstract_state(state)
        state.params, state.opt_state, data_state, meta = checkpoints.restore(
            resume_step, params=abs_params, opt_state=abs_opt)
        it.set_state(data_state)
        step = int(meta["step"])
    start_step = step
    train_step = make_train_step(cfg, mesh)
    val = val_batches(data_dir, t_cfg) if t_cfg.eval_every else []
    writer = MetricsWriter(out_dir, resume_step=resume_step, tensorboard=tensorboard)
    progress = ProgressLine(t_cfg.steps, step, quiet=quiet)
    if resume_step is not None:
        progress.log(f"resuming {out_dir} at step {step}")
        if changed:
            progress.log("with changed settings: " + "; ".join(changed))
            writer.write(step, {"resume/changed": "; ".join(changed)})

    def save(at_step: int) -> None:
        checkpoints.save(at_step, params=state.params, opt_state=state.opt_state,
                         data_state=it.get_state(),
                         meta={"step": at_step, "examples_seen": at_step * t_cfg.batch_size})

    def run_eval(at_step: int) -> dict:
        if not val:
            return {}
        t0 = time.perf_counter()
        model = nnx.merge(state.graphdef, local_params(state.params))
        result = evaluate(model, val)
        result["val/seconds"] = time.perf_counter() - t0
        writer.write(at_step, result)
        progress.log(f"step {at_step}: val ce {result['val/sparse_ce']:.3f}  mae "
                     f"{result['val/barycenter_mae']:.2f} (diag "
                     f"{result['diag/barycenter_mae']:.2f})  within5 "
                     f"{result['val/within5']:.3f} (diag {result['diag/within5']:.3f})")
        return result

    last_eval, last_metrics, window, saved_step = {}, {}, [], resume_step
    interrupted = False
    try:
        with _StopFlag() as stop:
            if step == 0 and t_cfg.eval_every:
                last_eval = run_eval(0)
            while step < t_cfg.steps:
                if stop.stop_requested():
                    interrupted = True
                    break
                t0 = time.perf_counter()
                batch = shard_batch(_prepare_batch(next(it), step), mesh)
                state.params, state.opt_state, metrics = train_step(
                    state.params, state.opt_state, batch)
                metrics = jax.device_get(metrics)
                dt = time.perf_counter() - t0
                if not bool(metrics["finite"]):
                    last = checkpoints.latest_step()
                    where = (f"the last good checkpoint is step {last} in {manager_dir}"
                             if last is not None else "no checkpoint was written yet")
                    writer.write(step + 1, {"train/nonfinite": 1.0,
                                            "train/loss": float(metrics["loss"]),
                                            "train/grad_norm": float(metrics["grad_norm"])})
                    raise NonFiniteLoss(
                        f"non-finite training loss ({float(metrics['loss'])}) or gradient norm "
                        f"({float(metrics['grad_norm'])}) at step {step + 1}: run stopped "
                        f"without saving that step; {where} (intact). Check the data, or "
                        "resume from it with a lower learning rate: re-run with --lr ... "
                        "--allow-changes.")
                step += 1
                window.append(dict(metrics, step_time=dt))
                if step % t_cfg.log_every == 0 or step == t_cfg.steps:
                    mean = _mean_records(window)
                    total_time = sum(r["step_time"] for r in window)
                    last_metrics = {f"train/{k}": v for k, v in mean.items()
                                    if k != "step_time"}
                    last_metrics.update({
                        "train/lr": float(state.schedule(step - 1)),
                        "train/examples_per_s": len(window) * t_cfg.batch_size / total_time,
                        "train/step_time_s": total_time / len(window),
                        "train/examples_seen": step * t_cfg.batch_size,
                    })
                    writer.write(step, last_metrics)
                    window = []
                if t_cfg.eval_every and (step % t_cfg.eval_every == 0 or step == t_cfg.steps):
                    last_eval = run_eval(step)
                if t_cfg.ckpt_every and step % t_cfg.ckpt_every == 0:
                    save(step)
                    saved_step = step
                progress.update(step, f"loss {float(metrics['loss']):.4f}  "
                                      f"{t_cfg.batch_size / dt:.1f} ex/s")
            if saved_step != step:
                save(step)
            if interrupted:
                name = signal.Signals(stop.signal).name if stop.signal else "signal"
                progress.log(f"{name}: saved a checkpoint at step {step} in {manager_dir}; "
                             "re-run the same command to resume")
    finally:
        progress.close()
        writer.close()
        checkpoints.close()
    model_dir = None
    if not interrupted:
        model_dir = out_dir / "model"
        model = nnx.merge(state.graphdef, local_params(state.params))
        ckpt.save_model(model_dir, model, cfg.model, params=state.params)
    return TrainResult(out_dir, step, start_step, interrupted, stop.signal if interrupted else None,
                       last_metrics, last_eval, model_dir)


def _prepare_batch(batch: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    """Hook between the data iterator and the device (identity; tests patch it)."""
    return batch
