"""Certificates of one aligned pair (docs/design.md §6 and "What the certificates say"), from a
trained aligner's scores and plans.

- projective contraction per 128-row block of each head's scores (exact rho_H = tanh^2(Delta/4)
  and the range bound tanh^2(Omega_S/2); summarised per pair);
- the a-posteriori bias certificate of the stopped-base gradient and the certified tail depth
  (``pfamalign.kernels.bias``), for the reconstruction-loss cotangent of the pair;
- ``marginals`` of the plan the model outputs: sender / receiver errors, total mass, whether
  the unit targets are feasible at all;
- ``ceta``: the transport plan's own perturbation bound on its support, both plans converged in
  float64, beside the row softmax's receiver imbalance;
- ``softmax_ot``: the row softmax of the same scores as semi-relaxed OT (half-oscillation
  bound, tail mass, local constant, margins, locking) and the drift of the solver's plans;
- ``stable_matches`` (with a score-noise radius): aligned pairs certified to stay winners.

Every list section holds one entry per head.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from pfamalign.alignment import certificates as cert


@functools.lru_cache(maxsize=None)
def _compiled():
    """``(project, transport_plan)``: the model's projection and the dense plan, each compiled
    as one program (run eagerly, each of their operations was a program of its own: about 230
    a certificate)."""
    import jax
    from flax import nnx

    from pfamalign.kernels import transport_plan

    return (nnx.jit(lambda model, *inputs: model.project(*inputs)),
            jax.jit(transport_plan, static_argnames="config"))


def _scores(model, q_feat, k_feat, q_len, k_len):
    """Per-head scores ``[H, Lq, Lk]``, their support, and the op inputs of the pair."""
    import jax.numpy as jnp

    project, _ = _compiled()
    q, k, v, tokens = project(model, q_feat[None], k_feat[None], jnp.array([q_len]), jnp.array([k_len]))
    tcfg = model.cfg.transport
    d = q.shape[-1]
    s = np.asarray(jnp.einsum("hid,hjd->hij", q[0], k[0])) / (np.sqrt(d) * tcfg.eps)
    i, j = np.indices(s.shape[1:])
    band = np.ones_like(i, bool) if tcfg.dustbin == "widened" else np.abs(i - j) <= tcfg.half_band
    return s, band, (q, k, v, tokens)


def certify_pair(predictor, pair: dict, *, tail_depths=(0, 1, 2, 4), tol: float = 1e-5,
                 perturbation: float = 1e-2, block_rows: int = 128, seed: int = 0,
                 score_noise: float | None = None, progress=lambda stage: None) -> dict:
    """All certificates of a pair record (``pfamalign.inputs``) under ``predictor``'s model, as a
    JSON-ready dict (see the module docstring); its ``target``, if any, gives the cotangent.
    ``score_noise``: the gauge-reduced radius r of ``stable_matches`` (None: not computed).
    ``progress(stage)`` is told each stage as it starts (long pairs take minutes)."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels.bias import tail_bias_certificate

    model, target = predictor.model, pair.get("target")
    q_feat, k_feat = predictor.featurize([pair["q_seq"], pair["k_seq"]])
    lq, lk = len(q_feat), len(k_feat)
    s, band, (q, k, v, tokens) = _scores(model, jnp.asarray(q_feat), jnp.asarray(k_feat), lq, lk)
    tcfg = dataclasses.replace(model.cfg.transport, impl="xla")
    ql, kl = jnp.array([lq]), jnp.array([lk])
    out = {"lengths": [lq, lk], "heads": int(s.shape[0]), "transport": {
        "half_band": tcfg.half_band, "eps": tcfg.eps, "base_steps": tcfg.base_steps,
        "tail_steps": tcfg.tail_steps, "dustbin": tcfg.dustbin, "marginals": tcfg.marginals,
        "relax": tcfg.relax, "tol": tcfg.tol}}
    if model.cfg.encoder == "transformer":  # the encoder's attention, layer by layer
        from pfamalign.encoder import layer_report
        out["encoder"] = {"layers": layer_report(model.encoder, [q_feat, k_feat])}

    # projective contraction, per head and block
    progress("projective contraction per block")
    blocks = []
    for h in range(s.shape[0]):
        for b in cert.block_contraction(s[h], mask=band, block_rows=block_rows):
            blocks.append({"head": h, **dataclasses.asdict(b)})
    certified = [b for b in blocks if b["strictly_positive"]]
    out["contraction"] = {
        "blocks": blocks,
        "rho_H": cert.distribution_summary([b["rho_h"] for b in certified]),
        "range_bound": cert.distribution_summary([b["range_bound"] for b in certified]),
        "delta": cert.distribution_summary([b["delta"] for b in certified]),
        "certified_blocks": len(certified), "total_blocks": len(blocks)}

    # bias certificate, for the reconstruction cotangent (or a fixed random one without target)
    progress(f"tail bias at depths {', '.join(map(str, tail_depths))}")
    base = _compiled()[1](q, k, ql, kl, tokens, config=tcfg)  # [1, H, Lq + 1, Lk + 1]
    v_ext = jnp.concatenate([v, jnp.broadcast_to(tokens.v[None, :, None], v[:, :, :1].shape)], 2) \
        if tokens is not None else jnp.concatenate([v, jnp.zeros_like(v[:, :, :1])], 2)
    o = jnp.einsum("bhij,bhjv->bhiv", base[:, :, :-1], v_ext)
    if target is not None:
        t = np.asarray(target)
        want = jnp.where(jnp.asarray(t >= 0)[None, None, :, None], v[:, :, np.maximum(t, 0)], o)
        g_out = 2.0 * (o - want)  # d/dO of the reconstruction error on annotated rows
        cotangent = "reconstruction loss"
    else:
        g_out = jax.random.normal(jax.random.PRNGKey(seed), o.shape, o.dtype)
        g_out = g_out / jnp.linalg.norm(g_out)
        cotangent = "random unit"
    bias = tail_bias_certificate(q, k, v, ql, kl, tokens, config=tcfg, g_out=g_out,
                                 tail_depths=tail_depths, tol=tol)
    out["bias"] = {"cotangent": cotangent, "tol": bias.tol, "certified_tail_depth": bias.certified_depth,
                   "rows": [r._asdict() for r in bias.rows]}

    progress("the output plan (float64 solves to convergence)")
    sections, converged = plan_certificates(model, q, k, tokens, lq, lk, base, perturbation=perturbation,
                                            seed=seed)
    out.update(sections)
    if score_noise is not None:
        progress(f"aligned pairs stable under score noise {score_noise:g}")
        aln, _ = predictor.align(pair["q_seq"], pair["k_seq"])
        ceta = out["ceta"]
        out["stable_matches"] = _stable(all(c["applies"] for c in ceta) and tcfg.marginals == "balanced",
                                        converged, max(c["mass"] for c in ceta), tcfg.eps, aln.pairs,
                                        score_noise)
    return out


