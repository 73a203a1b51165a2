"""Transport op forward + backward: time and peak memory, banded XLA path vs dense baselines.

For each length L (W=256, W=1024 at L=16384 by default; d=64, T=15, R=2, one pair, one head)
and implementation:
  * ``xla``: the banded op (``impl="xla"``, exact R-step tail adjoint, one reference plan);
  * ``xla-branch-free``: the banded op with ``branch_free=True`` (log-domain steps, two-pass
    log-sum-exps, no ``lax.cond`` in the loop: on a GPU each one waits on a host copy);
  * ``pallas``: the same op through the Pallas kernels (``impl="pallas"``; Triton on a GPU,
    Mosaic on a TPU; interpret mode on a CPU, slow: not in the default set);
  * ``pallas-resident``: the Triton kernels reading a score band stored once per call
    (``resident_scores=True``) instead of recomputing every tile (GPU; interpret mode on a CPU);
  * ``xla-unrolled``, ``pallas-resident-unrolled``: those with ``unroll=True`` (straight-line
    steps: no loop counters or per-step output writes; fewer kernel launches on a GPU);
  * ``pallas-fused``: ``pallas-resident-unrolled`` with ``fused_steps=True`` (a Sinkhorn step
    as two kernels that compute the potentials and the centering themselves);
  * ``pallas-one-pass``: ``pallas-fused`` with ``one_pass_steps=True`` (each step reads the
    band once: a program holds a few rows of it in registers);
  * ``pallas-fused-tf32x3``, ``pallas-one-pass-tf32x3``: those with ``triton_dots="tf32x3"``
    (the Triton dots on tensor cores as three TF32 products, f32 accumulation);
  * ``reference``: the same stopped-base surrogate computed densely and differentiated by JAX
    autodiff (``impl="reference"``);
  * ``ott``: ott-jax's dense log-domain Sinkhorn (``ott.solvers.linear.sinkhorn.Sinkhorn`` on a
    ``Geometry`` whose cost is minus the same scores, entries outside the band given a
    prohibitive cost so the support is the same), exactly T+R iterations, differentiated by
    unrolling (``implicit_diff=None``); O = L * plan @ V (ott's marginals are 1/L). Note it
    differentiates all T+R iterations (no stopped base) and updates columns first.
Every configuration runs in a fresh subprocess: ``peak_rss_MiB`` is that child's own peak
(``VmHWM``: interpreter + JAX runtime + compile + runs; ``ru_maxrss`` where it reports none,
which is the larger of that and the peak it inherited from this driver at the fork, ~180 MiB:
the same figure for any child above that); the time is the min over ``--repeats`` calls
after the compiling call. ``temp_MiB`` is XLA's compiled temporary memory. A dense baseline
is skipped (with the reason recorded) when its compiled memory exceeds ``--mem-budget-gib``.
Ratios are against ``reference`` at the same L in the same run: ``speedup_vs_ref`` =
reference time / time, ``rss_vs_ref`` = RSS / reference RSS. Every run also checks its
gradients: ``grad_err`` is the largest difference of dq, dk, dv (loss ``sum(w * O)``) from
those of ``grad_err_vs``, the dense ``reference`` at the same L where it ran, else ``xla``;
a target passes only with ``grad_err`` <= 1e-5, the op's promise (ott-jax differentiates
another function: it is not checked).

Targets (this 2-core CPU): at L=4096, W=256 xla >= 10x faster than reference; at L=16384,
W=1024 xla forward + backward under 2 GiB peak RSS. On a GPU (issue 11): at L=4096 W=256 >= 4x
and at L=16384 W=1024 >= 10x faster than reference, and >= 100x faster than ott at 16384.
The device it ran on is printed first (stderr) and under the table.

    python scripts/bench_transport.py --json              # all sizes, ~5-8 min on a loaded 2-core box
    python scripts/bench_transport.py --quick             # L 512..4096 only, 2 repeats (~2-4 min)
    python scripts/bench_transport.py --lengths 4096 --impls xla,reference
    python scripts/bench_transport.py --impls reference,xla,pallas    # on a GPU or TPU
    python scripts/bench_transport.py --impls reference,xla,xla-branch-free --lengths 1024,4096
    python scripts/bench_transport.py --impls reference,xla,pallas,pallas-resident    # on a GPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import _common
from pfamalign.kernels.config import IMPL_VARIANTS

IMPLS = ("reference", "ott", "xla")  # the default set; the other variants on request
KNOWN_IMPLS = ("ott",) + tuple(IMPL_VARIANTS)
# The parent only records the environment (which starts JAX's backend): on a GPU it must not
# preallocate the memory its children measure with (``_leave_gpu_memory_to_children``).
_PARENT_PREALLOCATE = "_BENCH_TRANSPORT_PARENT_PREALLOCATE"


def _child(cfg: dict) -> dict:
    """Runs one configuration in this (fresh) process and returns its measurements."""
    import jax.numpy as jnp

    length, hb, impl, d = cfg["L"], cfg["W"], cfg["impl"], cfg["d"]
    t, r, eps = cfg["T"], cfg["R"], cfg["eps"]
    q, k, v, w = _common.make_problem(1, 1, length, d, d)
    lens = jnp.array([length])
    dustbin = cfg.get("dustbin", "none")
    if impl == "ott":
        if dustbin != "none":
            return {"status": "skipped", "reason": "ott-jax has no dustbin"}
        op = _ott_op(length, hb, d, t + r, eps)
    else:
        import jax

        from pfamalign.kernels import DustbinTokens, TransportConfig, transport
        from pfamalign.kernels.config import impl_variant

        tc = TransportConfig(half_band=hb, eps=eps, base_steps=t, tail_steps=r, dustbin=dustbin,
                             **impl_variant(impl))
        tokens = None if dustbin == "none" else DustbinTokens(
            *(jax.random.normal(jax.random.PRNGKey(i), (1, n)) / 2 for i, n in enumerate((d, d, d))))
        op = lambda q, k, v: transport(q, k, v, lens, lens, tokens, config=tc)
    fb, mem = _common.compile_with_memory(_common.fwd_bwd(op), q, k, v, w)
    need = mem.get("temp_bytes", 0) + mem.get("argument_bytes", 0) + mem.get("output_bytes", 0)
    out = {"compile_s": mem["compile_s"], "temp_MiB": mem.get("temp_bytes", 0) / _common.MIB}
    if not impl.startswith("xla") and need > cfg["mem_budget_gib"] * 1024**3:
        return {**out, "status": "skipped",
                "reason": f"compiled memory {need / 1024**3:.1f} GiB > budget {cfg['mem_budget_gib']} GiB"}
    timing = _common.time_fn(fb, q, k, v, w, repeats=cfg["repeats"], budget_s=cfg["time_budget_s"])
    if cfg.get("save"):  # the last timed call's gradients, for the parent's check
        import numpy as np

        np.savez(cfg["save"], *(np.asarray(g) for g in timing["result"][1]))
    return {**out, "status": "ok", "fwd_bwd_ms": 1e3 * timing["min_s"], "first_call_ms": 1e3 * timing["first_s"],
            "peak_rss_bytes": _common.own_peak_rss_bytes()}


GRAD_TOL = 1e-5  # the op's promise: largest gradient difference from the dense reference
CHECKED_AGAINST = ("reference", "xla")  # the first of these that ran at a length


def _grad_err(saved: dict, length: int, impl: str) -> tuple[float | None, str | None]:
    """(largest |difference| of the gradients of ``impl`` from the first of CHECKED_AGAINST
    that ran at ``length``, its name); (None, None) for ott or with nothing to check against."""
    import numpy as np

    against = next((m for m in CHECKED_AGAINST if m != impl and (length, m) in saved), None)
    if impl == "ott" or (length, impl) not in saved or against is None:
        return None, None
    with np.load(saved[length, impl], allow_pickle=False) as mine, \
            np.load(saved[length, against], allow_pickle=False) as theirs:
        return max(float(np.max(np.abs(mine[f] - theirs[f]))) for f in mine.files), against


def _ott_op(length: int, hb: int, d: int, iterations: int, eps: float):
    """O = L * P V with P from ott-jax's Sinkhorn, exactly ``iterations`` unrolled iterations."""
    import jax.numpy as jnp
    import numpy as np
    from ott.geometry import geometry
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import sinkhorn

    solver = sinkhorn.Sinkhorn(threshold=-1.0, min_iterations=iterations, max_iterations=iterations,
                               inner_iterations=iterations, implicit_diff=None)

    def one(q, k, v):  # [L, d], [L, d], [L, dv]
        s = q @ k.T / np.sqrt(d)
        i = jnp.arange(length)
        band = jnp.abs(i[:, None] - i[None, :]) <= hb  # built in the trace: no L x L constant
        cost = jnp.where(band, -s, 1e4)  # outside the band: exp(-1e4 / eps) = 0, same support
        out = solver(linear_problem.LinearProblem(geometry.Geometry(cost_matrix=cost, epsilon=eps)))
        return length * out.matrix @ v

    return lambda q, k, v: one(q[0, 0], k[0, 0], v[0, 0])[None, None]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=_common.positive_int_list, default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--half-band", type=_common.positive_int, default=256, help="W (default 256)")
    ap.add_argument("--wide-from", type=int, default=16384,
                    help="use --wide-half-band from this L on (default 16384)")
    ap.add_argument("--wide-half-band", type=_common.positive_int, default=1024, help="default 1024")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"subset of {','.join(KNOWN_IMPLS)} (default {','.join(IMPLS)})")
    ap.add_argument("--dim", type=_common.positive_int, default=64, help="d = dv (default 64)")
    ap.add_argument("--base-steps", type=int, default=15, help="T (default 15)")
    ap.add_argument("--tail-steps", type=int, default=2, help="R (default 2)")
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--dustbin", choices=("none", "spoke", "capacity"), default="none",
                    help="dustbin mode (default none, issue 11's targets; spoke: the shipped models'); "
                         "ott-jax runs only without one")
    ap.add_argument("--mem-budget-gib", type=float, default=6.0,
                    help="skip a dense baseline whose compiled memory exceeds this (default 6: the dense "
                         "reference at L=16384 needs 7.0 GiB and ~100 s per call; pass 8 to include it, +7 min)")
    ap.add_argument("--time-budget-s", type=float, default=60.0,
                    help="stop repeating a configuration after this many seconds (at least one timed call)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child (default 900)")
    ap.add_argument("--quick", action="store_true", help="L 512..4096 and 2 repeats")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    _common.add_output_args(ap, repeats=3)
    args = ap.parse_args(argv)

    if args.child:  # one configuration, in its own process
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return
    if args.quick:
        args.lengths = [n for n in args.lengths if n <= 4096]
        args.repeats = min(args.repeats, 2)
    impls = [m for m in args.impls.split(",") if m]
    if unknown := sorted(set(impls) - set(KNOWN_IMPLS)):
        ap.error(f"unknown --impls {unknown}; choose from {', '.join(KNOWN_IMPLS)}")
    if not impls:
        ap.error(f"--impls names no implementation; choose from {', '.join(KNOWN_IMPLS)}")
    if min(args.base_steps, args.tail_steps) < 0 or args.base_steps + args.tail_steps == 0:
        ap.error("--base-steps and --tail-steps must be at least 0, and not both 0")
    if args.eps <= 0 or args.timeout <= 0:
        ap.error("--eps and --timeout must be above 0")
    device = _common.device_name()
    print(f"# device: {device}", file=sys.stderr, flush=True)
    # reference, then xla, first: the ratios and the gradient checks need them
    impls = sorted(impls, key=lambda m: (m != "reference", m != "xla"))
    cols = ["L", "W", "impl", "status", "fwd_bwd_ms", "speedup_vs_ref", "grad_err", "grad_err_vs", "peak_rss_MiB",
            "rss_vs_ref", "temp_MiB", "compile_s", "reason"]
    rep = _common.Report(f"Transport fwd+bwd: d={args.dim}, T={args.base_steps}, R={args.tail_steps}, eps={args.eps}, "
                         f"dustbin {args.dustbin}, one pair, one head", cols, json_lines=args.json, script="bench_transport",
                         config={k: v for k, v in vars(args).items() if k != "child"})
    results, saved, scratch = {}, {}, tempfile.mkdtemp(prefix="bench_transport_")
    try:
        _run_all(args, impls, rep, results, saved, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _targets(rep, results, device.split()[0] if args.dustbin == "none" else "none")  # targets: no dustbin
    rep.note(f"device: {device}")
    rep.finish()
    if not any(r.get("status") == "ok" for r in results.values()):
        sys.exit("bench_transport: no configuration ran (see the reasons above)")


def _run_all(args, impls, rep, results, saved, scratch):
    """Every (L, impl) in its own child: its row, with its gradients checked."""
    for length in args.lengths:
        hb = args.wide_half_band if length >= args.wide_from else args.half_band
        for impl in impls:
            cfg = {"L": length, "W": hb, "impl": impl, "d": args.dim, "T": args.base_steps, "R": args.tail_steps,
                   "eps": args.eps, "dustbin": args.dustbin, "repeats": args.repeats, "mem_budget_gib": args.mem_budget_gib,
                   "time_budget_s": args.time_budget_s, "save": os.path.join(scratch, f"{length}_{impl}.npz")}
            run = _common.run_child([sys.executable, __file__, "--child", json.dumps(cfg)], timeout=args.timeout)
            lines = [ln for ln in run["stdout"].splitlines() if ln.startswith("{")]
            if run["timed_out"]:
                res = {"status": "timeout", "reason": f"no result within {args.timeout:.0f} s"}
            elif run["returncode"] != 0 or not lines:
                res = {"status": "failed",
                       "reason": f"exit {run['returncode']}: {_common.failure_line(run['stderr'])[:200]}"}
            else:
                res = json.loads(lines[-1])
                if res.get("status") == "ok" and os.path.exists(cfg["save"]):
                    saved[length, impl] = cfg["save"]
                    res["grad_err"], res["grad_err_vs"] = _grad_err(saved, length, impl)
            # the child's own peak where it reported one (ru_maxrss is at least this driver's at the fork)
            res["peak_rss_MiB"] = res.pop("peak_rss_bytes", run["peak_rss_bytes"]) / _common.MIB
            results[(length, impl)] = res
            ref = results.get((length, "reference"), {})
            ok = res.get("status") == "ok" and ref.get("status") == "ok"
            rep.add(L=length, W=hb, impl=impl, **res,
                    speedup_vs_ref=ref["fwd_bwd_ms"] / res["fwd_bwd_ms"] if ok else None,
                    rss_vs_ref=res["peak_rss_MiB"] / ref["peak_rss_MiB"] if ok else None)


BANDED = tuple(n for n in IMPL_VARIANTS if n != "reference")  # the banded variants, each against the GPU targets


def _targets(rep, results, platform: str):
    """The targets of ``platform`` (the device's), stated as PASS / MISS where measured: on a
    CPU the CPU ones for xla, on a GPU issue 11's for each banded implementation; the dense
    crossover that sets ``impl="auto"`` on any device."""
    ok = lambda length, impl: results.get((length, impl), {}).get("status") == "ok"
    ms = lambda length, impl: results[(length, impl)]["fwd_bwd_ms"] if ok(length, impl) else None

    def verdict(length, impl, ratio, want):  # fast enough, and exact (its gradients checked)
        err, vs = (results[length, impl].get(f) for f in ("grad_err", "grad_err_vs"))
        exact = err is not None and err <= GRAD_TOL
        checked = f"gradients {err:.1e} from {vs}" if err is not None else "gradients not checked"
        return f"{checked}: {'PASS' if ratio >= want and exact else 'MISS'}"

    for impl in BANDED if platform == "gpu" else ():
        for length, want in ((4096, 4), (16384, 10)):
            if ok(length, impl) and ok(length, "reference"):
                ratio = ms(length, "reference") / ms(length, impl)
                rep.note(f"target L={length} W={_w(rep, length)}: {impl} {ratio:.1f}x faster than reference "
                         f"(>= {want}x on GPU), {verdict(length, impl, ratio, want)}")
        if ok(16384, impl) and ok(16384, "ott"):
            ratio = ms(16384, "ott") / ms(16384, impl)
            rep.note(f"target L=16384: {impl} {ratio:.1f}x faster than ott (>= 100x on GPU), "
                     f"{verdict(16384, impl, ratio, 100)}")
    if platform == "cpu" and ok(4096, "xla") and ok(4096, "reference"):
        ratio = ms(4096, "reference") / ms(4096, "xla")
        rep.note(f"target L=4096 W={_w(rep, 4096)}: xla {ratio:.1f}x faster than reference (>= 10x on CPU): "
                 f"{'PASS' if ratio >= 10 else 'MISS'}")
    from pfamalign.kernels.config import dense_crossover

    for impl in BANDED:
        lengths = sorted({length for length, i in results if i == impl})
        if lengths and any((n, "reference") in results for n in lengths):
            at = dense_crossover({n: (ms(n, "reference"), ms(n, impl)) for n in lengths})
            rep.note(f"dense crossover ({impl} vs reference on this device, kernels.config.dense_crossover): "
                     + (f"L = {at}" if at is not None else "none: it does not win at the longest L measured"))
    big = results.get((16384, "xla"), {})
    if platform == "cpu" and big.get("status") == "ok":
        gib = big["peak_rss_MiB"] / 1024
        rep.note(f"target L=16384 W={_w(rep, 16384)}: xla peak RSS {gib:.2f} GiB (< 2 GiB): "
                 f"{'PASS' if gib < 2 else 'MISS'}")


def _w(rep, length):
    return next((r["W"] for r in rep.rows if r["L"] == length), math.nan)


def _leave_gpu_memory_to_children() -> None:
    """Command line only: the parent runs without preallocation, its children with JAX's
    defaults (the marker tells them the parent set it)."""
    if "--child" in sys.argv:
        if os.environ.pop(_PARENT_PREALLOCATE, None):
            os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    elif "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        os.environ[_PARENT_PREALLOCATE] = "1"


if __name__ == "__main__":
    _leave_gpu_memory_to_children()
    main()
