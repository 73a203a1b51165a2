"""Triton tiling sweep of the banded kernels, then the op under the fastest tilings (GPU only).

1. Traces the op (forward + backward, the benchmark's settings, the Triton variant ``--impl``)
   to collect the kernel shapes it launches (``pallas_gpu.tiling``'s ``KernelShape`` and band
   geometry per call site).
2. Times each kernel shape alone for every (tile edge, num_warps, num_stages) that compiles:
   one JSON line per tiling (``ms`` per call: ``KERNEL_REPEATS`` chained calls in one jit, so
   no per-call Python dispatch, min of 3). A stored band's kernels ("pallas-resident") keep
   the band's tile edge (only the launch settings are free); their LSE and product lines time
   the row walk and the column walk together (one forced tiling serves both).
3. Forces the fastest tiling per shape (``pallas_gpu.FORCED_TILING``) and times the whole op
   against the banded XLA path and dense autodiff in the same process (``speedup_vs_ref``).

    python scripts/tune_triton.py                       # L 4096 W 256 sweep; op at 4096, 16384
    python scripts/tune_triton.py --impl pallas-resident --op-lengths 4096,16384
    python scripts/tune_triton.py --op-lengths 1024,4096,16384 --budget-s 240
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import _common
from pfamalign.kernels.config import IMPL_VARIANTS

TRITON_VARIANTS = tuple(name for name, v in IMPL_VARIANTS.items() if v["impl"] == "pallas")  # Triton kernels


def _collect_shapes(length: int, hb: int, d: int, t: int, r: int, impl: str = "pallas"):
    """{KernelShape: BandGeometry} of the op's Triton calls at this size (lowered for cuda)
    under the variant ``impl`` (``TRITON_VARIANTS``)."""
    import jax

    from pfamalign.kernels import TransportConfig, pallas_gpu, transport
    from pfamalign.kernels.config import impl_variant
    from pfamalign.kernels.pallas_ops import lower

    seen, original = {}, pallas_gpu.tiling

    def spy(geom, shape):
        seen.setdefault(shape, geom)
        return original(geom, shape)

    pallas_gpu.tiling = spy
    try:
        q, k, v, w = _common.make_problem(1, 1, length, d, d)
        lens = jax.numpy.array([length])
        tc = TransportConfig(half_band=hb, base_steps=t, tail_steps=r, kernel="gpu", **impl_variant(impl))
        fb = _common.fwd_bwd(lambda q, k, v: transport(q, k, v, lens, lens, config=tc))
        lower(fb, "cuda", q, k, v, w)
    finally:
        pallas_gpu.tiling = original
    return seen


KERNEL_REPEATS = 50  # kernel calls chained inside one jit: per-call time without dispatch


def _kernel_call(shape, geom):
    """A fresh jit (so a forced tiling is traced anew) that runs the kernel of this shape
    ``KERNEL_REPEATS`` times in a loop, each call's offsets depending on the last call; and its
    inputs: ``(fn, args)``. A stored band's LSE and products run both walks (rows, columns)."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import pallas_gpu

    n, lp = 1, geom.length
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    arr = lambda f: 0.1 * jax.random.normal(next(keys), (n, lp, f), jnp.float32)
    zeros = jnp.zeros((n, lp), jnp.float32)
    xz = (arr(shape.mx), arr(shape.mx)) if shape.mx else ()
    prepare = lambda *ops: ops  # the operands' set-up, inside the jit but outside the loop
    if shape.stored and shape.d:  # the scores kernel that stores the band
        kernel = lambda off, q, k: pallas_gpu.band_scores.__wrapped__(q, k, off, off, geom=geom)
        operands = (arr(shape.d), arr(shape.d))
    elif shape.stored:  # the kernels that read the band: stored once, before the loop
        if shape.m == 0:
            walk = lambda off, band, transposed: pallas_gpu.stored_lse.__wrapped__(
                band, jnp.ones_like(off), off, geom=geom, transposed=transposed)
        else:
            walk = lambda off, band, *rest, transposed: pallas_gpu.stored_product.__wrapped__(
                band, jnp.ones_like(off), off, off, *rest, geom=geom, transposed=transposed)
        kernel = lambda off, *ops: walk(off, *ops, transposed=False) + walk(off, *ops, transposed=True)
        prepare = lambda q, k, *rest: (pallas_gpu.band_scores.__wrapped__(q, k, zeros, zeros, geom=geom),
                                       *rest)
        operands = (arr(16), arr(16)) + ((arr(shape.m),) + xz if shape.m else ())
    elif shape.m == 0:
        kernel = lambda off, q, k: pallas_gpu.band_lse.__wrapped__(q, k, off, geom=geom)
        operands = (arr(shape.d), arr(shape.d))
    else:
        kernel = lambda off, q, k, *rest: pallas_gpu.band_product.__wrapped__(q, k, off, off, *rest, geom=geom)
        operands = (arr(shape.d), arr(shape.d), arr(shape.m), *xz)

    def chained(off, *operands):
        operands = prepare(*operands)
        body = lambda _, off: off + 0.0 * jnp.sum(kernel(off, *operands))
        return jax.lax.fori_loop(0, KERNEL_REPEATS, body, off)

    return jax.jit(chained), (zeros, *operands)


