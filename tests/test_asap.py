"""The compiled transport (ASAP) of the alignment plan: 1-D potentials, reconstruction, fit,
compiled directories."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linprog

from pfamalign import asap, checkpoint
from pfamalign.kernels import TransportConfig
from pfamalign.model import AlignerConfig, build_model

EMBEDDER = "builtin/onehot+blosum62"


def _model(seed=0, half_band=5, dustbin="spoke"):
    cfg = AlignerConfig(name="asap_test", feature_dim=50, embedder_id=EMBEDDER, encoder="none",
                        heads=2, head_dim=8, value_dim=4, substitution_window=1, ce_weight=1.0,
                        transport=TransportConfig(half_band=half_band, eps=0.7, base_steps=6,
                                                  tail_steps=2, dustbin=dustbin, impl="reference"))
    return build_model(cfg, seed=seed)


def _inputs(seed=0, length=16, q_len=(16, 11), k_len=(12, 16)):
    rng = np.random.default_rng(seed)
    feats = lambda: jnp.asarray(rng.normal(size=(len(q_len), length, 50)), jnp.float32)
    return feats(), feats(), jnp.asarray(q_len, jnp.int32), jnp.asarray(k_len, jnp.int32)


def _pairs(seed, n):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(rng.integers(8, 20), 50)).astype(np.float32),
             rng.normal(size=(rng.integers(8, 20), 50)).astype(np.float32)) for _ in range(n)]


# ---- 1-D potentials ---------------------------------------------------------------------------

def _lp(x, y):
    """Optimal value of the 1-D problem (uniform masses, cost -x y) by a dense LP."""
    n, m = len(x), len(y)
    cost = -np.outer(x, y)
    a_eq = np.vstack([np.kron(np.eye(n), np.ones(m)), np.kron(np.ones(n), np.eye(m))])
    b_eq = np.concatenate([np.full(n, 1 / n), np.full(m, 1 / m)])
    res = linprog(cost.ravel(), A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    assert res.status == 0
    return res.fun, cost


@pytest.mark.parametrize("n, m, ties", [(5, 7, False), (7, 3, False), (6, 6, False), (4, 6, True), (1, 5, False)])
def test_kantorovich_1d_is_an_optimal_dual_of_the_lp(n, m, ties):
    rng = np.random.default_rng(n * 10 + m)
    x, y = rng.normal(size=n), rng.normal(size=m)
    if ties:  # repeated values on both sides
        x[1], y[2], y[3] = x[0], y[0], y[0]
    pad_x, pad_y = np.concatenate([x, rng.normal(size=3)]), np.concatenate([y, rng.normal(size=2)])
    f, g = (np.asarray(a, np.float64) for a in asap.kantorovich_1d(
        jnp.asarray(pad_x, jnp.float32), jnp.asarray(pad_y, jnp.float32), n, m))
    assert np.all(f[n:] == 0) and np.all(g[m:] == 0)  # padding carries nothing
    value, cost = _lp(x, y)
    f, g = f[:n], g[:m]
    # feasible (f_i + g_j <= c_ij) and optimal (dual objective = the LP's optimum)
    assert np.max(f[:, None] + g[None, :] - cost) < 1e-5
    np.testing.assert_allclose(f.mean() + g.mean(), value, atol=1e-5)


def test_kantorovich_1d_ends_a_row_first_on_ties_as_documented():
    """n = m: every row event ties with a column event. Both orders give optimal duals, but
    different potentials (so different features for a fitted operator): the documented rule,
    the row first, puts the staircase through (i + 1, i), where f + g is the cost."""
    x, y = np.array([0.3, -1.2, 2.0]), np.array([1.5, -0.4, 0.9])  # sorted: x 1 0 2, y 1 2 0
    f, g = (np.asarray(a, np.float64) for a in asap.kantorovich_1d(jnp.asarray(x, jnp.float32),
                                                                   jnp.asarray(y, jnp.float32), 3, 3))
    xs, ys = np.argsort(x), np.argsort(y)
    for i, j in ((0, 0), (1, 0), (1, 1), (2, 1), (2, 2)):  # row first: down, then right
        assert f[xs[i]] + g[ys[j]] == pytest.approx(-x[xs[i]] * y[ys[j]], abs=1e-6)
    assert f[xs[0]] == 0 and f[xs[0]] + g[ys[1]] != pytest.approx(-x[xs[0]] * y[ys[1]], abs=1e-3)


# ---- reconstruction from the teacher's dual ----------------------------------------------------

@pytest.mark.parametrize("dustbin", ["spoke", "capacity", "none"])
def test_asap0_from_the_teachers_exact_dual_is_the_teachers_plan(dustbin):
    model = _model(dustbin=dustbin)
    args = _inputs()
    plan, u, _ = asap.teacher(model, *args)
    s, mask, log_a, log_b, _, _ = asap.problem(model, *args)
    got, _, _ = asap.reconstruct(s, mask, log_a, log_b, u, passes=1)
    # 1e-6, relative where a capacity dustbin's corner holds ~Lq mass (float32 rounding)
    np.testing.assert_allclose(np.asarray(got), np.asarray(plan), rtol=1e-6, atol=1e-6)


def test_three_pass_from_the_exact_dual_is_the_teacher_plus_one_step():
    model = _model()
    args = _inputs(1)
    _, u, _ = asap.teacher(model, *args)
    s, mask, log_a, log_b, _, _ = asap.problem(model, *args)
    got, _, _ = asap.reconstruct(s, mask, log_a, log_b, u, passes=3)
    cfg = model.cfg.transport
    longer = dataclasses.replace(model.cfg, transport=dataclasses.replace(cfg, tail_steps=cfg.tail_steps + 1))
    plus_one = build_model(longer, seed=0)
    want, _, _ = asap.teacher(plus_one, *args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    before, _, _ = asap.teacher(model, *args)
    assert np.max(np.abs(np.asarray(want) - np.asarray(before))) > 1e-4  # the step is visible


def test_column_sums_are_exact_after_the_key_side_transform():
    model = _model(dustbin="capacity")
    args = _inputs(2)
    s, mask, log_a, log_b, _, _ = asap.problem(model, *args)
    u = jnp.asarray(np.random.default_rng(0).normal(scale=3.0, size=s.shape[:-1]), jnp.float32)
    plan, _, _ = asap.reconstruct(s, mask, log_a, log_b, u, passes=1)
    cols = np.asarray(plan).sum(-2)  # [B, H, Lk + 1]
    has = np.asarray(mask).any(-2)
    want = np.where(has, np.exp(np.asarray(log_b)), 0.0)
    np.testing.assert_allclose(cols, np.broadcast_to(want, cols.shape), rtol=2e-6, atol=1e-6)
    assert np.max(np.abs(np.asarray(plan).sum(-1) - 1.0)) > 1e-2  # the rows are not exact


def test_three_pass_row_error_is_within_the_key_dual_drift_bound():
    """After key, query, key: |row_i - a_i| <= a_i (exp(||v+ - v0||_inf) - 1), v0 the first key
    dual and v+ the last (the query transform made the rows exact against v0)."""
    model = _model(dustbin="capacity")
    args = _inputs(4)
    s, mask, log_a, log_b, _, _ = asap.problem(model, *args)
    u = jnp.asarray(np.random.default_rng(1).normal(scale=2.0, size=s.shape[:-1]), jnp.float32)
    _, _, v0 = asap.reconstruct(s, mask, log_a, log_b, u, passes=1)
    plan, _, v_plus = asap.reconstruct(s, mask, log_a, log_b, u, passes=3)
    cols = np.asarray(mask).any(-2)
    drift = np.max(np.where(cols, np.abs(np.asarray(v_plus) - np.asarray(v0)), 0.0), -1, keepdims=True)
    rows = np.asarray(mask).any(-1)
    a = np.broadcast_to(np.exp(np.asarray(log_a)), rows.shape)
    err = np.where(rows, np.abs(np.asarray(plan).sum(-1) - a), 0.0)
    bound = a * (np.exp(drift) - 1)
    assert np.all(err <= bound * (1 + 1e-5) + 1e-6)
    assert np.max(err) > 1e-3  # the rows are not exact: the bound is not vacuous here


# ---- the fit ------------------------------------------------------------------------------------

def test_ridge_equals_a_least_squares_solve():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)) * [1, 2, 3, 0.1, 5, 1], rng.normal(size=200)
    penalty = 0.3
    lam = penalty * np.trace(x.T @ x) / x.shape[1]
    aug_x = np.vstack([x, np.sqrt(lam) * np.eye(6)])
    aug_y = np.concatenate([y, np.zeros(6)])
    np.testing.assert_allclose(asap.ridge(x, y, penalty), np.linalg.lstsq(aug_x, aug_y, rcond=None)[0],
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(asap.ridge(x, y, 0.0), np.linalg.lstsq(x, y, rcond=None)[0], rtol=1e-8)
    # no penalty and collinear features (a column of zeros, two equal columns): the fit is
    # least squares' minimum-norm solution, not a singular-matrix error
    collinear = np.column_stack([x[:, :3], np.zeros(200), x[:, 0]])
    w = asap.ridge(collinear, y, 0.0)
    assert np.all(np.isfinite(w)) and w[3] == 0.0 and w[0] == pytest.approx(w[4], rel=1e-9)
    np.testing.assert_allclose(collinear @ w, collinear @ np.linalg.pinv(collinear) @ y, rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # ~45 s: five compilations (the compiled directory test fits fast)
def test_fit_learns_the_dual_and_reports_held_out_statistics():
    model = _model()
    op = asap.fit(model, _pairs(0, 12), asap.AsapSettings(slices=3), held_out=_pairs(1, 4))
    assert op.omega.shape == (2, 7) and op.slices.shape == (2, 8 + model.substitution_dim, 3)
    s = op.stats
    assert s["r2_dual"] > 0.5 and s["r2_train"] > 0.5
    assert s["col_marginal_err_passes1"] < 1e-5  # the key-side transform is last
    # the compiled plans are closer to the teacher than one plain Sinkhorn step's
    args = asap.pad_batch(_pairs(1, 4))
    teacher = np.asarray(asap.engine_plan(model, None, *args, engine="sinkhorn")[0])
    one = np.asarray(asap.engine_plan(model, None, *args, engine="steps", steps=1)[0])
    got = np.asarray(asap.Engine("asap", operator=op).plan(model, *args))
    rel = lambda p: np.linalg.norm(p - teacher) / np.linalg.norm(teacher)
    assert rel(got) < rel(one)


def test_steps_engine_is_plain_sinkhorn_with_that_many_steps():
    from pfamalign.kernels import transport_plan

    model = _model()
    xq, xk, lq, lk = _inputs(3)
    got = np.asarray(asap.Engine("steps", 3).plan(model, xq, xk, lq, lk))
    q, k, _, tokens = model.project(xq, xk, lq, lk)
    cfg = dataclasses.replace(model.cfg.transport, base_steps=3, tail_steps=0)
    want = np.asarray(transport_plan(q, k, lq, lk, tokens, config=cfg)).mean(1)  # dustbin row kept
    assert got.shape == (2, 17, 17)
    np.testing.assert_allclose(got, want, atol=1e-6)
    with pytest.raises(ValueError, match="--steps"):
        asap.Engine("steps")


def test_steps_engine_runs_past_the_references_limit_to_the_converged_plan():
    """More steps than the reference's program may hold (MAX_REFERENCE_STEPS) run in the
    scaling solve's loop: 1,000 steps of balanced problems (equal lengths) meet the row
    targets that 200 steps still miss by 7.5e-5 (the last step is a column step: columns
    hold at any number)."""
    from pfamalign.kernels.reference import dense_constraints

    model = _model()
    xq, xk, lq, lk = _inputs(3, q_len=(16, 11), k_len=(16, 11))
    _, log_a, _ = dense_constraints(lq, lk, 16, 16, model.cfg.transport)
    real_rows = np.arange(17) < np.append(np.asarray(lq), 16)[:2, None]  # the dustbin row is last
    real_rows[:, -1] = True

    def row_error(steps):
        plan = np.asarray(asap.Engine("steps", steps).plan(model, xq, xk, lq, lk))  # head mean
        return np.max(np.abs(plan.sum(-1) - np.exp(np.asarray(log_a))[:, 0]) * real_rows)

    assert asap.MAX_REFERENCE_STEPS < 1000 <= asap.MAX_ENGINE_STEPS
    assert row_error(asap.MAX_REFERENCE_STEPS) > 1e-5 > 1e-6 > row_error(1000)


def test_steps_engine_solves_by_the_reference_where_float32s_range_is_left():
    """At eps 0.001 the scaling solve leaves float32's range (``safe`` False; its plan is NaN):
    the engine's plan is then the reference's; past MAX_REFERENCE_STEPS it is refused by name,
    not run for minutes."""
    import jax

    from pfamalign.kernels import transport_plan

    cfg = _model().cfg
    model = build_model(dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, eps=0.001)))
    xq, xk, lq, lk = _inputs(3)
    scaled, safe = asap.engine_plan(model, None, xq, xk, lq, lk, engine="steps", steps=3)
    assert not bool(safe) and np.isnan(np.asarray(scaled)).any()
    got = np.asarray(asap.Engine("steps", 3).plan(model, xq, xk, lq, lk))
    q, k, _, tokens = model.project(xq, xk, lq, lk)
    step3 = asap.steps_config(model.cfg.transport, 3)
    # compiled as the engine's program is: at eps 0.001 an op-by-op run differs by 2e-4
    want = np.asarray(jax.jit(lambda *a: transport_plan(*a, config=step3))(q, k, lq, lk, tokens))
    np.testing.assert_allclose(got, want.mean(1), atol=1e-6)
    limit = asap.MAX_REFERENCE_STEPS
    with pytest.raises(ValueError, match=rf"--steps {limit + 1} .*float32's range.*--steps {limit} or fewer"):
        asap.Engine("steps", limit + 1).plan(model, xq, xk, lq, lk)


def test_steps_engine_on_relaxed_marginals_runs_past_the_balanced_references_limit():
    """The scaling solve covers balanced marginals only; a model with a free side takes the
    reference, whose loop over relaxed steps is cheap (1,000 steps of a 64-residue pair in 4 s):
    MAX_REFERENCE_STEPS, the balanced reference's limit, does not hold it."""
    cfg = _model().cfg
    rows = build_model(dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, marginals="rows")))
    xq, xk, lq, lk = _inputs(3)
    steps = asap.MAX_REFERENCE_STEPS + 1
    engine = asap.Engine.load("steps", "/nonexistent-model-dir", rows, steps=steps)
    got = np.asarray(engine.plan(rows, xq, xk, lq, lk))
    want = asap.engine_plan(rows, None, xq, xk, lq, lk, engine="steps", steps=steps, solver="reference")[0]
    np.testing.assert_allclose(got, np.asarray(want), atol=1e-6)


