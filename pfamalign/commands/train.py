"""``pfamalign train``: train an aligner on a prepared dataset (``pfamalign.training``)."""

from __future__ import annotations

import inspect

import click

from pfamalign.commands._common import DatasetDirectory, Number
from pfamalign.config_table import CONFIG_NAMES, CONFIGS

_ATTENTION = {"softmax": "softmax attention", "ceta": "CETA attention",
              "gsa": "OrthGSA attention (+ indexer KL), Cayley hyper-connections"}
_NOTES = {"align_ce": "the configuration built to align"}


def _config_summary(name: str) -> str:
    """One configuration in words, from its entry in ``config_table.CONFIGS`` (the registry
    ``--config`` accepts), so that the help lists every one and cannot go stale."""
    model, transport, _ = CONFIGS[name]
    dustbin = transport.get("dustbin", "none")
    parts = ["balanced" if dustbin == "none" else f"{dustbin} dustbin"]
    if transport.get("marginals") == "rows":
        parts[0] += ", row softmax (columns free)"
    if transport.get("tail_steps", 2) != 2:
        parts[0] += f", R={transport['tail_steps']}"
    losses = [(label, model.get(key, default)) for label, key, default in
              (("recon", "recon_weight", 1.0), ("CE", "ce_weight", 0.0),
               ("mono", "mono_weight", 0.0))]
    parts.append(" + ".join(label if w == 1 else f"{w:g} {label}" for label, w in losses if w))
    encoder = model.get("encoder")
    if encoder == "transformer":
        attention = model.get("attention", "softmax")
        parts.append(f"transformer, {_ATTENTION.get(attention, attention + ' attention')}")
    else:
        parts.append("encoder by features" if encoder is None else f"{encoder} encoder")
    if name in _NOTES:
        parts.append(_NOTES[name])
    return "; ".join(parts)


def _config_lines(width: int = 88) -> str:
    """The help's list of configurations, indented as the lines of ``_HELP`` (a \\b block:
    click keeps the line breaks)."""
    import textwrap

    pad = max(map(len, CONFIG_NAMES)) + 2
    lines = []
    for name in CONFIG_NAMES:
        wrapped = textwrap.wrap(_config_summary(name), width - pad - 2)
        lines.append(f"      {name:<{pad}}{wrapped[0]}")
        lines += [f"      {'':<{pad}}{more}" for more in wrapped[1:]]
    return "\n".join(lines)


_HELP = """Train an aligner on a prepared dataset.

    \b
    Configurations (reference settings: T=15 Sinkhorn steps with a stopped gradient, then
    R=2 differentiated ones, band 1024, global batch 64; losses:
    recon = reconstruction, CE = sparse CE, mono = monotonicity; encoder by features: conv
    for built-in features, none for ESM-2; details in pfamalign/configs.py):
{configs}

    \b
    Examples:
      pfamalign train --data data/ --config align_ce --out runs/align_ce --steps 3000
      pfamalign train --data data/ --config align_ceta --out runs/ceta --compile   # + runs/ceta/compiled

    Re-running the same command resumes from the newest checkpoint (same step, same data
    position); SIGTERM or Ctrl-C save a checkpoint and exit (status 128 + signal). A NaN or
    inf loss stops the run and leaves the last good checkpoint. OUT/model/ is the final model
    (`pfamalign align --checkpoint OUT/model`; OUT itself stands for OUT/model once the run
    finished, for its newest checkpoint before, with the shipped model's decoder). The
    run ends by choosing the model's decoder on the val families (MEA, affine, hybrid,
    posterior: the plan mixed with the pair-HMM posteriors or through the plan pair-HMM;
    best aligned-pair F1, kept only when it beats the shipped model's decoder by a family
    bootstrap; OUT/model/decoding.json) and recording the dataset and families it learnt
    from (OUT/model/training.json, which `pfamalign eval` checks for overlap).

    \b
    Devices and hosts: data parallel over every device JAX sees (the batch is split, the
    parameters replicated). On a TPU pod slice run the same command on every host with
    --distributed, e.g.
      gcloud compute tpus tpu-vm ssh NAME --worker=all --command \\
        "pfamalign train --distributed --data /mnt/data --config k2_eps1 --out /mnt/runs/k2"
    --data and --out must be on storage every host reads and writes (NFS, GCS fuse);
    each process loads only its rows of every global batch. The transport op picks its
    implementation per backend (transport.impl=auto): the Pallas kernels on TPU, on GPU dense
    autodiff for short pairs and banded kernels above (the stored-band Triton kernels from
    L 4096 at one eps, no tolerance and at most 64 steps, else the XLA path from 8192), the XLA
    path on CPU; force one with
    --set transport.impl=xla (or reference, pallas).
    """
