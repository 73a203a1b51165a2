"""The a-posteriori tail bias certificate (kernels/bias.py): the identity
grad_full = grad_stopped + c_R holds to rounding, ||c_R|| contracts with the tail depth R, the
certified depth follows the tolerance, and bad settings raise ValueError.

Each certificate compiles a few programs per tail depth, so the cases share one computation
per problem (module-scoped fixtures) and use few depths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfamalign.kernels import BlockSizes, DustbinTokens, TransportConfig
from pfamalign.kernels.bias import tail_bias_certificate


def make_inputs(b, h, lq, lk, d, dv, seed=0, dtype=jnp.float32, scale=1.0):
    """q, k, v, dustbin tokens and an output cotangent w, all standard normal (q, k scaled)."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    q = scale * jax.random.normal(ks[0], (b, h, lq, d), dtype)
    k = scale * jax.random.normal(ks[1], (b, h, lk, d), dtype)
    v = jax.random.normal(ks[2], (b, h, lk, dv), dtype)
    tokens = DustbinTokens(*(jax.random.normal(kk, (h, m), dtype) for kk, m in zip(ks[3:6], (d, d, dv))))
    w = jax.random.normal(ks[6], (b, h, lq, dv), dtype)
    return q, k, v, tokens, w


@pytest.fixture(scope="module")
def ragged_spoke_x64():
    """Float64, spoke dustbin, ragged lengths (padding rows, empty lines): the identity."""
    with jax.enable_x64(True):
        q, k, v, tokens, w = make_inputs(2, 2, 21, 18, 8, 4, seed=1, dtype=jnp.float64, scale=0.7)
        cfg = TransportConfig(half_band=4, eps=1.0, base_steps=5, dustbin="spoke", blocks=BlockSizes(8))
        return tail_bias_certificate(q, k, v, jnp.array([21, 15]), jnp.array([18, 13]), tokens,
                                     config=cfg, g_out=w, tail_depths=(0, 2))


@pytest.fixture(scope="module")
def contracting_x64():
    """Float64, a dense band and small scores: a strongly contracting problem. Returns the
    inputs too, to re-certify at other tolerances (cached compilations)."""
    with jax.enable_x64(True):
        q, k, v, _, w = make_inputs(1, 2, 16, 16, 8, 4, seed=2, dtype=jnp.float64, scale=0.5)
        ql = kl = jnp.array([16])
        cfg = TransportConfig(half_band=16, eps=1.0, base_steps=4, blocks=BlockSizes(16))
        cert = lambda tol, depths=(1, 2, 4): tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w,
                                                                   tail_depths=depths, tol=tol)
        return cert, cert(1e-5)


def test_identity_holds_to_rounding(ragged_spoke_x64):
    for row in ragged_spoke_x64.rows:
        assert np.isfinite(row.bias_norm) and row.bias_norm > 1e-3  # T = 5: a real bias
        assert row.residual <= 1e-10 * row.grad_norm, row
        assert abs(row.gap_norm - row.bias_norm) <= 1e-10 * row.grad_norm


def test_bias_contracts_with_tail_depth(contracting_x64):
    _, cert = contracting_x64
    rows = cert.rows
    assert [r.tail_steps for r in rows] == [1, 2, 4]
    for a, b in zip(rows, rows[1:]):
        assert b.bias_norm < 0.5 * a.bias_norm, (a, b)
        assert b.eta_norm < a.eta_norm, (a, b)
    for row in rows:
        assert row.residual <= 1e-10 * row.grad_norm, row


def test_certified_depth_follows_tolerance(contracting_x64):
    cert_at, cert = contracting_x64
    biases = [r.bias_norm for r in cert.rows]
    assert cert.tol == 1e-5
    expected = next((r.tail_steps for r in cert.rows if r.bias_norm <= 1e-5), None)
    assert cert.certified_depth == expected
    with jax.enable_x64(True):
        assert cert_at(np.sqrt(biases[0] * biases[1])).certified_depth == 2  # between R=1 and R=2
        assert cert_at(biases[0] * 1.0001).certified_depth == 1
        assert cert_at(biases[-1] * 0.5).certified_depth is None
        # depths in any order, repeated: certified in increasing order, each once (the smallest
        # R that holds, not the first given)
        shuffled = cert_at(biases[0] * 1.0001, depths=(4, 2, 1, 2))
        assert [r.tail_steps for r in shuffled.rows] == [1, 2, 4] and shuffled.certified_depth == 1


@pytest.mark.parametrize("dustbin", ["spoke", "capacity"])
def test_identity_float32(dustbin):
    q, k, v, tokens, w = make_inputs(1, 1, 20, 20, 8, 4, seed=3, scale=0.7)
    cfg = TransportConfig(half_band=3, eps=0.8, base_steps=6, dustbin=dustbin, blocks=BlockSizes(8))
    cert = tail_bias_certificate(q, k, v, jnp.array([20]), jnp.array([17]), tokens, config=cfg, g_out=w,
                                 tail_depths=(2,))
    (row,) = cert.rows
    assert row.bias_norm > 1e-3
    assert row.residual <= 1e-5 * row.grad_norm, row


def test_no_base_steps_certify_zero_bias():
    """T = 0: the base is the constant zero potential, so the stopped gradient is the full one:
    every bias and gap is 0 and the smallest depth certifies; depth 0 (no step at all) is
    refused by name."""
    q, k, v, _, w = make_inputs(1, 1, 10, 10, 8, 4, seed=3)
    ql = kl = jnp.array([10])
    cfg = TransportConfig(half_band=3, base_steps=0, tail_steps=1, blocks=BlockSizes(8))
    cert = tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w, tail_depths=(1, 2))
    assert [row.tail_steps for row in cert.rows] == [1, 2] and cert.certified_depth == 1
    for row in cert.rows:
        assert row.bias_norm == 0.0 and row.gap_norm <= 1e-6 * row.grad_norm and row.grad_norm > 0, row
    with pytest.raises(ValueError, match="base_steps=0.*tail depth of 0"):
        tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w, tail_depths=(0, 1))


def test_errors():
    q, k, v, tokens, w = make_inputs(1, 1, 10, 10, 8, 4)
    ql = kl = jnp.array([10])
    cfg = TransportConfig(half_band=3, base_steps=4)
    sched = TransportConfig(half_band=3, eps=0.5, base_steps=4, eps_schedule=((1.0, 2), (0.5, 2)))
    with pytest.raises(ValueError, match="constant eps.*eps_schedule"):
        tail_bias_certificate(q, k, v, ql, kl, config=sched, g_out=w)
    to_tol = TransportConfig(half_band=3, base_steps=4, tol=1e-4, max_steps=50)  # no fixed T to unroll
    with pytest.raises(ValueError, match="fixed number of base steps.*tol=0.0001"):
        tail_bias_certificate(q, k, v, ql, kl, config=to_tol, g_out=w)
    with pytest.raises(ValueError, match="tail_depths"):
        tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w, tail_depths=())
    with pytest.raises(ValueError, match="tail_depths"):
        tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w, tail_depths=(1, -1))
    with pytest.raises(ValueError, match="tol"):
        tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w, tol=0.0)
    with pytest.raises(ValueError, match="g_out"):
        tail_bias_certificate(q, k, v, ql, kl, config=cfg, g_out=w[..., :2])
    with pytest.raises(ValueError, match="needs DustbinTokens"):
        tail_bias_certificate(q, k, v, ql, kl, config=TransportConfig(half_band=3, dustbin="spoke"), g_out=w)
