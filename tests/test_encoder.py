"""The transformer residue encoder (pfamalign.encoder): softmax, CETA and gated sparse attention,
plain and Cayley hyper-connection residuals; each invariant against an independent reference."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pfamalign import checkpoint, configs, encoder as enc
from pfamalign.kernels import TransportConfig
from pfamalign.model import AlignerConfig, aligner_loss, build_model
import faultkill
import meshes

D = 50  # builtin/onehot+blosum62 features


def _cfg(name="align_orthgsa", **kw):
    small = {"encoder_width": 32, "encoder_layers": 2, "attn_heads": 2, "attn_head_dim": 8,
             "topk": 8, "topk_min": 4, "topk_local": 2, "indexer_dim": 8}
    cfg = configs.get_config(name, embedder_id="builtin/onehot+blosum62", feature_dim=D).model
    return dataclasses.replace(cfg, **{**small, **kw})


def _feat(b=3, l=24, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(b, l, D)), jnp.float32)


ALL = [("softmax", "plain"), ("ceta", "plain"), ("gsa", "cayley"), ("gsa", "plain"),
       ("softmax", "cayley")]


# ---- Cayley --------------------------------------------------------------------------------

def _np_cayley(a):
    eye = np.eye(a.shape[-1])
    return (eye - a) @ np.linalg.inv(eye + a)


@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0, 10.0])
def test_cayley_is_orthogonal_with_determinant_one_in_float32(scale):
    rng = np.random.default_rng(1)
    params = jnp.asarray(scale * rng.normal(size=(500, 6)), jnp.float32)
    m = np.asarray(enc.cayley(enc.skew(params, 4)), np.float64)
    err = np.abs(np.swapaxes(m, -1, -2) @ m - np.eye(4)).max()
    assert err < 1e-6, err
    np.testing.assert_allclose(np.linalg.det(m), 1.0, atol=1e-6)
    # and it is the Cayley transform itself, not just some orthogonal matrix
    ref = _np_cayley(np.asarray(enc.skew(params, 4), np.float64))
    np.testing.assert_allclose(m, ref, atol=1e-5)


def test_truncated_series_is_not_orthogonal():
    """The check above can fail: a second-order series of the same map misses 1e-6 at scale 1."""
    rng = np.random.default_rng(1)
    a = np.asarray(enc.skew(jnp.asarray(rng.normal(size=(50, 6)), jnp.float32), 4), np.float64)
    eye = np.eye(4)
    approx = (eye - a) @ (eye - a + a @ a)
    assert np.abs(np.swapaxes(approx, -1, -2) @ approx - eye).max() > 1e-2


def test_cayley_vjp_matches_float64_finite_differences():
    rng = np.random.default_rng(2)
    p = rng.normal(size=(6,))
    g = rng.normal(size=(4, 4))
    iu = np.triu_indices(4, 1)

    def f64(x):
        a = np.zeros((4, 4))
        a[iu] = x
        return np.sum(_np_cayley(a - a.T) * g)

    h = 1e-6
    fd = np.array([(f64(p + h * e) - f64(p - h * e)) / (2 * h) for e in np.eye(6)])
    _, vjp = jax.vjp(lambda x: enc.cayley(enc.skew(x, 4)), jnp.asarray(p, jnp.float32))
    got = np.asarray(vjp(jnp.asarray(g, jnp.float32))[0])
    np.testing.assert_allclose(got, fd, rtol=1e-4, atol=1e-5)


# ---- the encoder at initialisation, padding, streams --------------------------------------

# Compiled: about twice as fast as the encoder op by op on these sizes.
_encode = nnx.jit(lambda model, feat, lens: model.encoder(feat, lens))


@pytest.mark.parametrize("attention,residual", [  # 15-25 s each: one representative by default
    pytest.param(a, r, marks=[] if (a, r) == ("ceta", "plain") else pytest.mark.slow) for a, r in ALL])
def test_encoder_is_its_input_projection_at_init(attention, residual):
    cfg = _cfg(attention=attention, residual=residual)
    model = build_model(cfg)
    feat, lens = _feat(), jnp.array([24, 17, 5])
    out, _ = _encode(model, feat, lens)
    mask = enc.length_mask(24, lens)
    want = model.encoder.norm(model.encoder.inp(feat * mask) * mask) * mask
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-6)


@pytest.mark.parametrize("attention,residual", [  # 10-16 s each: one representative by default
    pytest.param(a, r, marks=[] if (a, r) == ("gsa", "cayley") else pytest.mark.slow) for a, r in ALL])
def test_padding_does_not_change_real_outputs(attention, residual):
    cfg = _cfg(attention=attention, residual=residual)
    model = _perturbed(build_model(cfg))
    feat = _feat(b=1, l=20)
    short, _ = _encode(model, feat, jnp.array([20]))
    noise = jnp.asarray(np.random.default_rng(3).normal(size=(1, 12, D)), jnp.float32)
    padded, _ = _encode(model, jnp.concatenate([feat, noise], 1), jnp.array([20]))
    # float32 reduction order differs between the two padded shapes (perturbed weights, unit-norm
    # LayerNorm outputs): 1e-4 absolute
    np.testing.assert_allclose(np.asarray(padded[:, :20]), np.asarray(short), atol=1e-4)
    assert np.all(np.asarray(padded[:, 20:]) == 0)


def _perturbed(model, scale=0.3, seed=5):
    """The model with every parameter moved off its initialisation (zero-initialised branches
    would hide the attention)."""
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
    params = jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape), params)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def _stream_spread(model, feat, lens):
    states, _ = model.encoder.streams(feat, lens)
    x = np.asarray(states[-1])  # [B, L, n, W]
    return float(np.abs(x - x.mean(2, keepdims=True)).max())


@functools.partial(jax.jit, static_argnums=0)
def _loss_grad(graphdef, params, batch):  # one compile for every model of one graphdef
    return jax.grad(lambda p: aligner_loss(nnx.merge(graphdef, p), batch)[0])(params)


def _train(model, steps=3, lr=1e-2):
    feat, lens = _feat(b=2, l=16, seed=7), jnp.array([16, 11])
    target = jnp.asarray(np.where(np.arange(16)[None] < np.array([[16], [11]]),
                                  np.arange(16)[None], -1), jnp.int32)
    batch = {"q_feat": feat, "k_feat": feat[::-1], "q_len": lens, "k_len": lens[::-1],
             "target": jnp.minimum(target, 10)}
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    for _ in range(steps):
        params = jax.tree.map(lambda p, g: p - lr * g, params, _loss_grad(graphdef, params, batch))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state), feat, lens


@pytest.mark.slow  # two compiled training gradients (25 s); layer_report[gsa-cayley] checks the spread
def test_streams_differ_after_a_few_steps_and_not_without_distinct_distribution_weights():
    model = build_model(_cfg(encoder_layers=1))
    feat, lens = _feat(), jnp.array([24, 17, 5])
    assert _stream_spread(model, feat, lens) == 0.0  # identical at init (exact identity)
    trained, feat, lens = _train(model)
    assert _stream_spread(trained, feat, lens) > 1e-4
    # the control: uniform distribution weights keep the streams identical forever
    uniform = build_model(_cfg(encoder_layers=1))
    for block in uniform.encoder.blocks:
        for hc in (block.hc1, block.hc2):
            hc.b[...] = jnp.ones_like(hc.b[...])
    trained, feat, lens = _train(uniform)
    assert _stream_spread(trained, feat, lens) < 1e-6


# ---- gated sparse attention ----------------------------------------------------------------

def test_k_per_length_rule():
    cfg = _cfg(topk=64, topk_min=16, topk_fraction=0.25)
    lens = jnp.array([0, 5, 64, 100, 200, 1300])
    np.testing.assert_array_equal(np.asarray(enc.topk_per_length(lens, cfg)),
                                  [0, 16, 16, 25, 50, 64])


def test_sparse_path_equals_dense_attention_masked_to_the_same_keys():
    cfg = _cfg(attention="gsa", residual="plain")
    model = _perturbed(build_model(cfg))
    attn = model.encoder.blocks[0].attn
    x = _feat(l=40, seed=4)[..., :32]
    lens = jnp.array([40, 23, 3])

    def out(sparse, x):
        o, _, _ = attn.mix(x, lens, sparse=sparse)
        return o * enc.length_mask(40, lens)

    dense, sparse = out(False, x), out(True, x)
    np.testing.assert_allclose(np.asarray(sparse), np.asarray(dense), atol=1e-5)
    g = jnp.asarray(np.random.default_rng(6).normal(size=dense.shape), jnp.float32)
    loss = lambda sp: lambda m, x: jnp.sum(nnx.merge(*m).mix(x, lens, sparse=sp)[0]
                                           * enc.length_mask(40, lens) * g)
    split = nnx.split(attn)
    grads = {}
    for sp in (False, True):
        grads[sp] = jax.grad(lambda x: loss(sp)(split, x))(x)
    np.testing.assert_allclose(np.asarray(grads[True]), np.asarray(grads[False]), atol=1e-4)
    # and the selection really drops keys (else the test compares dense with dense)
    _, _, info = attn.mix(x, lens, trace=True)
    sel = np.asarray(info["selected"])
    assert sel[0].sum(-1).max() < 40


def test_padding_is_never_selected_and_short_rows_give_exact_zeros():
    rng = np.random.default_rng(8)
    scores = jnp.asarray(rng.normal(size=(3, 30, 30)) + 50 * (np.arange(30) >= 12), jnp.float32)
    lens = jnp.array([12, 3, 0])  # padding scores highest; row 1 shorter than k; row 2 empty
    k = jnp.array([8, 8, 8])
    idx, keep = enc.select_keys(scores, lens, k, 1, 8)
    idx, keep = np.asarray(idx), np.asarray(keep)
    for b, n in enumerate([12, 3, 0]):
        assert np.all(idx[b][keep[b]] < n)
    # the real rows of the 3-residue sequence have at most one non-local key; the empty one none
    assert keep[1, :3].sum(-1).max() <= 1 and not keep[2].any()
    cfg = _cfg(attention="gsa", residual="plain")
    attn = _perturbed(build_model(cfg)).encoder.blocks[0].attn
    x = _feat(l=30)[..., :32]
    for sparse in (False, True):
        o = np.asarray(attn.mix(x, lens, sparse=sparse)[0])
        assert np.isfinite(o).all()
        assert np.all(o[2] == 0) and np.all(o[1, 3:] == 0)  # no keys / padding: exact zeros
        # the 3-residue sequence (shorter than k) attends to all its keys, as dense attention
        q, k, v = attn.heads(x)
        dense, _ = enc.dense_attention(q[1:2], k[1:2], v[1:2], (jnp.arange(30) < 3)[None, None, None])
        dense = np.asarray(dense.transpose(0, 2, 1, 3).reshape(1, 30, -1)[0, :3])
        gate = np.asarray(jax.nn.sigmoid(attn.output_gate(x[1:2])))[0, :3]
        np.testing.assert_allclose(o[1, :3], dense * gate, atol=1e-5)


@pytest.mark.slow  # two eager gradients of the whole loss (58 s); the KL itself: the test below
def test_indexer_gradient_is_nonzero_with_the_kl_weight_and_exactly_zero_without():
    for weight in (0.1, 0.0):
        model = _perturbed(build_model(_cfg(indexer_weight=weight)))
        graphdef, state = nnx.split(model)
        params = nnx.to_pure_dict(state)
        feat, lens = _feat(), jnp.array([24, 17, 5])
        batch = {"q_feat": feat, "k_feat": feat, "q_len": lens, "k_len": lens,
                 "target": jnp.asarray(np.tile(np.arange(24), (3, 1)) * 0 - 1, jnp.int32).at[:, :4].set(1)}
        grads = jax.grad(lambda p: aligner_loss(nnx.merge(graphdef, p), batch)[0])(params)
        attn = grads["encoder"]["blocks"][0]["attn"]
        norm = sum(float(jnp.sum(jnp.abs(attn[n]["kernel"]))) for n in ("index_q", "index_k", "index_w"))
        if weight:
            assert norm > 1e-6
        else:
            assert norm == 0.0


def test_indexer_kl_is_zero_when_the_indexer_matches_and_positive_otherwise():
    rng = np.random.default_rng(9)
    s = jnp.asarray(rng.normal(size=(1, 1, 6, 6)), jnp.float32)
    mask = jnp.ones((1, 1, 6), bool)
    p = jax.nn.softmax(s, -1)
    rows = jnp.ones((1, 6))
    assert abs(float(enc.indexer_kl(p, s[:, 0], mask, rows))) < 1e-6
    assert float(enc.indexer_kl(p, -s[:, 0], mask, rows)) > 0.1


def test_indexer_kl_is_the_mean_over_real_rows_only():
    rng = np.random.default_rng(4)
    s = jnp.asarray(rng.normal(size=(1, 1, 6, 6)), jnp.float32)
    p = jax.nn.softmax(s, -1)
    scores = jnp.asarray(rng.normal(size=(1, 6, 6)), jnp.float32)
    mask, rows = jnp.ones((1, 1, 6), bool), jnp.array([[1.0, 1, 1, 1, 0, 0]])
    target, logq = np.asarray(p[0, 0], np.float64), np.asarray(jax.nn.log_softmax(scores[0]), np.float64)
    per_row = (target * (np.log(target) - logq)).sum(-1)
    assert float(enc.indexer_kl(p, scores, mask, rows)) == pytest.approx(per_row[:4].mean(), rel=1e-5)


def test_the_lightning_indexer_is_the_head_weighted_relu_score_over_sqrt_dim():
    attn = _perturbed(build_model(_cfg(attention="gsa", residual="plain")), scale=0.1).encoder.blocks[0].attn
    cfg, x = attn.cfg, _feat(b=1, l=7, seed=2)[..., :32]
    qi = np.asarray(attn.index_q(x), np.float64).reshape(1, 7, cfg.attn_heads, cfg.indexer_dim)
    ki, w = np.asarray(attn.index_k(x), np.float64), np.asarray(attn.index_w(x), np.float64)
    want = np.einsum("bhij,bih->bij", np.maximum(np.einsum("bihe,bje->bhij", qi, ki), 0), w) / np.sqrt(cfg.indexer_dim)
    np.testing.assert_allclose(np.asarray(attn.index_scores(x)), want, rtol=1e-5, atol=1e-5)


def test_a_plain_block_leaves_padding_rows_zero():
    block = _perturbed(build_model(_cfg(attention="softmax", residual="plain", encoder_layers=1))).encoder.blocks[0]
    x = _feat(b=1, l=9, seed=6)[..., :32]
    lens = jnp.array([6])
    mask = enc.length_mask(9, lens)
    out, _, _ = block(x * mask, lens, mask)
    assert np.all(np.asarray(out)[:, 6:] == 0) and np.any(np.asarray(out)[:, :6] != 0)


# ---- CETA -----------------------------------------------------------------------------------

def _np_sinkhorn(s, iters=5000):
    """Balanced unit-marginal Sinkhorn in float64 to convergence (columns last, as the op)."""
    s = np.asarray(s, np.float64)
    u, v = np.zeros(s.shape[0]), np.zeros(s.shape[1])
    for _ in range(iters):
        u = -np.log(np.exp(s + v[None]).sum(1))
        v = -np.log(np.exp(s + u[:, None]).sum(0))
    return np.exp(s + u[:, None] + v[None])


def test_ceta_layer_equals_float64_numpy_sinkhorn():
    cfg = _cfg(attention="ceta", residual="plain", ceta_steps=300, rope=False)
    attn = _perturbed(build_model(cfg), scale=0.1).encoder.blocks[0].attn
    x = _feat(b=2, l=16, seed=10)[..., :32]
    lens = jnp.array([16, 9])
    o, _, _ = attn.mix(x, lens)
    q, k, v = (np.asarray(t, np.float64) for t in attn.heads(x))
    for b, n in enumerate([16, 9]):
        for h in range(cfg.attn_heads):
            s = q[b, h, :n] @ k[b, h, :n].T / np.sqrt(cfg.attn_head_dim)
            plan = _np_sinkhorn(s)
            np.testing.assert_allclose(plan.sum(0), 1, atol=1e-9)
            np.testing.assert_allclose(plan.sum(1), 1, atol=1e-9)
            want = plan @ v[b, h, :n]
            got = np.asarray(o)[b, :n].reshape(n, cfg.attn_heads, -1)[:, h]
            np.testing.assert_allclose(got, want, atol=1e-5)  # the op's promise; 2.8e-7 measured


def test_a_ceta_layer_runs_its_base_steps_then_a_two_step_tail():
    """Unconverged (3 base steps), the layer is numpy's Sinkhorn of 3 + 2 steps exactly: the
    R = 2 refinement tail, as the transport op's contract has it (4 or 6 steps: 1e-2 off)."""
    cfg = _cfg(attention="ceta", residual="plain", ceta_steps=3, rope=False)
    attn = _perturbed(build_model(cfg), scale=0.1).encoder.blocks[0].attn
    x, lens = _feat(b=2, l=16, seed=10)[..., :32], jnp.array([16, 9])
    o, _, _ = attn.mix(x, lens)
    q, k, v = (np.asarray(t, np.float64) for t in attn.heads(x))
    for b, n in enumerate([16, 9]):
        for h in range(cfg.attn_heads):
            s = q[b, h, :n] @ k[b, h, :n].T / np.sqrt(cfg.attn_head_dim)
            got = np.asarray(o)[b, :n].reshape(n, cfg.attn_heads, -1)[:, h]
            np.testing.assert_allclose(got, _np_sinkhorn(s, 5) @ v[b, h, :n], atol=1e-5)