_HELP = inspect.cleandoc(_HELP.format(configs=_config_lines()))


# What the summary's metrics count (the keys after their split: train/, val/, diag/)
METRIC_NOTES = {"barycenter_mae": " residues", "within5": " of rows within 5 residues",
                "monotonicity_violation": " of row steps going back", "sparse_ce": " nats a reference pair",
                "examples_per_s": " (a typical step)"}


def summary_line(result, total_steps: int) -> str:
    """What a finished (not interrupted) run did, from its ``training.TrainResult``:
    ``trained 6 steps``, ``trained 3 steps (resumed at step 3, now at 6 of 6)`` or, for a
    run that was already finished, ``nothing to train: RUN was already at step 6 of 6``."""
    import os

    done = result.step - result.start_step
    if done == 0:
        return (f"nothing to train: {os.path.relpath(result.out_dir)} was already at step "
                f"{result.step} of {total_steps}")
    steps = f"trained {done} step{'' if done == 1 else 's'}"
    if result.start_step == 0:
        return steps
    return f"{steps} (resumed at step {result.start_step}, now at {result.step} of {total_steps})"


@click.command("train", help=_HELP, short_help="Train an aligner on a prepared dataset.")
@click.option("--data", "data_dir", required=True, type=DatasetDirectory(),
              help="Dataset directory written by `pfamalign prepare shards`.")
@click.option("--config", "config_name", type=click.Choice(CONFIG_NAMES), default=None,
              help="Named configuration (required for a new run; a resumed run uses the one "
                   "saved in --out).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Run directory: metrics.jsonl, config.json, checkpoints/, model/. An "
                   "existing checkpoint there is resumed.")
@click.option("--steps", type=int, default=None, help="Optimiser steps  [config: 2000]")
@click.option("--batch-size", type=int, default=None,
              help="Global batch, divisible by the device count  [config: 64]")
@click.option("--lr", type=Number(min=0, min_open=True), default=None,
              help="Peak learning rate  [config: 1e-3]")
@click.option("--eval-every", type=int, default=None,
              help="Validation every N steps, 0 = never  [config: 200]")
@click.option("--ckpt-every", type=int, default=None,
              help="Checkpoint every N steps, 0 = only at the end  [config: 200]")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=None,  # configs.MAX_SEED (it loads jax)
              help="Initialisation and data order  [config: 0]")
@click.option("--set", "set_items", multiple=True, metavar="KEY=VALUE",
              help="Override a config field (repeatable): a model field (heads=2), "
                   "transport.<field> (transport.eps=0.5) or train.<field> "
                   "(train.warmup_steps=50).")
@click.option("--tune-pairs", type=click.IntRange(min=1), default=500, show_default=True,
              help="At the end, choose the model's decoder on this many val pairs (drawn "
                   "across the val families); written to OUT/model/decoding.json.")
@click.option("--no-tune", is_flag=True,
              help="Skip the decoder choice: OUT/model gets the shipped model's decoder.")
@click.option("--compile", "compile_", is_flag=True,
              help="At the end, compile the model's transport (`pfamalign compile`: the plan and "
                   "any CETA encoder layers, calibrated on this dataset's train pairs) into "
                   "OUT/compiled, a model directory for `--engine asap` (replaced on a rerun).")
@click.option("--allow-changes", is_flag=True,
              help="Resume even though training settings differ from the saved run's: the "
                   "optimiser's (--lr, --steps, ...) and the batches' (--batch-size, --seed, "
                   "train.max_len, ...), e.g. a lower LR after a divergence; never the model's "
                   "or the dataset.")
@click.option("--distributed", is_flag=True,
              help="Multi-host: call jax.distributed.initialize() first (run the same command "
                   "on every host; see above).")
@click.option("--coordinator", default=None, metavar="HOST:PORT",
              help="With --distributed outside TPU / SLURM / MPI auto-detection: the "
                   "coordinator address (with --num-processes and --process-id).")
@click.option("--num-processes", type=click.IntRange(min=1), default=None, help="With --coordinator.")
@click.option("--process-id", type=click.IntRange(min=0), default=None,
              help="With --coordinator: this host's index, 0 to --num-processes - 1.")
@click.option("--tensorboard", is_flag=True,
              help="Also write TensorBoard scalars to OUT/tensorboard (needs tensorboardX).")
