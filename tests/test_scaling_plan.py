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
    # and no further from a float64 solve than the reference (to float32 rounding). Entries
    # above 1 (a capacity dustbin's corner holds ~Lq) round relative to their size: their
    # absolute error is compared in units of the entry, as float32 stores it
    err = lambda plan: (np.abs(plan - truth) / np.maximum(np.abs(truth), 1.0)).max()  # noqa: E731
    assert err(fast) <= max(2 * err(ref), 1e-6)


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

    plan = np.asarray(model_lib.fast_or_reference(program, (None,), q, k, ql, kl))
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
    # from encodings computed apart (what Predictor keeps across batches): the same plans
    encoded = (model.encodings(xq, ql), model.encodings(xk, kl))
    for got, want in zip(model.plans_both_ways(xq, xk, ql, kl, encoded=encoded), (ab, ba)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


@pytest.mark.parametrize("window", [-1, 0, 3])
@pytest.mark.parametrize("dustbin", ["none", "spoke", "capacity"])
def test_dense_scores_are_the_projected_dot_products(window, dustbin):
    """``Aligner.dense_scores`` (the substitution channel as diagonal sums) against the dot
    products of ``project``'s queries, keys and tokens (``dense_problem``): two heads, random
    parameters and window weights, padded rows and columns; and the model's plan from them
    is the reference plan."""
    from pfamalign.model import AlignerConfig, build_model

    cfg = AlignerConfig(name="scores_test", feature_dim=50, embedder_id="builtin/onehot+blosum62",
                        encoder="conv", encoder_layers=1, encoder_width=16, kernel_size=3, heads=2,
                        head_dim=8, value_dim=4, substitution_window=window, ce_weight=1.0,
                        transport=TransportConfig(half_band=6, eps=0.8, base_steps=6, tail_steps=2,
                                                  dustbin=dustbin))
    model = build_model(cfg, seed=3)
    rng = np.random.default_rng(window + 10)
    if window >= 0:
        model.substitution_logw[...] = jnp.asarray(rng.normal(size=2 * window + 1), jnp.float32)
    if cfg.dustbin:  # tokens of the trained scale, not the init's 0.02
        model.dustbin_q[...] = jnp.asarray(rng.normal(size=model.dustbin_q.shape), jnp.float32)
        model.dustbin_k[...] = jnp.asarray(rng.normal(size=model.dustbin_k.shape), jnp.float32)
    from pfamalign.pipelines.embed import get_embedder

    emb = get_embedder("builtin/onehot+blosum62")
    seqs = [("MKVLAAGIVGLLLAQS", "MKVLSAGIVG"), ("GSHMKTAYIAKQ", "MKTAYIAKQRQISFVKS")]
    pad = 20
    xq = jnp.asarray(np.stack([np.pad(np.asarray(emb.embed([a])[0]), ((0, pad - len(a)), (0, 0))) for a, _ in seqs]))
    xk = jnp.asarray(np.stack([np.pad(np.asarray(emb.embed([b])[0]), ((0, pad - len(b)), (0, 0))) for _, b in seqs]))
    ql, kl = jnp.array([len(a) for a, _ in seqs]), jnp.array([len(b) for _, b in seqs])
    q, k, _, tokens = model.project(xq, xk, ql, kl)
    tokens = tokens if tokens is not None else DustbinTokens(None, None, None)
    want, mask, _, _ = dense_problem(q, k, ql, kl, tokens, cfg.transport)
    got = model.dense_scores(xq, xk, ql, kl)
    assert got.shape == want.shape == (2, 2, pad + 1, pad + 1)
    support = np.broadcast_to(np.asarray(mask), want.shape)
    np.testing.assert_allclose(np.asarray(got)[support], np.asarray(want)[support], rtol=1e-5, atol=1e-5)
    reference = np.asarray(model.head_plans(xq, xk, ql, kl)[0]).mean(1)
    np.testing.assert_allclose(np.asarray(model.plan(xq, xk, ql, kl)), reference, atol=5e-6, rtol=0)