@pytest.mark.parametrize("band,equivariant", [(0, True), (2, False)])
def test_ceta_is_permutation_equivariant_with_a_full_band_only(band, equivariant):
    cfg = _cfg(attention="ceta", residual="plain", rope=False, attn_band=band)
    model = _perturbed(build_model(cfg), scale=0.2)
    feat, lens = _feat(b=1, l=16, seed=11), jnp.array([16])
    perm = np.random.default_rng(12).permutation(16)
    out, _ = _encode(model, feat, lens)
    out_p, _ = _encode(model, feat[:, perm], lens)
    close = np.allclose(np.asarray(out_p), np.asarray(out)[:, perm], atol=1e-4)
    assert close == equivariant


def test_identity_value_ceta_core_conserves_the_mean_and_softmax_does_not():
    rng = np.random.default_rng(13)
    q = jnp.asarray(rng.normal(size=(1, 2, 20, 8)) * 2, jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 2, 20, 8)) * 2, jnp.float32)
    x = jnp.asarray(rng.normal(size=(1, 2, 20, 8)), jnp.float32)  # the values: the residues
    lens = jnp.array([20])
    cfg = TransportConfig(half_band=20, eps=1.0, base_steps=15, tail_steps=2, dustbin="none")
    from pfamalign.kernels import transport
    ceta = transport(q, k, x, lens, lens, config=cfg)
    soft, _ = enc.dense_attention(q, k, x, jnp.ones((1, 1, 20, 20), bool))
    mean = np.asarray(x).mean(2)
    np.testing.assert_allclose(np.asarray(ceta).mean(2), mean, atol=1e-5)
    assert np.abs(np.asarray(soft).mean(2) - mean).max() > 1e-2


