"""`pfamalign train`: the loop on real shards, data parallelism, checkpoints, resume, stops."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from click.testing import CliRunner

import faultkill
import meshes
from pfamalign import checkpoint, evaluation, tuning
from pfamalign.decoding import DecoderSettings
from pfamalign.inference import Predictor, default_model_dir
from pfamalign.pipelines import reader
from pfamalign.training import loop as train, rundir, step as train_step
from pfamalign.cli import main as cli
from pfamalign.pipelines.config import PrepareConfig
from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.prepare import run_prepare

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / "data" / "pfam_seed"
STEPS = 6
TUNE_PAIRS = 6

# A small align_ce (the real op, T=15, band 1024) on one padded shape (lengths <= 160).
TINY = {"encoder_layers": 1, "encoder_width": 32, "head_dim": 16, "value_dim": 8,
        "position_features": 8, "train.batch_size": 8, "train.steps": STEPS, "train.lr": 3e-3,
        "train.warmup_steps": 1, "train.pad_multiple": 160, "train.max_len": 160,
        "train.log_every": 1, "train.eval_every": 0, "train.ckpt_every": 2,
        "train.eval_batch_size": 8}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Builtin-feature shards of the fixture families: 5 train families (96 pairs), 2 val."""
    out = tmp_path_factory.mktemp("train_data") / "ds"
    run_prepare(PrepareConfig(inputs=(str(SEED),), out=str(out),
                              embedder="builtin/onehot+blosum62",
                              sampling=SamplingConfig(pairs_per_family=24, max_len=160),
                              split_fractions=(0.7, 0.2, 0.1), seed=3), quiet=True)
    return out


def _cfg(dataset, **extra):
    return rundir.resolve_config(dataset, "align_ce", overrides={**TINY, **extra})


def _params(path):
    model, _ = checkpoint.load_model(path)
    return jax.tree.map(np.asarray, checkpoint.model_params(model))


def _assert_same(a, b):
    same = jax.tree.map(np.array_equal, a, b)
    assert all(jax.tree.leaves(same)), same


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory):
    """An uninterrupted run (8 devices) with validation at steps 0 and 6; its decoder is
    tuned on 6 val pairs."""
    out = tmp_path_factory.mktemp("ref") / "run"
    result = train.run(dataset, out, _cfg(dataset, **{"train.eval_every": STEPS}), quiet=True,
                       tune_pairs=TUNE_PAIRS)
    return result


# ---------------------------------------------------------------------------------------------
# The loop on real shards
# ---------------------------------------------------------------------------------------------

def test_run_writes_metrics_config_checkpoints_and_model(reference, dataset):
    out = reference.out_dir
    assert reference.step == STEPS and not reference.interrupted
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["model"]["name"] == "align_ce" and resolved["train"]["steps"] == STEPS
    assert resolved["data"]["embedder_id"] == "builtin/onehot+blosum62"
    assert resolved["devices"] == 8
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in lines if "train/loss" in r]
    assert [r["step"] for r in train_lines] == list(range(1, STEPS + 1))
    for key in ("train/recon", "train/ce", "train/mono", "train/grad_norm", "train/lr",
                "train/examples_per_s"):
        assert all(np.isfinite(r[key]) for r in train_lines), key
    val = [r for r in lines if "val/sparse_ce" in r]
    assert [r["step"] for r in val] == [0, STEPS]
    for key in ("val/reconstruction", "val/barycenter_mae", "val/within5",
                "val/monotonicity_violation", "diag/barycenter_mae", "diag/within5"):
        assert np.isfinite(val[-1][key]), key
    assert val[-1]["val/n_pairs"] > 0
    assert checkpoint.TrainCheckpoints(out / "checkpoints").all_steps() == [2, 4, 6]
    # the final model directory and the newest checkpoint load to the same parameters
    _assert_same(_params(out / "model"), _params(out / "checkpoints" / "6"))
    _assert_same(_params(out), _params(out / "model"))


def test_run_chooses_the_decoder_on_val_and_records_what_it_learnt_from(reference, dataset):
    model_dir = reference.out_dir / "model"
    # the model's own pair-HMM, counted on its training families only
    from pfamalign.alignment import pairhmm

    own = pairhmm.model_pairhmm(model_dir)
    counted = pairhmm.fit_mixture(reader.iter_pairs(dataset, "train"))
    assert (model_dir / pairhmm.MODEL_FILE).is_file()
    assert own.edges == counted.edges
    for mine, theirs, shipped in zip(own.components, counted.components, pairhmm.default_pairhmm().components):
        np.testing.assert_array_equal(mine.pair_probs, theirs.pair_probs)
        assert not np.array_equal(mine.pair_probs, shipped.pair_probs)
    record = checkpoint.read_training_record(model_dir)
    assert record["dataset"]["config_hash"] == reader.PairDataset(dataset).config_hash
    assert record["trained_on"]["families"] == rundir.split_families(dataset, "train")
    decoder = record["decoder"]
    assert decoder == reference.decoder and decoder["source"] == "tuned"
    assert decoder["n_pairs"] == TUNE_PAIRS
    assert decoder["families"] == rundir.split_families(dataset, "val")  # every val family
    chosen = DecoderSettings.load(model_dir)
    assert dataclasses.asdict(chosen) == decoder["settings"]
    assert chosen in tuning.candidate_settings()
    tuned = [r for r in (json.loads(line) for line in
                         (reference.out_dir / "metrics.jsonl").read_text().splitlines())
             if "tune/f1" in r]
    assert len(tuned) == 1 and tuned[0]["tune/f1"] == decoder["f1"]

    # the same pairs through `pfamalign eval`'s path: the chosen decoder's F1 is the one
    # recorded, and no other candidate beats it
    predictor = Predictor(model_dir)
    records, _, features = evaluation.pair_records(
        data=dataset, split="val", max_pairs=TUNE_PAIRS, seed=0,
        embedder_id=predictor.config.embedder_id)
    records = list(records)

    def f1(settings):
        ev = evaluation.evaluate(records, predictor=predictor, features=features, baselines=(),
                                 decoding=settings)
        return ev.summary(n_boot=0)["methods"]["model"]["prf"]["all"]["micro"]["f1"]["value"]

    assert f1(chosen) == pytest.approx(decoder["f1"])
    others = [DecoderSettings(), DecoderSettings.for_decoder("hybrid"),
              DecoderSettings(decoder="mea")]
    margin = decoder["margin_over_incumbent"]
    if margin is None:  # the best candidate won outright: no other candidate beats it
        assert all(f1(s) <= decoder["f1"] + 1e-12 for s in others)
    elif margin["low"] > 0 and margin["resampled"] == "families":  # a challenger beat it with evidence
        assert chosen != tuning.incumbent_settings()
        assert all(f1(s) <= decoder["f1"] + 1e-12 for s in others)
    else:  # a better-looking challenger without evidence (or too few families): the incumbent stays
        assert chosen == tuning.incumbent_settings() and margin["value"] > 0


