"""The check that a data-parallel step on 8 simulated CPU devices equals the 1-device step,
shared by the tests of every model kind (tests import it as ``meshes``)."""

import jax
import numpy as np
from flax import nnx

from pfamalign import checkpoint
from pfamalign.model import aligner_loss
from pfamalign.training import step as train_step


def assert_eight_devices_match_one(cfg, batches) -> None:
    """The batch-sharded gradient of the first batch equals the one-device gradient, and the
    optimiser steps over ``batches`` give the same losses on 8 devices as on 1. (Parameters
    are not compared elementwise after AdamW steps: for a parameter whose gradient is ~0,
    Adam's m/sqrt(v) turns reduction-order noise into an O(lr) update of either sign.)"""
    assert len(jax.devices()) == 8
    graphdef, _ = checkpoint.abstract_params(cfg.model)
    loss_fn = lambda p, b: aligner_loss(nnx.merge(graphdef, p), b)[0]
    losses, grads = {}, {}
    for n in (8, 1):
        mesh = train_step.make_mesh(jax.devices()[:n])
        state = train_step.init_state(cfg, mesh)
        grad_fn = jax.jit(jax.grad(loss_fn), in_shardings=(train_step.replicated(mesh),
                                                            train_step.batch_sharding(mesh)))
        grads[n] = jax.device_get(grad_fn(state.params, train_step.shard_batch(batches[0], mesh)))
        step = train_step.make_train_step(cfg, mesh)
        losses[n] = []
        for b in batches:
            state.params, state.opt_state, m = step(state.params, state.opt_state,
                                                    train_step.shard_batch(b, mesh))
            losses[n].append(float(m["loss"]))
    np.testing.assert_allclose(losses[8], losses[1], rtol=1e-5)
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads[1]))
    assert scale > 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale),
                 grads[8], grads[1])