def _profile(out_dir: str, name: str, fn, *args) -> None:
    """A perfetto trace of a few calls of ``fn`` (compiled first) under ``out_dir/name``."""
    import jax

    _common.block(fn(*args))
    with jax.profiler.trace(f"{out_dir}/{name}", create_perfetto_trace=True):
        for _ in range(3):
            _common.block(fn(*args))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", default="pallas", choices=TRITON_VARIANTS,
                    help="the Triton variant swept and timed (kernels.config.IMPL_VARIANTS)")
    ap.add_argument("--length", type=int, default=4096, help="L of the sweep (default 4096)")
    ap.add_argument("--half-band", type=int, default=256)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--base-steps", type=int, default=15)
    ap.add_argument("--tail-steps", type=int, default=2)
    ap.add_argument("--blocks", type=_common.int_list, default=[16, 32, 64, 128])
    ap.add_argument("--warps", type=_common.int_list, default=[2, 4, 8])
    ap.add_argument("--stages", type=_common.int_list, default=[1, 2, 3])
    ap.add_argument("--op-lengths", type=_common.int_list, default=[4096, 16384],
                    help="time the whole op at these L (W 1024 from 16384) after the sweep")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop the sweep after this long")
    ap.add_argument("--profile", metavar="DIR",
                    help="also write a perfetto trace of each impl's op under DIR/<impl>_<L>")
    args = ap.parse_args(argv)

    import jax

    from pfamalign.kernels import TransportConfig, pallas_gpu, transport
    from pfamalign.kernels.band import make_geometry
    from pfamalign.kernels.config import impl_variant
    from pfamalign.kernels.gpu_budget import GpuTiling

    emit = lambda row: print(json.dumps({"script": "tune_triton", "device": _common.device_name(), **row}),
                             flush=True)
    if jax.default_backend() != "gpu":
        sys.exit(f"tune_triton needs a GPU backend, have {jax.default_backend()!r}")
    shapes = _collect_shapes(args.length, args.half_band, args.dim, args.base_steps, args.tail_steps, args.impl)
    start, best = time.perf_counter(), {}
    for shape, geom in shapes.items():
        for block, warps, stages in itertools.product(args.blocks, args.warps, args.stages):
            # a stored band keeps its tile edge: only the launch settings are swept
            legal = block == geom.block if shape.stored else geom.block % block == 0
            if not legal or time.perf_counter() - start > args.budget_s:
                continue
            tiling = GpuTiling(block, warps, stages)
            pallas_gpu.FORCED_TILING[shape] = tiling
            kind = "scores" if shape.stored and shape.d else "lse" if shape.m == 0 else "product"
            row = {"kernel": kind, "impl": args.impl, "shape": vars(shape), "L": args.length,
                   "W": args.half_band, "block": block, "num_warps": warps, "num_stages": stages}
            try:
                fn, call_args = _kernel_call(shape, make_geometry(geom.length, geom.half_band, geom.block,
                                                                   pallas=True))
                ms = 1e3 * _common.time_fn(fn, *call_args)["min_s"] / KERNEL_REPEATS
                emit({**row, "ms": ms})
                if ms < best.get(shape, (float("inf"),))[0]:
                    best[shape] = (ms, tiling)
            except Exception as err:  # noqa: BLE001  (a tiling that does not compile is a result)
                emit({**row, "error": f"{type(err).__name__}: {str(err)[:200]}"})
        pallas_gpu.FORCED_TILING.pop(shape, None)
    jax.clear_caches()  # the kernels traced while collecting shapes keep their old tiling otherwise
    for shape, (ms, tiling) in best.items():
        emit({"best": vars(tiling), "shape": vars(shape), "ms": ms})
        pallas_gpu.FORCED_TILING[shape] = tiling

    for length in args.op_lengths:
        hb = 1024 if length >= 16384 else args.half_band
        q, k, v, w = _common.make_problem(1, 1, length, args.dim, args.dim)
        lens = jax.numpy.array([length])
        times = {}
        for impl in ("reference", "xla", args.impl):
            tc = TransportConfig(half_band=hb, base_steps=args.base_steps, tail_steps=args.tail_steps,
                                 **impl_variant(impl))
            fb = _common.fwd_bwd(lambda q, k, v, tc=tc: transport(q, k, v, lens, lens, config=tc))
            times[impl] = 1e3 * _common.time_fn(fb, q, k, v, w, repeats=5)["min_s"]
            if args.profile:
                _profile(args.profile, f"{impl}_{length}", fb, q, k, v, w)
        for impl, ms in times.items():
            emit({"op": impl, "L": length, "W": hb, "fwd_bwd_ms": ms, "speedup_vs_ref": times["reference"] / ms,
                  "tuned": impl == args.impl})


if __name__ == "__main__":
    main()
