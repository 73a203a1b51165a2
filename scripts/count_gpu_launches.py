"""Kernel launches of the transport op's forward + backward as XLA compiles it for an NVIDIA
H100, counted on a host without a GPU (XLA's deviceless compilation for a described target).

On the H100 (2026-11-24, docs/measurements/h100-2026-11-24/) the op at L 1024 was bound by
launches, not arithmetic. Counted by this script on that day's code (commit bd70f9a), a linear
model, about 5.8 us a launch plus the Triton kernels' own time, reproduces the three measured
times within 1 %:

    impl (L 1024, W 256)   launches   Triton   model                        measured
    reference (dense)         163        -     163 x 5.83 us = 0.95 ms      0.95 ms
    xla                       418        -     418 x 5.83 us = 2.44 ms      2.42 ms
    pallas                    291       42     249 x 5.83 us + 42 x ~60 us  3.99 ms
                                               (tune_triton's per call) = 3.97 ms

(the xla path's 18 lax.conds cost no more than a launch each there). So below the band's
memory time, the launch count is the GPU cost this host can measure. Every JSON line gives
the launches by kind, the host syncs (conditionals; while loops without a known trip count)
and ``floor_ms``: launches x ``US_PER_LAUNCH`` (a lower bound: kernels' own time excluded).

The compilation is XLA's own, Triton kernels included (compiled for sm_90 by XLA's Triton):
the Triton tiling before gpu_budget (128-wide tiles, 2 stages) fails here with the H100's very
error, ``RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 295424, available:
232448``, and today's tilings compile. So a clean run is also a compile check of the GPU path.

    pip install jax-cuda13-plugin==$JAXV jax-cuda13-pjrt==$JAXV   # JAXV: this jax's version
    python scripts/count_gpu_launches.py --lengths 1024,4096     # every variant (the README table)

Needs the plugin (no CUDA libraries: the version check is skipped, nothing runs) and ``ptxas``
on PATH (the CUDA toolkit; XLA compiles the PTX to check it). GEMMs compile as cuBLAS calls
(``--xla_gpu_enable_triton_gemm=false`` unless XLA_FLAGS is set: without a device nothing is
autotuned), as in the counts above.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

import numpy as np

import _common

US_PER_LAUNCH = 5.83  # fitted on the H100 figures above (dense autodiff, L 1024)
# The H100 as XLA's GPU compiler describes it (shared memory, SMs, bandwidth, compute capability).
H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 13 minor: 0 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
# HLO instructions that launch nothing.
FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
        "partition-id", "replica-id", "opt-barrier"}


def _computations(hlo: str) -> dict[str, tuple[bool, str]]:
    """{name: (is the entry, body text)} of an HLO module's text."""
    found = re.finditer(r"^(ENTRY )?%?([\w.\-]+) \(.*?\) -> .*?\{\n(.*?)^\}", hlo, re.S | re.M)
    return {m.group(2): (bool(m.group(1)), m.group(3)) for m in found}


def _opcode(line: str) -> str | None:
    """The opcode of one instruction line (``%x = TYPE opcode(...)``), None for other lines."""
    m = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):  # a tuple type: skip its balanced parentheses
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        rest = rest[i + 1:].lstrip()
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    m = re.match(r"([\w\-]+)\(", rest)
    return m.group(1) if m else None


def count_launches(hlo: str) -> tuple[collections.Counter, collections.Counter]:
    """(launches by kind, host syncs by kind) of an optimized GPU HLO module, loop bodies
    counted once per known trip (a conditional counts both branches: an upper bound)."""
    comps = _computations(hlo)
    kinds, syncs = collections.Counter(), collections.Counter()

    def walk(name: str, times: int) -> None:
        for line in comps[name][1].splitlines():
            op = _opcode(line)
            if op is None or op in FREE:
                continue
            called = lambda key: re.search(rf"{key}=%?([\w.\-]+)", line).group(1)
            if op == "while":
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                if trips is None:  # the condition runs on the device and its value goes to the host
                    syncs["while without a known trip count"] += times
                    walk(called("condition"), times)
                walk(called("body"), times * (int(trips.group(1)) if trips else 1))
            elif op == "conditional":
                syncs["conditional"] += times
                for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
                    for branch in branches.split(","):
                        walk(branch.strip().lstrip("%"), times)
            elif op == "call":
                walk(called("to_apply"), times)
            elif op == "custom-call":
                kinds["custom-call " + re.search(r'custom_call_target="([^"]+)"', line).group(1)] += times
            else:
                kinds[op] += times

    walk(next(name for name, (entry, _) in comps.items() if entry), 1)
    return kinds, syncs