def test_engines_give_both_directions_as_the_model_does():
    """``Engine.plans_both_ways`` is the engine's plan in each direction; the ``sinkhorn``
    engine's equals ``Aligner.plans_both_ways`` (dustbin rows included)."""
    model = _model()
    xq, xk, lq, lk = _inputs(5)
    want_ab, want_ba = (np.asarray(p) for p in model.plans_both_ways(xq, xk, lq, lk))
    ab, ba = (np.asarray(p) for p in asap.Engine("sinkhorn").plans_both_ways(model, xq, xk, lq, lk))
    assert ab.shape == ba.shape == (2, 17, 17)
    np.testing.assert_allclose(ab, want_ab, atol=1e-6)
    np.testing.assert_allclose(ba, want_ba, atol=1e-6)
    steps = asap.Engine("steps", 2)
    ab, ba = (np.asarray(p) for p in steps.plans_both_ways(model, xq, xk, lq, lk))
    np.testing.assert_allclose(ab, np.asarray(steps.plan(model, xq, xk, lq, lk)), atol=1e-6)
    np.testing.assert_allclose(ba, np.asarray(steps.plan(model, xk, xq, lk, lq)), atol=1e-6)


def test_predictor_symmetrizes_the_engines_plans(tmp_path):
    """``Predictor(engine=...)``: symmetric plans are the mean of the engine's two directions,
    through the one padding helper (``inference.pad_batch``) both share."""
    from pfamalign.inference import Predictor, pad_batch
    from pfamalign.plans import symmetrize, unpad

    src = checkpoint.save_model(tmp_path / "model", _model())
    predictor = Predictor(src, engine="steps", steps=2)
    assert predictor.provenance()["engine"] == {"name": "steps", "steps": 2}
    pairs = _pairs(2, 3)
    got = list(predictor.plans(pairs, symmetric=True))
    xq, xk, lq, lk = pad_batch(pairs)
    assert xq.shape[1] == 64 and list(lq) == [a.shape[0] for a, _ in pairs]
    engine = asap.Engine("steps", 2)
    ab = unpad(np.asarray(engine.plan(predictor.model, xq, xk, lq, lk)), lq, lk)
    ba = unpad(np.asarray(engine.plan(predictor.model, xk, xq, lk, lq)), lk, lq)
    for g, p, q in zip(got, ab, ba):
        assert g.plan.shape == (p.plan.shape[0], p.plan.shape[1])
        np.testing.assert_allclose(g.plan, symmetrize(p, q).plan, atol=1e-6)