def stable_matches(predictor, seq_a: str, seq_b: str, pairs, radius: float) -> dict:
    """``stable_matches`` of the aligned ``pairs`` of ``seq_a`` with ``seq_b`` alone (``align -f
    json --score-noise``): the test of ``certify_pair``, on the heads' mean converged float64
    plan of the A -> B direction, without the other certificates. No solve when the problem
    cannot have unit real rows and columns (not balanced, relaxed, or infeasible)."""
    import jax.numpy as jnp

    model, tcfg = predictor.model, predictor.model.cfg.transport
    balanced = tcfg.marginals == "balanced"
    if not (balanced and tcfg.relax is None
            and cert.feasible(*_totals(*_problem(len(seq_a), len(seq_b), tcfg)), balanced=True)):
        return _stable(False, [], 0.0, tcfg.eps, pairs, radius)
    q_feat, k_feat = predictor.featurize([seq_a, seq_b])
    lq, lk = len(q_feat), len(k_feat)
    _, _, (q, k, _, tokens) = _scores(model, jnp.asarray(q_feat), jnp.asarray(k_feat), lq, lk)
    s, mask, log_a, log_b = _extended_scores(q, k, tokens, lq, lk, tcfg)
    sols = [_converge(s[h], mask, log_a, log_b, tcfg) for h in range(s.shape[0])]
    converged = all(max(x.row_error, x.col_error) <= CONVERGED_ERROR for x in sols)
    return _stable(converged, [x.plan for x in sols], max(float(x.plan.sum()) for x in sols), tcfg.eps,
                   pairs, radius)


# The float64 solves aim at marginal errors <= 1e-9 within CONVERGED_STEPS steps; a plan counts
# as converged at CONVERGED_ERROR (cold, locked plans approach it slowly).
CONVERGED_STEPS = 20000
CONVERGED_ERROR = 1e-5


