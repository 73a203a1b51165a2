"""Static cost of the transport op's Triton kernels on an H100, read from their SASS on a host
without a GPU.

The op's forward + backward (``bench_transport``'s problem: one pair, d = dv = 64, T 15, R 2)
is traced with every ``pallas_gpu`` kernel call recorded (kernel, settings, operand shapes).
Each distinct call is lowered for "cuda" alone and compiled for sm_90 by PyPI ``triton``
(``kernels.triton_offline``); its SASS gives the warp instructions a program issues (its main
loop's body once per trip, the rest once). On each SM pipe that can bound it (instruction
issue, shared memory, MUFU, tensor cores: ``triton_offline.pipe_cycles``) that work takes
``cycles``; a kernel cannot take less than its busiest pipe's total over the SMs its programs
occupy, nor less than its operands' bytes over HBM bandwidth:

    compute = busiest pipe's cycles / min(programs, SMs) / clock,   memory = bytes / bandwidth
    bound = max(compute, memory)

A lower bound: latency, occupancy, bank conflicts and the launch are not in it. On the one
Triton measurement there is (the recomputing ``pallas`` kernels on an H100, 2026-11-24, all of
them compute-bound here: 42 calls, 47.6 ms of the 48.9 ms call at L 16384, W 1024, the rest
launches), the kernels took 4.9 times their bound (2.7x and 4.3x at L 4096 and 1024, where the
launch share is less certain; ``--calibrate`` prints these). So the estimate of a kernel is
``max(CALIBRATION x compute, memory / HBM_EFFICIENCY)``: the measured slowdown applied to the
work that showed it, streaming at 80 % of the bandwidth. Each JSON line gives a kernel's calls,
work, busiest pipe, bound and estimate, and ``gpu_kernel``, the name a GPU profile
(``profile_transport``) gives the same kernel; the last line per variant the sums, and with
``--launches`` (``count_gpu_launches``' counts) ``estimate_ms`` adds the other launches at
5.83 us (that script's fit).

    python scripts/triton_static_cost.py --impls pallas,pallas-one-pass,pallas-one-pass-tf32x3
    python scripts/triton_static_cost.py --impls pallas --lengths 1024,4096,16384 --calibrate
    python scripts/triton_static_cost.py --device h200 --impls pallas-fused-tf32x3 --lengths 16384 --profile P
        # P: profile_transport's JSON lines from a GPU; each kernel measured there / static

With ``--profile`` (``profile_transport``'s JSON lines from a GPU) each kernel's measured time
is set beside its static rows (matched by ``gpu_kernel``): one line per kernel with
``measured_over_bound`` and ``measured_over_estimate``, then one for all the Triton kernels
measured, whose ``measured_over_bound`` is the calibration these kernels call for.

Needs PyPI ``triton`` (the test extra); the tensor cores' rate is an assumption
(``HMMA_CYCLES``: mma.sync at half of Hopper's dense TF32 peak).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import pathlib
import re

import _common

SMS, CLOCK_GHZ, HBM_GBS = 132, 1.98, 3352.0  # the H100 as XLA describes it (count_gpu_launches)
# --device h200: the same chip (SMs, clocks, pipes) with HBM3e at 4.8 TB/s (datasheet): the
# machine lent now, so that a figure measured there has a prediction to meet. The calibration
# and the launch cost stay the H100's.
HBM_GBS_BY_DEVICE = {"h100": HBM_GBS, "h200": 4800.0}
HMMA_CYCLES = 8.0  # an HMMA.1688 (m16n8k8, TF32: 2,048 flops) on one sub-partition
US_PER_LAUNCH = 5.83  # count_gpu_launches' fit on the 2026-11-24 H100 figures
# Measured H100 time over the static bound of the recomputing Triton kernels (``pallas``), at
# L 16384, W 1024 (2026-11-24: 48.9 ms a call, of which 269 - 42 = 227 launches outside the
# Triton kernels at 5.83 us: 47.6 ms of kernels). Printed by --calibrate; see the README.
CALIBRATION = 4.9
HBM_EFFICIENCY = 0.8  # an assumption: streaming kernels' share of the peak bandwidth
MEASURED_PALLAS_KERNEL_MS = {1024: 3.99 - 249 * 5.83e-3, 4096: 3.68 - 325 * 5.83e-3, 16384: 48.9 - 227 * 5.83e-3}


def _record_calls(cfg, length: int) -> collections.Counter:
    """{(kernel name, settings, operand shapes): calls} of the op's forward + gradient, traced
    with the Triton wrapper forced (the calls the "cuda" lowering makes) and every ``lax.scan``
    (the solve's and the backward sweep's step loops) run as a Python loop, so that a step's
    kernels are recorded once per step."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import pallas_gpu, pallas_ops, transport

    calls = collections.Counter()
    counting = [True]  # not while a refusing branch (no CPU kernels) takes its output shapes
    names = ("band_scores", "band_lse", "band_product", "stored_lse", "stored_product", "stored_linear_product",
             "stored_row_half",
             "stored_col_half", "stored_one_pass_rows", "stored_one_pass_combine")
    real = {name: getattr(pallas_gpu, name) for name in names}

    def recorder(name):
        def call(*args, **static):
            shapes = tuple(None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
            calls[name, tuple(sorted((k, v) for k, v in static.items() if k != "interpret")), shapes] += counting[0]
            return real[name](*args, **static)
        return call

    def quiet_refusal(*args):
        counting[0] = False
        try:
            return refusal(*args)
        finally:
            counting[0] = True

    for name in names:
        setattr(pallas_gpu, name, recorder(name))
    refusal, pallas_ops._refusal = pallas_ops._refusal, quiet_refusal
    try:
        spec = jax.ShapeDtypeStruct((1, 1, length, 64), jnp.float32)
        lens = jnp.array([length])
        op = lambda q, k, v: transport(q, k, v, lens, lens, config=cfg)
        scan, jax.lax.scan = jax.lax.scan, _python_scan
        try:
            jax.eval_shape(_common.fwd_bwd(op), spec, spec, spec, spec)
        finally:
            jax.lax.scan = scan
    finally:
        for name in names:
            setattr(pallas_gpu, name, real[name])
        pallas_ops._refusal = refusal
    return calls


def _python_scan(f, init, xs=None, length=None, reverse=False, unroll=1, **unused):
    """``jax.lax.scan``'s semantics as a Python loop (each trip traced on its own)."""
    import jax
    import jax.numpy as jnp

    del unroll, unused
    n = length if xs is None else jax.tree.leaves(xs)[0].shape[0]
    carry, ys = init, []
    for i in (reversed(range(n)) if reverse else range(n)):
        carry, y = f(carry, None if xs is None else jax.tree.map(lambda a: a[i], xs))
        ys.append(y)
    ys = ys[::-1] if reverse else ys
    return carry, (jax.tree.map(lambda *a: jnp.stack(a), *ys) if ys else None)


def _trips(name: str, group: int, launch_geom, programs: int, tiles: int = 1) -> float:
    """Main-loop trips over all programs: a walk's key blocks, ``tiles`` a trip (the scores
    kernel: every band tile of its row); the one-pass combine's row groups."""
    from pfamalign.kernels.pallas_gpu import _key_range

    g = launch_geom
    blocks = sum(int(hi - lo) // tiles for lo, hi in (_key_range(i, g) for i in range(g.n_blocks)))
    if name == "band_scores":  # a row block's programs (one pair: its diagonal groups) share its tiles
        return -(-g.n_diag // (programs // g.n_blocks)) * programs
    if name == "stored_one_pass_rows":
        return 0.0
    if name == "stored_one_pass_combine":
        return blocks * g.block / group * (programs / (g.n_blocks + 2 * g.wb))
    return blocks * programs / g.n_blocks


def kernel_costs(cfg, length: int, workdir, hbm_gbs: float = HBM_GBS) -> list[dict]:
    """One dict per distinct Triton call of the op: calls, SASS work, pipe cycles and bound
    (memory at ``hbm_gbs``)."""
    import jax
    from jax._src.lib.mlir import ir

    from pfamalign.kernels import pallas_gpu, triton_offline
    from pfamalign.kernels.gpu_budget import KernelShape
    from pfamalign.kernels.pallas_ops import lower

    os.environ["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = []
    for i, ((name, static, shapes), n_calls) in enumerate(sorted(_record_calls(cfg, length).items(), key=str)):
        static = dict(static)
        fn = getattr(pallas_gpu, name).__wrapped__
        lowered = lower(jax.jit(functools.partial(fn, interpret=False, **static)), "cuda", *shapes)
        (call,) = triton_offline.custom_calls(lowered)
        config = call.attributes["mhlo.backend_config"]
        programs = 1
        for axis in ("grid_x", "grid_y", "grid_z"):
            programs *= ir.IntegerAttr(config[axis]).value
        compiled = triton_offline.compile_call(config, 90, workdir and workdir / f"L{length}-{i}")
        gpu_name = re.search(r"Function : (\S+)", compiled.sass)
        gpu_name = gpu_name and gpu_name.group(1)
        # A shifted half step's walk is its first loop; the exact walk after it is the fallback
        # (a line far from its stabilizer), left out of the estimate. A walk of several tiles a
        # trip (pallas_gpu.tiles_a_trip) has its main loop first, then at most one trip of the
        # rest (counted once a program, with the code outside the loop).
        shift_at = {"stored_row_half": 4, "stored_col_half": 5}.get(name)
        shifted = shift_at is not None and len(shapes) > shift_at and shapes[shift_at] is not None
        geom = static["geom"]
        tiles = pallas_gpu.wide_trips(pallas_gpu.tiles_a_trip(gpu_name or ""), geom)
        work = triton_offline.sass_work(compiled.sass, "first" if shifted or tiles > 1 else "longest")
        if name in ("band_lse", "band_product"):  # the recomputing kernels re-tile the band
            d = shapes[0].shape[-1]
            shape = (KernelShape(d) if name == "band_lse" else
                     KernelShape(d, shapes[4].shape[-1], 0 if shapes[5] is None else shapes[5].shape[-1]))
            geom = pallas_gpu.tiling(geom, shape)[0]
        group = geom.length // shapes[0].shape[1] if name == "stored_one_pass_combine" else 1
        trips = _trips(name, group, geom, programs, tiles) if work.has_loop else 0.0
        per_pipe = {pipe: programs * c for pipe, c in triton_offline.pipe_cycles(
            work.rest, compiled.num_warps, HMMA_CYCLES).items()}
        for pipe, c in triton_offline.pipe_cycles(work.body, compiled.num_warps, HMMA_CYCLES).items():
            per_pipe[pipe] += trips * c
        nbytes = sum(s.size * s.dtype.itemsize for s in jax.tree.leaves((shapes, lowered.out_info)) if s is not None)
        busiest = max(per_pipe, key=per_pipe.get)
        compute_us = per_pipe[busiest] / min(programs, SMS) / (CLOCK_GHZ * 1e3)
        memory_us = nbytes / (hbm_gbs * 1e3)
        # the name a GPU profile shows (the Pallas name: pallas_gpu.kernel_name), to match rows
        out.append({"kernel": name, "gpu_kernel": gpu_name, "calls": n_calls, "tiles_a_trip": tiles,
                    "programs": programs, "warps": compiled.num_warps,
                    "registers": compiled.registers, "loop_trips_per_program": round(trips / programs, 2),
                    "body_instructions": sum(work.body.values()), "rest_instructions": sum(work.rest.values()),
                    "busiest_pipe": busiest, "compute_us": round(compute_us, 2), "memory_us": round(memory_us, 2),
                    "bound_us": round(max(compute_us, memory_us), 2),
                    "estimate_us": round(max(CALIBRATION * compute_us, memory_us / HBM_EFFICIENCY), 2),
                    "settings": {k: v for k, v in static.items() if k != "geom"} | ({"shifted": True} if shifted else {})})
    return out


def as_measured(on: bool) -> None:
    """The kernels as they ran on the H100 on 2026-11-24 (padded dots, libdevice's expf, no
    line-sum products in the adjoint), or today's; clears jax's caches (the settings are read
    at trace time)."""
    import jax

    from pfamalign.kernels import pallas_gpu, sinkhorn, tile_math

    pallas_gpu.PADDED_DOTS, tile_math.EXP2, sinkhorn.COMPUTED_LINE_SUMS = on, not on, not on
    jax.clear_caches()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default="pallas,pallas-fused,pallas-one-pass,pallas-fused-tf32x3,pallas-one-pass-tf32x3",
                    help="comma-separated names of kernels.config.IMPL_VARIANTS with impl 'pallas'")
    ap.add_argument("--lengths", type=_common.positive_int_list, default=[4096, 16384])
    ap.add_argument("--launches", default="",
                    help="IMPL:L:N,... launches a call (count_gpu_launches.py), for estimate_ms")
    ap.add_argument("--device", choices=sorted(HBM_GBS_BY_DEVICE), default="h100",
                    help="whose memory bandwidth bounds the streaming kernels (default h100)")
    ap.add_argument("--profile", type=pathlib.Path,
                    help="profile_transport's JSON lines from a GPU: each kernel's measured time beside its rows")
    ap.add_argument("--calibrate", action="store_true",
                    help="print measured / bound of the recomputing kernels (impl pallas) where measured, "
                         "compiled as they ran then (as_measured)")
    args = ap.parse_args(argv)
    import tempfile

    from pfamalign.kernels.config import IMPL_VARIANTS

    for impl in args.impls.split(","):
        if IMPL_VARIANTS.get(impl, {}).get("impl") != "pallas":
            ap.error(f"--impls: {impl!r} has no Triton kernels; choose from "
                     + ", ".join(n for n, v in IMPL_VARIANTS.items() if v["impl"] == "pallas"))
    if args.calibrate:
        as_measured(True)
    launches = {}
    for item in filter(None, args.launches.split(",")):
        impl, length, n = item.split(":")
        launches[impl, int(length)] = int(n)
    profile = []
    if args.profile:
        try:
            profile = [json.loads(s) for s in args.profile.read_text().splitlines() if s.startswith("{")]
        except (OSError, ValueError) as e:
            ap.error(f"--profile {args.profile}: {e}")
    with tempfile.TemporaryDirectory(prefix="triton_static_cost_") as tmp:
        _report(args, launches, pathlib.Path(tmp), profile)


def against_profile(rows: list[dict], measured: list[dict]) -> list[dict]:
    """Static ``rows`` (``kernel_costs``) beside the ops of one GPU profile (``profile_transport``
    rows of the same L and variant: op name, calls and ms a call of the op), by kernel name:
    one dict per kernel the profile timed, then their total (``gpu_kernel`` "(all measured)")."""
    static = collections.defaultdict(lambda: {"calls": 0, "bound_ms": 0.0, "estimate_ms": 0.0})
    for r in rows:
        s = static[r["gpu_kernel"]]
        s["calls"] += r["calls"]
        s["bound_ms"] += r["calls"] * r["bound_us"] / 1e3
        s["estimate_ms"] += r["calls"] * r["estimate_us"] / 1e3
    # A kernel launched from two places in the program is two ops of the profile, the second
    # named as XLA names a duplicate (``stored_rows_product__1``): one kernel here.
    timed = {}
    for m in measured:
        name = re.sub(r"__\d+$", "", m.get("op") or "")
        if name in static:
            t = timed.setdefault(name, {"calls": 0, "ms": 0.0})
            t["calls"] += m.get("calls") or 0
            t["ms"] += m["ms"]
    out = [{"gpu_kernel": name, "calls": static[name]["calls"], "measured_calls": t["calls"], "measured_ms": t["ms"],
            "bound_ms": static[name]["bound_ms"], "estimate_ms": static[name]["estimate_ms"]}
           for name, t in timed.items()]
    if out:
        out.append({"gpu_kernel": "(all measured)", "calls": sum(o["calls"] for o in out),
                    "measured_calls": sum(o["measured_calls"] or 0 for o in out),
                    **{f: sum(o[f] for o in out) for f in ("measured_ms", "bound_ms", "estimate_ms")}})
    for o in out:
        o["measured_over_bound"] = o["measured_ms"] / o["bound_ms"] if o["bound_ms"] else None
        o["measured_over_estimate"] = o["measured_ms"] / o["estimate_ms"] if o["estimate_ms"] else None
    return out


def _report(args, launches: dict, workdir, profile: list[dict]) -> None:
    """Prints the per-kernel rows and the per-variant totals (module doc), and each kernel
    against ``profile`` where it has rows of the same L and variant."""
    from pfamalign.kernels import TransportConfig
    from pfamalign.kernels.config import impl_variant

    for length in args.lengths:
        half_band = 1024 if length >= 16384 else 256
        for impl in args.impls.split(","):
            cfg = TransportConfig(half_band=half_band, base_steps=15, tail_steps=2, kernel="gpu", interpret=False,
                                  **impl_variant(impl))
            rows = kernel_costs(cfg, length, workdir, HBM_GBS_BY_DEVICE[args.device])
            for row in rows:
                print(json.dumps({"L": length, "W": half_band, "impl": impl, "device": args.device, **row}),
                      flush=True)
            bound_ms = sum(r["calls"] * r["bound_us"] for r in rows) / 1e3
            estimate_ms = sum(r["calls"] * r["estimate_us"] for r in rows) / 1e3
            total = {"L": length, "W": half_band, "impl": impl, "device": args.device,
                     "triton_calls": sum(r["calls"] for r in rows),
                     "triton_bound_ms": round(bound_ms, 3), "calibration": CALIBRATION,
                     "triton_estimate_ms": round(estimate_ms, 3)}
            if (impl, length) in launches:
                other = launches[impl, length] - total["triton_calls"]
                total["estimate_ms"] = round(estimate_ms + other * US_PER_LAUNCH / 1e3, 3)
            if args.calibrate and impl == "pallas" and length in MEASURED_PALLAS_KERNEL_MS:
                total["measured_kernels_ms"] = round(MEASURED_PALLAS_KERNEL_MS[length], 2)
                total["measured_over_bound"] = round(MEASURED_PALLAS_KERNEL_MS[length] / bound_ms, 2)
            print(json.dumps(total), flush=True)
            measured = [p for p in profile if p.get("L") == length and p.get("impl") == impl]
            for row in against_profile(rows, measured):
                print(json.dumps({"L": length, "W": half_band, "impl": impl, "device": args.device,
                                  **{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}}),
                      flush=True)


if __name__ == "__main__":
    main()