# ---- certificates of the encoder ---------------------------------------------------------

@pytest.mark.parametrize("attention,residual", [("ceta", "plain"),  # the others with --full
                                                pytest.param("gsa", "cayley", marks=pytest.mark.slow),
                                                pytest.param("softmax", "plain", marks=pytest.mark.slow)])
def test_layer_report_states_the_layers_certificates(attention, residual):
    model = _perturbed(build_model(_cfg(attention=attention, residual=residual)), scale=0.1)
    feats = [np.asarray(_feat(b=1, l=n, seed=n)[0]) for n in (19, 11)]
    layers = enc.layer_report(model.encoder, feats)
    assert [entry["layer"] for entry in layers] == [0, 1]
    x = np.zeros((2, 19, D), np.float32)
    for n, f in enumerate(feats):
        x[n, : len(f)] = f
    _, _, infos = model.encoder.streams(jnp.asarray(x), jnp.array([19, 11]), trace=True)
    for entry, info in zip(layers, infos):  # the diagnostics, computed directly
        plans = [np.asarray(info["plan"], np.float64)[n, :, :ln, :ln] for n, ln in enumerate((19, 11))]
        if attention == "ceta":  # a plan's senders are its rows, its receivers its columns
            assert entry["sender_error"] == pytest.approx(max(np.abs(p.sum(-1) - 1).max() for p in plans), rel=1e-12)
            assert entry["receiver_error"] == pytest.approx(max(np.abs(p.sum(-2) - 1).max() for p in plans),
                                                            rel=1e-12)
            continue
        if attention == "gsa":  # selected keys within topk_local of their row, of all selected
            picked = [np.asarray(info["selected"])[n, :ln, :ln] for n, ln in enumerate((19, 11))]
            near = [np.abs(np.subtract.outer(np.arange(len(p)), np.arange(len(p)))) <= model.cfg.topk_local
                    for p in picked]
            assert entry["local_share"] == sum((p & w).sum() for p, w in zip(picked, near)) / sum(
                p.sum() for p in picked)
        pmax = np.concatenate([p.max(-1).ravel() for p in plans])
        assert entry["receiver_imbalance"] == pytest.approx(
            max(np.abs(p.sum(-2) - 1).max() for p in plans), rel=1e-12)
        assert entry["tail_mass_median"] == pytest.approx(np.median(1 - pmax), rel=1e-12)
        assert entry["locked_fraction"] == np.mean(pmax >= 0.9999)
    for entry in layers:
        assert entry["attention"] == attention
        if attention == "ceta":  # the last step balances the columns exactly, rows to T=15
            assert entry["receiver_error"] < 1e-5 and entry["sender_error"] < 1e-2
        else:  # a row softmax: rows sum to 1, receivers do not
            assert entry["receiver_imbalance"] > 1e-3
            assert 0 <= entry["tail_mass_median"] < 1 and 0 <= entry["locked_fraction"] <= 1
        if attention == "gsa":
            assert entry["k"] == [5, 4]  # clip(ceil(0.25 * len), 4, 8) for 19 and 11
            assert 0 < entry["local_share"] <= 1 and entry["indexer_kl"] >= 0
        if residual == "cayley":
            assert entry["cayley_orthogonality_error"] < 1e-5 and entry["stream_spread"] > 0