def _extended_scores(q, k, tokens, lq, lk, tcfg):
    """float64 scores ``S = q.k / sqrt(d)`` ``[H, Lq + 1, Lk + 1]`` (last row / column: the
    dustbin tokens), the support and the log targets of the op (``_problem``)."""
    f64 = lambda x: np.asarray(x, np.float64)
    qe, ke = f64(q[0]), f64(k[0])  # [H, L, d]
    h, _, d = qe.shape
    tq = f64(tokens.q) if tokens is not None and tcfg.dustbin != "none" else np.zeros((h, d))
    tk = f64(tokens.k) if tokens is not None and tcfg.dustbin != "none" else np.zeros((h, d))
    qe, ke = np.concatenate([qe, tq[:, None]], 1), np.concatenate([ke, tk[:, None]], 1)
    s = np.einsum("hid,hjd->hij", qe, ke) / np.sqrt(d)
    return (s, *_problem(lq, lk, tcfg))


def _problem(lq, lk, tcfg):
    """The op's support ``[Lq + 1, Lk + 1]`` and log targets (``kernels.reference``), float64."""
    from pfamalign.kernels.reference import dense_log_targets, dense_support

    lens = (np.array([lq]), np.array([lk]))
    mask = np.asarray(dense_support(*lens, lq, lk, half_band=tcfg.half_band, dustbin=tcfg.dustbin))[0]
    targets = dense_log_targets(*lens, lq, lk, dustbin=tcfg.dustbin)
    log_a, log_b = (np.asarray(x, np.float64)[0, 0] for x in targets)
    return mask, log_a, log_b


def _totals(mask, log_a, log_b) -> tuple[float, float]:
    """The row and column totals of the targets on the support's active lines."""
    return float(np.exp(log_a)[mask.any(1)].sum()), float(np.exp(log_b)[mask.any(0)].sum())


def _converge(s, mask, log_a, log_b, tcfg):
    """The op's problem on scores ``s`` solved at the final eps towards marginal errors <= 1e-9."""
    return cert.solve_dense(s, mask, log_a, log_b, kappa=tcfg.damping(), stages=((float(tcfg.eps), 1),),
                            tol=1e-9, max_steps=CONVERGED_STEPS)


def plan_certificates(model, q, k, tokens, lq, lk, plan, *, perturbation=1e-2, seed=0) -> dict:
    """``marginals``, ``ceta`` and ``softmax_ot`` (one entry per head) of the plan ``[1, H, Lq + 1,
    Lk + 1]`` the model outputs, recomputed in float64 from its scores (see the module
    docstring), and the heads' converged float64 plans. ``perturbation``: sup-norm size of the
    random score perturbation."""
    tcfg = model.cfg.transport
    s, mask, log_a, log_b = _extended_scores(q, k, tokens, lq, lk, tcfg)
    kappa, tau = tcfg.damping(), float(tcfg.eps)
    balanced = tcfg.marginals == "balanced"
    real_rows, real_cols = np.arange(lq + 1) < lq, np.arange(lk + 1) < lk
    # the lines the support reaches (without a dustbin, rows beyond the band carry no mass)
    active_rows, active_cols = real_rows & mask.any(1), real_cols & mask.any(0)
    supported = active_rows[real_rows]  # per real row
    # the op's own steps: its base (with tol: at eps until the marginals meet tol, up to
    # max_steps), then its tail
    base = ((tau, 0),) if tcfg.tol is not None else tuple(tcfg.base_stages())
    own, tol_stage = base + ((tau, tcfg.tail_steps),), len(base) - 1
    rng = np.random.default_rng(seed)
    out, converged_plans = {"marginals": [], "ceta": [], "softmax_ot": []}, []
    for h in range(s.shape[0]):
        p_out = np.asarray(plan[0, h], np.float64)
        mine = cert.solve_dense(s[h], mask, log_a, log_b, kappa=kappa, stages=own, tol=tcfg.tol,
                                max_steps=tcfg.max_steps, tol_stage=tol_stage)
        conv = _converge(s[h], mask, log_a, log_b, tcfg)
        noise = np.where(mask, perturbation * rng.uniform(-1, 1, size=s[h].shape), 0.0)
        conv_t = _converge(s[h] + noise, mask, log_a, log_b, tcfg)
        totals = _totals(mask, log_a, log_b)
        marg = cert.plan_marginals(p_out, active_rows, active_cols, balanced=balanced, total_rows=totals[0],
                                   total_cols=totals[1], steps=mine.steps - tcfg.tail_steps)
        marg["l1_to_converged"] = float(np.abs(p_out - conv.plan).sum())
        out["marginals"].append(marg)

        converged = max(conv.row_error, conv.col_error, conv_t.row_error, conv_t.col_error) <= CONVERGED_ERROR
        bound = cert.plan_perturbation(conv.plan, conv_t.plan, noise, mask, tau=tau,
                                       gauge=(kappa[0] == 1.0, kappa[1] == 1.0))
        # The real rows' softmax on the same support, and its balanced column target Lq / Lk.
        z = np.where(mask, s[h] / tau, -np.inf)[real_rows]
        sm = cert.masked_softmax(z, mask[real_rows])
        out["ceta"].append({
            **bound, "converged": bool(converged), "solve_steps": [conv.steps, conv_t.steps],
            "solve_error": max(conv.row_error, conv.col_error, conv_t.row_error, conv_t.col_error),
            "applies": bool(marg["feasible"] and converged and tcfg.relax is None),
            "lipschitz": float(p_out[real_rows].sum(1).max()),
            "softmax_receiver_imbalance": float(np.abs(sm[:, :lk].sum(0) / (lq / lk) - 1).max()),
            "plan_receiver_imbalance": marg["receiver_error"]})

        z_t = np.where(mask, (s[h] + noise) / tau, -np.inf)[real_rows]
        rows = cert.softmax_rows(z, z_t, mask[real_rows])
        plan_delta = np.where(supported, cert.tail_mass(p_out[real_rows], normalize=True), np.nan)
        rows["plan_tail_mass"] = cert.distribution_summary(plan_delta[supported])
        rows["per_row"]["plan_tail_mass"] = plan_delta.tolist()  # every real row; NaN: no support
        rows["per_row"]["sender_error"] = np.where(supported, np.abs(p_out[real_rows].sum(1) - 1), np.nan).tolist()
        rows["drift"] = mine.drift.tolist()  # ||P^(t+1) - P^(t)||_1 over the op's own steps
        out["softmax_ot"].append(rows)
        converged_plans.append(conv.plan)
    return out, converged_plans


