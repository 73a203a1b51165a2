"""The train step: optimiser, state, the pure jitted step, and the data-parallel mesh.

Data parallelism: a 1-D mesh ``("data",)`` over every device JAX sees (all hosts with
``--distributed``); parameters and optimiser state are replicated, the global batch is split
over the mesh, and the loss is the global mean, so 1 device and N devices take the same step
for the same global batch. Multi-host: every process loads only its own rows of each global
batch (``pipelines.reader``); the arrays are assembled with
``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import dataclasses
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
from pfamalign.configs import OptimConfig, RunConfig
from pfamalign.model import Aligner, aligner_loss
from pfamalign.training.errors import TrainingError

BATCH_KEYS = ("q_feat", "k_feat", "q_len", "k_len", "target", "valid")  # the step's inputs


# ---------------------------------------------------------------------------------------------
# Devices and the data-parallel mesh
# ---------------------------------------------------------------------------------------------

# After the last step process 0 finishes the model alone (pair-HMM count, decoder tuning:
# minutes) while the other processes wait at jax's shutdown barrier, whose default deadline
# (300 s) is shorter than that on a small host.
SHUTDOWN_TIMEOUT_S = 4 * 3600


def init_distributed(coordinator: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None) -> None:
    """Joins a multi-host run: auto-detected (TPU / SLURM / MPI) without a coordinator."""
    if coordinator is not None:
        # cross-process collectives for CPU devices (no effect on TPU / GPU)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes, process_id,
                                   shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S)
    else:
        jax.distributed.initialize(shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S)


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
    """Refuses a global batch the mesh cannot split evenly, and processes with unequal device
    counts (each loads ``batch / processes`` rows, which its devices must split evenly)."""
    if jax.device_count() != jax.local_device_count() * jax.process_count():
        raise TrainingError(f"the {jax.process_count()} processes have {jax.device_count()} devices in all, "
                            f"but this one has {jax.local_device_count()}: every process needs the same "
                            "number of devices (XLA_FLAGS, CUDA_VISIBLE_DEVICES, the hosts' accelerators)")
    n = mesh.devices.size
    if batch_size % n:
        raise TrainingError(f"global batch {batch_size} is not divisible by the {n} devices; "
                            f"use a multiple of {n} (--batch-size; resuming a run, with --allow-changes)")
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


def local_params(params):
    """A host copy of replicated parameters (works on every process of a multi-host run)."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), params)


# ---------------------------------------------------------------------------------------------
# Optimiser and state
# ---------------------------------------------------------------------------------------------

def make_optimizer(cfg: OptimConfig) -> tuple[optax.GradientTransformation, Callable]:
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
    """Fresh parameters (seeded by ``cfg.train.data.seed``) and optimiser state, replicated."""
    model = Aligner(cfg.model, rngs=nnx.Rngs(params=cfg.train.data.seed))
    graphdef, state = nnx.split(model)
    tx, schedule = make_optimizer(cfg.train.optim)
    params = jax.device_put(nnx.to_pure_dict(state), replicated(mesh))
    opt_state = jax.jit(tx.init, out_shardings=replicated(mesh))(params)
    return TrainState(graphdef, params, opt_state, tx, schedule)


def abstract_state(state: TrainState):
    """ShapeDtypeStruct trees (with shardings) of the params and optimiser state."""
    struct = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return jax.tree.map(struct, state.params), jax.tree.map(struct, state.opt_state)


# ---------------------------------------------------------------------------------------------
# The train step
# ---------------------------------------------------------------------------------------------

def _all_finite(tree) -> jax.Array:
    """Whether every floating-point leaf of ``tree`` is finite (integer leaves: counters)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def make_train_step(cfg: RunConfig, mesh) -> Callable:
    """``step(params, opt_state, batch) -> (params, opt_state, metrics)``, jitted with the
    batch sharded over ``data`` and everything else replicated. A non-finite loss or
    gradient, or updated params / optimiser state that are not finite, leave params and
    optimiser state unchanged (``metrics["finite"]`` is False; ``state_finite`` says which).

    Cached per (model config, optimiser settings, mesh): runs in one process (a resume,
    tests) reuse the compiled step.
    """
    key = (cfg.model, cfg.train.optim, mesh)
    if key not in _STEP_CACHE:
        _STEP_CACHE[key] = _build_train_step(cfg, mesh)
    return _STEP_CACHE[key]


_STEP_CACHE: dict[tuple, Callable] = {}


def _build_train_step(cfg: RunConfig, mesh) -> Callable:
    graphdef, _ = ckpt.abstract_params(cfg.model)
    tx, _ = make_optimizer(cfg.train.optim)

    def loss_fn(params, batch):
        return aligner_loss(nnx.merge(graphdef, params), batch)

    def step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # a finite loss and gradient can still give non-finite parameters (--lr inf): the
        # new state is checked too, so that no checkpoint ever holds it
        state_ok = _all_finite(new_params) & _all_finite(new_opt)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & state_ok
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        metrics = dict(metrics, grad_norm=grad_norm, finite=ok, state_finite=state_ok)
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    rep, data = replicated(mesh), batch_sharding(mesh)
    return jax.jit(step, in_shardings=(rep, rep, data), out_shardings=(rep, rep, rep),
                   donate_argnums=(0, 1))