def test_engine_plans_are_checked_for_overflow_not_for_their_marginals():
    """A few-step or compiled plan's rows are what it approximates (a 1-step row can hold 1.4):
    ``Predictor`` checks such plans for finiteness, sign and entries only."""
    from pfamalign.plans import PairPlan

    plan = np.full((4, 4), 0.1)
    plan[0, :3] = [0.9, 0.4, 0.1]  # a query row of mass 1.4 + dustbin
    with pytest.raises(ValueError, match="query row"):
        PairPlan(plan).check()
    PairPlan(plan).check(marginals=False)
    plan[2, 2] = -1e-4  # no engine's plan can hold one (each is an exponential or a mean of them)
    with pytest.raises(ValueError, match="negative mass"):
        PairPlan(plan).check(marginals=False)
    plan[2, 2] = 0.0
    plan[1, 1] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        PairPlan(plan).check(marginals=False)


def test_asap_refuses_a_model_with_relaxed_marginals():
    model = _model()
    cfg = model.cfg
    rows = build_model(dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, marginals="rows")))
    with pytest.raises(asap.CompileError, match="balanced"):
        asap.fit(rows, _pairs(0, 2))
    # --engine asap says so at once (it said to run `pfamalign compile`, which then refused)
    with pytest.raises(asap.CompileError, match="balanced"):
        asap.Engine.load("asap", "/nonexistent-model-dir", rows)