def _stable(applies: bool, plans, mass: float, tau: float, pairs, radius: float) -> dict:
    """``stable_matches`` of the decoded ``pairs`` on the heads' mean converged ``plans`` of total
    mass ``mass`` (the largest head's): valid only when every head's problem is balanced,
    feasible and converged (unit real rows and columns), which the caller says in ``applies``."""
    if not applies:
        n = len(np.asarray(pairs).reshape(-1, 2))
        return {"score_noise": radius, "applies": False, "certified": 0, "aligned": n, "pairs": [],
                "stable": [None] * n,  # not tested (null in JSON), not "unstable"
                "reason": "needs a balanced, feasible, converged plan (unit rows and columns)"}
    res = cert.stable_matches(np.mean(plans, 0), pairs, mass=mass, tau=float(tau), radius=radius)
    return {**res, "applies": True}


# A block whose Hilbert-metric contraction rate is this close to 1 is strictly positive, but
# the bound it gives is no contraction worth the name (rho_H = 1 - 6.5e-12 at eps 1e-3).
RHO_VACUOUS = 1 - 1e-6


def contraction_verdict(contraction: dict) -> str:
    """What the projective-contraction certificate says, in words, for the table and the plot
    alike: "certified" blocks are the strictly positive ones, whose rho_H < 1 may still be 1
    to the precision that matters."""
    positive = [b for b in contraction["blocks"] if b["strictly_positive"]]
    head = f"{len(positive)}/{len(contraction['blocks'])} blocks strictly positive"
    if not positive:
        return f"{head}: no contraction certified"
    worst = max(b["rho_h"] for b in positive)
    if worst > RHO_VACUOUS:
        return f"{head}, rho_H up to 1 - {1 - worst:.1e}: the bound certifies no contraction"
    return f"{head}, rho_H at most {worst:.3g}: each contracts"