@pytest.mark.slow  # 48 s: certify compiles the bias certificate; layer_report above is the fast check
def test_certify_cli_reports_the_encoder_layers(tmp_path):
    import json

    from click.testing import CliRunner

    from pfamalign.cli import main as cli

    model = _perturbed(build_model(_cfg(attention="ceta", residual="plain")), scale=0.1)
    checkpoint.save_model(tmp_path / "m", model)
    # equal lengths: the float64 solves converge in a few steps (unequal spoke problems run all
    # 20000); one tail depth (each compiles two gradients)
    res = CliRunner().invoke(cli, ["certify", "MKVLAAGIVGLLLAHE", "MKVLSAGIVGLAHEKR", "--checkpoint",
                                   str(tmp_path / "m"), "--json", str(tmp_path / "c.json"),
                                   "--tail-depths", "0"])
    assert res.exit_code == 0, res.output
    layers = json.loads((tmp_path / "c.json").read_text())["encoder"]["layers"]
    assert [entry["layer"] for entry in layers] == [0, 1]
    for entry in layers:  # CETA: the last step balances the columns exactly, rows to T=15
        assert entry["attention"] == "ceta"
        assert entry["receiver_error"] < 1e-5 and entry["sender_error"] < 1e-2
    # the text output has them too (it had only the JSON): one row a layer, the JSON's numbers
    table = res.output[res.output.index("encoder attention per layer"):]
    for entry in layers:
        assert f"{entry['sender_error']:.3g}" in table and f"{entry['receiver_error']:.3g}" in table


