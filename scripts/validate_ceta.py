"""Conservative entropic transport attention (CETA), measured: which matrices are row-stochastic,
conserve mass, balance their receivers, satisfy the entropic-OT optimality (KKT) conditions and
the plan perturbation bound ``||P(S) - P(T)||_1 <= (M / 2 tau) osc(S - T)``; the softmax's
worst receiver imbalance n - 1; the constant attained; the O(1 / t) approach to the identity
under a causal mask. One JSON line per check, each with "ok" (the measurement agrees with the
theory as docs/design.md states it).

    python scripts/validate_ceta.py --json
"""

from __future__ import annotations

import argparse

import numpy as np

import _common


def _kkt_residual(p, s, mask, tau):
    """Balanced entropic OT optimality: log P - S / tau is additive (u_i + v_j) on the support
    and both marginals are 1. Max of the gauge oscillation and the marginal errors."""
    from pfamalign.alignment import certificates as cert

    logp = np.where(mask, np.log(np.where(mask, np.maximum(p, 1e-300), 1.0)), 0.0) - np.where(mask, s / tau, 0.0)
    return max(cert.gauge_oscillation(logp, mask), np.abs(p.sum(1) - 1).max(), np.abs(p.sum(0) - 1).max())


def property_table(rep, n, tau, trials, rng):
    from pfamalign.alignment import certificates as cert

    s = rng.normal(scale=2.0, size=(n, n))
    full = np.ones((n, n), bool)
    zeros = np.zeros(n)

    def matrices(x):
        # the capacity plan: n real lines and a dustbin line on each side, the dustbins taking n
        xe = np.zeros((n + 1, n + 1))
        xe[:n, :n] = x
        la, lb = np.r_[zeros, np.log(n)], np.r_[zeros, np.log(n)]
        cap = cert.solve_dense(xe, np.ones((n + 1, n + 1), bool), la, lb, stages=((tau, 1),), tol=1e-12)
        return {
            "row softmax": (cert.masked_softmax(x / tau, full, 1), full),
            "column-normalised softmax": (cert.masked_softmax(x / tau, full, 0), full),
            "Sinkhorn, 17 steps": (cert.solve_dense(x, full, zeros, zeros, stages=((tau, 17),)).plan, full),
            "converged CETA": (cert.solve_dense(x, full, zeros, zeros, stages=((tau, 1),), tol=1e-12).plan, full),
            "capacity plan": (cap.plan, np.ones((n + 1, n + 1), bool)),
        }

    base = matrices(s)
    ratios = {k: [] for k in base}
    for _ in range(trials):
        d = rng.normal(scale=rng.uniform(1e-3, 0.5), size=(n, n))
        for name, (p2, mask) in matrices(s + d).items():
            de = np.zeros(mask.shape)
            de[:n, :n] = d
            b = cert.plan_perturbation(base[name][0], p2, de, mask, tau=tau, gauge=(False, False))
            ratios[name].append(b["ratio"])
    # what the theory says: (row-stochastic, receivers balanced, KKT, bound guaranteed)
    expect = {"row softmax": (True, False, False, True), "column-normalised softmax": (False, True, False, True),
              "Sinkhorn, 17 steps": (False, True, False, False), "converged CETA": (True, True, True, True),
              "capacity plan": (True, True, True, True)}
    for name, (p, mask) in base.items():
        real = slice(0, n)
        row_err = float(np.abs(p[real].sum(1) - 1).max())
        recv = float(np.abs(p[:, real].sum(0) - 1).max())
        mean_cons = float(abs(p[:, real].sum() / n - 1)) if name != "capacity plan" else \
            float(abs(p.sum() / (2 * n) - 1))
        sx = np.zeros(mask.shape)
        sx[:n, :n] = s
        kkt = _kkt_residual(p, sx, mask, tau) if name != "capacity plan" else float(
            max(np.abs(p.sum(1)[:n] - 1).max(), np.abs(p.sum(0)[:n] - 1).max()))
        worst, viol = float(np.max(ratios[name])), int(np.sum(np.asarray(ratios[name]) > 1 + 1e-9))
        rs, bal, opt, bound = expect[name]
        ok = ((row_err < 1e-9) == rs and (recv < 1e-9) == bal and (kkt < 1e-8) == opt
              and mean_cons < 1e-9 and (viol == 0 or not bound))
        rep.add(check="property_table", matrix=name, row_stochastic_err=row_err, mean_conservation_err=mean_cons,
                receiver_imbalance=recv, kkt_residual=kkt, worst_bound_ratio=worst, violations=viol, ok=bool(ok))


