"""One-reference vs four-plan tail adjoint (docs/design.md §3.5) on the XLA path.

Both evaluate the same exact R-step tail adjoint. ``four_plan`` exponentiates every tail plan
(row plans A^r and column plans B^r, r = 1..R) on its own; ``one_reference`` writes each as a
diagonal rescaling of the output plan P and the whole score cotangent as one modulated
product with P (one exponential per band entry). For each (L, W): backward-only time
(the VJP applied to stored residuals), forward + backward time, the speedup
four_plan / one_reference, and the largest gradient difference between the two (relative to
the largest gradient entry). Both adjoints are timed in alternation (min over ``--repeats``).

    python scripts/benchmark_four_plan_adjoint.py                  # L 1024..4096, W 64,256 (~3-5 min)
    python scripts/benchmark_four_plan_adjoint.py --lengths 512 --half-bands 32 --json
"""

from __future__ import annotations

import argparse

import _common


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=_common.positive_int_list, default=[1024, 2048, 4096])
    ap.add_argument("--half-bands", type=_common.int_list, default=[64, 256])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dim", type=int, default=64, help="d = dv (default 64)")
    ap.add_argument("--base-steps", type=int, default=15, help="T (default 15)")
    ap.add_argument("--tail-steps", type=int, default=2, help="R (default 2)")
    ap.add_argument("--eps", type=float, default=1.0)
    _common.add_output_args(ap, repeats=5)
    args = ap.parse_args(argv)

    import jax.numpy as jnp
    import numpy as np

    from pfamalign.kernels import TransportConfig, transport

    cols = ["L", "W", "bwd_one_ref_ms", "bwd_four_plan_ms", "bwd_speedup", "fwd_bwd_one_ref_ms",
            "fwd_bwd_four_plan_ms", "fwd_bwd_speedup", "max_grad_diff"]
    rep = _common.Report(f"Tail adjoint schedules: R={args.tail_steps}, T={args.base_steps}, d={args.dim}, "
                         f"batch={args.batch}", cols, json_lines=args.json, script="benchmark_four_plan_adjoint",
                         config=vars(args))
    for length in args.lengths:
        q, k, v, w = _common.make_problem(args.batch, 1, length, args.dim, args.dim)
        lens = jnp.full((args.batch,), length)
        for hb in args.half_bands:
            fns, grads = {}, {}
            for adj in ("one_reference", "four_plan"):
                cfg = TransportConfig(half_band=hb, eps=args.eps, base_steps=args.base_steps,
                                      tail_steps=args.tail_steps, adjoint=adj)
                op = lambda q, k, v, cfg=cfg: transport(q, k, v, lens, lens, config=cfg)
                fwd, bwd = _common.split_fwd_bwd(op)
                _, vjp = fwd(q, k, v)
                fb = _common.fwd_bwd(op)
                grads[adj] = fb(q, k, v, w)[1]
                fns[f"bwd_{adj}"] = (bwd, (vjp, w))
                fns[f"fb_{adj}"] = (fb, (q, k, v, w))
            best = _common.time_interleaved(fns, repeats=args.repeats)
            scale = max(float(jnp.max(jnp.abs(g))) for g in grads["four_plan"])
            diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads["one_reference"], grads["four_plan"]))
            rep.add(L=length, W=hb, bwd_one_ref_ms=1e3 * best["bwd_one_reference"],
                    bwd_four_plan_ms=1e3 * best["bwd_four_plan"],
                    bwd_speedup=best["bwd_four_plan"] / best["bwd_one_reference"],
                    fwd_bwd_one_ref_ms=1e3 * best["fb_one_reference"], fwd_bwd_four_plan_ms=1e3 * best["fb_four_plan"],
                    fwd_bwd_speedup=best["fb_four_plan"] / best["fb_one_reference"], max_grad_diff=diff / scale)
    sp = [r["bwd_speedup"] for r in rep.rows]
    rep.note(f"backward speedup one_reference vs four_plan: min {min(sp):.2f}x, geometric mean "
             f"{float(np.exp(np.mean(np.log(sp)))):.2f}x (target >= 1.3x)")
    rep.finish()


if __name__ == "__main__":
    main()