# ---- configs, checkpoints, devices ---------------------------------------------------------

def test_old_config_dicts_load_with_the_defaults():
    cfg = configs.get_config("align_ce", embedder_id="builtin/onehot+blosum62", feature_dim=D).model
    old = {k: v for k, v in cfg.to_dict().items()
           if k in {f.name for f in dataclasses.fields(AlignerConfig)}
           and k not in ("attention", "residual", "streams", "attn_heads", "attn_head_dim",
                         "mlp_ratio", "rope", "gates", "topk", "topk_fraction", "topk_min",
                         "topk_local", "indexer_dim", "indexer_weight", "attn_band", "ceta_steps")}
    assert AlignerConfig.from_dict(old) == cfg
    with pytest.raises(ValueError, match="attention must be one of"):
        dataclasses.replace(cfg, attention="linear")


def test_named_configs_are_align_ce_otherwise_and_within_ten_percent_in_parameters():
    counts = {}
    base = configs.get_config("align_ce", embedder_id="builtin/onehot+blosum62", feature_dim=D).model
    for name in ("align_ce", "align_attn", "align_ceta", "align_orthgsa"):
        cfg = configs.get_config(name, embedder_id="builtin/onehot+blosum62", feature_dim=D).model
        assert dataclasses.replace(cfg, name="align_ce", encoder="conv", attention="softmax",
                                   residual="plain", mlp_ratio=3) == base
        counts[name] = sum(x.size for x in jax.tree.leaves(nnx.state(build_model(cfg), nnx.Param)))
    for name, n in counts.items():
        assert abs(n / counts["align_ce"] - 1) < 0.10, counts


