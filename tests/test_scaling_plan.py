"""The scaling-domain inference plan (``kernels/scaling.py``) against the log-domain reference:
the same plan to float32 rounding on every dustbin mode, band and padding; reported unsafe
where float32's range rules it out (and the model then answers with the reference); the
reference for configurations it does not cover."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfamalign.kernels import DustbinTokens, TransportConfig, scaling_transport_plan, transport_plan
from pfamalign.kernels.reference import dense_problem, reference_solve
from pfamalign.kernels.scaling import scaling_applies, scaling_solve


def _inputs(b, h, lq, lk, d, *, seed, scale=1.0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = scale * jax.random.normal(keys[0], (b, h, lq, d))
    k = scale * jax.random.normal(keys[1], (b, h, lk, d))
    tokens = DustbinTokens(scale * jax.random.normal(keys[2], (h, d)),
                           scale * jax.random.normal(keys[3], (h, d)), jnp.zeros((h, 1)))
    return q, k, tokens


def _float64_plan(q, k, ql, kl, tokens, cfg):
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.asarray(x), jnp.float64)  # noqa: E731
        tok = DustbinTokens(f64(tokens.q), f64(tokens.k), f64(tokens.v))
        v = jnp.zeros(k.shape[:-1] + (1,), jnp.float64)
        return np.asarray(reference_solve(f64(q), f64(k), v, jnp.asarray(ql), jnp.asarray(kl), tok, cfg)[0])


@pytest.mark.parametrize("dustbin", ["none", "spoke", "widened", "capacity"])
@pytest.mark.parametrize("half_band", [3, 64])
def test_scaling_plan_is_the_reference_plan(dustbin, half_band):
    cfg = TransportConfig(half_band=half_band, eps=0.7, base_steps=9, tail_steps=2, dustbin=dustbin)
    q, k, tokens = _inputs(3, 2, 21, 17, 8, seed=half_band + len(dustbin), scale=1.5)
    ql, kl = jnp.array([21, 9, 1]), jnp.array([17, 17, 12])  # padding rows and columns, a 1-residue query
    fast, safe = scaling_transport_plan(q, k, ql, kl, tokens, config=cfg)
    fast, ref = np.asarray(fast), np.asarray(transport_plan(q, k, ql, kl, tokens, config=cfg))
    assert bool(safe)
    truth = _float64_plan(q, k, ql, kl, tokens, cfg)
    np.testing.assert_array_equal(fast == 0, ref == 0)  # the same support
    np.testing.assert_allclose(fast, ref, atol=5e-6, rtol=0)
    # and no further from a float64 solve than the reference (to float32 rounding)
    assert np.abs(fast - truth).max() <= max(2 * np.abs(ref - truth).max(), 1e-6)


def _unreachable_column(depth):
    """A problem whose key 5 scores ``depth`` e-folds below every row's best (queries and the
    dustbin query along one direction, key 5 against it): a column float32's exp cannot hold
    once the depth passes ~87."""
    cfg = TransportConfig(half_band=64, eps=1.0, base_steps=5, tail_steps=2, dustbin="spoke")
    q, k, tokens = _inputs(2, 1, 12, 14, 8, seed=3, scale=0.3)
    q = q + 1.0
    k = k.at[:, :, 5].set(-depth / np.sqrt(8) * jnp.ones(8))
    tokens = DustbinTokens(tokens.q + 1.0, tokens.k, tokens.v)
    return q, k, jnp.array([12, 10]), jnp.array([14, 14]), tokens, cfg


def _scaling_of(q, k, ql, kl, tokens, cfg):
    dots, mask, log_a, log_b = dense_problem(q, k, ql, kl, tokens, cfg)
    plan, safe = scaling_solve(dots, mask, log_a, log_b, cfg)
    return np.asarray(plan), bool(safe)


def test_scaling_solve_reports_a_range_float32_cannot_hold():
    assert _scaling_of(*_unreachable_column(20.0))[1]
    assert not _scaling_of(*_unreachable_column(120.0))[1]


def test_out_of_range_scores_fall_back_to_the_reference():
    """The model's plan: scaling solve unsafe here, so it answers with the reference plan."""
    from pfamalign import model as model_lib

    q, k, ql, kl, tokens, cfg = _unreachable_column(120.0)
    raw, safe = _scaling_of(q, k, ql, kl, tokens, cfg)
    ref = np.asarray(transport_plan(q, k, ql, kl, tokens, config=cfg))
    assert not safe and not (np.isfinite(raw).all() and np.allclose(raw, ref, atol=1e-3))
    assert ref[:, 0, :12, 5].sum() > 0.5  # a column the transport still reaches (its unit mass)

    calls = []

    def program(model, *args, solver):  # stands in for the model's jitted plan program
        calls.append(solver)
        if solver == "scaling":
            return scaling_transport_plan(q, k, ql, kl, tokens, config=cfg)
        return transport_plan(q, k, ql, kl, tokens, config=cfg), jnp.array(True)

    plan = np.asarray(model_lib._fast_or_reference(program, None, q, k, ql, kl))
    assert calls == ["scaling", "reference"]
    np.testing.assert_array_equal(plan, ref)


@pytest.mark.parametrize("change", [dict(marginals="rows", relax=None), dict(marginals="cols", relax=2.0),
                                    dict(tol=1e-3, max_steps=20), dict(eps_schedule=((2.0, 3), (1.0, 3)))])
def test_other_configurations_run_the_reference(change):
    cfg = dataclasses.replace(TransportConfig(half_band=64, eps=1.0, base_steps=6, tail_steps=2,
                                              dustbin="spoke"), **change)
    assert not scaling_applies(cfg)
    q, k, tokens = _inputs(1, 1, 10, 11, 8, seed=5)
    ql, kl = jnp.array([10]), jnp.array([11])
    plan, safe = scaling_transport_plan(q, k, ql, kl, tokens, config=cfg)
    assert bool(safe)
    np.testing.assert_array_equal(np.asarray(plan), np.asarray(transport_plan(q, k, ql, kl, tokens, config=cfg)))


def test_the_models_plans_are_the_reference_plans():
    """The shipped model's ``plan`` / ``plans_both_ways`` (scaling solve) against its
    ``head_plans`` (the reference solver), both directions, padded pairs."""
    from pfamalign.inference import Predictor, pad_batch

    predictor = Predictor()
    model = predictor.model
    seqs = [("MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE", "MKVLSAGIVGLAQSPDRWKNLSTGYFAE"),
            ("GSHMKTAYIAKQRQISFVKSHFSRQ", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEK")]
    xq, xk, ql, kl = pad_batch([tuple(predictor.featurize(pair)) for pair in seqs])
    ref_ab = np.asarray(model.head_plans(xq, xk, ql, kl)[0]).mean(1)
    ref_ba = np.asarray(model.head_plans(xk, xq, kl, ql)[0]).mean(1)
    np.testing.assert_allclose(np.asarray(model.plan(xq, xk, ql, kl)), ref_ab, atol=5e-6, rtol=0)
    ab, ba = model.plans_both_ways(xq, xk, ql, kl)
    np.testing.assert_allclose(np.asarray(ab), ref_ab, atol=5e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(ba), ref_ba, atol=5e-6, rtol=0)
