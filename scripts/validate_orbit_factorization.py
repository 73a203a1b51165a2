"""Transport-orbit factorisation (docs/design.md §3.5): every plan of every step is a diagonal
rescaling of one reference plan.

From the op's potentials history (T base + R tail steps, centered), for every step t:
  row plan     A^t = exp(S + û^t ⊕ v^{t-1}),  û^t = -LSE_row(S + v^{t-1}) (v^0 = 0),
  column plan  B^t = exp(S + u^t ⊕ v^t),
formed densely and directly, and as ``diag(e^a) P diag(e^b)`` of the one reference plan
P = exp(S + u^F ⊕ v^F) (the final plan), with a, b the potential differences (split by a
constant so neither factor over/underflows alone, as the adjoint does). Prints the largest
absolute and relative difference per plan (relative over entries >= ``--rel-floor``), in
float32 and float64. The history holds the centered u; û is recomputed from v^{t-1}.

    python scripts/validate_orbit_factorization.py               # L=128, W=32, T=15, R=2 (~1 min)
    python scripts/validate_orbit_factorization.py --half-band 128 --json
"""

from __future__ import annotations

import argparse

import _common


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=128, help="L (default 128)")
    ap.add_argument("--half-band", type=int, default=32, help="W (default 32)")
    ap.add_argument("--dim", type=int, default=64, help="d (default 64)")
    ap.add_argument("--base-steps", type=int, default=15, help="T (default 15)")
    ap.add_argument("--tail-steps", type=int, default=2, help="R (default 2)")
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--signal", type=float, default=1.0)
    ap.add_argument("--rel-floor", type=float, default=1e-20, help="relative errors over entries >= this")
    ap.add_argument("--dtypes", default="float32,float64")
    _common.add_output_args(ap, repeats=None)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from pfamalign.kernels import TransportConfig, transport

    cols = ["dtype", "plan", "t", "max_abs_err", "max_rel_err", "max_entry"]
    rep = _common.Report(
        f"Orbit factorisation: L={args.length}, W={args.half_band}, T={args.base_steps}, R={args.tail_steps}",
        cols, json_lines=args.json, script="validate_orbit_factorization", config=vars(args))
    cfg = TransportConfig(half_band=args.half_band, eps=args.eps, base_steps=args.base_steps,
                          tail_steps=args.tail_steps)
    n = args.length
    for name in args.dtypes.split(","):
        with jax.enable_x64(name == "float64"):
            dtype = jnp.dtype(name)
            q, k, v, _ = _common.make_problem(1, 1, n, args.dim, args.dim, signal=args.signal, dtype=dtype)
            lens = jnp.array([n])
            pots = transport(q, k, v, lens, lens, config=cfg, return_potentials=True).potentials
            u_hist, v_hist = pots.u[0, 0, :, :n], pots.v[0, 0, :, :n]  # [T + R, L] centered
            i, j = np.indices((n, n))
            support = jnp.asarray(np.abs(i - j) <= args.half_band)
            s = jnp.where(support, q[0, 0] @ k[0, 0].T / (np.sqrt(args.dim) * args.eps), -jnp.inf)
            plan = lambda a, b: jnp.where(support, jnp.exp(s + a[:, None] + b[None, :]), 0.0)
            u_f, v_f = u_hist[-1], v_hist[-1]
            p_ref = plan(u_f, v_f)

            def rescaled(a, b):  # diag(e^a) P diag(e^b), the constant moved to balance the factors
                c = 0.5 * (jnp.max(a) - jnp.max(b))
                return jnp.exp(a - c)[:, None] * p_ref * jnp.exp(b + c)[None, :]

            def record(label, t, direct, fact):
                err = jnp.abs(fact - direct)
                big = direct >= args.rel_floor
                rel = jnp.max(jnp.where(big, err / jnp.where(big, direct, 1.0), 0.0))
                rep.add(dtype=name, plan=label, t=t, max_abs_err=float(jnp.max(err)), max_rel_err=float(rel),
                        max_entry=float(jnp.max(direct)))

            v_prev = jnp.zeros(n, dtype)
            for t in range(args.base_steps + args.tail_steps):
                u_hat = -jax.nn.logsumexp(s + v_prev[None, :], axis=1)
                record("A", t + 1, plan(u_hat, v_prev), rescaled(u_hat - u_f, v_prev - v_f))
                record("B", t + 1, plan(u_hist[t], v_hist[t]), rescaled(u_hist[t] - u_f, v_hist[t] - v_f))
                v_prev = v_hist[t]
    for name in args.dtypes.split(","):
        sel = [r for r in rep.rows if r["dtype"] == name]
        rep.note(f"{name}: over all {len(sel)} plans max_abs_err={max(r['max_abs_err'] for r in sel):.3e}, "
                 f"max_rel_err={max(r['max_rel_err'] for r in sel):.3e}")
    rep.finish()


if __name__ == "__main__":
    main()