def test_save_and_load_give_the_same_encoder(tmp_path):
    cfg = _cfg()
    model = _perturbed(build_model(cfg))
    checkpoint.save_model(tmp_path / "m", model)
    loaded, _ = checkpoint.load_model(tmp_path / "m")
    assert dataclasses.replace(loaded.cfg, transport=cfg.transport) == cfg
    feat, lens = _feat(), jnp.array([24, 17, 5])
    np.testing.assert_array_equal(np.asarray(_encode(loaded, feat, lens)[0]),
                                  np.asarray(_encode(model, feat, lens)[0]))


@pytest.mark.slow  # 58 s (compiles dominate; one layer is no faster): test_train's 8-device test is the fast one
def test_eight_devices_take_the_same_step_as_one():
    assert len(jax.devices()) == 8
    cfg = configs.RunConfig(_cfg(), configs.TrainConfig().replace(batch_size=8, lr=1e-3))
    rng = np.random.default_rng(14)
    lens = rng.integers(5, 24, size=8)
    target = np.where(np.arange(24)[None] < lens[:, None], np.minimum(np.arange(24)[None], lens[:, None] - 1), -1)
    batch = {"q_feat": np.asarray(_feat(b=8, seed=15)), "k_feat": np.asarray(_feat(b=8, seed=16)),
             "q_len": lens.astype(np.int32), "k_len": lens.astype(np.int32),
             "target": target.astype(np.int32), "valid": np.ones(8, bool)}
    meshes.assert_eight_devices_match_one(cfg, [batch])