def test_an_operator_with_non_finite_numbers_is_refused_by_name(tmp_path):
    """A damaged asap.json that no checksum covers (an older compile): the plan failed later,
    blamed on the transport's eps."""
    model = _model(seed=0)
    op = asap.fit(model, _pairs(0, 4), asap.AsapSettings(slices=2))
    for key in ("omega", "omega_dustbin"):
        data = json.loads(json.dumps(op.to_dict()))
        data[key][0][0] = float("nan")
        with pytest.raises(ValueError, match=f"{key} holds non-finite numbers"):
            asap.Operator.from_dict(data)


# ---- compiled directories ---------------------------------------------------------------------

def test_a_compiled_directory_refuses_other_parameters(tmp_path):
    model = _model(seed=0)
    src = checkpoint.save_model(tmp_path / "model", model)
    op = asap.fit(model, _pairs(0, 4), asap.AsapSettings(slices=2))
    out = asap.write_compiled(src, tmp_path / "compiled", op)
    loaded, _ = checkpoint.load_model(out, impl=None)  # loads wherever a model loads
    engine = asap.Engine.load("asap", out, loaded)
    np.testing.assert_array_equal(engine.operator.omega, op.omega)
    with pytest.raises(asap.CompileError, match="recompile"):
        asap.Engine.load("asap", out, _model(seed=1))
    # the same weights under another transport (the teacher the operator fitted is another plan)
    colder = dataclasses.replace(model.cfg, transport=dataclasses.replace(model.cfg.transport, eps=0.25))
    with pytest.raises(asap.CompileError, match="parameters and configuration"):
        asap.Engine.load("asap", out, build_model(colder, seed=0))
    with pytest.raises(asap.CompileError, match="no compiled operator"):
        asap.Engine.load("asap", src, model)
    with pytest.raises(ValueError, match="checkpoint itself"):
        asap.write_compiled(src, src, op)
    # the settings' own shapes, slices or not: a hand-edited operator is named, not a shape error
    for settings in (asap.AsapSettings(), asap.AsapSettings(slices=2)):
        fitted = op if settings.slices else asap.fit(model, _pairs(0, 4), settings)
        assert asap.Operator.from_dict(json.loads(json.dumps(fitted.to_dict()))).omega.shape == fitted.omega.shape
        edited = {**fitted.to_dict(), "omega": np.asarray(fitted.omega)[:, :-1].tolist()}
        with pytest.raises(ValueError, match=r"omega has shape \(2, \d\), where its settings"):
            asap.Operator.from_dict(edited)
    with pytest.raises(ValueError, match="already exists"):
        asap.write_compiled(src, out, op)


def test_verify_names_an_operator_fitted_to_another_model(tmp_path, monkeypatch):
    """Checksums vouch for bytes, not for what the operator was fitted to: an operator from an
    older pfamalign (its checksum recorded) or another model's (in a directory without
    checksums) passed `verify` and failed in `align --engine asap`. The parameters are read
    from the directory itself (the parameter cache is neither read nor written), and damage
    elsewhere is not blamed on the operator."""
    from pfamalign import runs

    cache = tmp_path / "cache"
    monkeypatch.setenv("PFAMALIGN_CACHE_DIR", str(cache))
    model = _model(seed=0)
    src = checkpoint.save_model(tmp_path / "model", model)
    op = asap.fit(model, _pairs(0, 4), asap.AsapSettings(slices=2))
    out = asap.write_compiled(src, tmp_path / "compiled", op)
    assert _run(["verify", out]).exit_code == 0
    assert not (cache / "params").exists()  # verify judged the files, and cached nothing
    legacy = {k: v for k, v in op.to_dict().items() if k != "fingerprint"}
    (out / asap.OPERATOR_FILE).write_text(json.dumps({**legacy, "params_hash": asap.params_hash(model, 1)}))
    runs.add_checksums(out, (asap.OPERATOR_FILE,))  # as its own pfamalign recorded it
    res = _run(["verify", out])
    assert res.exit_code == 1 and "checksum mismatch" not in res.output, res.output
    assert f"{out / asap.OPERATOR_FILE}: the compiled operator was made by a pfamalign before 2026-11-29" \
        in res.output, res.output
    (out / asap.OPERATOR_FILE).write_text(json.dumps(op.to_dict()))
    runs.add_checksums(out, (asap.OPERATOR_FILE,))
    config = json.loads((out / "config.json").read_text())
    config["model"]["transport"]["eps"] *= 2  # another teacher: damage, reported as such
    (out / "config.json").write_text(json.dumps(config))
    res = _run(["verify", out])
    assert f"{out / 'config.json'}: checksum mismatch" in res.output and "fitted to" not in res.output, res.output
    (out / checkpoint.CHECKSUMS).unlink()  # nothing vouches for anything now
    (out / "config.json").write_text((src / "config.json").read_text())
    res = _run(["verify", out])  # a problem (nothing to verify against), but the operator is this model's
    assert f"no {checkpoint.CHECKSUMS}" in res.output and "fitted to the model" not in res.output, res.output
    foreign = asap.fit(_model(seed=1), _pairs(0, 4), asap.AsapSettings(slices=2))
    (out / asap.OPERATOR_FILE).write_text(json.dumps(foreign.to_dict()))
    res = _run(["verify", out])
    assert res.exit_code == 1, res.output
    assert f"{out / asap.OPERATOR_FILE}: the compiled operator was fitted to the model" in res.output
    assert "recompile with `pfamalign compile`" in res.output and "restore them instead" in res.output