def test_no_val_pairs_falls_back_to_the_shipped_decoder(reference, tmp_path):
    data = tmp_path / "ds"
    run_prepare(PrepareConfig(inputs=(str(SEED / "PF05371.sto"),), out=str(data),
                              embedder="builtin/onehot+blosum62",
                              sampling=SamplingConfig(pairs_per_family=4),
                              split_fractions=(1.0, 0.0, 0.0)), quiet=True)
    model_dir = tmp_path / "model"
    shutil.copytree(reference.out_dir / "model", model_dir)
    (model_dir / "decoding.json").unlink()
    decoder = train.finish_model(model_dir, data, tune_pairs=TUNE_PAIRS)
    assert decoder["source"] == "default_model" and "no val pairs" in decoder["reason"]
    assert DecoderSettings.load(model_dir) == DecoderSettings.load(default_model_dir())
    record = checkpoint.read_training_record(model_dir)
    assert record["decoder"] == decoder and record["trained_on"]["families"] == ["PF05371"]


def test_a_few_steps_lower_the_training_loss(reference, dataset):
    cfg = _cfg(dataset)
    it = train.train_iterator(dataset, cfg.train)
    batches = [next(it) for _ in range(3)]
    fresh = train_step.init_state(cfg, train_step.make_mesh(jax.devices()[:1]))
    init_model = checkpoint.model_from_params(cfg.model, jax.device_get(fresh.params))
    trained, _ = checkpoint.load_model(reference.out_dir / "model")
    # the validation step (compiled by the reference run for this shape) gives the objective
    loss = lambda model, b: float(evaluation.eval_batch(model, b)[0]["loss"])
    before = np.mean([loss(init_model, b) for b in batches])
    after = np.mean([loss(trained, b) for b in batches])
    assert after < before - 0.05, (before, after)


def test_eight_devices_take_the_same_steps_as_one(dataset):
    """Three optimiser steps on 8 devices give the 1-device losses and gradient (``meshes``)."""
    cfg = _cfg(dataset)
    it = train.train_iterator(dataset, cfg.train)
    meshes.assert_eight_devices_match_one(cfg, [next(it) for _ in range(3)])


# ---------------------------------------------------------------------------------------------
# Interruptions
# ---------------------------------------------------------------------------------------------

def test_verify_checks_each_checkpoints_data_state_and_the_model_settings(reference, tmp_path):
    import shutil

    from pfamalign.commands.verify import verify_directory

    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    checked, problems = verify_directory(out)
    assert problems == [] and any(line.startswith(f"{out}/checkpoints/6:") for line in checked)
    recorded = json.loads((out / "checkpoints/6/checksums.json").read_text())["sha256"]
    assert {name.split("/")[0] for name in recorded} == {"params", "opt_state", "data", "meta", "_CHECKPOINT_METADATA"}
    # the finished model records its settings files too: an edited decoder is noticed
    model_sums = json.loads((out / "model/checksums.json").read_text())["sha256"]
    assert {"config.json", "decoding.json", "training.json"} <= set(model_sums)
    decoding = json.loads((out / "model/decoding.json").read_text())
    (out / "model/decoding.json").write_text(json.dumps({**decoding, "alpha": 0.9}))  # still valid
    assert verify_directory(out)[1] == [f"{out / 'model/decoding.json'}: checksum mismatch (corrupt or modified)"]
    data_state = next(p for p in (out / "checkpoints/6/data").rglob("*") if p.is_file())
    data_state.write_bytes(data_state.read_bytes() + b" ")  # still JSON: only the sum sees it
    (out / "model" / "decoding.json").write_text('{"gap_open": "three"}')
    _, problems = verify_directory(out)
    assert any(p.startswith(str(data_state)) and "checksum mismatch" in p for p in problems), problems
    assert any("decoding.json" in p and "gap_open" in p for p in problems), problems