# ---- the named configurations train, resume and load ----------------------------------------

@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    from conftest import make_seed_dataset

    return make_seed_dataset(tmp_path_factory.mktemp("enc_data") / "ds", pairs_per_family=8,
                             max_len=96, split_fractions=(0.7, 0.2, 0.1), seed=3)


@pytest.mark.parametrize("name", [
    "align_orthgsa",
    pytest.param("align_attn", marks=pytest.mark.slow),
    pytest.param("align_ceta", marks=pytest.mark.slow)])
def test_named_config_trains_resumes_and_loads(name, tiny_dataset, tmp_path, monkeypatch):
    from pfamalign.inference import Predictor
    from pfamalign.training import loop as train, rundir

    sets = {"encoder_layers": 1, "encoder_width": 32, "attn_heads": 2, "attn_head_dim": 8,
            "topk": 8, "topk_min": 4, "topk_local": 2, "indexer_dim": 8, "head_dim": 16,
            "value_dim": 8, "train.batch_size": 8, "train.steps": 4, "train.lr": 3e-3,
            "train.warmup_steps": 1, "train.pad_multiple": 96, "train.max_len": 96,
            "train.eval_every": 0, "train.ckpt_every": 2}
    cfg = rundir.resolve_config(tiny_dataset, name, overrides=sets)
    out = tmp_path / "run"

    faultkill.sigterm_at(monkeypatch, 2)
    first = train.run(tiny_dataset, out, cfg, quiet=True)
    assert first.interrupted and first.step == 3
    monkeypatch.undo()
    second = train.run(tiny_dataset, out, cfg, quiet=True, tune_pairs=None)
    assert (second.start_step, second.step) == (3, 4)
    model, loaded_cfg = checkpoint.load_model(out / "model")
    assert loaded_cfg.encoder == "transformer" and loaded_cfg.attention == cfg.model.attention
    pred = Predictor(out / "model")
    feats = pred.featurize(["MKVLAAGIVGLLLA", "MKVLSAGIVGLA"])
    plan = next(pred.plans([(feats[0], feats[1])]))
    assert np.isfinite(plan.real).all() and plan.real.sum() > 0.5


