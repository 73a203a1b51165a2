"""The training loop: data, resume, the cadence of logging / validation / checkpoints, the
non-finite guard and signals.

Resume: ``RUN/checkpoints/N`` holds the parameters, the optimiser state, the grain iterator
state (``{"next_index": N}``) and bookkeeping after N steps. Re-running the same command
restores the newest checkpoint and continues with batch N: the parameters after the run are
bit-identical to those of an uninterrupted run (tested with SIGKILL). SIGTERM / SIGINT save a
checkpoint at the current step and exit cleanly. A non-finite loss or gradient stops the run
without saving (the step is not applied), so the last good checkpoint stays the newest.

The end of a finished run: ``RUN/model`` (parameters), its decoder chosen on the val split
(``decoding.json``) and the record of what it learnt from (``training.json``), see
``finish_model``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import sys
import time

import jax
import numpy as np
from flax import nnx

from pfamalign import checkpoint as ckpt
from pfamalign import evaluation, tuning
from pfamalign.alignment import pairhmm
from pfamalign.configs import RunConfig, TrainConfig
from pfamalign.pipelines import reader
from pfamalign.pipelines.locks import LockError, directory_lock
from pfamalign.training.errors import NonFiniteLoss, TrainingError
from pfamalign.training.rundir import (MetricsWriter, ProgressLine, data_info, open_run,
                                       split_families)
from pfamalign.training.step import (abstract_state, check_batch, init_state, local_params,
                                     make_mesh, make_train_step, shard_batch)


# ---------------------------------------------------------------------------------------------
# Data (pipelines.reader)
# ---------------------------------------------------------------------------------------------

def train_iterator(data_dir, cfg: TrainConfig):
    """A checkpointable grain iterator over this process's rows of the global batches
    (shuffled, length-bucketed, repeating; ``get_state()`` / ``set_state()``)."""
    d = cfg.data
    try:
        return reader.batch_iterator(
            data_dir, "train", batch_size=d.batch_size, seed=d.seed, bucket_window=d.bucket_window,
            pad_multiple=d.pad_multiple, max_len=d.max_len, with_strings=False,
            process_index=jax.process_index(), process_count=jax.process_count())
    except ValueError as err:
        raise TrainingError(str(err)) from None


def val_batches(data_dir, cfg: TrainConfig) -> list[dict[str, np.ndarray]]:
    """The validation batches: ``eval_pairs`` pairs of the val split within ``max_len``
    (``reader.select_pairs``), length-sorted, padded like training; [] when there is no val
    split."""
    ds = reader.PairDataset(data_dir)
    if "val" not in ds.splits or ds.num_pairs("val") == 0:
        return []
    return list(reader.batch_dataset(
        data_dir, "val", batch_size=cfg.loop.eval_batch_size, shuffle=False, num_epochs=1,
        bucket_window=None, drop_remainder=False, pad_multiple=cfg.data.pad_multiple,
        max_len=cfg.data.max_len, max_pairs=cfg.loop.eval_pairs, with_strings=False))


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

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
    decoder: dict | None  # how the model's decoder was chosen (``tuning.choose_decoder``)


class _StopFlag:
    """SIGTERM / SIGINT set a flag (the loop saves and exits); a second SIGINT aborts, except
    while a checkpoint is being written (``saving``): orbax's writer threads interrupted
    mid-save print tracebacks and leave a half-written step behind, so the second is noted
    (the run stops after the save) and only a third aborts (a save that hangs)."""

    def __init__(self):
        self.signal: int | None = None
        self._old = {}
        self._saving = False
        self._noted = False

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handler
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            if self._saving and not self._noted:
                self._noted = True
                print("\nwriting the checkpoint; the run stops after it (Ctrl-C again aborts now, without "
                      "it)", file=sys.stderr, flush=True)
                return
            raise KeyboardInterrupt
        self.signal = signum

    @contextlib.contextmanager
    def saving(self):
        """A checkpoint write: a second SIGINT during it is noted, and the run stops after the
        save as after the first (the checkpoint just written is the one to resume from)."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False
        self._noted = False

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def stop_requested(self) -> bool:
        flag = self.signal is not None
        if jax.process_count() > 1:  # every process must agree before saving
            from jax.experimental import multihost_utils

            flag = bool(np.any(multihost_utils.process_allgather(np.array([flag]))))
        return flag