def test_sigterm_saves_and_the_resumed_run_is_identical(reference, dataset, tmp_path,
                                                        monkeypatch, capfd):
    out = tmp_path / "run"
    logged = _cfg(dataset, **{"train.log_every": 4})  # a train/ line at steps 4 and 6: the save at 3 splits one

    faultkill.sigterm_at(monkeypatch, 2)
    first = train.run(dataset, out, logged, quiet=True)
    assert first.interrupted and first.signal == signal.SIGTERM and first.step == 3
    assert checkpoint.TrainCheckpoints(out / "checkpoints").all_steps() == [2, 3]
    assert not (out / "model").exists()
    from pfamalign.commands.verify import NOTE, verify_directory

    checked, problems = verify_directory(out)  # intact, and said to be unfinished
    assert problems == [] and f"{NOTE}{out}: an unfinished run (newest checkpoint: step 3; no model/ yet)" in \
        " ".join(checked)
    from pfamalign.inference import Predictor

    capfd.readouterr()
    Predictor(out)  # aligning with it says which checkpoint, and orbax's note on its layout is no news
    err = capfd.readouterr().err
    assert f"Warning: {out} is an unfinished run: aligning with its newest checkpoint (step 3)" in err
    assert "_CHECKPOINT_METADATA" not in err, err
    monkeypatch.undo()
    second = train.run(dataset, out, logged, quiet=True, tune_pairs=None)
    assert (second.start_step, second.step) == (3, STEPS)
    _assert_same(_params(out / "model"), _params(reference.out_dir / "model"))
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["train/loss"] for r in lines if "train/loss" in r}
    assert list(losses) == [4, STEPS]  # no duplicated lines after the resume
    # each line is its window's mean, the steps before the interrupt included (the reference
    # logs every step)
    ref = {r["step"]: r["train/loss"] for r in map(json.loads, (reference.out_dir / "metrics.jsonl")
                                                   .read_text().splitlines()) if "train/loss" in r}
    assert losses[4] == pytest.approx(np.mean([ref[s] for s in (1, 2, 3, 4)]), rel=1e-6)
    assert losses[STEPS] == pytest.approx(np.mean([ref[s] for s in (5, 6)]), rel=1e-6)
    # without tuning the model gets the shipped model's decoder, and says so
    assert second.decoder["source"] == "default_model" and "--no-tune" in second.decoder["reason"]
    assert DecoderSettings.load(out / "model") == DecoderSettings.load(default_model_dir())
    # the summary says what each run did; re-running the finished run trains nothing
    from pfamalign.commands.train import summary_line

    assert summary_line(reference, STEPS) == f"trained {STEPS} steps"
    assert summary_line(second, STEPS) == f"trained 3 steps (resumed at step 3, now at {STEPS} of {STEPS})"
    res = _cli(["train", "--data", str(dataset), "--out", str(out), "--no-tune"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"nothing to train: {os.path.relpath(out)} was already at step {STEPS} of {STEPS}" in text
    assert not re.search(r"trained \d", text), text


def test_a_run_interrupted_in_its_first_validation_writes_that_line_once(dataset, tmp_path, monkeypatch):
    """SIGTERM during the step-0 validation: the line is written, checkpoint 0 saved; the
    resumed run does not validate step 0 again (metrics.jsonl would hold it twice)."""
    out = tmp_path / "run"
    validate = train.evaluation.validate

    def interrupted(*args, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        return validate(*args, **kw)

    monkeypatch.setattr(train.evaluation, "validate", interrupted)
    cfg = _cfg(dataset, **{"train.eval_every": STEPS, "train.steps": 2})
    first = train.run(dataset, out, cfg, quiet=True, tune_pairs=None)
    assert first.interrupted and first.step == 0
    monkeypatch.undo()
    train.run(dataset, out, cfg, quiet=True, tune_pairs=None)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "val/sparse_ce" in r] == [0, 2]


def _sigint_here() -> None:
    """Ctrl-C, delivered to this thread now (``os.kill`` may wake another thread, and the
    handler then runs whenever that one is scheduled)."""
    import threading

    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_a_second_sigint_during_the_save_is_held_and_a_torn_save_is_cleared(dataset, tmp_path,
                                                                          monkeypatch, capsys):
    """Ctrl-C, then a second Ctrl-C while the checkpoint the first asked for is written: the
    save completes (no KeyboardInterrupt through orbax's writer; a note says a third aborts)
    and the run stops as after the first. A step left half-written by a killed save (orbax's
    temporary directory) is removed when the run resumes."""
    out = tmp_path / "run"
    prepare, original_save = train._prepare_batch, checkpoint.TrainCheckpoints.save
    first = []

    def first_sigint(batch, at):
        if at == 2:
            first.append(at)
            _sigint_here()
        return prepare(batch, at)

    def save(self, step, **parts):
        if first:  # the impatient second Ctrl-C, mid-save
            _sigint_here()
        return original_save(self, step, **parts)

    monkeypatch.setattr(train, "_prepare_batch", first_sigint)
    monkeypatch.setattr(checkpoint.TrainCheckpoints, "save", save)
    stopped = train.run(dataset, out, _cfg(dataset), quiet=True)
    assert "the run stops after it (Ctrl-C again aborts now" in capsys.readouterr().err
    assert stopped.interrupted and stopped.signal == signal.SIGINT and stopped.step == 3
    assert checkpoint.TrainCheckpoints(out / "checkpoints").all_steps() == [2, 3]
    assert checkpoint.verify_checksums(out / "checkpoints" / "3") == []
    monkeypatch.undo()
    torn = out / "checkpoints" / "5.orbax-checkpoint-tmp"  # a step this run does not save
    (torn / "params").mkdir(parents=True)
    resumed = train.run(dataset, out, _cfg(dataset), quiet=True, tune_pairs=None)
    assert (resumed.start_step, resumed.step) == (3, STEPS) and not torn.exists()


_SLOW_TRAIN = """
import sys, time
from pfamalign.training import loop as train
_orig = train._prepare_batch
def _slow(batch, step):
    time.sleep(0.4)
    return _orig(batch, step)
train._prepare_batch = _slow
from pfamalign.cli import main
main(sys.argv[1:], prog_name="pfamalign")
"""


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(reference, dataset, tmp_path):
    """A real `pfamalign train` process killed with SIGKILL after a checkpoint; re-running
    the command finishes with bit-identical parameters."""
    out = tmp_path / "run"
    env = dict(os.environ, CI="1", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    args = ["train", "--data", str(dataset), "--config", "align_ce", "--out", str(out), "--quiet",
            "--tune-pairs", str(TUNE_PAIRS)]
    for key, value in TINY.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_TRAIN, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    try:
        while not (out / "checkpoints" / "2" / "params").is_dir():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
        proc.kill()  # SIGKILL
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    steps = checkpoint.TrainCheckpoints(out / "checkpoints").all_steps()
    assert steps and max(steps) < STEPS and not (out / "model").exists()
    done = subprocess.run([sys.executable, "-m", "pfamalign.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_same(_params(out / "model"), _params(reference.out_dir / "model"))


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(reference, dataset, tmp_path,
                                                                 monkeypatch):
    out = tmp_path / "run"

    def poison(batch, step):
        if step == 3:  # the 4th step; checkpoint 2 exists
            batch = dict(batch, q_feat=np.full_like(batch["q_feat"], np.nan))
        return batch

    monkeypatch.setattr(train, "_prepare_batch", poison)
    with pytest.raises(train.NonFiniteLoss,
                       match=r"at step 4.*last good checkpoint is step 2.*--allow-changes"):
        train.run(dataset, out, _cfg(dataset), quiet=True)
    assert checkpoint.TrainCheckpoints(out / "checkpoints").all_steps() == [2]
    _assert_same(_params(out / "checkpoints" / "2"),
                 _params(reference.out_dir / "checkpoints" / "2"))
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 4 and last["train/nonfinite"] == 1.0
    assert not (out / "model").exists()


def test_resume_refuses_other_settings(reference, dataset):
    with pytest.raises(train.TrainingError, match="train.lr"):
        train.run(dataset, reference.out_dir, _cfg(dataset, **{"train.lr": 1e-2}), quiet=True)
    with pytest.raises(train.TrainingError, match="model.heads"):
        train.run(dataset, reference.out_dir, _cfg(dataset, heads=2), quiet=True)
    # --allow-changes: other optimisation settings are accepted (listed), the model is not
    saved = json.loads((reference.out_dir / "config.json").read_text())
    info = rundir.data_info(dataset)
    changed = rundir.check_resumable(_cfg(dataset, **{"train.lr": 1e-4}), saved, info,
                                    allow_changes=True)
    assert changed == ["train.lr: 0.003 -> 0.0001"]
    with pytest.raises(train.TrainingError, match="model.heads"):
        rundir.check_resumable(_cfg(dataset, heads=2), saved, info, allow_changes=True)


def test_allowed_changes_to_a_finished_run_that_trains_nothing_record_nothing(reference, dataset, tmp_path):
    """A rerun of a finished run with --allow-changes and nothing to train rewrote config.json
    with the new settings: the original command was then refused. --steps below the step
    reached is refused (it trained nothing, and recorded steps: 2 of a run at 6)."""
    run = tmp_path / "run"
    shutil.copytree(reference.out_dir, run)
    before = (run / "config.json").read_bytes()
    result = train.run(dataset, run, _cfg(dataset, **{"train.lr": 5e-4}), quiet=True, allow_changes=True,
                       tune_pairs=None)
    assert result.step == result.start_step == STEPS and (run / "config.json").read_bytes() == before
    with pytest.raises(train.TrainingError, match=f"at step {STEPS}; --steps 2 would train nothing"):
        train.run(dataset, run, _cfg(dataset, **{"train.steps": 2}), quiet=True, allow_changes=True)
    assert (run / "config.json").read_bytes() == before
    train.run(dataset, run, _cfg(dataset), quiet=True, tune_pairs=None)  # the original settings: accepted


def test_examples_seen_counts_each_steps_batch_across_a_resume_with_another_batch_size(reference, dataset,
                                                                                     tmp_path):
    """It was step x batch_size: 8 steps at batch 16 after 6 at 8 read 128, not 6 x 8 + 2 x 16 = 80."""
    run = tmp_path / "run"
    shutil.copytree(reference.out_dir, run)
    train.run(dataset, run, _cfg(dataset, **{"train.steps": STEPS + 2, "train.batch_size": 16}), quiet=True,
              allow_changes=True, tune_pairs=None)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    seen = {r["step"]: r["train/examples_seen"] for r in lines if "train/examples_seen" in r}
    assert seen[STEPS] == STEPS * 8 and seen[STEPS + 2] == STEPS * 8 + 2 * 16, seen


def test_a_resume_on_other_devices_says_so(reference, dataset, tmp_path):
    """A run resumed on 4 of its 8 devices resumed silently, and its config.json then said 4."""
    run = tmp_path / "run"
    shutil.copytree(reference.out_dir, run)
    shutil.rmtree(run / "checkpoints" / str(STEPS))  # as killed before its last checkpoint
    shutil.rmtree(run / "model")
    train.run(dataset, run, _cfg(dataset), quiet=True, tune_pairs=None, mesh=train_step.make_mesh(jax.devices()[:4]))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    changed = [r["resume/changed"] for r in lines if "resume/changed" in r]
    assert changed == ["devices: 8 -> 4; (the same batches; parameters equal the uninterrupted run's to "
                       "rounding, not bit for bit)"], changed


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def _cli(args):
    return CliRunner().invoke(cli, args, env={"CI": "1", "COLUMNS": "200"})


def test_cli_help():
    res = _cli(["train", "--help"])
    assert res.exit_code == 0
    for text in ("k2_eps1", "align_ce", "--distributed", "--set", "--tensorboard", "TPU pod",
                 "--tune-pairs", "--no-tune", "--compile", "OUT/compiled"):
        assert text in res.output


def test_a_finished_run_loads_as_its_model_and_a_rerun_keeps_it(reference, dataset, tmp_path):
    """A finished run directory stands for RUN/model (its tuned decoder, not the affine defaults
    of a directory without decoding.json); an unfinished run (its newest checkpoint) decodes with
    the shipped decoder; re-running the finished run, even with --no-tune, leaves model, decoder and
    record as they were (it used to export and choose the decoder again)."""
    run = tmp_path / "run"
    shutil.copytree(reference.out_dir, run)
    model = run / "model"
    marked = DecoderSettings.for_decoder("hybrid")  # a decoder no re-tuning would write
    marked.save(model)
    predictor = Predictor(run)
    assert predictor.path == model and predictor.decoding == marked
    unfinished = tmp_path / "unfinished"  # its newest checkpoint, no model/ yet
    shutil.copytree(run, unfinished, ignore=lambda d, names: ["model"] if d == str(run) else [])
    assert Predictor(unfinished).decoding == DecoderSettings.load(default_model_dir())
    before = {p: p.read_bytes() for p in sorted(model.rglob("*")) if p.is_file()}
    res = _cli(["train", "--data", str(dataset), "--out", str(run), "--no-tune"])
    assert res.exit_code == 0, res.output
    assert "already finished" in " ".join(res.output.split())
    assert {p: p.read_bytes() for p in sorted(model.rglob("*")) if p.is_file()} == before


def test_a_finished_run_extended_and_stopped_loads_its_model_with_a_warning(reference, tmp_path, capsys):
    """The model's record names its step; a finished run extended (``--steps``) past it and
    stopped before it finished again still loads its old model (the newer parameters have no
    decoder of their own), and says so: which step loads, which newer one exists, how to finish.
    (It loaded silently before.) A finished run with no newer checkpoint loads without a word."""
    run = tmp_path / "run"
    shutil.copytree(reference.out_dir, run)
    assert checkpoint.read_training_record(run / "model")["step"] == STEPS
    capsys.readouterr()
    Predictor(run)
    assert "Warning" not in capsys.readouterr().err
    # the extension's checkpoint (what an interrupted `--steps 2N` run leaves): the newest
    shutil.copytree(run / "checkpoints" / str(STEPS), run / "checkpoints" / str(2 * STEPS))
    for path in (run, run / "model"):
        assert Predictor(path).path == run / "model"
        err = " ".join(capsys.readouterr().err.split())
        assert f"is the model of step {STEPS}, but its run has trained on to step {2 * STEPS} since" in err
        assert "re-run the same `pfamalign train` command" in err and f"checkpoints/{2 * STEPS}" in err
    # a record with no usable step, or none readable, loads without the warning (and without a crash)
    record = run / "model" / checkpoint.TRAINING_RECORD
    for text in ('{"step": "3"}', '{"step": null}', "[]", "{not json"):
        record.write_text(text)
        Predictor(run / "model")
        assert "trained on to" not in capsys.readouterr().err, text


def test_cli_help_lists_every_configuration_and_decoder_family():
    from pfamalign.commands.train import train as train_command

    choices = next(p for p in train_command.params if p.name == "config_name").type.choices
    output = _cli(["train", "--help"]).output
    section = output.split("Configurations")[1].split("Examples:")[0].splitlines()
    listed = [line.split()[0] for line in section  # one line per configuration, then its wraps
              if line.startswith("    ") and not line.startswith("     ")]
    assert listed == list(choices)
    # the decoders tuning.candidate_settings tries are the ones the help names
    text = " ".join(output.split())
    for decoder in {s.decoder for s in tuning.candidate_settings()}:
        assert {"mea": "MEA"}.get(decoder, decoder) in text, decoder
    assert "plan pair-HMM" in text


@pytest.mark.slow  # ~1 min: a tiny CETA run, then its compile (plan + the CETA layer), twice
def test_train_compile_writes_the_compiled_model_and_a_rerun_replaces_it(dataset, tmp_path):
    from pfamalign import asap

    out = tmp_path / "ceta"
    sets = {**TINY, "attn_heads": 2, "attn_head_dim": 8, "mlp_ratio": 1, "train.ckpt_every": 0}
    args = ["train", "--data", str(dataset), "--config", "align_ceta", "--out", str(out), "--no-tune",
            "--compile", "-q", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    res = _cli(args)
    assert res.exit_code == 0, res.output
    op = asap.load_operator(out / "compiled")
    model, _ = checkpoint.load_model(out / "compiled")
    op.check(model)  # the trained parameters, one operator per CETA layer
    assert len(op.layers) == 1 and op.stats["split"] == "train" and op.stats["data"] == str(dataset)
    assert "r2_dual" in op.layers[0].stats and not (out / "model" / asap.OPERATOR_FILE).exists()
    first = (out / "compiled" / asap.OPERATOR_FILE).stat().st_mtime_ns
    res = _cli(args)  # the finished run resumes at its end and compiles again, over the old one
    assert res.exit_code == 0, res.output
    assert (out / "compiled" / asap.OPERATOR_FILE).stat().st_mtime_ns > first
    asap.load_operator(out / "compiled").check(model)
    # `verify RUN` checks the compiled model too (it checked model/ and checkpoints/ only)
    from pfamalign.commands.verify import verify_directory

    assert verify_directory(out)[1] == []
    operator = out / "compiled" / asap.OPERATOR_FILE
    operator.write_bytes(operator.read_bytes()[:100])
    assert f"{operator}: checksum mismatch (corrupt or modified)" in verify_directory(out)[1]


def test_a_runs_config_is_checked_by_verify_and_a_resume_names_one_that_does_not_fit(reference, dataset,
                                                                                     tmp_path):
    """RUN/config.json, which a resume reads (and rewrites: no checksum can vouch for it): an
    edit that changes the parameters' shapes is a problem in verify and a named error on
    resume (it was orbax's "Requested shape ... strict=False"); a missing or damaged one is a
    problem in verify (it said ok)."""
    import shutil

    from pfamalign.commands.verify import verify_directory

    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    shutil.rmtree(out / "model")  # an unfinished run: the resume restores its newest checkpoint
    saved = json.loads((out / "config.json").read_text())
    heads = saved["model"]["heads"] + 2
    (out / "config.json").write_text(json.dumps({**saved, "model": {**saved["model"], "heads": heads}}))
    problems = verify_directory(out)[1]
    assert problems and all(p.startswith(f"{out / 'config.json'} does not match the parameters of checkpoint "
                                         f"{STEPS}: ") for p in problems), problems
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoints/6 does not match the run's config.json "
                                                         r"\(.* the config asks for .*restore it from a copy"):
        train.run(dataset, out, _cfg(dataset, heads=heads), quiet=True)
    (out / "config.json").write_text(json.dumps(saved)[:200])
    assert [p for p in verify_directory(out)[1] if "config.json" in p] == [
        next(p for p in verify_directory(out)[1] if p.startswith(f"{out / 'config.json'} is damaged"))]
    (out / "config.json").unlink()
    assert f"{out / 'config.json'}: missing; the run cannot resume without it (restore it from a copy)" in \
        verify_directory(out)[1]


@pytest.mark.parametrize("damaged", ["values", "tree"])
def test_a_damaged_checkpoint_without_checksums_fails_its_resume_in_one_line(reference, dataset, tmp_path, damaged):
    """A checkpoint with no checksums (killed before they were written) whose parameters are
    damaged: the resume fails with orbax's innermost cause in one CheckpointError, and none
    of the hundreds of lines of TensorStore specs its pending reads print at exit.
    ``values``: every file of the process's OCDBT store cut in half (the file that holds the
    arrays varies from run to run, and damage elsewhere in it can go unread: CI once damaged
    the largest file, and the resume ran on). ``tree``: the merged b-tree cut in half, which
    drops names from orbax's metadata without an error; it blamed config.json."""
    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    shutil.rmtree(out / "model")
    newest = out / "checkpoints" / str(STEPS)
    (newest / "checksums.json").unlink()
    store = newest / "params" / ("ocdbt.process_0/d" if damaged == "values" else "d")
    victims = [p for p in store.iterdir() if p.is_file()]
    assert victims
    for victim in victims:
        victim.write_bytes(victim.read_bytes()[:victim.stat().st_size // 2])
    code = ("from pfamalign.training import loop, rundir; "
            f"cfg = rundir.resolve_config({str(dataset)!r}, None, saved=rundir.read_saved({str(out)!r})); "
            f"loop.run({str(dataset)!r}, {str(out)!r}, cfg, quiet=True)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pfamalign.runs.CheckpointError: cannot restore checkpoint {newest}: ") \
        and "remove that step directory" in last, res.stderr[-3000:]
    assert "Encountered error while reading array" not in res.stderr and "Event loop is closed" not in res.stderr
    if damaged == "tree":
        assert (f"{newest / 'params'} is damaged: dustbin_k, dustbin_q, dustbin_v and " in last
                and "listed in its _METADATA but unreadable" in last), last


def test_verify_names_a_damaged_parameter_tree_that_no_checksum_covers(reference, tmp_path):
    """A model without checksums (saved by an older pfamalign) whose merged OCDBT b-tree is
    cut in half: ``pfamalign verify`` reports the parameters as damaged (it blamed config.json
    for the names orbax's metadata then lacks), and prints no TensorStore traceback (the
    silencing hook was dropped when the command's interrupt handling ended)."""
    model = tmp_path / "model"
    shutil.copytree(reference.out_dir / "model", model)
    (model / "checksums.json").unlink()
    [tree] = (model / "params" / "d").iterdir()
    tree.write_bytes(tree.read_bytes()[:tree.stat().st_size // 2])
    res = subprocess.run([sys.executable, "-m", "pfamalign.cli", "verify", str(model)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 1
    problems = [line for line in res.stderr.splitlines() if line.startswith("problem: ")]
    assert any(p.startswith(f"problem: {model / 'params'} is damaged: ") and "listed in its _METADATA but unreadable"
               in p for p in problems), res.stderr
    assert not any("config.json" in p for p in problems), problems
    assert "Traceback" not in res.stderr, res.stderr


# A checkpoint's JSON parts with no checksums to vouch for them (killed before they were
# written), each of the wrong shape: (file under the step, text, what the error says)
BOOKKEEPING_DAMAGE = [
    ("data/metadata", "[]", "data/metadata is not a data-iterator state"),
    ("data/metadata", "{}", r"its data/metadata is not a state of this data iterator \(KeyError"),
    ("data/metadata", '{"next_index": "x"}', "its data/metadata is not a state of this data iterator"),
    ("meta/metadata", "{}", "meta/metadata is not a checkpoint's bookkeeping"),
    ("meta/metadata", '{"step": "seven"}', "meta/metadata is not a checkpoint's bookkeeping"),
    ("meta/metadata", '{"step": 4}', "meta/metadata records step 4 in the directory of step 6"),
    ("meta/metadata", '{"step": 6, "examples_seen": -1}', "examples_seen is not a whole number"),
    ("meta/metadata", '{"step": 6, "log_window": [1]}', "log_window is not a list of metric lines"),
    ("_CHECKPOINT_METADATA", "[]", "_CHECKPOINT_METADATA: not a checkpoint's metadata"),
]


@pytest.mark.parametrize("part,text,says", BOOKKEEPING_DAMAGE, ids=[f"{p}={t}" for p, t, _ in BOOKKEEPING_DAMAGE])
def test_a_checkpoints_bookkeeping_of_the_wrong_shape_is_named_on_resume(reference, dataset, tmp_path, part, text,
                                                                         says):
    """JSON orbax hands back as read: a wrong shape was a KeyError / TypeError traceback mid-
    resume, orbax's "Metadata dict must be a dictionary" naming no file, or (a step 4 in the
    directory of step 6) taken as it was. Each is a CheckpointError saying to remove the step."""
    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    shutil.rmtree(out / "model")
    newest = out / "checkpoints" / str(STEPS)
    (newest / "checksums.json").unlink()
    (newest / part).write_text(text)
    with pytest.raises(checkpoint.CheckpointError, match=says) as err:
        train.run(dataset, out, _cfg(dataset), quiet=True)
    assert "remove that step directory to resume from the one before" in str(err.value)


def test_a_checkpoints_own_metadata_is_in_its_checksums(reference, tmp_path):
    """orbax's step metadata (``_CHECKPOINT_METADATA``), which every resume reads, is
    recorded with the parts: an edit to it is damage that ``verify`` names (it said ok)."""
    from pfamalign.commands.verify import verify_directory

    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    meta = out / "checkpoints" / str(STEPS) / "_CHECKPOINT_METADATA"
    assert "_CHECKPOINT_METADATA" in json.loads(meta.with_name("checksums.json").read_text())["sha256"]
    meta.write_text("{}")
    assert f"{meta}: checksum mismatch (corrupt or modified)" in verify_directory(out)[1]


def test_a_step_directory_without_parameters_is_refused_before_training(reference, dataset, tmp_path):
    """A step directory without params/ (a partial copy): the resume went back to the step
    before, trained the step again, then could not save over it ("Checkpoint for step 6
    already exists"), on every retry. It is refused first, and verify names it."""
    from pfamalign.commands.verify import verify_directory

    out = tmp_path / "run"
    shutil.copytree(reference.out_dir, out)
    shutil.rmtree(out / "model")
    newest = out / "checkpoints" / str(STEPS)
    shutil.rmtree(newest / "params")
    with pytest.raises(train.TrainingError, match=f"{newest} is an incomplete checkpoint .*remove that step"):
        train.run(dataset, out, _cfg(dataset), quiet=True)
    assert any(p.startswith(f"{newest}: an incomplete checkpoint (no params/") for p in verify_directory(out)[1])
    (newest / "checksums.json").unlink()  # nothing to list the missing files: still named
    assert any(p.startswith(f"{newest}: an incomplete checkpoint (no params/") for p in verify_directory(out)[1])


def test_saves_add_one_log_filter_however_many(tmp_path):
    """Each checkpoint save silences its orphaned writes' asyncio messages with a log filter:
    one for the process, not one more per save (a long run's logger collected thousands)."""
    import logging

    from pfamalign import checkpoint

    before = list(logging.getLogger("asyncio").filters)
    for step in range(3):
        with checkpoint._orbax_writing(tmp_path / str(step)):
            pass
    assert len([f for f in logging.getLogger("asyncio").filters if f not in before]) <= 1


def test_only_the_orphaned_reads_messages_are_dropped(monkeypatch):
    """What a failed orbax read leaves behind prints nothing (its pending reads' failures, and
    one collected at shutdown failing on a lazy import: that line came after the error in CI);
    any other unraisable error still reaches the previous hook."""
    import types

    from pfamalign import checkpoint

    passed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: passed.append(str(u.exc_value)))
    checkpoint._silence_orphaned_reads.cache_clear()
    try:
        checkpoint._silence_orphaned_reads()
        for err in (RuntimeError("Event loop is closed"), ValueError("Encountered error while reading array x"),
                    ImportError("sys.meta_path is None, Python is likely shutting down"),
                    ImportError("No module named 'humanize'"), RuntimeError("a real failure")):
            sys.unraisablehook(types.SimpleNamespace(exc_type=type(err), exc_value=err, exc_traceback=None,
                                                     err_msg=None, object=None))
    finally:
        checkpoint._silence_orphaned_reads.cache_clear()
    assert passed == ["No module named 'humanize'", "a real failure"]


def test_cli_bad_inputs(dataset, tmp_path):
    out = ["--out", str(tmp_path / "r")]
    res = _cli(["train", "--data", str(tmp_path / "missing"), "--config", "k2_eps1", *out])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = _cli(["train", "--data", str(tmp_path), "--config", "k2_eps1", *out])
    assert res.exit_code == 2 and "Invalid value for '--data'" in res.output \
        and "not a prepared dataset" in res.output  # a usage error, as in every command
    res = _cli(["train", "--data", str(dataset), "--config", "k3_eps9", *out])
    assert res.exit_code == 2 and "Invalid value for '--config'" in res.output
    res = _cli(["train", "--data", str(dataset), *out])
    assert res.exit_code == 2 and "--config is required" in res.output
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--batch-size", "12",
                *out])
    assert res.exit_code == 1 and "global batch 12 is not divisible by the 8 devices" in res.output
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--set", "bogus=1", *out])
    assert res.exit_code == 1 and "unknown --set key 'bogus'" in res.output
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--set", "heads", *out])
    assert res.exit_code == 2 and "key=value" in res.output
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--no-tune", "--tune-pairs", "50", *out])
    assert res.exit_code == 2 and "give one of them" in res.output  # one would be silently ignored
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--batch-size", "800",
                *out])
    assert res.exit_code == 1 and "fewer than one batch of 800" in res.output
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--coordinator",
                "localhost:1234", *out])
    assert res.exit_code == 2 and "go together, with --distributed" in res.output
    # --distributed: its options checked, and no cluster is one line, not a traceback
    cluster = ["--distributed", "--coordinator"]
    for args, said in (([*cluster, "notahostport", "--num-processes", "1", "--process-id", "0"], "is not HOST:PORT"),
                       ([*cluster, "localhost:1234", "--num-processes", "2", "--process-id", "5"],
                        "5 is not below --num-processes 2"),
                       ([*cluster, "localhost:1234", "--num-processes", "0", "--process-id", "0"], "--num-processes"),
                       (["--distributed"], "--distributed: cannot join a multi-host run")):
        res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", *args, *out])
        assert res.exit_code in (1, 2) and said in res.output and "Traceback" not in res.output, res.output
    # refused before the training, not after it: --compile of an unbalanced model, seeds past a C long
    res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--compile",
                "--set", "transport.marginals=rows", *out])
    assert res.exit_code == 2 and "--compile: ASAP compiles balanced plans only" in res.output
    for seed in ("--set=train.seed=-1", f"--set=train.seed={2**63}"):
        res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", seed, *out])
        assert res.exit_code in (1, 2) and "seed must be" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "r").exists()
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        res = _cli(["train", "--data", str(dataset), "--config", "k2_eps1", "--tensorboard",
                    *out])
        assert res.exit_code == 2 and "pip install" in res.output


# ---------------------------------------------------------------------------------------------
# Topologies: a model saved on 8 devices loads on 1; two processes train like one
# ---------------------------------------------------------------------------------------------

_CHECKSUM = """
import sys, jax, numpy as np
from pfamalign import checkpoint
model, cfg = checkpoint.load_model(sys.argv[1])
leaves = jax.tree.leaves(checkpoint.model_params(model))
print(len(jax.devices()), repr(float(sum(np.asarray(x, np.float64).sum() for x in leaves))))
"""


def _checksum(path, devices):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    out = subprocess.run([sys.executable, "-c", _CHECKSUM, str(path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    n, total = out.stdout.split()
    return int(n), float(total)


def test_a_model_saved_on_8_devices_loads_on_1(reference):
    n, total = _checksum(reference.out_dir / "model", 1)
    want = sum(np.asarray(x, np.float64).sum()
               for x in jax.tree.leaves(_params(reference.out_dir / "model")))
    assert n == 1 and total == float(want)


@pytest.mark.slow
def test_two_processes_train_like_one(dataset, tmp_path):
    """`--distributed` with two CPU processes x 4 devices (gloo collectives) takes the same
    steps as one process with 8 devices; with `--compile` process 0 alone compiles the model,
    once it is finished (every process compiled it, the others while process 0 still finished
    it: "not finished yet")."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    base = ["--data", str(dataset), "--config", "align_ce", "--quiet"]
    for key, value in TINY.items():
        base += ["--set", f"{key}={value}"]
    env = dict(os.environ, CI="1", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "pfamalign.cli", "train", *base, "--out", str(tmp_path / "multi"),
         "--distributed", "--coordinator", f"localhost:{port}", "--num-processes", "2",
         "--process-id", str(i), "--compile"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for i in range(2)]
    outs = [p.communicate(timeout=900)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert not any("not finished" in out for out in outs), outs
    compiled = tmp_path / "multi" / "compiled"
    assert (compiled / "asap.json").is_file() and (compiled / "training.json").is_file()
    single = train.run(dataset, tmp_path / "single", _cfg(dataset), quiet=True)
    losses = {}
    for name in ("multi", "single"):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        losses[name] = [json.loads(x)["train/loss"] for x in lines if "train/loss" in x]
    np.testing.assert_allclose(losses["multi"], losses["single"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 _params(tmp_path / "multi" / "model"), _params(single.out_dir / "model"))


def test_processes_with_unequal_device_counts_are_refused(dataset, tmp_path):
    """Two processes with 4 and 2 devices (6 in all, global batch 12): both failed in the
    state's replication with "cannot reshape array of size 6 into shape (2,4)"."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "pfamalign.cli", "train", "--data", str(dataset), "--config", "align_ce", "--quiet",
         "--out", str(tmp_path / "run"), "--batch-size", "12", "--steps", "1", "--distributed", "--coordinator",
         f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)],
        env=dict(os.environ, CI="1", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i, devices in enumerate((4, 2))]
    outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    for p, out, mine in zip(procs, outs, (4, 2)):
        assert p.returncode == 1 and "Traceback" not in out, out
        assert f"the 2 processes have 6 devices in all, but this one has {mine}" in out, out


def test_the_decoder_line_says_when_tuning_kept_the_shipped_decoder():
    from pfamalign import tuning

    settings = dataclasses.asdict(tuning.incumbent_settings())
    choice = {"source": "tuned", "split": "val", "families": ["PF00001"], "n_pairs": 20, "f1": 0.655,
              "f1_below30": None, "settings": settings,
              "margin_over_incumbent": {"value": 0.01, "low": -0.005, "high": 0.026,
                                        "resampled": "pairs (too few families: no evidence)"}}
    line = tuning.describe(choice)
    assert "the shipped model's, kept: too few families to change it (at least 5)" in line
    assert "20 val pairs of 1 family: F1 0.655" in line and "tuned on" not in line
    choice["families"] = [f"PF0000{n}" for n in range(6)]
    choice["margin_over_incumbent"].update(resampled="families")
    assert "gain +0.010 [-0.005, +0.026] is not surely above zero" in tuning.describe(choice)
    choice["margin_over_incumbent"].update(low=0.002)  # the evidence asked for: the change stands
    assert tuning.describe(choice).endswith("tuned on 20 val pairs of 6 families: F1 0.655")


def test_progress_without_a_terminal_is_a_line_every_log_every_steps_at_the_typical_rate(capsys):
    from pfamalign.training.rundir import ProgressLine

    progress = ProgressLine(30, 0, quiet=False, every=10)  # pytest's stderr: not a terminal
    for step in range(1, 31):  # the first step compiles: 20 s; the others take 0.1 s
        progress.update(step, f"loss {1 / step:.4f}", step_time=20.0 if step == 1 else 0.1, batch_size=4)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["step 10/30  loss 0.1000  40.0 ex/s  left 0:00:02",
                     "step 20/30  loss 0.0500  40.0 ex/s  left 0:00:01",
                     "step 30/30  loss 0.0333  40.0 ex/s  left 0:00:00"]
    ProgressLine(30, 0, quiet=True, every=10).update(10, "loss 1", step_time=0.1)
    assert capsys.readouterr().err == ""
    # two steps, the first compiling: the rate is the second's (the upper middle was the compile)
    short = ProgressLine(2, 0, quiet=False, every=1)
    short.update(1, "loss 1", step_time=20.0, batch_size=4)
    short.update(2, "loss 1", step_time=0.1, batch_size=4)
    assert capsys.readouterr().err.splitlines()[-1] == "step 2/2  loss 1  40.0 ex/s  left 0:00:00"


def test_a_metrics_file_that_links_elsewhere_is_refused_and_odd_lines_are_dropped(tmp_path):
    """Resuming a handed-over run whose metrics.jsonl was a symbolic link rewrote the link's
    target (a file outside the run); a line that is JSON but not an object was a traceback."""
    from pfamalign.training.errors import TrainingError
    from pfamalign.training.rundir import MetricsWriter

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(TrainingError, match="metrics.jsonl is a symbolic link or not a regular file"):
        MetricsWriter(run, resume_step=3)
    assert victim.read_text() == "my notes\n"
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n[1, 2]\n{"step": "x"}\n{"step": 5}\n{"step": 3}\n{"tor')
    writer = MetricsWriter(run, resume_step=3)
    writer.write(4, {"b": 2.0})
    writer.close()
    assert [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "a": 1}, {"step": 3}, {"step": 4, "b": 2.0}]


def test_the_optimiser_clips_decays_only_matrices_and_follows_its_schedule():
    """``make_optimizer`` as ``OptimConfig`` documents it: linear warmup to ``lr``, cosine decay
    to ``lr * final_lr_ratio`` at ``steps``; weight decay on matrices only; gradients clipped
    to ``clip_norm`` (global norm) before AdamW."""
    import jax.numpy as jnp
    import optax

    from pfamalign.configs import OptimConfig

    cfg = OptimConfig(steps=100, lr=1e-2, warmup_steps=10, final_lr_ratio=0.1, weight_decay=0.5, clip_norm=1.0)
    tx, schedule = train_step.make_optimizer(cfg)
    assert float(schedule(0)) == pytest.approx(cfg.lr / 11)
    assert float(schedule(10)) == pytest.approx(cfg.lr)
    assert float(schedule(55)) == pytest.approx(cfg.lr * (0.1 + 0.9 * 0.5), rel=1e-5)  # half way down the cosine
    assert float(schedule(100)) == pytest.approx(cfg.lr * 0.1)
    params = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
    # zero gradients: only the decay moves a parameter, and only a matrix
    upd, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    assert not np.any(np.asarray(upd["b"]))
    np.testing.assert_allclose(upd["w"], -float(schedule(0)) * cfg.weight_decay * params["w"], rtol=1e-6)
    # a spike, then an ordinary gradient: as AdamW given the spike scaled down to clip_norm
    spike, ordinary = {"w": jnp.full((2, 3), 100.0), "b": jnp.full(3, -50.0)}, {"w": jnp.full((2, 3), 0.1),
                                                                                  "b": jnp.full(3, 0.2)}
    clipped = jax.tree.map(lambda g: g * cfg.clip_norm / optax.global_norm(spike), spike)
    adamw = optax.adamw(schedule, weight_decay=cfg.weight_decay, mask={"w": True, "b": False})
    for opt, grads in ((tx, (spike, ordinary)), (adamw, (clipped, ordinary))):
        state = opt.init(params)
        for g in grads:
            upd, state = opt.update(g, state, params)
        if opt is tx:
            got = upd
    for name in params:
        np.testing.assert_allclose(got[name], upd[name], rtol=1e-5)
