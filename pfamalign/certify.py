"""Certificates of one aligned pair (docs/design.md §6), from a trained aligner's scores and plans.

- projective contraction per 128-row block of each head's scores (exact rho_H = tanh^2(Delta/4)
  and the range bound tanh^2(Omega_S/2); summarised as in the seed paper's Table 7);
- the a-posteriori bias certificate of the stopped-base gradient and the certified tail depth
  (``pfamalign.kernels.bias``), for the reconstruction-loss cotangent of the pair;
- conservative transport: receiver-mass imbalance ``||A^T 1 - 1||_inf`` of the row softmax of
  the scores vs the Sinkhorn plan, and the score-perturbation bound for a perturbation of the
  scores;
- row tail mass ``1 - max_j P_i(j)`` of both (the locking diagnostic of the softmax view).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pfamalign.alignment import certificates as cert


def _scores(model, q_feat, k_feat, q_len, k_len):
    """Per-head scores ``[H, Lq, Lk]``, their support, and the op inputs of the pair."""
    import jax.numpy as jnp

    q, k, v, tokens = model.project(q_feat[None], k_feat[None], jnp.array([q_len]), jnp.array([k_len]))
    tcfg = model.cfg.transport
    d = q.shape[-1]
    s = np.asarray(jnp.einsum("hid,hjd->hij", q[0], k[0])) / (np.sqrt(d) * tcfg.eps)
    i, j = np.indices(s.shape[1:])
    band = np.ones_like(i, bool) if tcfg.dustbin == "widened" else np.abs(i - j) <= tcfg.half_band
    return s, band, (q, k, v, tokens)


def certify_pair(predictor, pair: dict, *, tail_depths=(0, 1, 2, 4), tol: float = 1e-5,
                 perturbation: float = 1e-2, block_rows: int = 128, seed: int = 0) -> dict:
    """All certificates of a pair record (``pfamalign.inputs``) under ``predictor``'s model, as a
    JSON-ready dict (see the module docstring); its ``target``, if any, gives the cotangent."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import transport_plan
    from pfamalign.kernels.bias import tail_bias_certificate

    model, target = predictor.model, pair.get("target")
    q_feat, k_feat = predictor.featurize([pair["q_seq"], pair["k_seq"]])
    lq, lk = len(q_feat), len(k_feat)
    s, band, (q, k, v, tokens) = _scores(model, jnp.asarray(q_feat), jnp.asarray(k_feat), lq, lk)
    tcfg = dataclasses.replace(model.cfg.transport, impl="xla")
    ql, kl = jnp.array([lq]), jnp.array([lk])
    out = {"lengths": [lq, lk], "heads": int(s.shape[0]), "transport": {
        "half_band": tcfg.half_band, "eps": tcfg.eps, "base_steps": tcfg.base_steps,
        "tail_steps": tcfg.tail_steps, "dustbin": tcfg.dustbin}}
    if model.cfg.encoder == "transformer":  # the encoder's attention, layer by layer
        from pfamalign.encoder import layer_report
        out["encoder"] = {"layers": layer_report(model.encoder, [q_feat, k_feat])}

    # projective contraction, per head and block
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
    base = transport_plan(q, k, ql, kl, tokens, config=tcfg)  # [1, H, Lq + 1, Lk + 1]
    v_ext = jnp.concatenate([v, jnp.broadcast_to(tokens.v[None, :, None], v[:, :, :1].shape)], 2) \
        if tokens is not None else jnp.concatenate([v, jnp.zeros_like(v[:, :, :1])], 2)
    o = jnp.einsum("bhij,bhjv->bhiv", base[:, :, :-1], v_ext)
    if target is not None:
        t = np.asarray(target)
        want = jnp.where(jnp.asarray(t >= 0)[None, None, :, None], v[:, :, np.maximum(t, 0)], o)
        g_out = 2.0 * (o - want)  # d/dO of the reconstruction error on annotated rows
        cotangent = "reconstruction loss"
    else:
        g_out = jax.random.normal(jax.random.PRNGKey(seed), o.shape)
        g_out = g_out / jnp.linalg.norm(g_out)
        cotangent = "random unit"
    bias = tail_bias_certificate(q, k, v, ql, kl, tokens, config=tcfg, g_out=g_out,
                                 tail_depths=tail_depths, tol=tol)
    out["bias"] = {"cotangent": cotangent, "tol": bias.tol, "certified_tail_depth": bias.certified_depth,
                   "rows": [r._asdict() for r in bias.rows]}

    # conservative transport and tail mass: softmax of the band scores vs the Sinkhorn plan
    masked = np.where(band[None], s, -np.inf)
    softmax = cert.row_softmax(masked, tau=1.0)  # [H, Lq, Lk]
    plan = np.asarray(base[0])  # [H, Lq + 1, Lk + 1]
    rng = np.random.default_rng(seed)
    noise = perturbation * rng.uniform(-1, 1, size=s.shape)
    finite = np.where(band[None], s, 0.0)
    bound = cert.score_perturbation(finite, finite + noise, tau=1.0)
    out["conservative"] = {
        "receiver_mass_imbalance": {
            "softmax": cert.receiver_mass_imbalance(softmax),
            "sinkhorn": cert.receiver_mass_imbalance(plan, col_mask=np.r_[np.ones(lk, bool), False]),
        },
        "score_perturbation": {"perturbation_inf": float(np.abs(noise).max()), "lhs": bound.lhs,
                               "rhs": bound.rhs, "holds": bound.holds},
    }
    tm_soft = cert.tail_mass(softmax)
    tm_sink = cert.tail_mass(plan[:, :-1, :], normalize=True)
    out["tail_mass"] = {"softmax": cert.distribution_summary(tm_soft),
                        "sinkhorn": cert.distribution_summary(tm_sink),
                        "per_row": {"softmax": tm_soft.mean(0).tolist(), "sinkhorn": np.nanmean(tm_sink, 0).tolist()}}
    return out


def plot_certificates(result: dict, path) -> None:
    """Three panels: rho_H per block, bias ||c_R|| vs R, tail mass per row (softmax vs Sinkhorn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(131)
    rho = [b["rho_h"] for b in result["contraction"]["blocks"] if b["strictly_positive"]]
    rng = [b["range_bound"] for b in result["contraction"]["blocks"] if b["strictly_positive"]]
    ax.plot(rho, "o-", label="rho_H = tanh²(Δ/4)")
    ax.plot(rng, "s--", label="range bound tanh²(Ω/2)")
    ax.set_xlabel("certified block")
    ax.set_ylabel("contraction rate")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax = fig.add_subplot(132)
    rows = result["bias"]["rows"]
    ax.semilogy([r["tail_steps"] for r in rows], [max(r["bias_norm"], 1e-30) for r in rows], "o-", label="||c_R||")
    ax.semilogy([r["tail_steps"] for r in rows], [max(r["eta_norm"], 1e-30) for r in rows], "s--", label="||eta_R||")
    ax.axhline(result["bias"]["tol"], color="gray", lw=0.8, ls=":", label="tol")
    ax.set_xlabel("tail steps R")
    ax.legend(fontsize=7)
    ax = fig.add_subplot(133)
    ax.plot(result["tail_mass"]["per_row"]["softmax"], label="row softmax")
    ax.plot(result["tail_mass"]["per_row"]["sinkhorn"], label="Sinkhorn plan")
    ax.set_xlabel("query row")
    ax.set_ylabel("tail mass 1 - max_j P_i(j)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