def worst_softmax_imbalance(rep, sizes, tau):
    """Every row's argmax on column 0: column 0 receives n, the imbalance tends to n - 1."""
    from pfamalign.alignment import certificates as cert

    for n in sizes:
        s = np.zeros((n, n))
        s[:, 0] = 40.0 * tau
        p = cert.masked_softmax(s / tau, np.ones((n, n), bool), 1)
        imb = float(np.abs(p.sum(0) - 1).max())
        rep.add(check="softmax_worst_receiver_imbalance", n=n, value=imb, bound=n - 1,
                ok=bool((n - 1) * (1 - 1e-9) <= imb <= n - 1))


def constant_attained(rep, sizes, tau, d):
    """n / 2 blocks of 2 x 2 equal scores, diagonals pushed by +d, off-diagonals by -d: each
    block's plan moves by 2 d / tau in l1, the total n d / tau = (M / tau) ||S - T||_inf."""
    from pfamalign.alignment import certificates as cert

    for n in sizes:
        mask = np.kron(np.eye(n // 2, dtype=bool), np.ones((2, 2), bool))
        diff = np.where(mask, np.kron(np.eye(n // 2), np.array([[d, -d], [-d, d]])), 0.0)
        z = np.zeros(n)
        solve = lambda x: cert.solve_dense(x, mask, z, z, stages=((tau, 1),), tol=1e-14).plan
        b = cert.plan_perturbation(solve(np.zeros((n, n))), solve(diff), diff, mask, tau=tau)
        sup_ratio = b["lhs"] / b["rhs_sup"]
        rep.add(check="constant_attained", n=n, value=sup_ratio, gauge_ratio=b["ratio"],
                ok=bool(sup_ratio >= 0.999 and b["holds"]))


def causal_rate(rep, n, tau, steps, rng):
    """Lower-triangular support: the identity is the only doubly stochastic matrix on it, and
    Sinkhorn's off-diagonal mass decays polynomially, about like 1 / t (log-log slope between
    the last two step counts in (-1.2, -0.5)), not geometrically."""
    from pfamalign.alignment import certificates as cert

    s = rng.normal(size=(n, n))
    mask = np.tril(np.ones((n, n), bool))
    z = np.zeros(n)
    vals = []
    for t in steps:
        p = cert.solve_dense(s, mask, z, z, stages=((tau, t),)).plan
        vals.append(float(p.sum() - np.trace(p)))
    slope = float(np.log(vals[-1] / vals[-2]) / np.log(steps[-1] / steps[-2]))
    ok = all(a > b for a, b in zip(vals, vals[1:])) and -1.2 < slope < -0.5
    rep.add(check="causal_identity_rate", n=n, steps=list(steps), off_diagonal_mass=vals, value=slope,
            ok=bool(ok))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=12, help="size of the property-table problem (default 12)")
    ap.add_argument("--tau", type=float, default=0.7, help="temperature (default 0.7)")
    ap.add_argument("--trials", type=int, default=50, help="random perturbations per matrix (default 50)")
    ap.add_argument("--sizes", default="2,4,16", help="n of the constructions (default 2,4,16)")
    ap.add_argument("--causal-steps", type=_common.positive_int_list, default=[10, 100, 1000],
                    help="Sinkhorn steps under the causal mask, two or more (the rate is the slope between "
                         "the last two; default 10,100,1000)")
    ap.add_argument("--seed", type=int, default=0)
    _common.add_output_args(ap, repeats=None)
    args = ap.parse_args(argv)
    if len(args.causal_steps) < 2:
        ap.error(f"--causal-steps needs two or more step counts (a rate is a slope), got {args.causal_steps}")
    rng = np.random.default_rng(args.seed)
    sizes = _common.int_list(args.sizes)
    rep = _common.Report("CETA claims, measured", ["check", "matrix", "n", "value", "worst_bound_ratio", "ok"],
                         json_lines=args.json, script="validate_ceta", config=vars(args))
    property_table(rep, args.n, args.tau, args.trials, rng)
    worst_softmax_imbalance(rep, sizes, args.tau)
    constant_attained(rep, sizes, args.tau, 1e-5)
    causal_rate(rep, 8, args.tau, args.causal_steps, rng)
    rep.finish()
    return 0 if all(r["ok"] for r in rep.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
