"""Memory of the R = 2 backward (docs/design.md §3.5): analytic bytes plus XLA's own accounting.

Analytic, per problem (one pair, one head), float32:
  * ``active_M``: band entries |i - j| <= W (``band.active_entries``), in millions;
  * ``four_plans_MiB``: the direct schedule keeps the four tail plans A^1, B^1, A^2, B^2
    resident (4 x active x 4 B); ``one_ref_MiB``: the one-reference schedule keeps only the
    output plan P (1 x active x 4 B) — every other plan is a diagonal rescaling of it;
  * ``band_tiles_MiB``: what the XLA path actually lays out per band-sized array, the
    ``n_diag x b x Lp`` tiles including the masked corners of the edge tiles;
  * the Pallas path's O(L) schedule (score tiles recomputed from q, k in every kernel):
    ``pallas_vectors_MiB`` = q, k, v, O, dO, dq, dk, dv (``L x d``, d = dv here), the potentials
    (v^0, û^r, u^r, v^r, u_F, v_F: 3R + 3 vectors), adjoint vectors (α_r, β_r, ū, v̄: 2R + 2),
    orbit scales (4R) and the factors X, Z (``L x (dv + 2R)``); ``pallas_tile_KiB`` = the
    working set of one kernel instance: a logits/plan tile and a modulation tile (b x b), q and
    k tiles (b x d), x and z tiles (b x (dv + 2R)), a y tile and an accumulator (b x d),
    single-buffered (the pipeline double-buffers the input tiles).
Measured (``--measure``, default on): XLA's compiled temporary memory of the XLA path's
backward alone (``bwd_temp_MiB``: the VJP applied to stored residuals) and of forward +
backward (``fwd_bwd_temp_MiB``), from ``jax.jit(...).lower(...).compile().memory_analysis()``
on abstract shapes (nothing is run, so any size compiles quickly).

    python scripts/estimate_r2_backward_memory.py          # includes L=16384, W=1024, b=128, d=64 (~1-2 min)
    python scripts/estimate_r2_backward_memory.py --cases 16384x1024 --no-measure
"""

from __future__ import annotations

import argparse

import _common

DEFAULT_CASES = "1024x256,2048x256,4096x256,8192x256,16384x256,16384x1024"


def analytic(length: int, half_band: int, block: int, d: int, dv: int, tail: int) -> dict:
    """Analytic bytes of the R-step backward for one problem (float32)."""
    from pfamalign.kernels.band import active_entries, make_geometry

    f32, mib = 4, _common.MIB
    active = active_entries(length, length, half_band)
    geom = make_geometry(length, half_band, block)
    n1 = length + 1  # + the dustbin slot
    m = dv + 2 * tail
    vectors = (4 * length * d + 4 * length * dv  # q, k, dq, dk; v, O, dO, dv
               + (3 * tail + 3) * n1 + (2 * tail + 2) * n1 + 4 * tail * n1  # potentials, adjoints, scales
               + 2 * n1 * m)  # X, Z
    tiles = 2 * block * block + 2 * block * d + 2 * block * m + 2 * block * d
    return {"active_M": active / 1e6, "four_plans_MiB": 4 * active * f32 / mib, "one_ref_MiB": active * f32 / mib,
            "band_tiles_MiB": geom.n_diag * geom.block * geom.length * f32 / mib,
            "pallas_vectors_MiB": vectors * f32 / mib, "pallas_tile_KiB": tiles * f32 / 1024.0}


def measured(length: int, half_band: int, block: int, d: int, tail: int, base: int) -> dict:
    """XLA's compiled temp memory of the backward and of forward + backward (abstract shapes)."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import BlockSizes, TransportConfig, transport

    cfg = TransportConfig(half_band=half_band, base_steps=base, tail_steps=tail, blocks=BlockSizes(block))
    lens = jnp.array([length])
    op = lambda q, k, v: transport(q, k, v, lens, lens, config=cfg)
    x = jax.ShapeDtypeStruct((1, 1, length, d), jnp.float32)
    fwd, bwd = _common.split_fwd_bwd(op)
    _, vjp = jax.eval_shape(fwd, x, x, x)
    out = {}
    for name, fn, args in (("bwd", bwd, (vjp, x)), ("fwd_bwd", _common.fwd_bwd(op), (x, x, x, x))):
        mem = _common.compile_with_memory(fn, *args)[1]
        out[f"{name}_temp_MiB"] = mem["temp_bytes"] / _common.MIB if "temp_bytes" in mem else None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=_common.shapes_list(2, "LxW"), default=DEFAULT_CASES, help=f"LxW list (default {DEFAULT_CASES})")
    ap.add_argument("--block", type=int, default=128, help="tile edge b (default 128)")
    ap.add_argument("--dim", type=int, default=64, help="d = dv (default 64)")
    ap.add_argument("--tail-steps", type=int, default=2, help="R (default 2)")
    ap.add_argument("--base-steps", type=int, default=15, help="T, for the measured compile (default 15)")
    ap.add_argument("--no-measure", dest="measure", action="store_false", help="analytic columns only")
    _common.add_output_args(ap, repeats=None)
    args = ap.parse_args(argv)

    cols = ["L", "W", "active_M", "four_plans_MiB", "one_ref_MiB", "band_tiles_MiB", "pallas_vectors_MiB",
            "pallas_tile_KiB"] + (["bwd_temp_MiB", "fwd_bwd_temp_MiB"] if args.measure else [])
    rep = _common.Report(f"R={args.tail_steps} backward memory per problem: b={args.block}, d=dv={args.dim}, float32",
                         cols, json_lines=args.json, script="estimate_r2_backward_memory",
                         config={**vars(args), "cases": [f"{a}x{b}" for a, b in args.cases]})
    for length, hb in args.cases:
        row = {"L": length, "W": hb, **analytic(length, hb, args.block, args.dim, args.dim, args.tail_steps)}
        if args.measure:
            row.update(measured(length, hb, args.block, args.dim, args.tail_steps, args.base_steps))
        rep.add(**row)
    rep.note("four_plans / one_ref = 4 exactly; the XLA path keeps band-sized arrays (band_tiles_MiB each) "
             "resident in its backward, the Pallas path only O(L) vectors and per-instance tiles.")
    rep.finish()


if __name__ == "__main__":
    main()