def plot_certificates(result: dict, path, *, title: str | None = None, names: tuple[str, str] = ("query", "key"),
                      fmt: str | None = None) -> None:
    """Six panels: rho_H per block, bias ||c_R|| vs R, each real row's sender error, tail mass
    per row (row softmax vs plan), the half-oscillation bound's tightness per row, and the drift
    of the solver's plans (title: the certified stable matches). Head 0. ``title``: the pair;
    ``names``: the sequences' names (rows are ``names[0]``'s residues, numbered from 1)."""
    from matplotlib.figure import Figure

    from pfamalign.alignment.plots import integer_ticks as integer, residue_label, save_figure

    fig = Figure(figsize=(14, 7.5))
    ax = fig.add_subplot(231)
    blocks = result["contraction"]["blocks"]
    shown = [(n, b) for n, b in enumerate(blocks, start=1) if b["strictly_positive"]]
    ax.plot([n for n, _ in shown], [b["rho_h"] for _, b in shown], "o-", mfc="none", label=r"$\rho_H = \tanh^2(\Delta/4)$")
    ax.plot([n for n, _ in shown], [b["range_bound"] for _, b in shown], "s--", mfc="none", ms=9,
            label=r"range bound $\tanh^2(\Omega/2)$")
    if not shown:
        ax.text(0.5, 0.5, "no block with a strictly positive kernel:\nno contraction certified",
                transform=ax.transAxes, ha="center", va="center", fontsize=9)
    elif max(b["rho_h"] for _, b in shown) > RHO_VACUOUS:
        ax.text(0.5, 0.08, r"$\rho_H \approx 1$: the bound certifies no contraction", transform=ax.transAxes,
                ha="center", fontsize=8)
    ax.set_xlim(0.5, max(len(blocks), 1) + 0.5)
    integer(ax.xaxis)
    ax.set_xlabel(f"block of {names[0]} rows (of {len(blocks)})")
    ax.set_ylabel("contraction rate")
    ax.set_ylim(0, 1.05)
    ax.set_title("projective contraction", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    ax = fig.add_subplot(232)
    bias = result["bias"]
    rows = bias["rows"]
    ax.semilogy([r["tail_steps"] for r in rows], [max(r["bias_norm"], 1e-30) for r in rows], "o-",
                label=r"bias $\|c_R\|$")
    ax.semilogy([r["tail_steps"] for r in rows], [max(r["eta_norm"], 1e-30) for r in rows], "s--",
                label=r"$\|\eta_R\|$")
    ax.axhline(bias["tol"], color="gray", lw=0.8, ls=":", label=f"tol {bias['tol']:g}")
    integer(ax.xaxis)
    ax.set_xlabel("tail steps R")
    ax.set_ylabel("norm")
    depth = bias["certified_tail_depth"]
    ax.set_title(f"tail bias: certified depth {depth}" if depth is not None
                 else f"tail bias: no depth within tol {bias['tol']:g}", fontsize=10)
    ax.legend(fontsize=8)
    sm, marg = result["softmax_ot"][0], result["marginals"][0]
    query_rows = np.arange(1, len(sm["per_row"]["sender_error"]) + 1)
    ax = fig.add_subplot(233)
    ax.plot(query_rows, sm["per_row"]["sender_error"], label="|row sum − 1| of the plan")
    ax.axhline(abs(marg["expected_row_sum"] - 1), color="gray", lw=0.8, ls=":",
               label="|expected row sum − 1|" + ("" if marg["feasible"] else " (targets infeasible)"))
    ax.set_xlabel(residue_label(names[0]))
    ax.set_ylabel("row-sum error")
    ax.set_title("sender (row) marginals", fontsize=10)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(234)
    ax.plot(query_rows, sm["per_row"]["tail_mass"], label="row softmax")
    ax.plot(query_rows, sm["per_row"]["plan_tail_mass"], label="plan (rows normalised)")
    ax.set_xlabel(residue_label(names[0]))
    ax.set_ylabel(r"tail mass $1 - \max_j P_i(j)$")
    ax.set_ylim(0, 1.02)
    ax.set_title("mass outside each row's best key", fontsize=10)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(235)
    ax.plot(query_rows, sm["per_row"]["row_bound_ratio"], ".")
    ax.set_xlabel(residue_label(names[0]))
    ax.set_ylabel(r"$\|\Delta sm\|_1 \,/\, (\mathrm{osc}(\Delta z)/2)$")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"softmax bound tightness; plan bound ratio {result['ceta'][0]['ratio']:.3g}", fontsize=10)
    ax = fig.add_subplot(236)
    drift = sm["drift"]
    ax.semilogy(range(2, len(drift) + 2), [max(x, 1e-30) for x in drift], "o-")
    integer(ax.xaxis)
    ax.set_xlabel("solver step t")
    ax.set_ylabel(r"$\|P^{(t)} - P^{(t-1)}\|_1$")
    st = result.get("stable_matches")
    ax.set_title("drift of the solver's plans" if st is None else
                 f"stable matches at r={st['score_noise']:g}: {st['certified']}/{st['aligned']}"
                 + ("" if st["applies"] else " (does not apply)"), fontsize=10)
    lq, lk = result["lengths"]
    fig.suptitle(f"{title + ': ' if title else ''}certificates of the transport plan ({lq} x {lk} residues, head 0 "
                 f"of {result['heads']}, numbered from 0 as in the tables)", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, fmt=fmt)