def _elements(shape: str) -> int:
    """Entries of an HLO array shape (``f32[1,16385]{1,0}``; a scalar ``f32[]`` is 1)."""
    dims = re.match(r"\w+\[([\d,]*)\]", shape).group(1)
    return int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1


def recomputed_reductions(hlo: str, length: int = 1024) -> list[dict]:
    """The reductions of at least ``length`` entries each that XLA fused into an elementwise
    kernel of at least ``length`` outputs (a loop fusion, or an input fusion whose hero is not
    a reduce, such as a concatenation): such a kernel may compute the whole reduction again
    for every output entry, O(L^2) work. On an H200 (2026-11-30) two of them, each appending a
    dustbin line, took 1.6 ms apiece of a 7.3 ms call at L 16384 (``sinkhorn._unfused``)."""
    comps = _computations(hlo)
    found = []
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) fusion\(.*calls=%?([\w.\-]+)", line)
        if not m or m.group(3) not in comps:
            continue
        name, out_shape, body = m.group(1), m.group(2), comps[m.group(3)][1]
        defs = {d.group(1): d.group(2) for d in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ", body, re.M)}
        root = next((ln for ln in body.splitlines() if ln.lstrip().startswith("ROOT")), "")
        if _opcode(root) == "reduce" or _opcode(root) == "tuple" and " reduce(" in body and "kind=kInput" in line:
            continue  # a reduction kernel: the reduce is what it parallelizes
        for red in re.finditer(r"^\s*%?[\w.\-]+ = (\S+) reduce\(%?([\w.\-]+)", body, re.M):
            size = _elements(defs.get(red.group(2), "f32[]"))
            reduced = size // max(_elements(red.group(1)), 1)
            if reduced >= length and _elements(out_shape) >= length:
                found.append({"fusion": name, "reduces": reduced, "outputs": _elements(out_shape)})
    return found


def _h100():
    """A sharding on a described H100 (no device needed)."""
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no CUDA libraries are loaded
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=H100_TARGET, topology="1x1x1")
    except Exception as err:  # noqa: BLE001 - the plugin's absence shows up in several forms
        sys.exit(f"error: no deviceless CUDA compilation here ({err}); install the jax CUDA plugin at "
                 f"this jax's version: pip install jax-cuda13-plugin==V jax-cuda13-pjrt==V")
    return NamedSharding(topologies.make_mesh(topology, (1,), ("x",)), PartitionSpec())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default="reference,xla,xla-unrolled,pallas,pallas-resident,pallas-resident-unrolled,"
                    "pallas-fused,pallas-one-pass",
                    help="comma-separated names of kernels.config.IMPL_VARIANTS")
    ap.add_argument("--lengths", type=_common.positive_int_list, default=[1024, 4096, 16384])
    ap.add_argument("--half-band", type=int, default=256, help="W (1024 from L 16384, as bench_transport)")
    ap.add_argument("--dustbin", choices=("none", "spoke", "capacity"), default="none",
                    help="dustbin mode (default none, bench_transport's; spoke: the shipped models')")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import DustbinTokens, TransportConfig, transport
    from pfamalign.kernels.config import impl_variant
    from pfamalign.kernels.pallas_ops import offline_target

    impls = args.impls.split(",")
    for name in impls:
        try:
            impl_variant(name)  # an unknown name fails before any compilation
        except ValueError as err:
            ap.error(str(err))
    sharding = _h100()
    for length in args.lengths:
        half_band = 1024 if length >= 16384 else args.half_band
        spec = jax.ShapeDtypeStruct((1, 1, length, 64), jnp.float32, sharding=sharding)
        lens = jnp.array([length])
        for name in impls:
            cfg = TransportConfig(half_band=half_band, base_steps=15, tail_steps=2, dustbin=args.dustbin,
                                  **impl_variant(name))
            tokens = None if args.dustbin == "none" else DustbinTokens(*(jnp.ones((1, 64)) / 8,) * 3)
            op = lambda q, k, v, cfg=cfg, tokens=tokens: transport(q, k, v, lens, lens, tokens, config=cfg)
            with offline_target("cuda", sharding.mesh):
                hlo = jax.jit(_common.fwd_bwd(op)).lower(spec, spec, spec, spec).compile().as_text()
            kinds, syncs = count_launches(hlo)
            launches = sum(kinds.values())
            recomputed = recomputed_reductions(hlo)
            print(json.dumps({"L": length, "W": half_band, "impl": name, "dustbin": args.dustbin,
                              "target": "H100 (deviceless)",
                              "launches": launches, "floor_ms": round(launches * US_PER_LAUNCH / 1e3, 3),
                              "host_syncs": dict(syncs), "recomputed_reductions": recomputed,
                              "by_kind": dict(kinds.most_common()),
                              "jax": jax.__version__}), flush=True)


if __name__ == "__main__":
    main()
