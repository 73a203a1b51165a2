"""Tail refinement (docs/design.md §3.4): what the R differentiable tail steps buy after a
T-step stopped base, on the banded XLA path.

For each length L and tail depth R (one pair, one head, self-similar q / k so that the plan
concentrates near the diagonal):
  * ``base_row_viol``: max_i |sum_j P_ij - 1| of the base plan (R = 0; columns are exact after
    every full step, rows are what the base leaves unbalanced);
  * ``row_viol``: the same after the R tail steps;
  * ``out_rel_err``: ||O - O*|| / ||O*||, O* from a converged solve (``--converged-steps``);
  * ``grad_cos`` / ``grad_rel_err``: the op's (stopped-base) gradient of ``sum(w * O)`` w.r.t.
    (q, k) against the full unrolled gradient (base_steps=0, tail_steps=T+R: the same forward,
    differentiated through all steps);
  * ``fwd_bwd_ms``: forward + backward time of the op (min over ``--repeats`` after compiling)
    and ``time_vs_R0``, its ratio to R = 0 in the same run.

    python scripts/validate_tail_refinement.py                   # L 512,1024,2048, W 256 (~3-6 min)
    python scripts/validate_tail_refinement.py --lengths 256 --half-band 32 --json
"""

from __future__ import annotations

import argparse
import dataclasses

import _common


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=_common.positive_int_list, default=[512, 1024, 2048], help="comma-separated L")
    ap.add_argument("--half-band", type=int, default=256, help="W (default 256)")
    ap.add_argument("--dim", type=int, default=64, help="d = dv (default 64)")
    ap.add_argument("--base-steps", type=int, default=15, help="T (default 15)")
    ap.add_argument("--tail-depths", type=_common.int_list, default=[0, 1, 2, 4], help="R values")
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--signal", type=float, default=1.0, help="q/k similarity (see _common.make_problem)")
    ap.add_argument("--converged-steps", type=int, default=300, help="T of the converged reference solve")
    _common.add_output_args(ap)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from pfamalign.kernels import TransportConfig, transport

    cols = ["L", "R", "base_row_viol", "row_viol", "out_rel_err", "grad_cos", "grad_rel_err", "fwd_bwd_ms",
            "time_vs_R0"]
    rep = _common.Report(f"Tail refinement: W={args.half_band}, d={args.dim}, T={args.base_steps}, eps={args.eps}",
                         cols, json_lines=args.json, script="validate_tail_refinement", config=vars(args))

    def value_and_grad(cfg):
        """(q, k, v1, w) -> ((loss, O with the row sums as last column), (dq, dk)); v1 = [v, 1]."""
        def loss(q, k, v1, w):
            o = transport(q, k, v1, lens, lens, config=cfg)
            return jnp.sum(w * o[..., :-1]), o
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))

    for length in args.lengths:
        q, k, v, w = _common.make_problem(1, 1, length, args.dim, args.dim, signal=args.signal)
        lens = jnp.array([length])
        v1 = jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], -1)
        base = TransportConfig(half_band=args.half_band, eps=args.eps, base_steps=args.base_steps)
        conv = dataclasses.replace(base, base_steps=args.converged_steps, tail_steps=0)
        (_, o_conv), _ = value_and_grad(conv)(q, k, v1, w)
        o_star = np.asarray(o_conv[..., :-1], np.float64)
        rep.note(f"L={length}: converged reference (T={args.converged_steps}) row violation "
                 f"{float(jnp.max(jnp.abs(o_conv[..., -1] - 1))):.2e}")
        base_viol, t0 = None, None
        for r in args.tail_depths:
            cfg = dataclasses.replace(base, tail_steps=r)
            f = value_and_grad(cfg)
            (_, o), g = f(q, k, v1, w)
            timing = _common.time_fn(f, q, k, v1, w, repeats=args.repeats)
            full = dataclasses.replace(cfg, base_steps=0, tail_steps=args.base_steps + r)
            _, g_full = value_and_grad(full)(q, k, v1, w)
            a = np.concatenate([np.ravel(x) for x in g]).astype(np.float64)
            b = np.concatenate([np.ravel(x) for x in g_full]).astype(np.float64)
            viol = float(jnp.max(jnp.abs(o[..., -1] - 1)))
            base_viol = viol if r == 0 else base_viol
            t0 = timing["min_s"] if r == 0 else t0
            rep.add(L=length, R=r, base_row_viol=base_viol, row_viol=viol,
                    out_rel_err=float(np.linalg.norm(np.asarray(o[..., :-1], np.float64) - o_star)
                                      / np.linalg.norm(o_star)),
                    grad_cos=float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))),
                    grad_rel_err=float(np.linalg.norm(a - b) / np.linalg.norm(b)),
                    fwd_bwd_ms=1e3 * timing["min_s"], time_vs_R0=timing["min_s"] / t0 if t0 else None)
    if 0 not in args.tail_depths:
        rep.note("base_row_viol is only measured when R=0 is among --tail-depths")
    rep.finish()


if __name__ == "__main__":
    main()