def test_the_fingerprint_ignores_how_the_plan_runs_and_names_an_older_pfamaligns_operator():
    """A compiled operator serves the model whatever its runtime settings (impl, kernels,
    dots...), which a new such setting in the configuration would otherwise have made "another
    model"; an operator of a pfamalign before 2026-11-29 (its hash over the parameters alone,
    no "fingerprint" in asap.json) was refused as "fitted to the model ..." though the model
    was the same: now it is named as older; one of fingerprint 2 (the whole configuration)
    still serves; an unknown fingerprint is refused by name."""
    assert set(asap.RUNTIME_TRANSPORT_FIELDS) <= {f.name for f in dataclasses.fields(TransportConfig)}
    model = _model()
    op = _shaped_operator(model, model.cfg.heads, model.cfg.head_dim + model.substitution_dim, asap.AsapSettings())
    stored = op.to_dict()
    assert stored["fingerprint"] == asap.FINGERPRINT
    op.check(model)
    for runtime in ({"impl": "xla"}, {"triton_dots": "tf32x3", "unroll": True}, {"blocks": 16}):
        other = dataclasses.replace(model.cfg, transport=dataclasses.replace(model.cfg.transport, **runtime))
        op.check(build_model(other, seed=0))  # the same plans: served
    legacy = {k: v for k, v in stored.items() if k != "fingerprint"}
    asap.Operator.from_dict({**legacy, "params_hash": asap.params_hash(model, 2)}).check(model)
    with pytest.raises(asap.CompileError, match="made by a pfamalign before 2026-11-29.*recompile"):
        asap.Operator.from_dict({**legacy, "params_hash": asap.params_hash(model, 1)}).check(model)
    with pytest.raises(asap.CompileError, match="fitted to the model"):
        asap.Operator.from_dict({**legacy, "params_hash": "0" * 64}).check(model)
    with pytest.raises(asap.CompileError, match=r"fingerprint of the model \(4\) that this pfamalign does not know"):
        asap.Operator.from_dict({**stored, "fingerprint": 4})


@pytest.mark.parametrize("replace", [False, True])
def test_a_directory_made_at_the_output_while_compiling_is_kept(tmp_path, monkeypatch, replace):
    """OUT was checked before the copy, then swapped out and deleted whatever it had become: a
    directory another process made there meanwhile (a user's, another compile's) was lost."""
    import shutil

    model = _model(seed=0)
    src = checkpoint.save_model(tmp_path / "model", model)
    op = asap.fit(model, _pairs(0, 4), asap.AsapSettings(slices=2))
    out = tmp_path / "compiled"
    copy = shutil.copytree

    def copy_while_someone_makes_out(*args, **kwargs):
        copied = copy(*args, **kwargs)
        if not out.exists():  # once, after the outer copy (copytree recurses through itself)
            out.mkdir()
            (out / "precious.txt").write_text("keep")
        return copied

    monkeypatch.setattr(shutil, "copytree", copy_while_someone_makes_out)
    with pytest.raises(ValueError, match="already exists"):
        asap.write_compiled(src, out, op, replace=replace)
    assert [p.name for p in out.iterdir()] == ["precious.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compiled", "model"]  # no stage left


# ---- the commands -------------------------------------------------------------------------------

def _run(args):
    from click.testing import CliRunner

    from pfamalign.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def test_compile_refuses_its_checkpoint_as_output_and_align_needs_a_compiled_model(tmp_path):
    src = checkpoint.save_model(tmp_path / "model", _model())
    res = _run(["compile", "--checkpoint", src, "-o", src])
    assert res.exit_code == 2 and "checkpoint itself" in res.output and "Traceback" not in res.output
    res = _run(["align", "--checkpoint", src, "--engine", "asap", "ACDEFGHIK", "ACDEGHIK"])
    assert res.exit_code == 2 and "no compiled operator" in res.output
    # a run's model beside the run's compiled one (`train --compile`): the error points there
    (tmp_path / "compiled").mkdir()
    (tmp_path / "compiled" / asap.OPERATOR_FILE).write_text("{}")
    with pytest.raises(asap.CompileError, match=f"the run's compiled model is {tmp_path / 'compiled'}: give "
                                                 f"--checkpoint {tmp_path / 'compiled'}"):
        asap.load_operator(src)
    res = _run(["align", "--checkpoint", src, "--steps", "2", "ACDEFGHIK", "ACDEGHIK"])
    assert res.exit_code == 2 and "--engine steps" in res.output
    # its options read as every command's: a shipped model's name, a split of the three
    res = _run(["compile", "--checkpoint", "ensemble", "-o", tmp_path / "c"])
    assert res.exit_code == 2 and "is an ensemble" in res.output, res.output
    res = _run(["compile", "--checkpoint", src, "--split", "foo", "-o", tmp_path / "c"])
    assert res.exit_code == 2 and "'foo' is not one of 'train', 'val', 'test'" in res.output, res.output