@click.option("-q", "--quiet", is_flag=True, help="No progress line and no summary.")
@click.pass_context
def train(ctx, data_dir, config_name, out_dir, steps, batch_size, lr, eval_every, ckpt_every,
          seed, set_items, tune_pairs, no_tune, compile_, allow_changes, distributed, coordinator, num_processes, process_id,
          tensorboard, quiet):
    """Trains an aligner (the help text is ``_HELP``)."""
    import os
    import shlex

    from pfamalign import configs, training
    from pfamalign.checkpoint import CheckpointError

    if tensorboard:
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            raise click.UsageError("--tensorboard needs tensorboardX: pip install "
                                   "'pfamalign[tensorboard]' (or pip install tensorboardX)")
    try:
        overrides = configs.parse_set_options(set_items)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--set") from None
    for key, value in (("steps", steps), ("batch_size", batch_size), ("lr", lr),
                       ("eval_every", eval_every), ("ckpt_every", ckpt_every), ("seed", seed)):
        if value is not None:
            overrides[f"train.{key}"] = value
    if no_tune and ctx.get_parameter_source("tune_pairs") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--tune-pairs sets how many pairs tune the decoder, and --no-tune skips the "
                               "tuning; give one of them")
    manual = (coordinator, num_processes, process_id)
    if any(x is not None for x in manual) and not (distributed and all(x is not None
                                                                        for x in manual)):
        raise click.UsageError("--coordinator, --num-processes and --process-id go together, "
                               "with --distributed")
    if coordinator is not None:
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise click.BadParameter(f"{coordinator!r} is not HOST:PORT (e.g. 10.0.0.1:1234)",
                                     param_hint="--coordinator")
        if process_id >= num_processes:
            raise click.BadParameter(f"{process_id} is not below --num-processes {num_processes}",
                                     param_hint="--process-id")
    if distributed:
        from pfamalign.training.step import init_distributed

        try:
            init_distributed(coordinator, num_processes, process_id)
        except (ValueError, RuntimeError) as err:  # no cluster detected, or none answering
            raise click.ClickException(
                f"--distributed: cannot join a multi-host run ({err}); outside TPU / SLURM / MPI "
                "auto-detection give --coordinator HOST:PORT --num-processes N --process-id I") from None
    try:
        cfg = training.run_config(data_dir, out_dir, config_name, overrides=overrides)
        if compile_:  # refused now, not after the training
            from pfamalign.asap import compile_refusal

            if (why := compile_refusal(cfg.model)) is not None:
                raise click.UsageError(f"--compile: {why}")
        result = training.run(data_dir, out_dir, cfg, tensorboard=tensorboard, quiet=quiet,
                              allow_changes=allow_changes,
                              tune_pairs=None if no_tune else tune_pairs)
    except training.OptionsError as err:
        raise click.UsageError(str(err)) from None
    except (training.TrainingError, CheckpointError, ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    if result.interrupted:
        ctx.exit(128 + int(result.signal or 15))
    import jax

    # process 0 wrote and finished the model: it alone compiles it (another process would
    # copy a model still being finished, and swap OUT/compiled with process 0's copy)
    if compile_ and result.model_dir is not None and jax.process_index() == 0:
        from pfamalign.commands.compile import compile_into

        try:
            compile_into(result.model_dir, result.out_dir / "compiled", data=data_dir, replace=True)
        except (ValueError, FileNotFoundError) as err:
            raise click.ClickException(f"--compile: {err}") from None
    if not quiet:
        from rich.console import Console

        console = Console(stderr=True)
        shown = {k: v for k, v in {**result.last_metrics, **result.last_eval}.items()
                 if k.split("/")[1] in ("loss", "examples_per_s", "sparse_ce", "barycenter_mae",
                                        "within5", "monotonicity_violation")}
        model = os.path.relpath(result.model_dir)
        console.print(f"{summary_line(result, cfg.train.steps)}; model: {model}")
        for key, value in shown.items():
            console.print(f"  {key:32s} {value:.4g}{METRIC_NOTES.get(key.split('/')[1], '')}")
        if any(k.startswith(("val/", "diag/")) for k in shown):  # the legend of lines shown
            console.print("  (val/: the model's plan on the val pairs, before decoding; diag/: the "
                          "diagonal baseline's)", soft_wrap=True)
        quoted = shlex.quote(model)  # lines to paste into a shell: paths with spaces quoted
        console.print(f"next: pfamalign eval --data {shlex.quote(str(data_dir))} --split test --checkpoint {quoted}\n"
                      f"      pfamalign align --checkpoint {quoted} SEQ_A SEQ_B", soft_wrap=True, markup=False)