def test_rope_scores_depend_on_the_offset_only_and_both_sides_are_rotated():
    """RoPE: a query-key score is a function of their offset, the rotation keeps norms, and
    an attention layer rotates its queries and its keys (no test ran with rope on)."""
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.normal(size=(1, 8)), jnp.float32) for _ in range(2))
    score = lambda i, j: float(jnp.sum(enc.rope(q, jnp.array([i])) * enc.rope(k, jnp.array([j]))))  # noqa: E731
    for shift in (1, 5, 17):
        assert abs(score(3 + shift, 1 + shift) - score(3, 1)) < 1e-4
    np.testing.assert_allclose(np.linalg.norm(enc.rope(q, jnp.array([7]))), np.linalg.norm(q), rtol=1e-6)
    attn = _perturbed(build_model(_cfg(attention="softmax", residual="plain"))).encoder.blocks[0].attn
    assert attn.cfg.rope
    x = _feat(b=1, l=12)[..., :32]
    got_q, got_k, _ = attn.heads(x)
    raw_q, raw_k, _ = (attn._split(t, 8) for t in jnp.split(attn.qkv(x), 3, -1))
    pos = jnp.arange(12)
    np.testing.assert_allclose(np.asarray(got_q), np.asarray(enc.rope(raw_q, pos)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_k), np.asarray(enc.rope(raw_k, pos)), atol=1e-6)