@pytest.mark.slow  # ~2 min: a dataset, a fit, three engines' compilations, the benchmark
def test_compile_writes_a_model_that_aligns_with_every_engine_and_benchmarks(tmp_path, capsys):
    import pathlib

    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.pairs import SamplingConfig
    from pfamalign.pipelines.prepare import run_prepare

    seed = pathlib.Path(__file__).parent / "data" / "pfam_seed"
    data = tmp_path / "ds"
    run_prepare(PrepareConfig(inputs=(str(seed),), out=str(data), embedder=EMBEDDER,
                              sampling=SamplingConfig(pairs_per_family=4, max_len=120),
                              split_fractions=(0.6, 0.2, 0.2), seed=1), quiet=True)
    src = checkpoint.save_model(tmp_path / "model", _model())
    out = tmp_path / "compiled"
    res = _run(["compile", "--checkpoint", src, "--data", data, "--pairs", 6, "--held-out", 2,
                "--slices", 2, "-o", out])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["held_out_pairs"] == 2 and -1 < stats["r2_dual"] <= 1
    assert json.loads((out / asap.OPERATOR_FILE).read_text())["params_hash"] == stats["params_hash"]
    # one pair and none held out is a fit (it was refused: "has 1 pairs; need at least 2")
    res = _run(["compile", "--checkpoint", src, "--data", data, "--pairs", 1, "--held-out", 0, "--slices", 2,
                "-o", tmp_path / "one"])
    assert res.exit_code == 0 and json.loads(res.output).get("held_out_pairs", 0) == 0, res.output
    for engine in (["--engine", "asap"], ["--engine", "steps", "--steps", 2], []):
        res = _run(["align", "--checkpoint", out, *engine, "-f", "json", "ACDEFGHIKLMN", "ACDEGHIKLN"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["pairs"]
    # the benchmark runs on the compiled model and prints one JSON line per engine and kind
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import bench_engines

        bench_engines.main(["--checkpoint", str(out), "--data", str(data), "--split", "train", "--pairs", "2",
                            "--lengths", "16", "--steps", "1", "--repeats", "1", "--bootstrap", "10", "--json"])
    finally:
        sys.path.pop(0)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    engines = {"sinkhorn", "steps_1", "asap0", "asap"}
    assert {r["engine"] for r in rows if r["kind"] == "speed"} == engines
    accuracy = {r["engine"]: r for r in rows if r["kind"] == "accuracy"}
    assert set(accuracy) == engines and accuracy["sinkhorn"]["plan_rel_l2"] == 0.0
    # `verify` checks the operator as the parameters (fitted numbers): an edit fails its
    # checksum, an unreadable one is named
    assert _run(["verify", out]).exit_code == 0
    op_path = out / asap.OPERATOR_FILE
    fitted = json.loads(op_path.read_text())
    fitted["omega"] = (np.asarray(fitted["omega"]) * 50).tolist()  # still an operator
    op_path.write_text(json.dumps(fitted))
    res = _run(["verify", out])
    assert res.exit_code == 1 and f"{op_path}: checksum mismatch" in res.output, res.output
    op_path.write_text('{"garbage": 1}')
    (out / checkpoint.CHECKSUMS).unlink()  # no checksum to fail: what it holds is read
    res = _run(["verify", out])
    assert res.exit_code == 1, res.output
    assert f"cannot read {op_path}: not a compiled ASAP operator" in res.output, res.output
    for unreadable in (b"[1]", b"null", b"\xff\xfe"):  # not an object, not UTF-8: named, no traceback
        op_path.write_bytes(unreadable)
        res = _run(["verify", out])
        assert res.exit_code == 1 and f"cannot read {op_path}" in res.output and res.exception is not None \
            and isinstance(res.exception, SystemExit), res.output


# ---- the encoder's CETA layers ------------------------------------------------------------------

def _ceta_model(seed=0):
    """A two-layer CETA encoder whose residual branches are switched on (their zero-initialised
    output maps drawn at random), so the layers' outputs reach the encoder's output."""
    cfg = AlignerConfig(name="asap_ceta_test", feature_dim=50, embedder_id=EMBEDDER, encoder="transformer",
                        attention="ceta", encoder_layers=2, encoder_width=16, attn_heads=2, attn_head_dim=8,
                        mlp_ratio=1, heads=1, head_dim=8, value_dim=4, substitution_window=1, ce_weight=1.0,
                        transport=TransportConfig(half_band=5, eps=0.7, base_steps=6, tail_steps=2,
                                                  dustbin="spoke", impl="reference"))
    model = build_model(cfg, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for block in model.encoder.blocks:
        for lin in (block.attn.out, block.mlp.down):
            lin.kernel[...] = jnp.asarray(rng.normal(scale=0.3, size=lin.kernel.shape), jnp.float32)
    return model


def _encode(model, pairs, op=None):
    """The encoder's output on both sides of ``pairs`` ``[2B, L, W]`` (real rows only compared:
    padding is zero), the CETA layers compiled by ``op``'s layer operators when given."""
    xq, xk, lq, lk = asap.pad_batch(pairs)
    feat, lens = jnp.asarray(np.concatenate([xq, xk])), jnp.asarray(np.concatenate([lq, lk]))
    ceta = asap.ceta_solvers(**op.ceta()) if op is not None else None
    return np.asarray(model.encode(feat, lens, ceta=ceta)[0])


def test_ceta_layer_asap0_from_the_exact_dual_is_the_layers_plan_and_output():
    """Each CETA layer, on its actual inputs (captured by running the encoder): ASAP-0 from
    the teacher's final dual is the layer's converged plan, and its ``P V`` the layer's output
    as the transport op computes it."""
    from pfamalign.kernels import transport

    model = _ceta_model()
    xq, _, lq, _ = asap.pad_batch(_pairs(6, 3))
    inputs = asap.ceta_inputs(model, xq, lq)
    assert len(inputs) == 2
    for (cfg, q, k, tokens, q_len, k_len), v in inputs:
        assert q.shape == (3, 2, xq.shape[1], 8) and tokens is None and cfg.dustbin == "none"
        plan, u, _ = asap.teacher_of(cfg, q, k, tokens, q_len, k_len)
        s, mask, log_a, log_b = asap.problem_of(cfg, q, k, tokens, q_len, k_len)
        got, _, _ = asap.reconstruct(s, mask, log_a, log_b, u, passes=1)
        np.testing.assert_allclose(np.asarray(got), np.asarray(plan), atol=1e-6)
        rows = np.asarray(plan).sum(-1)[..., :-1]
        real = np.arange(xq.shape[1])[None, None] < np.asarray(lq)[:, None, None]
        assert np.max(np.abs(np.where(real, rows - 1, 0))) < 1e-4  # converged: balanced
        want = np.asarray(transport(q, k, v, q_len, k_len, config=cfg))
        out = np.einsum("bhij,bhjv->bhiv", np.asarray(got)[..., :-1, :-1], np.asarray(v))
        np.testing.assert_allclose(out, want, atol=1e-6)


@pytest.mark.slow  # ~80 s: the fit (plan + two layers, held-out statistics), eager encoders
def test_fit_compiles_each_ceta_layer_and_the_compiled_encoder_is_close():
    model = _ceta_model()
    op = asap.fit(model, _pairs(10, 8), held_out=_pairs(11, 3),
                  ceta_settings=dataclasses.replace(asap.CETA_SETTINGS, slices=4))
    assert len(op.layers) == 2
    for i, layer in enumerate(op.layers):
        assert layer.omega.shape == (2, 3 + 4) and layer.slices.shape == (2, 8, 4)
        assert layer.stats["layer"] == i and layer.stats["held_out_sequences"] == 6
        assert 0.5 < layer.stats["r2_dual"] <= 1 and layer.stats["plan_rel_l2_passes3"] < 0.1
        assert layer.stats["col_marginal_err_passes1"] < 1e-5  # the key-side transform is last
    for pairs in (_pairs(10, 8)[:4], _pairs(11, 3)):  # calibration and held-out pairs
        teacher, got = _encode(model, pairs), _encode(model, pairs, op)
        rel = np.linalg.norm(got - teacher) / np.linalg.norm(teacher)
        assert 0 < rel < 0.02
    # the engine runs the compiled layers: its plan differs from the Sinkhorn layers' plan
    args = asap.pad_batch(_pairs(11, 3))
    with_layers = np.asarray(asap.Engine("asap", operator=op).plan(model, *args))
    without = np.asarray(asap.engine_plan(model, op.arrays(), *args, engine="asap", settings=op.settings)[0])
    assert 0 < np.max(np.abs(with_layers - without)) < 0.05


def _shaped_operator(model, heads, dim, settings, **fields):
    """An operator of the right shapes for ``model`` (random weights): what loading and the
    checks read, without a fit."""
    rng = np.random.default_rng(0)
    return asap.Operator(settings, rng.normal(size=(heads, settings.n_features)).astype(np.float32),
                         rng.normal(size=(heads, 4)).astype(np.float32), asap.make_slices(settings, heads, dim),
                         asap.params_hash(model), **fields)


def test_a_compiled_ceta_model_refuses_missing_or_foreign_layer_operators(tmp_path):
    model = _ceta_model()
    cfg = model.cfg
    layers = tuple(_shaped_operator(model, cfg.attn_heads, cfg.attn_head_dim, asap.CETA_SETTINGS, stats={"layer": i})
                   for i in range(2))
    op = _shaped_operator(model, cfg.heads, cfg.head_dim + model.substitution_dim, asap.AsapSettings(),
                          layers=layers)
    src = checkpoint.save_model(tmp_path / "model", model)
    out = asap.write_compiled(src, tmp_path / "compiled", op)
    engine = asap.Engine.load("asap", out, checkpoint.load_model(out, impl=None)[0])
    assert [layer.stats for layer in engine.operator.layers] == [layer.stats for layer in op.layers]
    np.testing.assert_array_equal(engine.operator.layers[1].omega, op.layers[1].omega)
    assert engine.describe()["ceta_layers"] == 2
    with pytest.raises(asap.CompileError, match="none for layer 1"):
        dataclasses.replace(op, layers=op.layers[:1]).check(model)
    foreign = dataclasses.replace(op.layers[0], params_hash="0" * 64)
    with pytest.raises(asap.CompileError, match="recompile"):
        dataclasses.replace(op, layers=(foreign, op.layers[1])).check(model)
    with pytest.raises(asap.CompileError, match="recompile"):
        asap.Engine.load("asap", out, _ceta_model(seed=1))
    # a rerun (`train --compile`) replaces a compiled directory, never any other directory
    asap.write_compiled(src, out, dataclasses.replace(op, stats={"rerun": 1}), replace=True)
    assert asap.load_operator(out).stats == {"rerun": 1}
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        asap.write_compiled(src, tmp_path / "other", op, replace=True)


def test_rows_without_support_keep_the_features_finite_and_on_their_scale():
    """No dustbin and a query longer than the key by more than the band: some real rows have
    no support. Their 'max' feature is 0 (it was -1e30, which centring spread over every row
    of the pair and which set the ridge's scale: the fit kept nothing)."""
    model = _model(half_band=2, dustbin="none")
    q_feat, k_feat, ql, kl = _inputs(length=16, q_len=(16,), k_len=(6,))
    s, mask, _, _, q, k = asap.problem(model, q_feat, k_feat, ql, kl)
    x, _, rows = asap.features(s, mask, q, k, ql, kl, None, asap.AsapSettings(), model.cfg.transport.eps)
    supported = np.asarray(mask[0, 0, :16].any(-1))
    assert not supported.all() and supported.any()  # the case in question
    assert np.all(np.isfinite(np.asarray(x))) and float(jnp.max(jnp.abs(x))) < 1e3


# ---- found missing by a mutation sweep: the features, the engine, the fit's statistics ------------

def test_features_and_targets_are_what_the_docstrings_say():
    """Each feature (centred over the row's real keys; zero on padding rows), the dustbin's
    regressors z and the centred targets, against numpy from the problem's scores."""
    model = _model()
    qf, kf, ql, kl = _inputs(7, length=16, q_len=(16, 11), k_len=(12, 16))
    s, mask, _, _, q, k = asap.problem(model, qf, kf, ql, kl)
    settings = asap.AsapSettings(features=("rowlse", "norm", "spoke", "max"))
    x, z, rows = asap.features(s, mask, q, k, ql, kl, None, settings, model.cfg.transport.eps)
    s, mask, x, z = (np.asarray(a, np.float64) for a in (s, mask, x, z))
    mask, lq = mask.astype(bool), 16
    centre = lambda c: c - c.mean(-1, keepdims=True)  # noqa: E731
    for b, n in enumerate(np.asarray(ql)):
        real, m = s[b, :, :n, :], mask[b, :, :n, :]
        rowlse = -np.log(np.where(m, np.exp(real), 0).sum(-1))
        want = {"rowlse": rowlse,
                "norm": (np.asarray(q, np.float64)[b, :, :n] ** 2).sum(-1) / (np.sqrt(q.shape[-1])
                                                                             * model.cfg.transport.eps),
                "spoke": np.where(m[..., -1], real[..., -1], 0.0),
                "max": np.where(m, real, -np.inf).max(-1)}
        for f, name in enumerate(settings.features):
            np.testing.assert_allclose(x[b, :, :n, f], centre(want[name]), atol=2e-4, err_msg=name)
        assert np.all(x[b, :, n:] == 0)
        db = -np.log(np.where(mask[b, :, lq], np.exp(s[b, :, lq]), 0).sum(-1))
        np.testing.assert_allclose(z[b], np.stack([np.ones(2), db - rowlse.mean(-1), np.full(2, np.log(n)),
                                                   np.full(2, np.log(int(kl[b])))], -1), atol=2e-4)
    u = jnp.asarray(np.random.default_rng(0).normal(size=(2, 2, lq + 1)), jnp.float32)
    y, y_db = (np.asarray(a, np.float64) for a in asap.centred_target(u, rows))
    u = np.asarray(u, np.float64)
    for b, n in enumerate(np.asarray(ql)):
        np.testing.assert_allclose(y[b, :, :n], centre(u[b, :, :n]), atol=1e-6)
        np.testing.assert_allclose(y_db[b], u[b, :, lq] - u[b, :, :n].mean(-1), atol=1e-6)


def test_slice_features_are_the_scaled_centred_1d_potentials():
    model = _model()
    qf, kf, ql, kl = _inputs(8, length=16, q_len=(16, 11), k_len=(12, 16))
    s, mask, _, _, q, k = asap.problem(model, qf, kf, ql, kl)
    settings = asap.AsapSettings(slices=2, features=("norm",))
    slices = asap.make_slices(settings, 2, q.shape[-1])
    np.testing.assert_allclose(np.linalg.norm(slices, axis=1), 1.0, rtol=1e-6)  # unit directions
    eps = model.cfg.transport.eps
    x, _, _ = asap.features(s, mask, q, k, ql, kl, jnp.asarray(slices), settings, eps)
    scale = 1.0 / (np.sqrt(q.shape[-1]) * eps)
    for b, (n, m) in enumerate(zip(np.asarray(ql), np.asarray(kl))):
        for h in range(2):
            for sl in range(2):
                f, _ = asap.kantorovich_1d(q[b, h] @ slices[h, :, sl], k[b, h] @ slices[h, :, sl], int(n), int(m))
                f = np.asarray(f, np.float64)[:n] * scale
                np.testing.assert_allclose(np.asarray(x)[b, h, :n, 1 + sl], f - f.mean(), atol=2e-4)


def test_engine_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        asap.Engine("steps", 0)


def test_ceta_solvers_run_each_layers_own_operator_as_p_v():
    model = _ceta_model()
    cfg = model.cfg
    ops = [_shaped_operator(model, cfg.attn_heads, cfg.attn_head_dim, asap.CETA_SETTINGS) for _ in range(2)]
    ops[1].omega = ops[1].omega * -2  # two layers, two operators: each must run its own
    arrays, settings = tuple(o.arrays() for o in ops), tuple(o.settings for o in ops)
    solvers = asap.ceta_solvers(arrays, settings)
    xq, _, lq, _ = asap.pad_batch(_pairs(6, 2))
    (tcfg, q, k, _, lens, _), v = asap.ceta_inputs(model, xq, lq)[0]
    for i in range(2):
        plan, _ = asap.asap_of(tcfg, arrays[i], settings[i], q, k, None, lens, lens)
        want = np.einsum("bhij,bhjv->bhiv", np.asarray(plan)[..., :-1, :-1], np.asarray(v))
        np.testing.assert_allclose(np.asarray(solvers[i](q, k, v, lens, tcfg)), want, atol=1e-5)


def test_engine_load_overrides_passes_describes_and_refuses_a_tampered_operator(tmp_path):
    model = _model()
    op = _shaped_operator(model, model.cfg.heads, model.cfg.head_dim + model.substitution_dim, asap.AsapSettings())
    out = asap.write_compiled(checkpoint.save_model(tmp_path / "model", model), tmp_path / "compiled", op)
    engine = asap.Engine.load("asap", out, model, passes=1)
    assert engine.operator.settings.passes == 1 and op.settings.passes == 3
    assert engine.describe() == {"name": "asap", "passes": 1, "slices": 0, "params_hash": op.params_hash[:16]}
    path = out / asap.OPERATOR_FILE
    data = json.loads(path.read_text())
    data["omega"] = (np.asarray(data["omega"]) * 2).tolist()
    path.write_text(json.dumps(data))
    with pytest.raises(asap.CompileError, match="checksum mismatch"):
        asap.Engine.load("asap", out, model)


def test_an_operator_with_more_layer_operators_than_ceta_layers_is_refused():
    model = _model()
    layer = _shaped_operator(model, 2, 8, asap.CETA_SETTINGS)
    op = _shaped_operator(model, model.cfg.heads, model.cfg.head_dim + model.substitution_dim, asap.AsapSettings(),
                          layers=(layer,))
    with pytest.raises(asap.CompileError, match="0 CETA layers"):
        op.check(model)


def test_fit_statistics_count_every_pair_and_name_the_dustbin():
    pairs, held = _pairs(0, 3), _pairs(1, 2)
    for dustbin in ("spoke", "none"):
        op = asap.fit(_model(dustbin=dustbin), pairs, asap.AsapSettings(), held_out=held, batch_size=2)
        assert op.stats["calibration_rows"] == sum(len(q) for q, _ in pairs) * 2
        assert ("r2_dustbin" in op.stats) == (dustbin != "none")


def test_each_ceta_layer_is_fitted_on_both_sides_of_every_pair():
    model = _ceta_model()
    pairs = _pairs(3, 2)
    ops = asap.fit_ceta(model, pairs, dataclasses.replace(asap.CETA_SETTINGS, slices=0), params_hash="x")
    rows = sum(len(q) + len(k) for q, k in pairs) * model.cfg.attn_heads
    assert [(o.stats["calibration_rows"], o.stats["calibration_sequences"]) for o in ops] == [(rows, 4)] * 2
