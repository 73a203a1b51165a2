"""The Triton kernels compiled for an NVIDIA architecture on a host without a GPU.

PyPI ``triton`` (in the test extra on Linux x86_64) compiles the Triton IR that the op's
lowering for "cuda" carries, with that call's ``num_warps`` and ``num_stages``, through ptxas
to a cubin; Triton's own ``cuobjdump`` reads back registers, stack (spills) and the SASS. Two
users: ``tests/test_gpu_budget.py`` (shared memory within the budget, no spills) and
``scripts/triton_static_cost.py`` (the SASS's work a program, for a time estimate).

A dev tool: nothing at run time imports it, and without ``triton`` its functions raise
ImportError.
"""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import tempfile
from typing import NamedTuple


class Compiled(NamedTuple):
    """What Triton allocates for a lowered kernel, and its SASS."""

    shared: int  # bytes of shared memory a program asks for
    registers: int  # a thread's, as ptxas assigned them (cuobjdump -res-usage)
    stack: int  # bytes of local stack a thread uses: > 0 means spilled registers
    num_warps: int
    sass: str  # cuobjdump -sass


def custom_calls(lowered) -> list:
    """Every ``stablehlo.custom_call`` of a lowered jax function (the Triton calls are those
    whose target is ``__gpu$xla.gpu.triton``, their IR and launch in ``mhlo.backend_config``)."""
    found = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.name == "stablehlo.custom_call":
                        found.append(inner)
                    walk(inner)

    walk(lowered.compiler_ir("stablehlo").operation)
    return found


def _cuobjdump() -> pathlib.Path:
    import triton

    return pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def compile_call(config, cc: int, workdir: pathlib.Path | None = None) -> Compiled:
    """The lowered Triton call whose ``mhlo.backend_config`` is ``config`` (its IR, num_warps,
    num_stages), compiled for ``sm_<cc>``. Set ``TRITON_DEFAULT_FP_FUSION=1`` first (XLA's
    Triton fuses multiply-adds; PyPI's default differs). Its files go to ``workdir``, or to a
    temporary directory that is removed afterwards."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="triton_offline_") as tmp:
            return compile_call(config, cc, pathlib.Path(tmp))
    import triton
    from jax._src.lib.mlir import ir
    from jaxlib.triton import dialect
    from triton.backends.compiler import GPUTarget

    ctx = ir.Context()
    dialect.register_dialect(ctx)
    module = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes, context=ctx)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "kernel.ttir"
    path.write_text(str(module))
    options = {key: ir.IntegerAttr(config[key]).value for key in ("num_warps", "num_stages")}
    kernel = triton.compile(str(path), target=GPUTarget("cuda", cc, 32), options=options)
    cubin = workdir / "kernel.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    run = lambda flag: subprocess.run([str(_cuobjdump()), flag, str(cubin)], capture_output=True, text=True,
                                      check=True).stdout
    usage = run("-res-usage")
    field = lambda name: int(re.search(rf"{name}:(\d+)", usage).group(1))
    return Compiled(kernel.metadata.shared, field("REG"), field("STACK"), options["num_warps"], run("-sass"))


# ---- the SASS's static work -------------------------------------------------------------------

# Shared-memory pipe cycles of one warp instruction on an SM (128 bytes a cycle, no bank
# conflicts assumed): the bytes it moves for 32 lanes / 128.
_SMEM_BYTES_PER_LANE = {"": 4, "U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


class Work(NamedTuple):
    """Warp instructions of a kernel, split into its longest loop's body and the rest."""

    body: collections.Counter  # opcode (with modifiers) -> count, in the loop body
    rest: collections.Counter  # everywhere else
    has_loop: bool


def sass_work(sass: str, main_loop: str = "longest") -> Work:
    """Opcode counts of the kernel's SASS: its main loop's body (``main_loop`` "longest": the
    longest backward-branch range; "first": the first one, for a kernel whose longer loop is
    a fallback that rarely runs) and the rest. Predicates are stripped; ``NOP`` and the final
    self-branch are left out."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            op = re.sub(r"^@!?U?P[T\d]+\s+", "", m.group(2)).split()[0]
            ins.append((int(m.group(1), 16), op, m.group(2)))
    loops = []
    for addr, op, text in ins:
        target = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    if main_loop not in ("longest", "first"):
        raise ValueError(f"main_loop must be 'longest' or 'first', got {main_loop!r}")
    pick = (lambda r: r[1] - r[0]) if main_loop == "longest" else (lambda r: -r[0])
    lo, hi = max(loops, key=pick) if loops else (1, 0)
    body, rest = collections.Counter(), collections.Counter()
    for addr, op, text in ins:
        if op == "NOP" or (op == "BRA" and re.search(rf"BRA (?:`\(\.L_x_\d+\) )?0x{addr:x}\b", text)):
            continue
        (body if lo <= addr <= hi else rest)[op] += 1
    return Work(body, rest, bool(loops))


def pipe_cycles(ops: collections.Counter, num_warps: int, hmma_cycles: float) -> dict[str, float]:
    """SM cycles that ``ops`` (one warp's instructions) cost a program of ``num_warps`` warps on
    each pipe that can bound it: issue (4 schedulers an SM, one instruction a cycle each),
    shared memory (128 bytes a cycle), MUFU (16 results a cycle) and the tensor cores
    (``hmma_cycles`` per HMMA on one of the 4 sub-partitions)."""
    smem = 0.0
    for op, n in ops.items():
        head, *mods = op.split(".")
        if head in ("LDS", "STS"):
            width = next((m for m in mods if m in _SMEM_BYTES_PER_LANE), "")
            smem += n * 32 * _SMEM_BYTES_PER_LANE[width] / 128
        elif head == "LDSM":  # ldmatrix: 1, 2 or 4 matrices of 8x8 16-bit values, 128 bytes each
            smem += n * next((int(m) for m in mods if m in ("1", "2", "4")), 4)
    count = lambda head: sum(n for op, n in ops.items() if op.split(".")[0] == head)
    return {"issue": sum(ops.values()) * num_warps / 4, "smem": smem * num_warps,
            "mufu": count("MUFU") * num_warps * 32 / 16, "hmma": count("HMMA") * num_warps * hmma_cycles / 4}
