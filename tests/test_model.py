"""The aligner (pfamalign.model), its named configurations and model directories."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pfamalign import checkpoint, configs
from pfamalign.training import step as train
from pfamalign.alignment.metrics import barycenters
from pfamalign.model import (AlignerConfig, aligner_loss, build_model, loss_targets,
                             position_features)

D = 50  # builtin/onehot+blosum62
EMBEDDER = "builtin/onehot+blosum62"


def _batch(seed=0, b=2, length=32, dim=D, q_len=(30, 21), k_len=(27, 32)):
    """Random features and a monotone partial target (some unaligned rows)."""
    rng = np.random.default_rng(seed)
    q_len, k_len = np.asarray(q_len, np.int32), np.asarray(k_len, np.int32)
    target = np.full((b, length), -1, np.int32)
    for i in range(b):
        n = min(q_len[i], k_len[i]) - 3
        rows = np.sort(rng.choice(q_len[i], n, replace=False))
        cols = np.sort(rng.choice(k_len[i], n, replace=False))
        target[i, rows] = cols
    feats = lambda: rng.normal(size=(b, length, dim)).astype(np.float32)
    return {"q_feat": feats(), "k_feat": feats(), "q_len": q_len, "k_len": k_len,
            "target": target, "valid": np.ones(b, bool)}


def _cfg(name, **overrides):
    return configs.get_config(name, embedder_id=EMBEDDER, feature_dim=D, overrides=overrides)


# ---------------------------------------------------------------------------------------------
# Every named configuration builds and takes a training step
# ---------------------------------------------------------------------------------------------

# align_orthgsa's full-size step takes 40 s: by default its 1-layer run in test_encoder
# (test_named_config_trains_resumes_and_loads) is the one that trains it.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "align_orthgsa" else n
                                  for n in configs.CONFIG_NAMES])
def test_every_named_config_builds_and_takes_a_step(name):
    cfg = _cfg(name, **{"train.batch_size": 2, "train.warmup_steps": 0})
    assert cfg.model.transport.base_steps == 15 and cfg.model.transport.half_band == 1024
    assert configs.get_config(name, embedder_id=EMBEDDER, feature_dim=D).train.batch_size == 64
    mesh = train.make_mesh(jax.devices()[:1])
    state = train.init_state(cfg, mesh)
    before = jax.tree.map(np.asarray, state.params)
    step = train.make_train_step(cfg, mesh)
    params, _, metrics = step(state.params, state.opt_state, train.shard_batch(_batch(), mesh))
    metrics = jax.device_get(metrics)
    assert bool(metrics["finite"]) and np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    w = cfg.model
    expect = w.recon_weight * metrics["recon"] + w.ce_weight * metrics["ce"] + \
        w.mono_weight * metrics["mono"] + metrics["encoder_aux"]  # gsa's weighted indexer KL
    np.testing.assert_allclose(metrics["loss"], expect, rtol=1e-5)
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, params)
    assert any(jax.tree.leaves(changed))
    assert (cfg.model.transport.dustbin != "none") == ("dustbin_q" in before)


def test_config_table():
    k2, k4 = _cfg("k2_eps1").model, _cfg("k4_eps1").model
    assert (k2.transport.tail_steps, k4.transport.tail_steps) == (2, 4)
    assert k2.transport.dustbin == "none" and k2.transport.eps == 1.0 and k2.ce_weight == 0
    mono, hybrid = _cfg("muot_dustbin_mono").model, _cfg("muot_dustbin_hybrid").model
    assert mono.transport.dustbin == hybrid.transport.dustbin == "widened"
    assert mono.mono_weight > 0 and mono.ce_weight == 0 and hybrid.ce_weight > 0
    ce = _cfg("align_ce").model
    assert (ce.transport.dustbin, ce.heads, ce.encoder, ce.recon_weight) == ("spoke", 1, "conv", 0)
    assert ce.ce_weight > 0
    # encoder by features: conv for builtin, none for ESM-2 (overridable)
    esm = configs.get_config("k2_eps1", embedder_id="esm2_t6_8M_UR50D/layer6", feature_dim=320)
    assert esm.model.encoder == "none" and k2.encoder == "conv"
    assert configs.get_config("k2_eps1", embedder_id="esm2_t6_8M_UR50D/layer6", feature_dim=320,
                              overrides={"encoder": "conv"}).model.encoder == "conv"


def test_overrides_and_roundtrip():
    cfg = _cfg("align_ce", **{"eps": "0.5", "transport.tail_steps": "3", "heads": "2",
                              "train.lr": "3e-4", "steps": "7",
                              "transport.eps_schedule": "[[2.0, 10], [0.5, 5]]"})
    assert cfg.model.transport.eps == 0.5 and cfg.model.transport.tail_steps == 3
    assert cfg.model.transport.eps_schedule == ((2.0, 10), (0.5, 5))
    assert cfg.model.heads == 2 and cfg.train.lr == 3e-4 and cfg.train.steps == 7
    again = configs.RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    with pytest.raises(ValueError, match="unknown --set key 'nope'"):
        _cfg("k2_eps1", nope="1")
    with pytest.raises(ValueError, match="feature_dim"):
        _cfg("k2_eps1", feature_dim="3")  # comes from the dataset
    with pytest.raises(ValueError, match="expected an integer"):
        _cfg("k2_eps1", heads="two")
    for key in ("train.steps", "encoder_layers"):  # a bool is no integer (Python's True is an int)
        with pytest.raises(ValueError, match="expected an integer, got 'true'"):
            _cfg("align_ce", **{key: "true"})
    for key in ("transport.blocks", "blocks"):  # the tile edge, in the JSON form's shape
        assert _cfg("align_ce", **{key: "64"}).model.transport.blocks.block == 64
    assert _cfg("align_ce", **{"blocks": "null"}).model.transport.blocks.block is None
    with pytest.raises(ValueError, match="power of two"):
        _cfg("align_ce", blocks="100")
    with pytest.raises(ValueError, match="dustbin must be one of"):
        _cfg("k2_eps1", dustbin="maybe")
    with pytest.raises(ValueError, match="unknown configuration 'k3'"):
        _cfg("k3")
    with pytest.raises(ValueError, match="key=value"):
        configs.parse_set_options(["heads"])


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------

def test_loss_targets():
    target = np.array([[2, -1, 0, -1], [-1, 1, -1, -1]])
    q_len = np.array([3, 2])
    np.testing.assert_array_equal(loss_targets(target, q_len, dustbin=True, key_length=5),
                                  [[2, 5, 0, -1], [5, 1, -1, -1]])
    np.testing.assert_array_equal(loss_targets(target, q_len, dustbin=False, key_length=5),
                                  [[2, -1, 0, -1], [-1, 1, -1, -1]])


def _scale_values(model, factor):
    model.v_proj.kernel[...] = model.v_proj.kernel[...] * factor
    model.v_proj.bias[...] = model.v_proj.bias[...] * factor
    if model.cfg.dustbin:
        model.dustbin_v[...] = model.dustbin_v[...] * factor


@pytest.mark.parametrize("name", ["k2_eps1", "muot_dustbin_mono"])
def test_reconstruction_cannot_be_lowered_by_shrinking_values(name):
    """Values are unit-normalised: rescaling the value projection leaves the loss unchanged,
    while it does move (by far more than the tolerance) when the value directions change."""
    model = build_model(_cfg(name).model)
    model.log_temp[...] = jnp.asarray(2.0)  # sharper plans: O_i depends more on single V_j
    batch = _batch(1)
    loss_fn = nnx.jit(aligner_loss)
    base = jax.device_get(loss_fn(model, batch)[1])
    for factor in (1e-3, 1e3):
        scaled = nnx.clone(model)
        _scale_values(scaled, factor)
        got = jax.device_get(loss_fn(scaled, batch)[1])
        np.testing.assert_allclose(got["recon"], base["recon"], rtol=1e-5)
        np.testing.assert_allclose(got["loss"], base["loss"], rtol=1e-5)
    turned = nnx.clone(model)  # same norms, other directions: the loss moves
    turned.v_proj.kernel[...] = turned.v_proj.kernel[...][:, ::-1]
    moved = float(loss_fn(turned, batch)[1]["recon"])
    assert abs(moved - float(base["recon"])) > 100 * 1e-5 * float(base["recon"])


@pytest.mark.parametrize("name", ["k2_eps1", "align_ce"])
def test_losses_match_the_dense_plan(name):
    """recon, CE, barycenters and the monotonicity term (over consecutive annotated rows)
    computed through the banded op (value columns [j, 1], target_logp) equal the
    docs/design.md §5 definitions on the dense reference plan."""
    cfg = _cfg(name, encoder_layers=1).model
    model = build_model(cfg, seed=3)
    batch = _batch(2)
    _, m = nnx.jit(aligner_loss)(model, batch)
    plan, v, tv = jax.device_get(nnx.jit(lambda mdl, b: mdl.head_plans(
        b["q_feat"], b["k_feat"], b["q_len"], b["k_len"]))(model, batch))
    lk = batch["k_feat"].shape[1]
    t = np.asarray(loss_targets(batch["target"], batch["q_len"], dustbin=cfg.dustbin,
                                key_length=lk))
    errs, logps, bary_err, steps = [], [], [], []
    for b in range(2):
        ql, kl = batch["q_len"][b], batch["k_len"][b]
        p = plan[b, :, :ql, :kl]  # [H, ql, kl]
        dust = plan[b, :, :ql, -1]
        out = p @ v[b, :, :kl] + dust[..., None] * tv[:, None]
        tgt = batch["target"][b, :ql]
        ann = np.flatnonzero(tgt >= 0)
        errs.append(np.sum((out[:, ann] - v[b][:, tgt[ann]]) ** 2, -1).ravel())
        full = np.concatenate([p, dust[..., None]], -1)  # dustbin column at index kl
        cols = np.where(t[b, :ql] == lk, kl, t[b, :ql])
        rows = np.flatnonzero(t[b, :ql] >= 0)
        logps.append(np.log(full[:, rows, cols[rows]]).ravel())
        bary_err.append(np.abs(barycenters(p)[:, ann] - tgt[ann]).ravel())
        both = np.flatnonzero((tgt[:-1] >= 0) & (tgt[1:] >= 0))  # consecutive annotated rows only
        steps.append(np.maximum(barycenters(p)[:, both] - barycenters(p)[:, both + 1], 0).ravel())
    np.testing.assert_allclose(m["recon"], np.concatenate(errs).mean(), rtol=2e-4)
    steps = np.concatenate(steps)
    assert m["n_mono"] == steps.size and steps.max() > 0  # some barycenter steps back
    np.testing.assert_allclose(m["mono"], steps.mean(), rtol=2e-4)
    np.testing.assert_allclose(m["ce"], -np.concatenate(logps).mean(), rtol=2e-4)
    np.testing.assert_allclose(m["bary_mae"], np.concatenate(bary_err).mean(), rtol=2e-4)


def test_the_loss_adds_the_encoders_auxiliary_loss():
    """A gated sparse attention encoder's indexer loss (``encoder_aux``, 0 for the other
    encoders) is a term of the training loss. (The full-size align_orthgsa step that also
    checks it is a slow test.)"""
    small = {"encoder_layers": 1, "encoder_width": 32, "attn_heads": 2, "attn_head_dim": 8, "topk": 8,
             "topk_min": 4, "topk_local": 2, "indexer_dim": 8, "head_dim": 16, "value_dim": 8}
    cfg = _cfg("align_orthgsa", **small).model
    _, m = jax.device_get(nnx.jit(aligner_loss)(build_model(cfg, seed=1), _batch(3)))
    assert m["encoder_aux"] > 0
    expect = cfg.recon_weight * m["recon"] + cfg.ce_weight * m["ce"] + cfg.mono_weight * m["mono"] + m["encoder_aux"]
    np.testing.assert_allclose(m["loss"], expect, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Encoder, plan
# ---------------------------------------------------------------------------------------------

def test_padding_never_leaks_into_real_positions():
    model = build_model(_cfg("align_ce").model)
    rng = np.random.default_rng(5)
    feat = rng.normal(size=(1, 20, D)).astype(np.float32)
    short = np.zeros((1, 32, D), np.float32)
    short[:, :20] = feat
    long = rng.normal(size=(1, 96, D)).astype(np.float32) * 10  # junk in the padding
    long[:, :20] = feat
    lens = np.array([20])
    a = np.asarray(model.encode(short, lens)[0])
    b = np.asarray(model.encode(long, lens)[0])
    np.testing.assert_allclose(a[:, :20], b[:, :20], rtol=1e-5, atol=1e-5)
    assert not np.any(b[:, 20:])


def test_position_features():
    f = np.asarray(position_features(8, jnp.array([5]), 4))
    assert f.shape == (1, 8, 4)
    np.testing.assert_allclose(f[0, 4], [np.sin(np.pi), np.sin(2 * np.pi), -1, 1], atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        dataclasses.replace(_cfg("align_ce").model, position_features=3)


@pytest.mark.parametrize("name", ["k2_eps1", "align_ce"])
def test_plan(name):
    model = build_model(_cfg(name).model)
    batch = _batch(6)
    plan = np.asarray(model.plan(batch["q_feat"], batch["k_feat"], batch["q_len"],
                                 batch["k_len"]))
    assert plan.shape == (2, 33, 33)
    assert np.all(plan >= 0)
    for b in range(2):
        ql, kl = batch["q_len"][b], batch["k_len"][b]
        assert not plan[b, ql:32].any() and not plan[b, :, kl:32].any()
        assert plan[b, :ql].sum() > 0
        has_dustbin = plan[b, :ql, 32].sum() > 0 and plan[b, 32, :kl].sum() > 0
        assert has_dustbin == (name == "align_ce")
        if has_dustbin:  # unit column targets: every real key's column sums to 1 with its row
            np.testing.assert_allclose(plan[b, :, :kl].sum(0), 1.0, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Model directories
# ---------------------------------------------------------------------------------------------

def test_save_and_load_model(tmp_path):
    cfg = _cfg("align_ce", encoder_layers=1).model
    model = build_model(cfg, seed=7)
    checkpoint.save_model(tmp_path / "m", model)
    data = json.loads((tmp_path / "m" / "config.json").read_text())
    assert data["format"] == "pfamalign-model" and data["model"]["embedder_id"] == EMBEDDER
    assert data["model"]["transport"]["dustbin"] == "spoke"
    loaded, loaded_cfg = checkpoint.load_model(tmp_path / "m")
    assert loaded_cfg == cfg
    same = jax.tree.map(np.array_equal, checkpoint.model_params(model),
                        checkpoint.model_params(loaded))
    assert all(jax.tree.leaves(same))
    batch = _batch(8)
    args = (batch["q_feat"], batch["k_feat"], batch["q_len"], batch["k_len"])
    np.testing.assert_array_equal(model.plan(*args), loaded.plan(*args))
    # saving again replaces the directory's parameters
    checkpoint.save_model(tmp_path / "m", build_model(cfg, seed=8))
    again, _ = checkpoint.load_model(tmp_path / "m")
    assert not np.array_equal(again.q_proj.kernel[...], loaded.q_proj.kernel[...])


def test_load_model_errors(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="not a model directory"):
        checkpoint.load_model(tmp_path / "empty")
    bad = tmp_path / "bad"
    (bad / "params").mkdir(parents=True)
    (bad / "config.json").write_text("{}")
    with pytest.raises(checkpoint.CheckpointError, match="no 'model' section"):
        checkpoint.load_model(bad)


def test_aligner_config_validation():
    base = _cfg("k2_eps1").model
    with pytest.raises(ValueError, match="encoder must be one of"):
        dataclasses.replace(base, encoder="lstm")
    with pytest.raises(ValueError, match="at least one loss weight"):
        dataclasses.replace(base, recon_weight=0.0)
    with pytest.raises(ValueError, match="heads must be"):
        dataclasses.replace(base, heads=0)
    assert AlignerConfig.from_dict(base.to_dict()) == base


def test_substitution_channel_is_a_windowed_blosum62_score():
    """With the learned part of q, k zeroed, <q_i, k_j> is sum_o w_o BLOSUM62(a_{i+o}, b_{j+o})."""
    import dataclasses

    import numpy as np

    from pfamalign.residues import blosum62
    from pfamalign.configs import get_config
    from pfamalign.model import build_model
    from pfamalign.pipelines.embed import get_embedder

    emb = get_embedder("builtin/onehot+blosum62")
    cfg = get_config("align_ce", embedder_id=emb.embedder_id, feature_dim=emb.dim).model
    cfg = dataclasses.replace(cfg, substitution_window=2)
    model = build_model(cfg, seed=0)
    model.q_proj.kernel[...] = 0.0 * model.q_proj.kernel[...]
    model.q_proj.bias[...] = 0.0 * model.q_proj.bias[...]
    weights = np.array([0.5, 1.0, 2.0, 1.0, 0.25])
    model.substitution_logw[...] = np.log(weights).astype(np.float32)
    a, b = "MKVLHWAC", "MKILHYACDE"
    fa, fb = (np.asarray(f)[None] for f in emb.embed([a, b]))
    q, k, _, _ = model.project(fa, fb, np.array([len(a)]), np.array([len(b)]))
    got = np.einsum("id,jd->ij", np.asarray(q[0, 0]), np.asarray(k[0, 0])) / np.exp(float(model.log_temp[...]))
    table = blosum62()
    want = np.zeros((len(a), len(b)))
    for i in range(len(a)):
        for j in range(len(b)):
            for n, o in enumerate(range(-2, 3)):
                if 0 <= i + o < len(a) and 0 <= j + o < len(b):
                    want[i, j] += weights[n] * table[a[i + o]][b[j + o]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_substitution_channel_needs_blosum_features():
    import dataclasses

    import pytest

    from pfamalign.configs import get_config

    cfg = get_config("align_ce", embedder_id="builtin/onehot", feature_dim=25).model
    with pytest.raises(ValueError, match="substitution_window needs"):
        dataclasses.replace(cfg, substitution_window=3)