def _mean_records(records: list[dict]) -> dict[str, float]:
    out = {}
    for key in records[0]:
        if key in ("finite", "state_finite"):
            continue
        values = [float(r[key]) for r in records]
        out[key] = float(np.sum(values)) if key == "ce_offsupport" else float(np.mean(values))
    return out


def run(data_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: RunConfig,
        **options) -> TrainResult:
    """Trains (or resumes) a run into ``out_dir``; see the module docstring and ``_run`` for
    the ``options``. Process 0 holds the lock of ``out_dir`` (``pipelines.locks``): a second
    run into the same directory stops with a ``TrainingError`` naming the first."""
    out_dir = pathlib.Path(out_dir).absolute()
    if jax.process_index() != 0:
        return _run(data_dir, out_dir, cfg, **options)
    try:
        with directory_lock(out_dir, "training"):
            return _run(data_dir, out_dir, cfg, **options)
    except LockError as err:
        raise TrainingError(str(err)) from None


def _run(data_dir: str | os.PathLike, out_dir: pathlib.Path, cfg: RunConfig, *,
         mesh=None, tensorboard: bool = False, quiet: bool = False,
         allow_changes: bool = False, tune_pairs: int | None = 500) -> TrainResult:
    """The run (``run`` holds the directory's lock).

    A finished run saves ``RUN/model`` and chooses its decoder on at most ``tune_pairs``
    pairs of the val split (None: no tuning, the shipped model's decoder); ``finish_model``.

    ``allow_changes``: resume even if the optimisation settings differ from the saved run's
    (see ``rundir.check_resumable``); the run's ``config.json`` then records the new ones.

    Raises ``TrainingError`` for unusable settings and ``NonFiniteLoss`` when the loss
    diverges (the newest checkpoint is then the last good one).
    """
    optim, loop = cfg.train.optim, cfg.train.loop
    batch_size = cfg.train.data.batch_size
    out_dir = pathlib.Path(out_dir).absolute()
    mesh = mesh if mesh is not None else make_mesh()
    check_batch(batch_size, mesh)
    it = train_iterator(data_dir, cfg.train)  # validates the data before anything is written
    split_families(data_dir, "train")  # read at the end (training.json): a damaged table fails now
    resume_step, changed = open_run(out_dir, data_dir, cfg, mesh, allow_changes=allow_changes)
    manager_dir = out_dir / "checkpoints"

    # -- state --------------------------------------------------------------------------------
    state = init_state(cfg, mesh)
    checkpoints = ckpt.TrainCheckpoints(manager_dir, keep=loop.keep_checkpoints)
    step, window, seen_at_start = 0, [], 0
    if resume_step is not None:
        abs_params, abs_opt = abstract_state(state)
        state.params, state.opt_state, data_state, meta = checkpoints.restore(
            resume_step, params=abs_params, opt_state=abs_opt)
        try:
            it.set_state(data_state)
        except (KeyError, TypeError, ValueError, IndexError) as err:  # grain's own checks of its state
            raise ckpt.CheckpointError(
                f"cannot restore checkpoint {manager_dir / str(resume_step)}: its data/metadata is not a state of "
                f"this data iterator ({type(err).__name__}: {err}); remove that step directory to resume from "
                "the one before") from None
        step = int(meta["step"])
        window = list(meta.get("log_window", []))  # older checkpoints: none kept
        # counted, not step x batch_size: --allow-changes may have changed the batch size
        seen_at_start = int(meta.get("examples_seen", step * batch_size))
    start_step = step
    train_step = make_train_step(cfg, mesh)
    val = val_batches(data_dir, cfg.train) if loop.eval_every else []
    writer = MetricsWriter(out_dir, resume_step=resume_step, tensorboard=tensorboard)
    progress = ProgressLine(optim.steps, step, quiet=quiet, every=loop.log_every)
    if step == 0 and optim.warmup_steps >= optim.steps:  # the schedule clips it (training.step)
        progress.log(f"note: warmup_steps {optim.warmup_steps} >= steps {optim.steps}: the learning rate "
                     f"warms up for {max(optim.steps - 1, 0)} steps and never decays (--set "
                     "train.warmup_steps=N to change it)")
    if loop.eval_every and not val:
        progress.log(f"warning: {data_dir} has no val pairs (within max_len): no validation every "
                     f"{loop.eval_every} steps; prepare with a val split (--splits) to have one")
    if resume_step is not None and step < optim.steps:  # a finished run says so below, once
        progress.log(f"resuming {out_dir} at step {step}")
        if not (manager_dir / str(resume_step) / ckpt.CHECKSUMS).is_file():
            progress.log(f"warning: checkpoint {resume_step} has no {ckpt.CHECKSUMS} (saved by an "
                         "older pfamalign, or killed before it was written): resumed unverified")
        if changed:
            progress.log("with changed settings: " + "; ".join(changed))
            writer.write(step, {"resume/changed": "; ".join(changed)})

    def save(at_step: int) -> None:
        # the steps since the last train/ line go with the checkpoint: the resumed run's next
        # line averages them too, as the uninterrupted run's does
        pending = [{k: float(v) for k, v in r.items()} for r in window]
        checkpoints.save(at_step, params=state.params, opt_state=state.opt_state,
                         data_state=it.get_state(),
                         meta={"step": at_step, "examples_seen": examples_seen(at_step), "log_window": pending})

    def examples_seen(at_step: int) -> int:
        return seen_at_start + (at_step - start_step) * batch_size

    def run_eval(at_step: int) -> dict:
        if not val:
            return {}
        t0 = time.perf_counter()
        model = nnx.merge(state.graphdef, local_params(state.params))
        result = evaluation.validate(model, val)
        result["val/seconds"] = time.perf_counter() - t0
        writer.write(at_step, result)
        progress.log(f"step {at_step}: val sparse_ce {result['val/sparse_ce']:.3f}  mae "
                     f"{result['val/barycenter_mae']:.2f} (diag "
                     f"{result['diag/barycenter_mae']:.2f})  within5 "
                     f"{result['val/within5']:.3f} (diag {result['diag/within5']:.3f})")
        return result

    last_eval, last_metrics, saved_step = {}, {}, resume_step
    model_dir = decoder = None
    interrupted = False
    try:
        with _StopFlag() as stop:
            if step == 0 and resume_step is None and loop.eval_every:  # a resumed step 0 has its line
                last_eval = run_eval(0)
            while step < optim.steps:
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
                    cause = (f"non-finite training loss ({float(metrics['loss'])}) or gradient "
                             f"norm ({float(metrics['grad_norm'])})"
                             if bool(metrics["state_finite"]) else
                             f"non-finite parameters or optimiser state after the update (loss "
                             f"{float(metrics['loss'])}, gradient norm "
                             f"{float(metrics['grad_norm'])}, learning rate "
                             f"{float(state.schedule(step))})")
                    raise NonFiniteLoss(
                        f"{cause} at step {step + 1}: run stopped without saving that step; "
                        f"{where} (intact). Check the data, or resume from it with a lower "
                        "learning rate: re-run with --lr ... --allow-changes.")
                step += 1
                window.append(dict(metrics, step_time=dt))
                if step % loop.log_every == 0 or step == optim.steps:
                    mean = _mean_records(window)
                    total_time = sum(r["step_time"] for r in window)
                    last_metrics = {f"train/{k}": v for k, v in mean.items()
                                    if k != "step_time"}
                    last_metrics.update({
                        "train/lr": float(state.schedule(step - 1)),
                        # the window's median step: a step that compiled a new shape would set the mean
                        "train/examples_per_s": batch_size / float(np.median([r["step_time"] for r in window])),
                        "train/step_time_s": total_time / len(window),
                        "train/examples_seen": examples_seen(step),
                    })
                    writer.write(step, last_metrics)
                    window = []
                if loop.eval_every and (step % loop.eval_every == 0 or step == optim.steps):
                    last_eval = run_eval(step)
                if loop.ckpt_every and step % loop.ckpt_every == 0:
                    with stop.saving():
                        save(step)
                    saved_step = step
                progress.update(step, f"loss {float(metrics['loss']):.4f}", step_time=dt, batch_size=batch_size)
            if saved_step != step:
                with stop.saving():
                    save(step)
            interrupted = stop.stop_requested()  # also a signal during that last save
        # Finishing runs under the command's own handlers: a signal now unwinds at once (exit
        # 128 + signal) and the re-run finishes again, as training.json is written last.
        if interrupted:
            name = signal.Signals(stop.signal).name if stop.signal else "signal"
            progress.log(f"{name}: saved a checkpoint at step {step} in {manager_dir}; "
                         "re-run the same command to resume")
        elif step == start_step and (record := ckpt.read_training_record(out_dir / "model")):
            # a re-run of a finished run: its model, decoder and record stand
            model_dir, decoder = out_dir / "model", record.get("decoder")
            progress.log(f"{model_dir} is already finished (delete it to export and tune it again)")
        else:
            model_dir = out_dir / "model"
            if jax.process_index() == 0:  # a model being replaced is not finished until the end
                (model_dir / ckpt.TRAINING_RECORD).unlink(missing_ok=True)
            model = nnx.merge(state.graphdef, local_params(state.params))
            ckpt.save_model(model_dir, model, cfg.model, params=state.params)
            if jax.process_index() == 0:
                if tune_pairs:
                    progress.log(f"choosing the decoder on up to {tune_pairs} val pairs")
                decoder = finish_model(model_dir, data_dir, tune_pairs=tune_pairs,
                                       seed=cfg.train.data.seed, step=step)
                writer.write(step, {f"tune/{k}": v for k, v in decoder.items()})
                progress.log(tuning.describe(decoder))
    finally:
        progress.close()
        writer.close()
        checkpoints.close()
    return TrainResult(out_dir, step, start_step, interrupted, stop.signal if interrupted else None,
                       last_metrics, last_eval, model_dir, decoder)


def finish_model(model_dir: pathlib.Path, data_dir, *, tune_pairs: int | None,
                 seed: int = 0, step: int | None = None) -> dict:
    """Counts the model's own pair-HMM on the train split (``pairhmm.fit_for_model``), chooses
    the model's decoder on the val split (``tuning.choose_decoder``, at most ``tune_pairs``
    pairs; None skips tuning) and writes ``MODEL/training.json``: the dataset and the families
    the model trained and was tuned on, and ``step``, the training step it is (which tells a
    model from the newer checkpoints of a run extended since). Returns the decoder record."""
    pairhmm.fit_for_model(model_dir, data_dir, split="train")
    decoder = tuning.choose_decoder(model_dir, data_dir, split="val", max_pairs=tune_pairs,
                                    seed=seed)
    ckpt.write_training_record(model_dir, {
        "dataset": data_info(data_dir),
        "trained_on": {"split": "train", "families": split_families(data_dir, "train")},
        "decoder": decoder, **({} if step is None else {"step": int(step)})})
    return decoder


def _prepare_batch(batch: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    """Hook between the data iterator and the device (identity; tests patch it)."""
    return batch
