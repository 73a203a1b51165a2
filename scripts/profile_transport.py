"""Where the transport op's time goes, kernel by kernel: the profile behind a speed-up.

For each length L and implementation, the op's forward + backward (as ``bench_transport.py``
times it: d = 64, T = 15, R = 2, one pair) is compiled, its optimized HLO written as text, and
``--repeats`` calls traced with ``jax.profiler``; the trace is read back here
(``jax.profiler.ProfileData``, no TensorBoard needed) and every executed op or kernel is
summed by name: one JSON line per (L, impl, op) with its events and milliseconds in one call
of the op (``calls``, ``ms``) and its share of the traced time, the largest first, after one
line for the whole call (``ms_per_call``: the fastest of ``--repeats``, untraced). On a GPU the names are the XLA fusions and
custom calls (cuBLAS GEMMs, Triton kernels) of the device's streams, so a slow fusion is found
by name in the dumped HLO (``OUT/hlo/L<L>_<impl>.txt``). XLA's GPU command buffers (CUDA graphs)
are off while profiling unless ``--command-buffers``: the kernels a graph launches are not
attributed in the trace (on an H200, 2026-11-29, with them on, 0.08 ms of a 3.5 ms call was
traced, two ops of about seventy), so the whole call is timed without them too; the head line's
``traced_share`` says how much of the call the trace accounts for.

    python scripts/profile_transport.py --lengths 4096,8192 --impls xla          # the 4096 anomaly
    python scripts/profile_transport.py --lengths 1024 --top 10 --out /tmp/prof  # quick, on a CPU
    bash scripts/gpu_session.sh profile                                         # on the lent GPU
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pathlib
import shutil
import sys
import tempfile

import _common

# Host-side bookkeeping lines of a trace (what dispatches, not what computes).
_SKIP_LINES = ("python",)
_SKIP_EVENTS = ("ThunkExecutor::Execute", "ThunkExecutor::Execute (wait for completion)")  # and the
# "end: ..." markers of a CPU trace


def _leaves(events: list) -> list:
    """The events of one trace line that contain no other (a CPU's while loop holds its body's
    ops: only the ops are counted, so the times add up)."""
    events = sorted(events, key=lambda e: (e.start_ns, -e.end_ns))
    leaves = []
    for n, event in enumerate(events):
        after = events[n + 1] if n + 1 < len(events) else None
        if after is None or after.start_ns >= event.end_ns:
            leaves.append(event)
    return leaves


def trace_lines(xspace: str) -> dict:
    """``{"plane / line": [events, ms, a sample of names]}`` of every line of a trace: where its
    kernels went when the per-op times miss them."""
    import jax

    data = jax.profiler.ProfileData.from_file(xspace)
    summary = {}
    for plane in data.planes:
        for line in plane.lines:
            events = list(line.events)
            names = sorted({e.name for e in events})
            summary[f"{plane.name} / {line.name}"] = [len(events), sum(e.duration_ns for e in events) / 1e6,
                                                      names[:6]]
    return summary


def op_times(xspace: str) -> tuple[str, collections.Counter, collections.Counter]:
    """``(which planes, total ns per op name, events per op name)`` of a trace: the device
    planes when the trace has any (a GPU's kernels), else the host's (a CPU's XLA ops); only
    innermost events (``_leaves``)."""
    import jax

    data = jax.profiler.ProfileData.from_file(xspace)
    planes = [p for p in data.planes if p.name.startswith("/device:")] or \
             [p for p in data.planes if p.name.startswith("/host:CPU")]
    total, count = collections.Counter(), collections.Counter()
    for plane in planes:
        # A GPU stream's kernels do not nest, but back-to-back ones overlap by their clocks'
        # skew: as "leaves" only the last of each run was kept (on an H200, 2026-11-30, 0.2 of
        # 0.8 ms traced, every Triton kernel missing). A CPU line nests ops in their loops.
        leaves = (lambda events: events) if plane.name.startswith("/device:") else _leaves
        for line in plane.lines:
            if line.name in _SKIP_LINES:
                continue
            for event in leaves([e for e in line.events
                                 if e.name not in _SKIP_EVENTS and not e.name.startswith("end: ")]):
                total[event.name] += event.duration_ns
                count[event.name] += 1
    return ",".join(p.name for p in planes), total, count


def profile(length: int, half_band: int, impl: str, repeats: int, out: pathlib.Path, top: int,
            dustbin: str = "none") -> list[dict]:
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import DustbinTokens, TransportConfig, transport
    from pfamalign.kernels.config import impl_variant

    q, k, v, w = _common.make_problem(1, 1, length, 64, 64)
    lens = jnp.array([length])
    tc = TransportConfig(half_band=half_band, eps=1.0, base_steps=15, tail_steps=2,
                         dustbin=dustbin, **impl_variant(impl))
    tokens = None if dustbin == "none" else DustbinTokens(  # as bench_transport's
        *(jax.random.normal(jax.random.PRNGKey(i), (1, 64)) / 2 for i in range(3)))
    fb = jax.jit(_common.fwd_bwd(lambda q, k, v: transport(q, k, v, lens, lens, tokens, config=tc)))
    compiled = fb.lower(q, k, v, w).compile()
    from pfamalign.kernels.pallas_gpu import SCORE_GROUPS

    name = (f"L{length}_W{half_band}_{impl}" + ("" if dustbin == "none" else f"_{dustbin}")
            + ("" if SCORE_GROUPS == 1 else f"_groups{SCORE_GROUPS}"))
    hlo = out / "hlo" / f"{name}.txt"
    hlo.parent.mkdir(parents=True, exist_ok=True)
    hlo.write_text(compiled.as_text())
    timing = _common.time_fn(compiled, q, k, v, w, repeats=repeats)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(repeats):
                _common.block(compiled(q, k, v, w))
        (xspace,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
        planes, total, count = op_times(xspace)
        lines = trace_lines(xspace)
        kept = out / "trace" / f"{name}.xplane.pb"  # for another reader (TensorBoard)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(xspace, kept)
    traced_ms = sum(total.values()) / 1e6 / repeats
    head = {"L": length, "W": half_band, "impl": impl, "dustbin": dustbin, "op": "(whole call)", "calls": 1,
            "ms_per_call": 1e3 * timing["min_s"], "traced_ms_per_call": traced_ms,
            "traced_share": traced_ms / (1e3 * timing["min_s"]), "ops": len(total), "planes": planes,
            "hlo": str(hlo), "trace": str(kept), "lines": lines}
    if head["traced_share"] < 0.5:
        print(f"warning: L {length} {impl}: the trace accounts for {head['traced_share']:.0%} of the call "
              f"({traced_ms:.3f} of {head['ms_per_call']:.3f} ms): the per-op times miss most of it"
              + (" (GPU command buffers on?)" if jax.default_backend() == "gpu" else ""), file=sys.stderr)
    rows = [{"L": length, "W": half_band, "impl": impl, "op": name, "calls": count[name] // repeats,
             "ms": ns / 1e6 / repeats, "share": ns / max(sum(total.values()), 1)}
            for name, ns in total.most_common(top)]
    return [head, *rows]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=_common.positive_int_list, default=[4096, 8192])
    parser.add_argument("--half-band", type=int, default=256)
    parser.add_argument("--impls", default="xla", help="comma-separated names of kernels.config.IMPL_VARIANTS (reference, xla, pallas, "
                             "pallas-fused-tf32x3, ...)")
    parser.add_argument("--repeats", type=_common.positive_int, default=3)
    parser.add_argument("--top", type=int, default=25, help="ops listed per configuration, the slowest first")
    parser.add_argument("--streaming-tiles", type=int, default=None,
                        help="band tiles a trip of the Triton kernels' streaming walks (default: "
                             "kernels.pallas_gpu.STREAMING_TILES_A_TRIP); 1 measures the walks as they were before "
                             "2026-11-29")
    parser.add_argument("--score-groups", type=_common.positive_int_list, default=None,
                        help="comma-separated programs a row block of the band's scores kernel, each profiled "
                             "(kernels.pallas_gpu.SCORE_GROUPS; default: its value)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT") or "/tmp/profile_transport"),
                        help="where the HLO text and the trace (xplane.pb) go (default: $OUT, else "
                             "/tmp/profile_transport)")
    parser.add_argument("--dustbin", choices=("none", "spoke", "capacity"), default="none",
                        help="dustbin mode (default none, bench_transport's; spoke: the shipped models')")
    parser.add_argument("--command-buffers", action="store_true",
                        help="keep XLA's GPU command buffers (CUDA graphs) on: the call as it runs, but the "
                             "kernels they launch are missing from the trace")
    args = parser.parse_args(argv)
    from pfamalign.kernels.config import IMPL_VARIANTS  # no jax backend started yet

    if not (impls := [m for m in args.impls.split(",") if m]) or set(impls) - set(IMPL_VARIANTS):
        parser.error(f"--impls must name some of {', '.join(IMPL_VARIANTS)}; got {args.impls!r}")
    if not args.command_buffers:  # read when the backend starts, below
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_enable_command_buffer=".strip()
    import jax

    from pfamalign.kernels import pallas_gpu

    if args.streaming_tiles is not None:  # read when the kernels are traced
        pallas_gpu.STREAMING_TILES_A_TRIP = args.streaming_tiles
    print(f"device: {_common.device_name()}", file=sys.stderr)
    for groups in args.score_groups or [pallas_gpu.SCORE_GROUPS]:
        pallas_gpu.SCORE_GROUPS = groups
        jax.clear_caches()  # the kernels read it when traced: no trace of another value is reused
        for length in args.lengths:
            for impl in impls:
                for row in profile(length, args.half_band, impl, args.repeats, args.out, args.top, args.dustbin):
                    print(json.dumps({**row, "streaming_tiles": pallas_gpu.STREAMING_TILES_A_TRIP,
                                      "score_groups": groups, "command_buffers": args.command_buffers,
                                      "script": "profile_transport", "env": _common.environment()}), flush=True)


if __name__ == "__main__":
    main()
