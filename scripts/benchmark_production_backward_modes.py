"""The backward modes a user can pick, side by side at production-like sizes.

Modes (all differentiate ``sum(w * O)`` w.r.t. q, k, v; T base + R tail steps):
  * ``xla_one_reference``: the XLA band, exact R-step tail adjoint on one reference plan
    (the default);
  * ``xla_four_plan``: the same gradient, every tail plan exponentiated on its own;
  * ``reference``: the dense jnp solve differentiated by autodiff (the same stopped-base
    surrogate; Lq x Lk matrices);
  * ``full_unroll``: the XLA op with base_steps=0, tail_steps=T+R: the gradient through all
    steps (no stopped base; its adjoint runs T+R steps).
For each: forward + backward time (min over ``--repeats``, all modes timed in alternation),
its ratio to ``xla_one_reference`` measured in the same run, and XLA's compiled temporary
memory of the forward + backward.

    python scripts/benchmark_production_backward_modes.py                 # 8x512 (W=1024), 1x4096 (W=256): ~1-3 min
    python scripts/benchmark_production_backward_modes.py --cases 2x256x64 --json
"""

from __future__ import annotations

import argparse
import dataclasses

import _common

DEFAULT_CASES = "8x512x1024,1x4096x256"
MODES = ("xla_one_reference", "xla_four_plan", "reference", "full_unroll")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=_common.shapes_list(3, "BATCHxLxW"), default=DEFAULT_CASES,
                    help=f"BATCHxLxW list (default {DEFAULT_CASES}; W >= L is the dense band)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    ap.add_argument("--dim", type=int, default=64, help="d = dv (default 64)")
    ap.add_argument("--base-steps", type=int, default=15, help="T (default 15)")
    ap.add_argument("--tail-steps", type=int, default=2, help="R (default 2)")
    ap.add_argument("--eps", type=float, default=1.0)
    _common.add_output_args(ap, repeats=3)
    args = ap.parse_args(argv)

    import jax.numpy as jnp

    from pfamalign.kernels import TransportConfig, transport

    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes must name some of {', '.join(MODES)}; got {args.modes!r}")
    cols = ["batch", "L", "W", "mode", "fwd_bwd_ms", "time_vs_default", "temp_MiB", "compile_s"]
    rep = _common.Report(f"Backward modes: d={args.dim}, T={args.base_steps}, R={args.tail_steps}, eps={args.eps}",
                         cols, json_lines=args.json, script="benchmark_production_backward_modes",
                         config={**vars(args), "cases": [f"{b}x{l}x{w}" for b, l, w in args.cases]})
    for batch, length, hb in args.cases:
        q, k, v, w = _common.make_problem(batch, 1, length, args.dim, args.dim)
        lens = jnp.full((batch,), length)
        base = TransportConfig(half_band=hb, eps=args.eps, base_steps=args.base_steps, tail_steps=args.tail_steps)
        configs = {"xla_one_reference": base, "xla_four_plan": dataclasses.replace(base, adjoint="four_plan"),
                   "reference": dataclasses.replace(base, impl="reference"),
                   "full_unroll": dataclasses.replace(base, base_steps=0, tail_steps=args.base_steps + args.tail_steps)}
        fns, extra = {}, {}
        for mode in modes:
            op = lambda q, k, v, cfg=configs[mode]: transport(q, k, v, lens, lens, config=cfg)
            fb, mem = _common.compile_with_memory(_common.fwd_bwd(op), q, k, v, w)
            fns[mode] = (fb, (q, k, v, w))
            extra[mode] = {"temp_MiB": mem.get("temp_bytes", 0) / _common.MIB, "compile_s": mem["compile_s"]}
        best = _common.time_interleaved(fns, repeats=args.repeats)
        ref = best.get("xla_one_reference")
        for mode in modes:
            rep.add(batch=batch, L=length, W=hb, mode=mode, fwd_bwd_ms=1e3 * best[mode],
                    time_vs_default=best[mode] / ref if ref else None, **extra[mode])
    rep.note("time_vs_default: time / xla_one_reference time in the same run (> 1: slower than the default)")
    rep.finish()


if __name__ == "__main__":
    main()
